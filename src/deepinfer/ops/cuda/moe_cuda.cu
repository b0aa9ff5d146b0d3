// Router selection and the MoE glue kernels: the expert grouping plan (a counting sort of the T·k slots by
// expert), the clamped SwiGLU between the two grouped GEMMs (gemm_cuda.cu), and the combine that sums the
// routed outputs in expert-id order (the CPU op's order, and deterministic: no atomics on outputs).
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/swiglu_bf16.h"
#include "deepinfer/ops/cuda/topk.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kRouterThreads = 128;
constexpr int kMaxTopK = 32;
constexpr int kMaxGroups = 64;

__device__ __forceinline__ float router_score(RouterScoring s, float x) {
  switch (s) {
    case RouterScoring::kSigmoid:
      return 1.0f / (1.0f + expf(-x));
    case RouterScoring::kSqrtSoftplus:
      return sqrtf(x > 20.0f ? x : log1pf(expf(x)));  // torch softplus threshold
    case RouterScoring::kSoftmax:
      return x;
  }
  return x;
}

// One block per token; scores and the biased selection keys live in dynamic shared memory [2·E].
// kPrefetch (E <= kRouterPrefetch · kRouterThreads): a thread loads its logits and bias values together first, so the
// bias loads do not wait for the scores' shared-memory stores (two dependent global round trips before: the loads
// of the bias loop could not be moved above the stores of the scores loop). The same values: the same bits.
constexpr int kRouterPrefetch = 4;
template <bool kPrefetch>
__global__ void __launch_bounds__(kRouterThreads) router_select_kernel(RouterSelectKernelParams p) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  __shared__ int picked[kMaxTopK];
  float* scores = sm;
  float* biased = sm + p.experts;
  const int64_t t = blockIdx.x, e_count = p.experts, k = p.k;
  const float* logits = p.logits + t * e_count;
  float bias_of[kRouterPrefetch];
  if constexpr (kPrefetch) {
    float logit_of[kRouterPrefetch];
#pragma unroll
    for (int j = 0; j < kRouterPrefetch; ++j) {
      const int64_t e = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      logit_of[j] = e < e_count ? __ldg(logits + e) : 0.0f;
      bias_of[j] = p.bias && e < e_count ? __ldg(p.bias + e) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kRouterPrefetch; ++j) {
      const int64_t e = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (e < e_count) scores[e] = router_score(p.scoring, logit_of[j] / p.gate_temp);
    }
  } else {
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x)
      scores[e] = router_score(p.scoring, logits[e] / p.gate_temp);
  }
  if (p.scoring == RouterScoring::kSoftmax) {
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x) mx = fmaxf(mx, scores[e]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x) sum += expf(scores[e] - mx);
    sum = block_sum(sum, red);
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x) scores[e] = expf(scores[e] - mx) / sum;
  }
  if constexpr (kPrefetch) {
#pragma unroll
    for (int j = 0; j < kRouterPrefetch; ++j) {
      const int64_t e = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (e < e_count) biased[e] = scores[e] + (p.bias ? bias_of[j] : 0.0f);
    }
  } else {
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x) biased[e] = scores[e] + (p.bias ? p.bias[e] : 0.0f);
  }
  __syncthreads();
  if (p.n_group > 1 && !p.hash_table) {
    // Group-limited routing (the CPU op's mask_dropped_groups): a group scores its top-2 sum (kTop2Sum) or its
    // max (kMax); experts outside the topk_group best groups get −inf. Groups are few (8 for V3), so one thread
    // per group scores and thread 0 ranks them, ties to the lower group index.
    __shared__ float group_score[kMaxGroups];
    const int64_t per_group = e_count / p.n_group;
    for (int g = threadIdx.x; g < p.n_group; g += blockDim.x) {
      const float* s = biased + g * per_group;
      float first = -INFINITY, second = -INFINITY;
      for (int64_t i = 0; i < per_group; ++i) {
        if (s[i] > first) {
          second = first;
          first = s[i];
        } else if (s[i] > second) {
          second = s[i];
        }
      }
      group_score[g] = p.group_score == GroupScore::kMax ? first : first + second;
    }
    __syncthreads();
    __shared__ bool keep[kMaxGroups];
    if (threadIdx.x == 0) {
      for (int g = 0; g < p.n_group; ++g) keep[g] = false;
      for (int j = 0; j < p.topk_group; ++j) {
        int best = -1;
        for (int g = 0; g < p.n_group; ++g)
          if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
        keep[best] = true;
      }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x)
      if (!keep[e / per_group]) biased[e] = -INFINITY;
    __syncthreads();
  }
  if (p.hash_table) {
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      const int64_t tok = p.token_ids[t];
      const bool ok = tok >= 0 && tok < p.hash_rows;
      if (!ok && j == 0) atomicOr(p.status, kStatusRouterHashRange);
      int64_t id = 0;
      if (ok)
        id = p.hash_i64 ? static_cast<const int64_t*>(p.hash_table)[tok * k + j]
                        : static_cast<const int32_t*>(p.hash_table)[tok * k + j];
      if (id < 0 || id >= e_count) {
        atomicOr(p.status, kStatusExpertIdRange);
        id = 0;
      }
      picked[j] = static_cast<int>(id);
    }
  } else {
    // The selection runs on order-preserving integer keys (topk.cuh's float_key: −0 keyed as +0, so the
    // CPU's equal scores stay equal), written over the biased scores in place by the thread that computed them.
    uint32_t* keys = reinterpret_cast<uint32_t*>(biased);
    for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x) keys[e] = float_key(biased[e]);
    __syncthreads();
    if (threadIdx.x < 32) {
      // k rounds of a warp argmax; ties go to the lower expert id, as the CPU op's partial_sort. Lane l owns
      // experts l, l + 32, ...: it scans them for its best untaken key (in index order, so its own ties keep
      // the lower id), one warp max finds the best key and one warp min the lowest id holding it. The owner
      // lane then zeroes the winner's key, which no real score maps to (−inf is 0x007fffff), so only that lane
      // reads and writes the slot and no handoff between lanes goes through shared memory.
      const int lane = threadIdx.x;
      for (int64_t j = 0; j < k; ++j) {
        uint32_t best = 0, best_i = 0xffffffffu;
        for (int64_t e = lane; e < e_count; e += 32) {
          const uint32_t key = keys[e];
          if (key > best) {
            best = key;
            best_i = static_cast<uint32_t>(e);
          }
        }
        const uint32_t top = __reduce_max_sync(0xffffffffu, best);
        const uint32_t win = __reduce_min_sync(0xffffffffu, best == top ? best_i : 0xffffffffu);
        if (static_cast<int64_t>(win % 32) == lane) keys[win] = 0;
        if (lane == 0) picked[j] = static_cast<int>(win);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The CPU op's arithmetic: the sum in pick order, then one division per weight.
    float* w = p.weights + t * k;
    int32_t* idx = p.indices + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      idx[j] = picked[j];
      sum += (w[j] = scores[picked[j]]);
    }
    for (int64_t j = 0; j < k; ++j) w[j] = (p.normalize ? w[j] / (sum + 1e-20f) : w[j]) * p.route_scale;
  }
}

