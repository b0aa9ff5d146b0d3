#!/usr/bin/env python3
"""CPU emulation of indexer_scores_mma_kernel (src/deepinfer/ops/cuda/indexer_mma_cuda.cu), written when no GPU was
at hand: the kernel's block / pass / tile / warp structure and its ldmatrix addresses transcribed, with ldmatrix and
mma.sync m16n8k16 modelled from the PTX ISA's fragment layouts (not from the kernel's own assumptions), bf16 splits
through torch, sums in fp64. It checks the fragment mapping, the causal and paged masking, the −inf / NaN tails and
that every output is written, against a direct fp64 reference. Usage: tools/indexer_mma_emulate.py [seed]. It is a
transcription: after a kernel change it must be updated by hand, and the GPU tests (tests/cuda/
cuda_indexer_mma_test.cc) stay the authority."""
import math
import sys

import numpy as np
import torch
L = np.arange(32); G = L // 4; TQ = L % 4

def bf(x):  # round to bf16, as float64
    return torch.tensor(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).to(torch.float64).numpy()

def split(x):
    x = np.asarray(x, dtype=np.float32)
    hi = bf(x).astype(np.float32)
    lo = bf(x - hi).astype(np.float32)   # fp32 subtraction as on the GPU
    return hi.astype(np.float64), lo.astype(np.float64)

def ldmatrix_x4(arr, rows, cols):
    # rows/cols[32]: the address lane l supplies (row, col start of an 8-element row) for matrix l // 8.
    out = np.zeros((32, 4, 2))
    for i in range(4):
        r = G  # row of matrix i each lane receives
        src = 8 * i + r
        rr = rows[src]; cc = cols[src] + 2 * TQ
        out[:, i, 0] = arr[rr, cc]; out[:, i, 1] = arr[rr, cc + 1]
    return out

def mma(c, a, b0, b1):
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for j in range(2):
        A[G, 2 * TQ + j] = a[:, 0, j]; A[G + 8, 2 * TQ + j] = a[:, 1, j]
        A[G, 2 * TQ + 8 + j] = a[:, 2, j]; A[G + 8, 2 * TQ + 8 + j] = a[:, 3, j]
        B[2 * TQ + j, G] = b0[:, j]; B[2 * TQ + 8 + j, G] = b1[:, j]
    C[G, 2 * TQ] = c[:, 0]; C[G, 2 * TQ + 1] = c[:, 1]; C[G + 8, 2 * TQ] = c[:, 2]; C[G + 8, 2 * TQ + 1] = c[:, 3]
    D = A @ B + C
    return np.stack([D[G, 2 * TQ], D[G, 2 * TQ + 1], D[G + 8, 2 * TQ], D[G + 8, 2 * TQ + 1]], axis=1)

