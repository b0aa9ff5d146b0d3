#!/usr/bin/env python3
"""CPU check of the f32-scale form of the streaming decode kernel (gemm_stream_mma_kernel<..., kF32S = true> in
src/deepinfer/ops/cuda/gemm_stream_mma_cuda.cu), written when no GPU was at hand. The kernel sums a pair of K steps
(128 values) into block sums and adds them, times one f32 scale, into its accumulators; this transcribes the launch
shape (launch_shape: K slices a tile, kw), the slice bounds (s_bound: even starts), the prefetch loop (kPrefetch steps
a round, u's parity), where the block sums are zeroed and folded, and which scale each fold reads, and checks for the
tests' shapes that every step of every slice is counted once, times the scale of the K block it lies in. The mma
fragments are not modelled (their K order inside a step is the UE8M0 kernel's, GPU-tested). Usage:
tools/stream_f32_scale_emulate.py. A transcription: after a kernel change it must be updated by hand; the GPU tests
(CudaLinearTest.QuantLinearF32ScalesTakeTheTensorCoreDecodeKernels, CudaMoeTest.Fp8F32ScaleExperts...) stay the
authority."""
import random

K_SM_WARPS, K_TARGET_WARPS, K_PREFETCH_BYTES = 8, 2048, 128

def ceil_div(a, b):
    return -(-a // b)

def check(n, k, rows, slots, block_k):
    chunks, lbk = k // 16, block_k.bit_length() - 1
    steps = ceil_div(chunks, 4)
    w16 = ceil_div(n, 16) * slots >= 80  # kW16MinTiles
    tiles = ceil_div(n, 16 if w16 else 8)
    kw = 1
    while kw < K_SM_WARPS and tiles * slots * kw < K_TARGET_WARPS and steps >= 4 * kw:
        kw *= 2
    k_prefetch = K_PREFETCH_BYTES // (16 * (2 if w16 else 1))
    rng = random.Random(n * 131 + k)
    part = [rng.uniform(-1, 1) for _ in range(steps)]            # a step's mma sums (one output)
    scale = [rng.uniform(0.01, 2) for _ in range(ceil_div(k, block_k))]
    want = sum(scale[(64 * st) >> lbk] * part[st] for st in range(steps))
    got = 0.0
    s_bound = lambda w: steps * w // kw if w == kw else (steps * w // kw) & ~1
    for wk in range(kw):
        s_begin, s_end = s_bound(wk), s_bound(wk + 1)
        assert s_begin % 2 == 0, (n, k, kw, wk)
        acc, blk = 0.0, None
        for st0 in range(s_begin, s_end, k_prefetch):
            for u in range(k_prefetch):
                st = st0 + u
                if st >= s_end:
                    continue
                e = scale[(4 * st * 16) >> lbk]  # the load: (4 · st · 16) >> lbk, every lane
                if u % 2 == 0:
                    blk = 0.0
                blk += part[st]
                if u % 2 == 1 or st + 1 == s_end:
                    acc += e * blk
                    blk = None
        got += acc
    assert abs(got - want) <= 1e-9 * max(1.0, abs(want)), (n, k, rows, slots, block_k, got, want)
    return kw, w16

if __name__ == '__main__':
    shapes = [(300, 512), (264, 2048), (136, 4096), (72, 1040), (20008, 1024), (24576, 1536), (576, 7168),
              (1536, 7168), (7168, 16384), (2048, 7168), (7168, 2048)]
    seen = set()
    for n, k in shapes:
        for rows in (1, 2, 4, 8):
            for slots in (1, 16, 256):
                for block_k in (128, 256):
                    seen.add(check(n, k, rows, slots, block_k))
    print(f"ok: {len(shapes)} shapes x rows x slots x block_k; (kw, 16-row tiles) seen: {sorted(seen)}")