// Inclusive sum over the block of kN counters at once (blockDim.x a multiple of 32); `carry` (in shared memory,
// updated by the call) holds the totals of the earlier chunks, `sums` 32 × kN words. Contains __syncthreads: call
// from all threads.
template <int kN>
__device__ __forceinline__ void block_scan(int (&v)[kN], int* carry, int* sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int q = 0; q < kN; ++q)
    for (int o = 1; o < 32; o <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, v[q], o);
      if (lane >= o) v[q] += up;
    }
  if (lane == 31)
    for (int q = 0; q < kN; ++q) sums[warp * kN + q] = v[q];
  __syncthreads();
  int add[kN];
  for (int q = 0; q < kN; ++q) add[q] = carry[q];
  for (int w = 0; w < warp; ++w)
    for (int q = 0; q < kN; ++q) add[q] += sums[w * kN + q];
  for (int q = 0; q < kN; ++q) v[q] += add[q];
  __syncthreads();  // every thread has read carry and sums
  if (threadIdx.x == blockDim.x - 1)
    for (int q = 0; q < kN; ++q) carry[q] = v[q];
  __syncthreads();
}

// Single block: counts per expert (shared atomics), one block-wide scan of (rows, tiles, non-empty experts)
// over the experts, then a scatter with per-expert cursors. The scan replaces a serial walk by one thread over
// all E experts (384 for V4.1), whose dependent shared-memory loads made it the kernel's latency. The order of
// slots inside an expert's group is arbitrary, which is harmless: every gathered row is computed independently
// and written to its own slot.
__global__ void __launch_bounds__(1024) moe_plan_kernel(MoePlanKernelParams p) {
  extern __shared__ int counts[];  // [experts] counts, then [experts] cursors
  __shared__ int carry[4], sums[32 * 4];
  int* cursor = counts + p.experts;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) counts[e] = 0;
  if (threadIdx.x < 4) carry[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < p.slots; s += blockDim.x) {
    const int e = p.indices[s];
    if (e < 0 || e >= p.experts)
      atomicOr(p.status, kStatusExpertIdRange);
    else
      atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  const int pr = p.active_passes ? p.pass_rows : 1;
  for (int base = 0; base < p.experts; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int c = e < p.experts ? counts[e] : 0, passes = (c + pr - 1) / pr;
    int v[4] = {c, (c + kGemmTileM - 1) / kGemmTileM, c > 0 ? 1 : 0, passes};
    block_scan<4>(v, carry, sums);
    if (e < p.experts) {
      const int rows = v[0] - c;  // exclusive
      p.group_offsets[e] = rows;
      p.tile_offsets[e] = v[1] - (c + kGemmTileM - 1) / kGemmTileM;
      cursor[e] = rows;
      if (c > 0 && p.active_groups) p.active_groups[v[2] - 1] = e;
      if (p.active_passes)
        for (int q = 0; q < passes; ++q) p.active_passes[v[3] - passes + q] = e | (q << 16);
    }
  }
  if (threadIdx.x == 0) {
    p.group_offsets[p.experts] = carry[0];
    p.tile_offsets[p.experts] = carry[1];
    if (p.active_groups) p.active_groups[p.experts] = carry[2];
    if (p.active_passes) p.active_passes[p.pass_capacity] = carry[3];
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < p.slots; s += blockDim.x) {
    const int e = p.indices[s];
    if (e >= 0 && e < p.experts) p.perm[atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(s);
  }
}

// One SwiGLU output before the row weight (shared by both kernels: the same operations, so the same bits).
__device__ __forceinline__ float swiglu_one(const SwigluKernelParams& p, float g, float u) {
  if (p.limit > 0) {
    u = fminf(fmaxf(u, -p.limit), p.limit);
    g = fminf(g, p.limit);
  }
  return (g / (1.0f + expf(-g))) * u;
}
__device__ __forceinline__ float swiglu_row_weight(const SwigluKernelParams& p, int64_t r) {
  return p.weights[p.weight_rows ? p.weight_rows[r] : r];
}

__global__ void swiglu_kernel(SwigluKernelParams p) {
  const int64_t rows = p.rows_used ? *p.rows_used : p.rows;
  const int64_t total = rows * p.inter;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / p.inter, i = idx % p.inter;
    float h = swiglu_one(p, p.gu[r * 2 * p.inter + i], p.gu[r * 2 * p.inter + p.inter + i]);
    if (p.weights) h *= swiglu_row_weight(p, r);
    p.h[idx] = h;
  }
}

