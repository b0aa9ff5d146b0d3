#!/usr/bin/env python3
"""CPU emulation of CudaBackend::mla_attention_naive under KernelChoices::mla_bf16x3
(src/deepinfer/ops/cuda/cuda_backend_attention.cc), written when no GPU was at hand: the host code's buffers as flat
arrays, each cuBLASLt call (Impl::lt_batched: column-major, op_a / op_b, lda / ldb / ldd, strided batches, beta)
modelled from cuBLASLt's documented semantics, run_bf16_parts, run_mla_keys and the softmax's P terms as the kernels
index them. It checks the layouts (which K part holds hi or lo, strides, the causal row bounds and head groups)
against a float64 reference of the naive form, and prints the relative L2 error of bf16x3 next to fp32 and TF32
products (the tests' measure). Usage: tools/mla_bf16x3_emulate.py. A transcription: after a change to the host code it
must be updated by hand; the GPU tests (tests/cuda/cuda_mla_test.cc) stay the authority."""
import numpy as np

def bf16(x):  # RNE to bf16, as float32
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)

def tf32(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0xFFF + ((u >> 13) & 1)) >> 13) << 13).astype(np.uint32).view(np.float32)

def split(x):
    x = np.asarray(x, dtype=np.float32)
    hi = bf16(x)
    lo = np.where(np.isfinite(hi), bf16(x - hi), np.float32(0))
    return hi, lo

def matrix(buf, off, rows, cols, ld):  # column-major rows x cols at buf[off], leading dimension ld
    idx = off + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
    return buf[idx], idx

def lt_batched(bufs, g, rnd=None):
    """D[b] = op_a(A[b]) · op_b(B[b]) + beta · D[b]; A, B, D as (buffer name, element offset)."""
    for b in range(g['batch']):
        a_r, a_c = (g['k'], g['rows']) if g['trans_a'] else (g['rows'], g['k'])
        A, _ = matrix(bufs[g['a'][0]], g['a'][1] + b * g.get('stride_a', 0), a_r, a_c, g['lda'])
        B, _ = matrix(bufs[g['b'][0]], g['b'][1] + b * g.get('stride_b', 0), g['k'], g['cols'], g['ldb'])
        if g['trans_a']:
            A = A.T
        if rnd:
            A, B = rnd(A), rnd(B)
        D, idx = matrix(bufs[g['d'][0]], g['d'][1] + b * g.get('stride_d', 0), g['rows'], g['cols'], g['ldd'])
        prod = (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32)
        bufs[g['d'][0]][idx] = prod + (np.float32(g.get('beta', 0)) * D if g.get('beta', 0) else 0)

def bf16_parts(bufs, p):
    src, dst = bufs[p['src'][0]], bufs[p['dst'][0]]
    for r in range(p['rows']):
        for s in range(p.get('segs', 1)):
            e = np.arange(p['len'])
            x = src[p['src'][1] + r * p['src_row'] + s * p.get('src_seg', 0) + e]
            hi, lo = split(x)
            for j in range(p['parts']):
                dst[p['dst'][1] + r * p['dst_row'] + s * p.get('dst_seg', 0) + j * p['part_stride'] + e] = \
                    lo if (p['lo_parts'] >> j) & 1 else hi

shapes = set()  # (mode, heads a group, queries a chunk) the runs took

