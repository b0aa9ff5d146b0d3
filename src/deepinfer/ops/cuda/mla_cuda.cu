// MLA attention of the V3 family on the GPU, absorbed form (ops.h "MLA"): three kernels.
//   1. absorb: q̃_h = W_UK,hᵀ·q_nope,h, written beside q_pe as one [r + dr] query per (token, head);
//   2. attend in the latent space: logits = q̃·ĉ_s + q_pe·k_pe_s over the causally visible cache rows, fp32
//      online softmax, ō = Σ p·ĉ_s. One warp per (token, head, key split), 4 keys per step with independent
//      loads; splits merged in split order by a combine kernel (deterministic);
//   3. up-project: o_h = W_UV,h·ō_h, one warp per output channel.
// Correct-first (fp32 SIMT; kv_b is read once per token and head group): the tensor-core version that shares
// the cache rows across the 128 heads (FlashMLA-style) is the next step. Many queries (prefill) take the naive
// form on cuBLASLt's fp32 GEMMs instead (CudaBackend::mla_attention_naive) with the two kernels at the end here.
#include <algorithm>
#include <climits>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxRow = 640;  // r + dr (V3: 512 + 64); 20 floats per lane
constexpr int kPer = kMaxRow / 32;
constexpr int kKeys = 4;

// q_full[t, h] = [W_UK,hᵀ·q_nope (r) | q_pe (dr)]; block per (t, h), threads over the r latent channels.
__global__ void mla_absorb_kernel(MlaKernelParams p) {
  extern __shared__ float qs[];  // dn
  const int64_t th = blockIdx.x, h = th % p.heads;
  const float* q = p.q + th * (p.dn + p.dr);
  for (int64_t i = threadIdx.x; i < p.dn; i += blockDim.x) qs[i] = q[i];
  __syncthreads();
  const float* w_uk = p.kv_b + h * (p.dn + p.dv) * p.r;  // [dn, r]
  float* out = p.q_full + th * (p.r + p.dr);
  for (int64_t c = threadIdx.x; c < p.r; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < p.dn; ++i) acc = fmaf(qs[i], w_uk[i * p.r + c], acc);
    out[c] = acc;
  }
  for (int64_t i = threadIdx.x; i < p.dr; i += blockDim.x) out[p.r + i] = q[p.dn + i];
}

// Warp per (t, h, split): lane owns row channels lane + 32·e (e < kPer) of the [r + dr] key; the value is the
// first r of them.
__global__ void __launch_bounds__(128) mla_attend_kernel(MlaKernelParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t th = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (th >= p.tokens * p.heads) return;
  const int split = blockIdx.y;
  const int64_t t = th / p.heads, row = p.r + p.dr;
  const int64_t qpos = p.q_positions[t];
  float q[kPer], o[kPer];
  const float* qp = p.q_full + th * row;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t i = lane + 32 * e;
    q[e] = i < row ? qp[i] : 0.0f;
    o[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t begin = static_cast<int64_t>(split) * p.keys_per_split, end = min(p.s, begin + p.keys_per_split);
  int64_t s = begin;
  while (s < end) {
    // Up to 4 visible keys of this split, in order.
    int64_t idx[kKeys];
    int n = 0;
    for (; s < end && n < kKeys; ++s)
      if (p.kv_positions[s] <= qpos) idx[n++] = s;
    if (n == 0) break;
    float dot[kKeys];
#pragma unroll
    for (int c = 0; c < kKeys; ++c) {
      dot[c] = 0.0f;
      if (c < n) {
        const float* key = p.kv + idx[c] * row;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int64_t i = lane + 32 * e;
          if (i < row) dot[c] = fmaf(q[e], __ldg(key + i), dot[c]);
        }
      }
    }
    float mx = m, w[kKeys];
#pragma unroll
    for (int c = 0; c < kKeys; ++c) {
      dot[c] = warp_sum(dot[c]) * p.scale;
      if (c < n) mx = fmaxf(mx, dot[c]);
    }
    const float corr = expf(m - mx);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kKeys; ++c) {
      w[c] = c < n ? expf(dot[c] - mx) : 0.0f;
      sum += w[c];
    }
    l = l * corr + sum;
    m = mx;
#pragma unroll
    for (int e = 0; e < kPer; ++e) o[e] *= corr;
#pragma unroll
    for (int c = 0; c < kKeys; ++c) {
      if (c >= n) break;
      const float* val = p.kv + idx[c] * row;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int64_t i = lane + 32 * e;
        if (i < p.r) o[e] = fmaf(w[c], __ldg(val + i), o[e]);
      }
    }
  }
  const int64_t at = th * p.splits + split;
  float* po = p.part_o + at * p.r;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t i = lane + 32 * e;
    if (i < p.r) po[i] = o[e];
  }
  if (lane == 0) {
    p.part_m[at] = m;
    p.part_l[at] = l;
  }
}

