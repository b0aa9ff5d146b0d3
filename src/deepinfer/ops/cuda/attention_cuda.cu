// Sink attention (shared K = V head, sliding window + masked compressed entries, a per-head sink logit in
// the denominator only). Correct-first version: one warp per (token, head) streams its visible keys with an
// online softmax in fp32; invisible window slots and masked compressed entries are skipped without being
// read, so unused cache slots may hold anything (the tests poison them with NaN).
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxHeadDim = 512;
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr int kWarps = 4;

__global__ void __launch_bounds__(kWarps * 32) sink_attention_kernel(SinkAttentionKernelParams p) {
  const int64_t wid = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= p.tokens * p.heads) return;
  const int64_t t = wid / p.heads, h = wid % p.heads;
  const int hd = static_cast<int>(p.hd);
  float q[kPerLane], o[kPerLane];
  const float* qp = p.q + wid * p.hd;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    q[j] = i < hd ? qp[i] : 0.0f;
    o[j] = 0.0f;
  }
  // The running max starts at the sink logit: the sink joins the denominator (exp(sink − m)) only.
  const float sink = p.sinks[h];
  float m = sink, l = 1.0f;
  auto visit = [&](const float* key) {
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < hd) dot = fmaf(q[j], key[i], dot);
    }
    const float logit = warp_sum(dot) * p.scale;
    const float m_new = fmaxf(m, logit);
    const float corr = expf(m - m_new), w = expf(logit - m_new);
    l = l * corr + w;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < hd) o[j] = fmaf(w, key[i], o[j] * corr);
    }
    m = m_new;
  };
  const int64_t qpos = p.q_positions[t];
  for (int64_t s = 0; s < p.s; ++s) {
    const int64_t kp = p.kv_positions[s];
    if (kp <= qpos && kp > qpos - p.window) visit(p.window_kv + s * p.hd);
  }
  for (int64_t e = 0; e < p.n_comp; ++e)
    if (!p.comp_mask || p.comp_mask[t * p.n_comp + e]) visit(p.compressed + e * p.hd);
  const float inv = 1.0f / l;
  float* out = p.out + wid * p.hd;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < hd) out[i] = o[j] * inv;
  }
}

}  // namespace

void run_sink_attention(const SinkAttentionKernelParams& p, cudaStream_t stream) {
  DI_CHECK_CODE(p.hd <= kMaxHeadDim, ErrorCode::kUnsupported)
      << "sink_attention: head dim " << p.hd << " > " << kMaxHeadDim << " on CUDA";
  if (p.tokens * p.heads == 0) return;
  sink_attention_kernel<<<grid_1d(p.tokens * p.heads * 32, kWarps * 32), kWarps * 32, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
