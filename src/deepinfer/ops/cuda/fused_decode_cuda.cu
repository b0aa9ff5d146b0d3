// Fused decode ops: each kernel is the composition of existing kernels in one launch (a decode step at batch 1 is
// launch-bound: ~40 kernels of 3-8 µs a layer, docs/PERF.md). Bit-identity with the unfused launches rests on
// repeating their arithmetic exactly: hc_collapse's per-channel sum (hc_cuda.cu), rms_norm's per-thread sums over
// rms_norm_threads(dim) threads followed by block_sum (norm_cuda.cu), rope's angle and rotation (rope_cuda.cu), and
// fake_quant's block (fake_quant.cuh, shared with fake_quant_cuda.cu). Threads beyond rms_norm_threads(dim) add +0 to
// the block sum, which leaves it unchanged (block_sum already pads its last warp reduction with zeros).
#include <algorithm>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/fake_quant.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

// One block per token. The collapsed row goes to `out` first: the norm reads it back (each thread its own
// channels), which keeps any D without a register bound.
__global__ void hc_collapse_norm_kernel(HcCollapseNormKernelParams p) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float* x = p.streams + t * p.hc * p.d;
  const float* pre = p.pre + t * p.hc;
  float* y = p.out + t * p.d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < p.hc; ++k) acc = __fadd_rn(acc, __fmul_rn(pre[k], x[k * p.d + i]));
    y[i] = acc;
    ss = fmaf(acc, acc, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.d) + p.eps);
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
    const float v = __fmul_rn(y[i], inv);
    y[i] = p.weight ? __fmul_rn(p.weight[i], v) : v;
  }
}

// hc_collapse_norm_kernel for a fixed hc with the row in registers: every stream value a thread needs is loaded before
// anything is stored (the loop above stores y[i] between its loads, so the pointers' possible aliasing kept the
// compiler from hoisting the next iteration's loads: ~10 dependent global round trips a row at D = 5120, 8.1 µs a
// call at batch 1, ncu), and y is written once, after the norm, instead of written and read back. Same per-element
// arithmetic, same per-thread sum order (channels i, i + threads, ...) and the same block_sum: the same bits.
template <int kHc, int kPer>
__global__ void hc_collapse_norm_reg_kernel(HcCollapseNormKernelParams p) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float* __restrict__ x = p.streams + t * kHc * p.d;
  const float* pre = p.pre + t * kHc;
  float* y = p.out + t * p.d;
  float pk[kHc];
#pragma unroll
  for (int k = 0; k < kHc; ++k) pk[k] = pre[k];
  float acc[kPer], wt[kPer];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    float a = 0.0f;
    if (i < p.d) {
#pragma unroll
      for (int k = 0; k < kHc; ++k) a = __fadd_rn(a, __fmul_rn(pk[k], __ldg(x + k * p.d + i)));
      ss = fmaf(a, a, ss);
    }
    acc[j] = a;
    wt[j] = p.weight && i < p.d ? __ldg(p.weight + i) : 1.0f;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.d) + p.eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (i >= p.d) break;
    const float v = __fmul_rn(acc[j], inv);
    y[i] = p.weight ? __fmul_rn(wt[j], v) : v;
  }
}

// fake_quant of one row, a thread per quantization block (as the fake_quant kernel); a row that is not a whole number
// of blocks passes through unchanged, as in the op.
template <FakeQuantKind K>
__device__ __forceinline__ void fake_quant_row(float* v, int64_t hd) {
  constexpr int kBlock = fake_quant_block_size<K>();
  if (hd % kBlock != 0) return;
  for (int64_t b = threadIdx.x; b < hd / kBlock; b += blockDim.x) fake_quant_block<K>(v + b * kBlock);
}