// Block per (t, h): ō = Σ_s o_s·exp(m_s − M) / Σ_s l_s·exp(m_s − M) in split order (zero when nothing is
// visible), then o = W_UV,h·ō with one warp per output channel.
__global__ void mla_combine_project_kernel(MlaKernelParams p) {
  extern __shared__ float ol[];  // r
  const int64_t th = blockIdx.x, h = th % p.heads;
  const float* pm = p.part_m + th * p.splits;
  const float* pl = p.part_l + th * p.splits;
  float mx = -INFINITY;
  for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, pm[s]);
  float denom = 0.0f;
  if (mx > -INFINITY)
    for (int s = 0; s < p.splits; ++s) denom += pl[s] * expf(pm[s] - mx);
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  for (int64_t c = threadIdx.x; c < p.r; c += blockDim.x) {
    float acc = 0.0f;
    if (denom > 0.0f)
      for (int s = 0; s < p.splits; ++s) acc = fmaf(p.part_o[(th * p.splits + s) * p.r + c], expf(pm[s] - mx), acc);
    ol[c] = acc * inv;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const float* w_uv = p.kv_b + (h * (p.dn + p.dv) + p.dn) * p.r;  // [dv, r]
  for (int64_t j = warp; j < p.dv; j += warps) {
    float acc = 0.0f;
    for (int64_t c = lane; c < p.r; c += 32) acc = fmaf(w_uv[j * p.r + c], ol[c], acc);
    acc = warp_sum(acc);
    if (lane == 0) p.out[th * p.dv + j] = acc;
  }
}

__global__ void mla_max_position_kernel(const int64_t* q_positions, int64_t tokens, int64_t* out) {
  __shared__ long long red[32];
  long long m = LLONG_MIN;
  for (int64_t i = threadIdx.x; i < tokens; i += blockDim.x) m = max(m, static_cast<long long>(q_positions[i]));
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = max(m, red[w]);
    *out = m;
  }
}

// Element i of a row's dn + dr + dv: its key value (c < dn + dr), else its value, zeroed when no query sees the row.
__global__ void mla_keys_kernel(MlaKeysKernelParams p) {
  const int64_t qk = p.dn + p.dr, row = qk + p.dv, i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.s * p.heads * row) return;
  const int64_t c = i % row, sh = i / row, sk = sh / p.heads;
  if (c < qk) {
    p.keys[sh * qk + c] = c < p.dn ? p.kvx[sh * (p.dn + p.dv) + c] : p.kv[sk * (p.r + p.dr) + p.r + (c - p.dn)];
  } else if (p.kv_positions[sk] > *p.max_q_position) {
    p.kvx[sh * (p.dn + p.dv) + p.dn + (c - qk)] = 0.0f;
  }
}