def warp_scores(qh, ql, qrow0, kh, kl, krow0, dim, kMt, kNt, split_):
    acc = np.zeros((kMt, kNt, 32, 4))
    b_row = (L & 7) + ((L >> 4) << 3); b_col = ((L >> 3) & 1) * 8
    a_row = L & 15; a_col = (L >> 4) * 8
    for d in range(0, dim, 16):
        bh = [ldmatrix_x4(kh, krow0 + i * 16 + b_row, d + b_col) for i in range(kNt // 2)]
        bl = [ldmatrix_x4(kl, krow0 + i * 16 + b_row, d + b_col) for i in range(kNt // 2)]
        for mt in range(kMt):
            ah = ldmatrix_x4(qh, qrow0 + mt * 16 + a_row, d + a_col)
            al = ldmatrix_x4(ql, qrow0 + mt * 16 + a_row, d + a_col)
            for nt in range(kNt):
                b0 = bh[nt >> 1][:, (nt & 1) * 2]; b1 = bh[nt >> 1][:, (nt & 1) * 2 + 1]
                if split_:
                    acc[mt, nt] = mma(acc[mt, nt], ah, bl[nt >> 1][:, (nt & 1) * 2], bl[nt >> 1][:, (nt & 1) * 2 + 1])
                    acc[mt, nt] = mma(acc[mt, nt], al, b0, b1)
                acc[mt, nt] = mma(acc[mt, nt], ah, b0, b1)
    return acc

def kernel(P):
    """P: dict with q [T,H,D], keys (contig [n,D] or pool), weights [T,H], positions, n, ratio, scales, paged..."""
    T, H, D = P['q'].shape; n = P['n']
    kMt = 2 if H <= 32 else 4
    kRows = 16 * kMt; kTokens = 16 // kMt; kNt = 64 // 8 // (8 // kTokens); kWarpKeys = kNt * 8; kTile = 64
    out = np.full((T, n), 12345.0)  # poison: must all be overwritten
    status = [0]
    paged = P.get('tables') is not None
    def scored_entries(t):
        c = (P['pos'][t] + 1) // P['ratio'] if P['pos'][t] + 1 >= 0 else -((-(P['pos'][t] + 1)) // P['ratio'])
        if not paged: return c
        b = P['q_seq'][t]; ne = P['n_entries'][t]
        if b < 0 or b >= P['tables'].shape[0] or ne < 0 or ne > n:
            status[0] = 1; return -1
        return min(c, ne)
    def entry_key(t, e):
        if not paged: return P['keys'][e]
        bs, kr = P['block_size'], P['key_ratio']
        blk = e * kr // bs
        if blk >= P['tables'].shape[1]: status[0] = 1; return None
        id_ = P['tables'][P['q_seq'][t], blk]
        row = id_ * (bs // kr) + (e * kr % bs) // kr
        if id_ < 0 or row >= P['pool'].shape[0]: status[0] = 1; return None
        return P['pool'][row]
    grid = (T + kTokens - 1) // kTokens
    kLd = D + 8
    for bidx in range(grid):
        t0 = (grid - 1 - bidx) * kTokens
        count = []; seq = []
        for i in range(kTokens):
            t = t0 + i; c = -2; s = 0
            if t < T:
                c = scored_entries(t); c = -1 if c < 0 else min(c, n)
                if c >= 0 and paged: s = P['q_seq'][t]
            count.append(c); seq.append(s)
        qf = np.zeros((kTokens * kRows, kLd), dtype=np.float32)
        ws = np.zeros(kTokens * kRows)
        for i in range(kTokens):
            t = t0 + i
            if t < T:
                qf[i * kRows:i * kRows + H, :D] = P['q'][t]
                ws[i * kRows:i * kRows + H] = P['w'][t] * np.float32(P['wscale'])
        qh, ql = split(qf)
        q_split = np.any(ql != 0)
        pending = [i for i in range(kTokens) if count[i] >= 0]
        upto = [0] * kTokens
        while pending:
            first = pending[0]
            active = [i for i in pending if seq[i] == seq[first]]
            pending = [i for i in pending if i not in active]
            e_end = max([0] + [count[i] for i in active])
            ntiles = (e_end + kTile - 1) // kTile
            for i in active: upto[i] = min(n, ntiles * kTile)
            tk = t0 + first
            for it in range(ntiles):
                kf = np.zeros((kTile, kLd), dtype=np.float32); bad = np.zeros(kTile, bool)
                for r in range(kTile):
                    e = it * kTile + r
                    if e < e_end:
                        row = entry_key(tk, e)
                        if row is None: bad[r] = True
                        else: kf[r, :D] = row
                kh, kl = split(kf)
                k_split = np.any(kl != 0)
                for warp in range(8):
                    tok = warp % kTokens; part = warp // kTokens
                    if tok not in active: continue
                    cnt = count[tok]
                    col0 = it * kTile + part * kWarpKeys
                    if col0 >= n: continue
                    if col0 >= cnt:
                        for k in range(kWarpKeys):
                            if col0 + k < n: out[t0 + tok, col0 + k] = -np.inf
                        continue
                    acc = warp_scores(qh, ql, tok * kRows, kh, kl, part * kWarpKeys, D, kMt, kNt, q_split or k_split)
                    w = ws[tok * kRows:(tok + 1) * kRows]
                    s0 = np.zeros((kNt, 32)); s1 = np.zeros((kNt, 32))
                    for nt in range(kNt):
                        for mt in range(kMt):
                            w0 = w[mt * 16 + G]; w1 = w[mt * 16 + G + 8]
                            s0[nt] += np.maximum(acc[mt, nt, :, 0], 0) * P['sscale'] * w0
                            s1[nt] += np.maximum(acc[mt, nt, :, 1], 0) * P['sscale'] * w0
                            s0[nt] += np.maximum(acc[mt, nt, :, 2], 0) * P['sscale'] * w1
                            s1[nt] += np.maximum(acc[mt, nt, :, 3], 0) * P['sscale'] * w1
                        for o in (4, 8, 16):
                            s0[nt] = s0[nt] + s0[nt][L ^ o]; s1[nt] = s1[nt] + s1[nt][L ^ o]
                    for lane in range(32):
                        g, tq = lane // 4, lane % 4
                        if g >= kNt: continue
                        v = (s0[g][lane], s1[g][lane])
                        k = part * kWarpKeys + g * 8 + 2 * tq
                        for j in range(2):
                            e = col0 + g * 8 + 2 * tq + j
                            if e < n:
                                out[t0 + tok, e] = -np.inf if e >= cnt else (np.nan if bad[k + j] else v[j])
        for i in range(kTokens):
            c = count[i]
            if c == -2: continue
            for e in range(0 if c < 0 else upto[i], n):
                out[t0 + i, e] = np.nan if c < 0 else -np.inf
    return out, status[0]

def reference(P):
    T, H, D = P['q'].shape; n = P['n']; paged = P.get('tables') is not None
    out = np.zeros((T, n))
    for t in range(T):
        vis = (P['pos'][t] + 1) // P['ratio']
        if paged: vis = min(vis, P['n_entries'][t])
        for e in range(n):
            if e >= vis: out[t, e] = -np.inf; continue
            if paged:
                bs, kr = P['block_size'], P['key_ratio']
                id_ = P['tables'][P['q_seq'][t], e * kr // bs]
                key = P['pool'][id_ * (bs // kr) + (e * kr % bs) // kr].astype(np.float64)
            else:
                key = P['keys'][e].astype(np.float64)
            dots = P['q'][t].astype(np.float64) @ key
            out[t, e] = np.sum(np.maximum(dots, 0) * P['sscale'] * P['w'][t] * P['wscale'])
    return out

def rel(a, b):
    fa, fb = np.isfinite(a), np.isfinite(b)
    assert (fa == fb).all(), "finite pattern differs"
    assert (np.isneginf(a) == np.isneginf(b)).all(), "-inf pattern differs"
    d = a[fa] - b[fb]
    return np.linalg.norm(d) / max(np.linalg.norm(b[fb]), 1e-30)

rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
def U(*s): return rng.uniform(-1, 1, s).astype(np.float32)

def contig(T, H, D, n, ratio, unsorted=False, exact=False):
    q, k = U(T, H, D), U(n, D)
    if exact: q, k = bf(q).astype(np.float32), bf(k).astype(np.float32)
    if unsorted: pos = rng.integers(-1, ratio * n + 50, T)
    else:
        step = max(1, ratio * n // T); pos = np.array([max(0, ratio * n - 1 - (T - 1 - i) * step) for i in range(T)])
    P = dict(q=q, keys=k, w=U(T, H), pos=pos, n=n, ratio=ratio, sscale=np.float32(1 / math.sqrt(D)), wscale=np.float32(1 / math.sqrt(H)))
    return P

for name, P in [("V4 T=9 H=64 D=128 n=150 r=4", contig(9, 64, 128, 150, 4)),
                ("V4.1 T=19 H=32 D=128 n=70 r=2", contig(19, 32, 128, 70, 2)),
                ("H=40 D=64 T=6 n=130 r=1 unsorted", contig(6, 40, 64, 130, 1, unsorted=True)),
                ("H=16 D=64 T=11 n=65 r=1 exact", contig(11, 16, 64, 65, 1, exact=True))]:
    got, st = kernel(P); want = reference(P)
    assert not (got == 12345.0).any(), "unwritten output"
    print(name, "rel", rel(got, want), "status", st)

# Paged: 3 sequences, tokens interleaved, one without entries, one bad token row (q_seq out of range).
def paged_case(H=64, D=128):
    bs, kr = 64, 4; per = bs // kr
    seqs = [(7, 40), (5, 0), (6, 90)]
    maxb = max(1, max((ne + per - 1) // per for _, ne in seqs))
    ids = rng.permutation(len(seqs) * maxb + 2)
    tables = ids[:len(seqs) * maxb].reshape(len(seqs), maxb)
    pool = np.full((len(ids) * per, D), np.nan, np.float32)
    qs, pos, qseq, nent = [], [], [], []
    for b, (tk, ne) in enumerate(seqs):
        for e in range(ne):
            pool[tables[b, e * kr // bs] * per + (e * kr % bs) // kr] = U(D)
        for i in range(tk):
            step = max(1, kr * ne // max(tk, 1))
            pos.append(max(0, kr * ne - 1 - (tk - 1 - i) * step)); qseq.append(b); nent.append(ne)
    T = len(pos)
    perm = rng.permutation(T)
    pos, qseq, nent = np.array(pos)[perm], np.array(qseq)[perm], np.array(nent)[perm]
    n = max(ne for _, ne in seqs) + 5
    return dict(q=U(T, H, D), w=U(T, H), pos=pos, n=n, ratio=kr, sscale=np.float32(1 / math.sqrt(D)),
                wscale=np.float32(1 / math.sqrt(H)), tables=tables, pool=pool, q_seq=qseq, n_entries=nent,
                block_size=bs, key_ratio=kr)
for H in (64, 32):
    P = paged_case(H)
    got, st = kernel(P); want = reference(P)
    assert not (got == 12345.0).any(), "unwritten output"
    print("paged H=%d" % H, "rel", rel(got, want), "status", st)
    # bad q_seq on one token: NaN row + status
    P['q_seq'] = P['q_seq'].copy(); P['q_seq'][2] = 7
    got, st = kernel(P)
    assert np.isnan(got[2]).all() and st == 1
    ok = [t for t in range(len(P['pos'])) if t != 2]
    print("  bad q_seq row NaN, others rel", rel(got[ok], reference(dict(P, q_seq=np.where(np.arange(len(P['pos']))==2, 0, P['q_seq'])))[ok]))
