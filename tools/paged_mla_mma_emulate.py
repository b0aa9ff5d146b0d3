#!/usr/bin/env python3
"""CPU emulation of the paged MLA attend step on the tensor cores (src/deepinfer/ops/cuda/mla_paged_mma_cuda.cu,
KernelChoices::paged_mla_mma), written without a GPU to size the tests' tolerance: the absorbed queries and cache rows
of tests/ops/paged_mla_case.h's distributions (uniform (-1, 1) q and rows, W ~ 1/sqrt(r)), the kernel's blocking (splits
at 32-key boundaries, 16-key tiles, the S partials of four quarters of the row summed in order, online softmax in fp32,
P and the rows split into bf16 hi / lo, products hi·hi + hi·lo + lo·hi with the small terms first), the combine and
W_UV in fp32 — against a float64 reference. Prints the relative L2 error of the output (the GPU tests' measure) per
case. Usage: tools/paged_mla_mma_emulate.py [--seed N]. Products are exact in fp32 here and summed in fp32 per 16-value
k-step (the mma's internal order is not modelled): the GPU tests (tests/cuda/cuda_mla_test.cc) stay the authority."""
import argparse

import numpy as np

R, DR, DN, DV = 512, 64, 128, 128
ROW = R + DR


def bf16(x):  # RNE to bf16, as float32
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def split(x):
    x = np.asarray(x, dtype=np.float32)
    hi = bf16(x)
    return hi, bf16(x - hi)


def x3(a, b):
    """a [m, k] · b [k, n] as the kernel's mma3: (hi·lo + lo·hi) then + hi·hi, fp32 sums of 16-value k-steps."""
    ah, al = split(a)
    bh, bl = split(b)
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 16):
        s = slice(k0, k0 + 16)
        small = (ah[:, s].astype(np.float64) @ bl[s] + al[:, s].astype(np.float64) @ bh[s]).astype(np.float32)
        big = (ah[:, s].astype(np.float64) @ bh[s]).astype(np.float32)
        out = (out + small) + big
    return out


def attend(qf, rows, scale, splits):
    """One token: qf [H, ROW] absorbed queries, rows [n, ROW]; returns the combined Ō [H, R] (fp32)."""
    n, heads = rows.shape[0], qf.shape[0]
    tiles32 = -(-n // 32)
    per_split = -(-tiles32 // splits) * 32
    parts = []
    for sp in range(splits):
        kb, ke = min(n, sp * per_split), min(n, sp * per_split + per_split)
        m = np.full(heads, -np.inf, np.float32)
        l = np.zeros(heads, np.float32)
        o = np.zeros((heads, R), np.float32)
        for k0 in range(kb, ke, 16):
            tile = rows[k0:min(ke, k0 + 16)]
            q4 = [x3(qf[:, d:d + ROW // 4], tile[:, d:d + ROW // 4].T) for d in range(0, ROW, ROW // 4)]
            x = (((q4[0] + q4[1]) + q4[2]) + q4[3]) * np.float32(scale)
            mx = np.maximum(m, x.max(axis=1))
            corr = np.exp(m - mx).astype(np.float32)
            w = np.exp(x - mx[:, None]).astype(np.float32)
            l = l * corr + w.sum(axis=1, dtype=np.float32)
            m = mx
            o = o * corr[:, None] + x3(w, tile[:, :R])
        parts.append((o, m, l))
    mx = np.max(np.stack([p[1] for p in parts]), axis=0)
    den = sum(p[2] * np.exp(p[1] - mx) for p in parts)
    return sum(p[0] * (np.exp(p[1] - mx) / den)[:, None] for p in parts).astype(np.float32)


def case(rng, heads, n, splits):
    q = rng.uniform(-1, 1, (heads, DN + DR)).astype(np.float32)
    w = 1 / np.sqrt(R)
    kv_b = rng.uniform(-w, w, (heads, DN + DV, R)).astype(np.float32)
    rows = rng.uniform(-1, 1, (n, ROW)).astype(np.float32)
    scale = 1 / np.sqrt(DN + DR)
    w_uk, w_uv = kv_b[:, :DN], kv_b[:, DN:]
    qf = np.concatenate([np.einsum('hd,hdr->hr', q[:, :DN], w_uk), q[:, DN:]], axis=1).astype(np.float32)
    # float64 reference of the absorbed form
    s = qf.astype(np.float64) @ rows.astype(np.float64).T * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = np.einsum('hr,hvr->hv', p @ rows[:, :R].astype(np.float64), w_uv.astype(np.float64))
    got = np.einsum('hr,hvr->hv', attend(qf, rows, scale, splits), w_uv).astype(np.float64)
    return np.sqrt(((got - want) ** 2).sum() / (want ** 2).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--seed', type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    for heads, n, splits in [(32, 40, 1), (32, 700, 4), (32, 4500, 1), (32, 4500, 16), (16, 900, 8)]:
        print(f'heads {heads:3d} keys {n:5d} splits {splits:2d}: rel L2 {case(rng, heads, n, splits):.2e}')


if __name__ == '__main__':
    main()