// A block per row: the masked maximum, the exponentials and their sum (fp32, in key order per thread, then a tree), p.
__global__ void __launch_bounds__(256) mla_causal_softmax_kernel(MlaSoftmaxKernelParams p) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, t = row % p.tokens;
  float* x = p.logits + row * p.s;
  const int64_t qpos = p.q_positions[t];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  auto block_reduce = [&](float v, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
      const float u = __shfl_xor_sync(0xFFFFFFFFu, v, o);
      v = is_max ? fmaxf(v, u) : v + u;
    }
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[lane] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      const float u = __shfl_xor_sync(0xFFFFFFFFu, v, o);
      v = is_max ? fmaxf(v, u) : v + u;
    }
    return v;
  };
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < p.s; j += blockDim.x)
    if (p.kv_positions[j] <= qpos) mx = fmaxf(mx, x[j] * p.scale);
  mx = block_reduce(mx, true);
  // Each exponential once (0 where masked), kept in place for the normalisation.
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < p.s; j += blockDim.x) {
    const float e = p.kv_positions[j] <= qpos ? expf(x[j] * p.scale - mx) : 0.0f;
    x[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, false);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  if (p.p_hi) {
    __nv_bfloat16* hi = static_cast<__nv_bfloat16*>(p.p_hi) + row * p.ld_p;
    __nv_bfloat16* lo = static_cast<__nv_bfloat16*>(p.p_lo) + row * p.ld_p;
    for (int64_t j = threadIdx.x; j < p.s; j += blockDim.x) split_bf16(x[j] * inv, hi[j], lo[j]);
    return;
  }
  for (int64_t j = threadIdx.x; j < p.s; j += blockDim.x) x[j] *= inv;
}

__global__ void bf16_parts_kernel(Bf16PartsKernelParams p) {
  const int64_t n = p.rows * p.segs * p.len;
  __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.dst);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % p.len, rg = i / p.len, g = rg % p.segs, r = rg / p.segs;
    __nv_bfloat16 hi, lo;
    split_bf16(p.src[r * p.src_row + g * p.src_seg + e], hi, lo);
    __nv_bfloat16* out = dst + r * p.dst_row + g * p.dst_seg + e;
    for (int j = 0; j < p.parts; ++j) out[j * p.part_stride] = (p.lo_parts >> j) & 1u ? lo : hi;
  }
}

}  // namespace

void run_mla_max_position(const int64_t* q_positions, int64_t tokens, int64_t* out, cudaStream_t stream) {
  mla_max_position_kernel<<<1, 1024, 0, stream>>>(q_positions, tokens, out);
  DI_CUDA_CHECK_LAUNCH();
}

void run_mla_keys(const MlaKeysKernelParams& p, cudaStream_t stream) {
  const int64_t n = p.s * p.heads * (p.dn + p.dr + p.dv);
  if (n == 0) return;
  mla_keys_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_mla_causal_softmax(const MlaSoftmaxKernelParams& p, cudaStream_t stream) {
  const int64_t rows = p.heads * p.tokens;
  if (rows == 0 || p.s == 0) return;
  DI_CHECK(rows < (int64_t{1} << 31)) << "mla softmax: " << rows << " rows";
  mla_causal_softmax_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_bf16_parts(const Bf16PartsKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.parts == 2 || p.parts == 3) << "bf16_parts: " << p.parts << " parts";
  const int64_t n = p.rows * p.segs * p.len;
  if (n == 0) return;
  bf16_parts_kernel<<<grid_1d(std::min<int64_t>(n, int64_t{1} << 26), 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

int mla_splits(int64_t tokens, int64_t heads, int64_t s, int sm_count) {
  const int64_t blocks = std::max<int64_t>(1, ceil_div(tokens * heads, 4));
  const int64_t want = ceil_div(4ll * sm_count, blocks);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, ceil_div(s, 64), 64})));
}

void run_mla_attention(const MlaKernelParams& p, cudaStream_t stream) {
  DI_CHECK_CODE(p.r + p.dr <= kMaxRow, ErrorCode::kUnsupported)
      << "mla_attention: cache rows of " << p.r + p.dr << " values (> " << kMaxRow << ") on CUDA";
  const int64_t th = p.tokens * p.heads;
  if (th == 0) return;
  mla_absorb_kernel<<<static_cast<unsigned>(th), 256, p.dn * sizeof(float), stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  const dim3 grid(grid_1d(th * 32, 128), static_cast<unsigned>(p.splits));
  mla_attend_kernel<<<grid, 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  mla_combine_project_kernel<<<static_cast<unsigned>(th), 256, p.r * sizeof(float), stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