// One block per (token, head) row of either part, part 0's rows first. The rope angles are per row here (rope_kernel
// shares them per token): the same values, evaluated once per head instead of once per token.
__global__ void norm_rope_kernel(NormRopeKernelParams p) {
  __shared__ float red[32];
  const int64_t rows0 = p.parts[0].x ? p.tokens * p.parts[0].heads : 0;
  const int64_t b = blockIdx.x;
  // Field by field: a reference to parts[b < rows0 ? 0 : 1] would copy the params to local memory (a stack frame).
  const bool first = b < rows0;
  const int64_t r = first ? b : b - rows0;  // row = token · heads + head
  const int64_t heads = first ? p.parts[0].heads : p.parts[1].heads, hd = first ? p.parts[0].hd : p.parts[1].hd;
  const float* weight = first ? p.parts[0].weight : p.parts[1].weight;
  const bool norm = first ? p.parts[0].norm : p.parts[1].norm, rope = first ? p.parts[0].rope : p.parts[1].rope;
  const bool quant = first ? p.parts[0].fake_quant : p.parts[1].fake_quant;
  const FakeQuantKind kind = first ? p.parts[0].quant : p.parts[1].quant;
  const int64_t t = r / heads;
  float* v = (first ? p.parts[0].x : p.parts[1].x) + r * hd;
  if (norm) {
    const int threads = rms_norm_threads(hd);
    float ss = 0.0f;
    if (threadIdx.x < threads)
      for (int64_t i = threadIdx.x; i < hd; i += threads) ss = fmaf(v[i], v[i], ss);
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + p.eps);
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
      const float n = __fmul_rn(v[i], inv);
      v[i] = weight ? __fmul_rn(weight[i], n) : n;
    }
    __syncthreads();  // the rotation reads pairs another thread normalised
  }
  if (rope) {
    const float fpos = static_cast<float>(p.positions[t]);
    float* slice = v + (hd - 2 * p.half);
    for (int64_t i = threadIdx.x; i < p.half; i += blockDim.x) {
      const float theta = __fmul_rn(p.inv_freq[i], fpos);
      const float c = static_cast<float>(cos(static_cast<double>(theta)));
      const float s = static_cast<float>(sin(static_cast<double>(theta)));
      const float a = slice[2 * i], bb = slice[2 * i + 1];
      slice[2 * i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s));
      slice[2 * i + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(bb, c));
    }
  }
  if (!quant) return;
  __syncthreads();  // a quantization block spans pairs other threads rotated
  switch (kind) {
    case FakeQuantKind::kFP8E4M3Ue8m0Block32:
      fake_quant_row<FakeQuantKind::kFP8E4M3Ue8m0Block32>(v, hd);
      break;
    case FakeQuantKind::kFP4Ue8m0Block32:
      fake_quant_row<FakeQuantKind::kFP4Ue8m0Block32>(v, hd);
      break;
    case FakeQuantKind::kFP4E4m3Block16:
      fake_quant_row<FakeQuantKind::kFP4E4m3Block16>(v, hd);
      break;
  }
}

// A warp per (token, head) row of one normed part, for many rows (prefill: V4's per-head query norm, [T, 64, 512]):
// the block-per-row kernel above ran that at ~1.05 TB/s (ncu, H200: a 2 KB row per 256-thread block, two block
// reductions and a barrier a row). The same bits: lane l holds, for each of the W = rms_norm_threads(hd) / 32 warps of
// that kernel, old thread 32w + l's elements (i = 32w + l + j·threads, j < J) and sums them in the same order; each
// warp's butterfly (warp_sum) runs on its W values, then block_sum's second butterfly over lanes < W (zeros past
// them). The rotation pairs (i, i ^ 1) sit in lanes (l, l ^ 1) with the same (w, j): one shuffle; the angle and the
// products are rope's. kPer = hd / 32 values a lane.
template <int kPer>
__global__ void __launch_bounds__(256)
    norm_rope_warp_kernel(NormRopeKernelPart part, const int64_t* positions, const float* inv_freq, int64_t tokens,
                          int64_t half, float eps) {
  constexpr int hd = 32 * kPer, kThreads = rms_norm_threads(hd), W = kThreads / 32, J = kPer / W;
  static_assert(J * W == kPer && J >= 1, "rows of whole old-thread strides");
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= tokens * part.heads) return;
  float* v = part.x + r * hd;
  float val[J][W];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int w = 0; w < W; ++w) val[j][w] = v[32 * w + lane + j * kThreads];
  float ss[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j) a = fmaf(val[j][w], val[j][w], a);
    ss[w] = warp_sum(a);
  }
  float mine = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w)
    if (lane == w) mine = ss[w];
  const float inv = 1.0f / sqrtf(warp_sum(mine) / static_cast<float>(hd) + eps);
  const float fpos = part.rope ? static_cast<float>(positions[r / part.heads]) : 0.0f;
  const int64_t s0 = hd - 2 * half;  // the rotated slice: [s0, hd)