// swiglu_kernel with 4 outputs a thread (inter % 4 == 0; gu and h 16-byte, h16 8-byte aligned) and the bf16 copy
// written next to h.
__global__ void swiglu_bf16_kernel(SwigluKernelParams p, __nv_bfloat16* h16) {
  const int64_t rows = p.rows_used ? *p.rows_used : p.rows;
  const int64_t total = rows * p.inter / 4;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = 4 * idx / p.inter, i = 4 * idx % p.inter;
    const float4 g = *reinterpret_cast<const float4*>(p.gu + r * 2 * p.inter + i);
    const float4 u = *reinterpret_cast<const float4*>(p.gu + r * 2 * p.inter + p.inter + i);
    const float wt = p.weights ? swiglu_row_weight(p, r) : 1.0f;  // one load for the four, in flight with gu's
    float4 h;
    h.x = swiglu_one(p, g.x, u.x);
    h.y = swiglu_one(p, g.y, u.y);
    h.z = swiglu_one(p, g.z, u.z);
    h.w = swiglu_one(p, g.w, u.w);
    if (p.weights) {
      h.x *= wt;
      h.y *= wt;
      h.z *= wt;
      h.w *= wt;
    }
    reinterpret_cast<float4*>(p.h)[idx] = h;
    __align__(8) __nv_bfloat162 o[2];
    o[0].x = __float2bfloat16_rn(h.x);
    o[0].y = __float2bfloat16_rn(h.y);
    o[1].x = __float2bfloat16_rn(h.z);
    o[1].y = __float2bfloat16_rn(h.w);
    reinterpret_cast<uint2*>(h16)[idx] = *reinterpret_cast<const uint2*>(o);
  }
}