def run(T, H, dn, dr, r, dv, S, causal, budget, mode, seed=1):
    rng = np.random.default_rng(seed)
    qk = dn + dr
    q = rng.uniform(-1, 1, (T, H, qk)).astype(np.float32)
    kv = rng.uniform(-1, 1, (S, r + dr)).astype(np.float32)
    kvb = rng.uniform(-0.1, 0.1, (H * (dn + dv), r)).astype(np.float32)
    kvpos = np.arange(S) + 10
    qpos = np.arange(S - T, S) + 10
    scale = np.float32(1 / np.sqrt(qk))
    # float64 reference of the naive form
    ref = np.zeros((T, H, dv))
    kvx64 = (kv[:, :r].astype(np.float64) @ kvb.T.astype(np.float64)).reshape(S, H, dn + dv)
    for h in range(H):
        keys = np.concatenate([kvx64[:, h, :dn], kv[:, r:]], axis=1)
        lg = (q[:, h, :].astype(np.float64) @ keys.T) * scale
        lg = np.where(kvpos[None, :] <= qpos[:, None], lg, -np.inf)
        p = np.exp(lg - lg.max(1, keepdims=True))
        ref[:, h, :] = (p / p.sum(1, keepdims=True)) @ kvx64[:, h, dn:]
    # the host code, transcribed
    x3 = mode == 'bf16x3'
    rnd = tf32 if mode == 'tf32' else None
    chunk_tokens = 1024 if causal else T
    logit_floats = budget // 2 if x3 else budget
    row_floats = dn + dv + qk + ((3 * qk) // 2 + dv if x3 else 0)
    G = int(np.clip(min(logit_floats // (min(T, chunk_tokens) * S), budget // (S * row_floats)), 1, H))
    Tc = max(1, min(T, chunk_tokens, logit_floats // (G * S)))
    ld_p = -(-S // 8) * 8
    shapes.add((mode, G, Tc))
    f = lambda n: np.full(n, np.nan, np.float32)
    bufs = {'q': q.ravel().copy(), 'kv': kv.ravel().copy(), 'kvb': kvb.ravel().copy(), 'out': f(T * H * dv),
            'kvx': f(S * G * (dn + dv)), 'keys': f(S * G * qk), 'logits': f(G * Tc * S)}
    if x3:
        bufs.update({'c3': f(S * 3 * r), 'kvb3': f(G * (dn + dv) * 3 * r), 'keys3': f(S * G * 3 * qk),
                     'q3': f(Tc * G * 3 * qk), 'v2': f(2 * S * G * dv), 'p2': f(2 * G * Tc * ld_p)})
        bf16_parts(bufs, dict(src=('kv', 0), src_row=r + dr, rows=S, len=r, dst=('c3', 0), dst_row=3 * r,
                              part_stride=r, parts=3, lo_parts=0b010))
    max_q = qpos.max()
    for h0 in range(0, H, G):
        g = min(G, H - h0)
        e = dict(trans_a=True, rows=g * (dn + dv), cols=S, k=r, batch=1, a=('kvb', h0 * (dn + dv) * r), lda=r,
                 b=('kv', 0), ldb=r + dr, d=('kvx', 0), ldd=g * (dn + dv))
        if x3:
            bf16_parts(bufs, dict(src=('kvb', h0 * (dn + dv) * r), src_row=r, rows=g * (dn + dv), len=r,
                                  dst=('kvb3', 0), dst_row=3 * r, part_stride=r, parts=3, lo_parts=0b100))
            e.update(k=3 * r, a=('kvb3', 0), lda=3 * r, b=('c3', 0), ldb=3 * r)
        lt_batched(bufs, e, rnd)
        # run_mla_keys
        kvx = bufs['kvx']
        for sh in range(S * g):
            sk = sh // g
            bufs['keys'][sh * qk:sh * qk + dn] = kvx[sh * (dn + dv):sh * (dn + dv) + dn]
            bufs['keys'][sh * qk + dn:(sh + 1) * qk] = bufs['kv'][sk * (r + dr) + r:(sk + 1) * (r + dr)]
            if kvpos[sk] > max_q:
                kvx[sh * (dn + dv) + dn:(sh + 1) * (dn + dv)] = 0
        if x3:
            bf16_parts(bufs, dict(src=('keys', 0), src_row=g * qk, src_seg=qk, rows=S, segs=g, len=qk,
                                  dst=('keys3', 0), dst_row=g * 3 * qk, dst_seg=3 * qk, part_stride=qk, parts=3,
                                  lo_parts=0b100))
            bf16_parts(bufs, dict(src=('kvx', dn), src_row=g * (dn + dv), src_seg=dn + dv, rows=S, segs=g, len=dv,
                                  dst=('v2', 0), dst_row=g * dv, dst_seg=dv, part_stride=S * g * dv, parts=2,
                                  lo_parts=0b10))
        for t0 in range(0, T, Tc):
            tc = min(Tc, T - t0)
            Sc = S
            if causal:
                Sc = int(np.clip(qpos[t0:t0 + tc].max() - 10 + 1, 0, S))
            l = dict(trans_a=True, rows=Sc, cols=tc, k=qk, batch=g, a=('keys', 0), lda=g * qk, stride_a=qk,
                     b=('q', (t0 * H + h0) * qk), ldb=H * qk, stride_b=qk, d=('logits', 0), ldd=Sc, stride_d=tc * Sc)
            if x3:
                bf16_parts(bufs, dict(src=('q', (t0 * H + h0) * qk), src_row=H * qk, src_seg=qk, rows=tc, segs=g,
                                      len=qk, dst=('q3', 0), dst_row=g * 3 * qk, dst_seg=3 * qk, part_stride=qk,
                                      parts=3, lo_parts=0b010))
                l.update(k=3 * qk, a=('keys3', 0), lda=g * 3 * qk, stride_a=3 * qk, b=('q3', 0), ldb=g * 3 * qk,
                         stride_b=3 * qk)
            lt_batched(bufs, l, rnd)
            # the softmax: rows head-major (h * tc + t), each Sc logits; P's terms at row * ld_p
            lg = bufs['logits'][:g * tc * Sc].reshape(g, tc, Sc).astype(np.float64) * scale
            vis = kvpos[None, None, :Sc] <= qpos[t0:t0 + tc][None, :, None]
            lg = np.where(vis, lg, -np.inf)
            mx = lg.max(2, keepdims=True)
            ex = np.where(vis, np.exp(lg - np.where(np.isfinite(mx), mx, 0)), 0)
            sm = ex.sum(2, keepdims=True)
            P = np.where(sm > 0, ex / np.where(sm > 0, sm, 1), 0).astype(np.float32)
            o = dict(trans_a=False, rows=dv, cols=tc, k=Sc, batch=g, a=('kvx', dn), lda=g * (dn + dv),
                     stride_a=dn + dv, b=('logits', 0), ldb=Sc, stride_b=tc * Sc, d=('out', (t0 * H + h0) * dv),
                     ldd=H * dv, stride_d=dv)
            if not x3:
                bufs['logits'][:g * tc * Sc] = P.ravel()
                lt_batched(bufs, o, rnd)
                continue
            hi, lo = split(P)
            for j, part in enumerate((hi, lo)):
                for hh in range(g):
                    for t in range(tc):
                        row = hh * tc + t
                        bufs['p2'][j * g * tc * ld_p + row * ld_p:j * g * tc * ld_p + row * ld_p + Sc] = part[hh, t]
            o.update(lda=g * dv, stride_a=dv, ldb=ld_p, stride_b=tc * ld_p)
            for j, (a, b) in enumerate([(0, 0), (0, g * tc * ld_p), (S * g * dv, 0)]):
                o.update(a=('v2', a), b=('p2', b), beta=0 if j == 0 else 1)
                lt_batched(bufs, o)
    got = bufs['out'].reshape(T, H, dv).astype(np.float64)
    return np.sqrt(np.sum((got - ref) ** 2) / np.sum(ref ** 2))

if __name__ == '__main__':
    # Small dims under small budgets: one head a group in chunks of 60 queries, then groups of 3, 3 and 1 heads; with
    # and without the causal layout facts; then a prefill like the MLA test's (causal: chunks of 1024 and 76).
    for (T, H, dn, dr, r, dv, S, budget) in [(70, 6, 16, 8, 64, 24, 120, 4 * 30 * 120),
                                             (70, 7, 16, 8, 64, 24, 120, 62000),
                                             (1100, 4, 32, 16, 64, 32, 1300, 1 << 27)]:
        for causal in (False, True):
            errs = {m: run(T, H, dn, dr, r, dv, S, causal, budget, m) for m in ('fp32', 'bf16x3', 'tf32')}
            print(f"T={T} H={H} S={S} causal={causal}: " + ", ".join(f"{m} {e:.2e}" for m, e in errs.items()))
            print("  (mode, heads a group, queries a chunk):", sorted(shapes))
            shapes.clear()