#pragma unroll
  for (int j = 0; j < J; ++j) {
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const int i = 32 * w + lane + j * kThreads;
      const float n = __fmul_rn(val[j][w], inv);
      float x = part.weight ? __fmul_rn(__ldg(part.weight + i), n) : n;
      if (part.rope && 32 * w + j * kThreads + 32 > s0) {  // this chunk of 32 reaches the slice: all lanes shuffle
        const float other = __shfl_xor_sync(0xffffffffu, x, 1);
        if (i >= s0) {
          const int64_t k = (i - s0) >> 1;
          const float theta = __fmul_rn(inv_freq[k], fpos);
          const float c = static_cast<float>(cos(static_cast<double>(theta)));
          const float sn = static_cast<float>(sin(static_cast<double>(theta)));
          x = ((i - s0) & 1) == 0 ? __fsub_rn(__fmul_rn(x, c), __fmul_rn(other, sn))
                                  : __fadd_rn(__fmul_rn(other, sn), __fmul_rn(x, c));
        }
      }
      v[i] = x;
    }
  }
}

// The warp kernel's rows: a normed part without fake-quant, rows of 128 / 256 / 512 / 1024 contiguous values, a
// rotated slice of whole pairs, and enough rows that the launch is not latency-bound (decode keeps one launch).
constexpr int64_t kNormRopeWarpRows = 8192;
bool norm_rope_warp_takes(const NormRopeKernelParams& p, const NormRopeKernelPart& part) {
  if (!part.x || !part.norm || part.fake_quant || p.tokens * part.heads < kNormRopeWarpRows) return false;
  if (part.hd != 128 && part.hd != 256 && part.hd != 512 && part.hd != 1024) return false;
  return !part.rope || (p.half > 0 && 2 * p.half <= part.hd);
}

void launch_norm_rope_warp(const NormRopeKernelParams& p, const NormRopeKernelPart& part, cudaStream_t stream) {
  const int64_t rows = p.tokens * part.heads;
  const unsigned blocks = static_cast<unsigned>((rows + 7) / 8);
  switch (part.hd) {
    case 128:
      norm_rope_warp_kernel<4><<<blocks, 256, 0, stream>>>(part, p.positions, p.inv_freq, p.tokens, p.half, p.eps);
      break;
    case 256:
      norm_rope_warp_kernel<8><<<blocks, 256, 0, stream>>>(part, p.positions, p.inv_freq, p.tokens, p.half, p.eps);
      break;
    case 512:
      norm_rope_warp_kernel<16><<<blocks, 256, 0, stream>>>(part, p.positions, p.inv_freq, p.tokens, p.half, p.eps);
      break;
    default:
      norm_rope_warp_kernel<32><<<blocks, 256, 0, stream>>>(part, p.positions, p.inv_freq, p.tokens, p.half, p.eps);
      break;
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void run_hc_collapse_norm(const HcCollapseNormKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.d == 0) return;
  const int threads = rms_norm_threads(p.d);
  if (p.hc == 4 && p.d <= 16 * threads) {
    // kPer = 8 where it covers the row (d <= 4096 at 512 threads): the same operations (the values past d are skipped
    // either way) in 38 registers instead of 64, 3 blocks an SM instead of 2, so more of each SM's loads are in
    // flight while a block sums and stores (69% of the HBM rate at V4-Flash's 8192-token prefill with kPer = 16;
    // 1.22x with kPer = 8, H200).
    if (p.d <= 8 * threads)
      hc_collapse_norm_reg_kernel<4, 8><<<static_cast<unsigned>(p.tokens), threads, 0, stream>>>(p);
    else
      hc_collapse_norm_reg_kernel<4, 16><<<static_cast<unsigned>(p.tokens), threads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  hc_collapse_norm_kernel<<<static_cast<unsigned>(p.tokens), rms_norm_threads(p.d), 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_norm_rope(const NormRopeKernelParams& p, cudaStream_t stream) {
  // Parts the warp kernel takes run there; the others (if any) in one block-per-row launch.
  if (norm_rope_warp_takes(p, p.parts[0]) || norm_rope_warp_takes(p, p.parts[1])) {
    NormRopeKernelParams rest = p;
    for (NormRopeKernelPart& part : rest.parts) {
      if (!norm_rope_warp_takes(p, part)) continue;
      launch_norm_rope_warp(p, part, stream);
      part = NormRopeKernelPart{};
    }
    if (!rest.parts[0].x) std::swap(rest.parts[0], rest.parts[1]);
    if (rest.parts[0].x) run_norm_rope(rest, stream);
    return;
  }
  int64_t rows = 0;
  int threads = 128;
  for (const NormRopeKernelPart& part : p.parts) {
    if (!part.x) continue;
    DI_CHECK_INTERNAL(part.heads > 0 || p.tokens == 0) << "norm_rope: a part without heads";
    rows += p.tokens * part.heads;
    if (part.norm) threads = std::max(threads, rms_norm_threads(part.hd));
  }
  if (rows == 0) return;
  norm_rope_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