// Block (x = token, y = a span of kCombineSpan outputs): thread 0 orders the token's slots once (the per-output
// selection walk of the previous kernel, k² compares and 64-bit index math for every one of the d outputs, made it
// compute-bound: 440 us for 3.9k tokens x 4096 on the H200), then the threads sum over the span in that order.
constexpr int kCombineThreads = 256, kCombineSpan = 4 * kCombineThreads;
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(MoeCombineKernelParams p) {
  __shared__ int order[kMaxTopK];
  __shared__ int count;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    // Expert-id order with a selection walk: k is small, and ties (hash routing may repeat an expert) keep slot
    // order; ids outside [0, experts) are reported by the plan and their slots hold nothing.
    const int32_t* ids = p.indices + t * p.k;
    int last_id = -1, n_used = 0;
    int64_t last_slot = -1;
    for (int64_t n = 0; n < p.k; ++n) {
      int best_id = 0x7fffffff;
      int64_t best_slot = -1;
      for (int64_t j = 0; j < p.k; ++j) {
        const int id = ids[j];
        const bool after = id > last_id || (id == last_id && j > last_slot);
        if (after && (id < best_id || (id == best_id && j < best_slot))) {
          best_id = id;
          best_slot = j;
        }
      }
      if (best_slot < 0) break;
      last_id = best_id;
      last_slot = best_slot;
      if (best_id >= 0 && best_id < p.experts) order[n_used++] = static_cast<int>(best_slot);
    }
    count = n_used;
  }
  __syncthreads();
  const int64_t end = min(p.d, static_cast<int64_t>(blockIdx.y + 1) * kCombineSpan);
  const float* y = p.y_slot + t * p.k * p.d;
  const float* w = p.weights ? p.weights + t * p.k : nullptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * kCombineSpan + threadIdx.x; i < end; i += kCombineThreads) {
    float acc = 0.0f;
    for (int n = 0; n < count; ++n) {
      const int slot = order[n];
      const float v = y[slot * p.d + i];
      acc += w ? v * w[slot] : v;
    }
    if (p.shared) acc += p.shared[t * p.d + i];
    p.out[t * p.d + i] = acc;
  }
}

// moe_combine_kernel for decode-sized calls: block (token, 256 outputs), one output a thread (5 blocks of 4 serial
// outputs each at batch 1, D = 5120: 11.8 µs a call, ncu). The token's order is found in parallel: slot j's place is
// the number of valid slots with a smaller (expert id, slot) — the selection walk's order — and each thread issues
// all its loads first, in slot order, into shared memory, then sums them in that order. The sum is
// moe_combine_kernel's, term for term: fmaf(v, w, acc) with weights (the contraction nvcc makes of `acc += v * w`),
// `acc + v` without, then + shared: the same bits.
constexpr int kCombineSmallThreads = 256;
// Up to 16 tokens: faster there on the H200 (batch 1: 2.68 against 7.66 µs, batch 16: 4.14 against 7.82 µs; a CUDA
// graph of 20 calls, DecodeSmallOpTimings), slower at 64 (10.7 against 8.2 µs: 1280 blocks, each with its own
// ranking and 33 KB of shared memory, against the previous kernel's 320).
constexpr int64_t kCombineSmallMaxTokens = 16;
__global__ void __launch_bounds__(kCombineSmallThreads) moe_combine_small_kernel(MoeCombineKernelParams p) {
  __shared__ int ids[kMaxTopK], order[kMaxTopK];
  __shared__ float wsorted[kMaxTopK];
  __shared__ float vals[kMaxTopK][kCombineSmallThreads];  // this thread's output of every slot, in slot order
  __shared__ int count;
  const int64_t t = blockIdx.x;
  const int k = static_cast<int>(p.k);
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kCombineSmallThreads + threadIdx.x;
  const bool mine = i < p.d;
  // Every slot's value of this output is requested first (slot order; the sum order is only known after the ids):
  // the loads overlap the ids' round trip and the ranking.
  const float* y = p.y_slot + t * p.k * p.d + i;
  float v[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) v[j] = mine && j < k ? __ldg(y + j * p.d) : 0.0f;
  const float sh = mine && p.shared ? __ldg(p.shared + t * p.d + i) : 0.0f;
  if (threadIdx.x < k) ids[threadIdx.x] = p.indices[t * k + threadIdx.x];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j)
    if (j < k) vals[j][threadIdx.x] = v[j];
  __syncthreads();
  if (threadIdx.x < 32) {
    const int j = threadIdx.x;
    const int id = j < k ? ids[j] : -1;
    const bool valid = j < k && id >= 0 && id < p.experts;
    int place = 0;
    for (int j2 = 0; j2 < k; ++j2) {
      const int other = ids[j2];
      const bool before = other >= 0 && other < p.experts && (other < id || (other == id && j2 < j));
      place += before ? 1 : 0;
    }
    if (valid) {
      order[place] = j;
      wsorted[place] = p.weights ? p.weights[t * k + j] : 1.0f;
    }
    const unsigned n_valid = __popc(__ballot_sync(0xffffffffu, valid));
    if (j == 0) count = static_cast<int>(n_valid);
  }
  __syncthreads();
  if (!mine) return;
  const int n_used = count;
  float acc = 0.0f;
  if (p.weights) {
#pragma unroll
    for (int n = 0; n < kMaxTopK; ++n)
      if (n < n_used) acc = fmaf(vals[order[n]][threadIdx.x], wsorted[n], acc);
  } else {
#pragma unroll
    for (int n = 0; n < kMaxTopK; ++n)
      if (n < n_used) acc = acc + vals[order[n]][threadIdx.x];
  }
  if (p.shared) acc += sh;
  p.out[t * p.d + i] = acc;
}

}  // namespace

void run_router_select(const RouterSelectKernelParams& p, cudaStream_t stream) {
  DI_CHECK_CODE(p.k <= kMaxTopK, ErrorCode::kUnsupported) << "router: top-k " << p.k << " > " << kMaxTopK;
  DI_CHECK_CODE(p.n_group <= kMaxGroups, ErrorCode::kUnsupported)
      << "router: n_group " << p.n_group << " > " << kMaxGroups;
  if (p.tokens == 0) return;
  const size_t smem = sizeof(float) * 2 * static_cast<size_t>(p.experts);
  DI_CHECK_CODE(smem <= 48 * 1024, ErrorCode::kUnsupported) << "router: " << p.experts << " experts";
  if (p.experts <= kRouterPrefetch * kRouterThreads)
    router_select_kernel<true><<<static_cast<unsigned>(p.tokens), kRouterThreads, smem, stream>>>(p);
  else
    router_select_kernel<false><<<static_cast<unsigned>(p.tokens), kRouterThreads, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_moe_plan(const MoePlanKernelParams& p, cudaStream_t stream) {
  const size_t smem = sizeof(int) * 2 * static_cast<size_t>(p.experts);
  DI_CHECK_CODE(smem <= 48 * 1024, ErrorCode::kUnsupported) << "moe: " << p.experts << " experts";
  DI_CHECK(!p.active_passes || (p.pass_rows >= 1 && p.experts <= 65536 &&
                                p.pass_capacity >= moe_pass_capacity(p.slots, p.experts, p.pass_rows)))
      << "moe_plan: pass table of " << p.pass_capacity << " entries for " << p.slots << " slots";
  moe_plan_kernel<<<1, 1024, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_swiglu(const SwigluKernelParams& p, cudaStream_t stream) {
  if (p.rows * p.inter == 0) return;
  swiglu_kernel<<<grid_1d(p.rows * p.inter, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_swiglu_bf16(const SwigluKernelParams& p, void* h16, cudaStream_t stream) {
  const auto aligned = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  if (p.inter % 4 != 0 || !aligned(p.gu, 16) || !aligned(p.h, 16) || !aligned(h16, 8)) {
    run_swiglu(p, stream);
    run_cast_f32_to_bf16(p.h, h16, p.rows * p.inter, stream);
    return;
  }
  if (p.rows * p.inter == 0) return;
  swiglu_bf16_kernel<<<grid_1d(p.rows * p.inter / 4, 256), 256, 0, stream>>>(p, static_cast<__nv_bfloat16*>(h16));
  DI_CUDA_CHECK_LAUNCH();
}

void run_moe_combine(const MoeCombineKernelParams& p, cudaStream_t stream) {
  if (p.tokens * p.d == 0) return;
  DI_CHECK_CODE(p.k <= kMaxTopK, ErrorCode::kUnsupported) << "moe combine: top-k " << p.k << " > " << kMaxTopK;
  if (p.tokens <= kCombineSmallMaxTokens) {
    const int64_t blocks = ceil_div(p.d, kCombineSmallThreads);
    DI_CHECK(blocks <= 65535) << "moe combine: d = " << p.d << " is too large for one launch";
    moe_combine_small_kernel<<<dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(blocks)),
                               kCombineSmallThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t spans = ceil_div(p.d, kCombineSpan);
  DI_CHECK(spans <= 65535) << "moe combine: d = " << p.d << " is too large for one launch";
  moe_combine_kernel<<<dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(spans)), kCombineThreads, 0,
                       stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
