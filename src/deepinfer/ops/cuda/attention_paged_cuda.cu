// Paged sink attention (PagedSinkAttentionParams): all sequences of a step in one launch, key rows read
// straight from the paged pools through the block tables (no gather copy).
//
// Work split (flash-decoding): a block is (head group, query token, key split). Its 4 warps each own 2 heads and
// walk the split's key slots (window positions, then the selected compressed entries) in groups of 32: each
// lane resolves one slot to a pool row (or nothing: out of the window, padding, a bad page), a ballot compacts
// the valid ones, and they are processed 4 at a time. Each key row is loaded once into registers (16-byte loads
// when hd % 128 == 0) and used for both heads; the 8 dot products of a 4-key group are finished with one
// reduce-scatter over the warp (9 shuffles instead of 40). fp32 throughout, online softmax per head.
// With one split the block applies the sink and writes the output; with several, each split writes its
// unnormalised partial (o, running max, sum) and a combine kernel merges them in split order (deterministic).
// bf16 pools (--kv-cache-dtype bf16) are read as such (8-byte loads at hd % 128 == 0) and widened exactly in
// registers: the f32 pools' arithmetic over the same values. So are V4.1's records (--kv-cache-dtype fp8: 4-byte
// loads of FP8 window codes, 2-byte loads of FP4 entry codes, and the blocks' scale bytes; SlotPools).
// Prefill-like calls take the tensor-core kernel instead (attention_paged_mma.h: when, and its A/B switch); the
// combine is shared.
#include <algorithm>
#include <cstdint>

#include "deepinfer/ops/cuda/attention_paged_mma.h"
#include "deepinfer/ops/cuda/attention_paged_slots.cuh"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kHeadsPerWarp = 2;
constexpr int kHeadsPerBlock = kWarps * kHeadsPerWarp;
constexpr int kKeysPerGroup = 4;
constexpr unsigned kFull = 0xffffffffu;

// Dims a lane owns: with kVec (hd % 128 == 0) element e is dim 4·lane + 128·(e/4) + e%4 (float4 loads);
// otherwise lane + 32·e. kPer = hd / 32 rounded up (at most 16). kPools: how a pool row reads (SlotPools).
template <int kPer, bool kVec, SlotPools kPools = SlotPools::kF32>
__device__ __forceinline__ void load_row(const void* __restrict__ row, int hd, int lane, float (&v)[kPer]) {
  if constexpr (kVec) {
#pragma unroll
    for (int j = 0; j < kPer / 4; ++j) {
      const float4 x = slot_load4<kPools>(row, lane + 32 * j, hd);
      v[4 * j] = x.x;
      v[4 * j + 1] = x.y;
      v[4 * j + 2] = x.z;
      v[4 * j + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int i = lane + 32 * e;
      v[e] = i < hd ? slot_load1<kPools>(row, i, hd) : 0.0f;
    }
  }
}

template <int kPer, bool kVec>
__device__ __forceinline__ void store_row(float* row, int hd, int lane, const float (&v)[kPer], float mul) {
  if constexpr (kVec) {
#pragma unroll
    for (int j = 0; j < kPer / 4; ++j)
      *reinterpret_cast<float4*>(row + 4 * lane + 128 * j) =
          make_float4(v[4 * j] * mul, v[4 * j + 1] * mul, v[4 * j + 2] * mul, v[4 * j + 3] * mul);
  } else {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int i = lane + 32 * e;
      if (i < hd) row[i] = v[e] * mul;
    }
  }
}

// kPrefetch: a warp loads the next 4-key group while it computes the current one (small grids only, see launch()).
// kPools: the pools' formats (slot_pools_of(p)).
template <int kPer, bool kVec, bool kPrefetch, SlotPools kPools>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(PagedSinkAttentionKernelParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.y;
  const int split = blockIdx.z;
  const int h0 = blockIdx.x * kHeadsPerBlock + warp * kHeadsPerWarp;
  if (h0 >= p.heads) return;  // whole warp: no block-level sync below
  const int hd = static_cast<int>(p.hd);

  // This query's key slots: window positions [lo, pos], then the comp_idx row.
  const PagedQuerySlots qs = paged_query_slots(p, t, split == 0 && warp == 0 && lane == 0);
  const int64_t n_slots = qs.n_slots;
  const int64_t begin = min(n_slots, static_cast<int64_t>(split) * p.slots_per_split);
  const int64_t end = min(n_slots, begin + p.slots_per_split);

  float q[kHeadsPerWarp][kPer], o[kHeadsPerWarp][kPer], m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int h = min(h0 + hh, static_cast<int>(p.heads) - 1);  // a missing second head duplicates the first
    load_row<kPer, kVec>(p.q + (t * p.heads + h) * p.hd, hd, lane, q[hh]);
#pragma unroll
    for (int e = 0; e < kPer; ++e) o[hh][e] = 0.0f;
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
  }

  for (int64_t base = begin; base < end; base += 32) {
    const int64_t slot = base + lane;
    const void* mine = nullptr;
    if (slot < end) mine = paged_slot_row(p, qs, t, slot);
    unsigned valid = __ballot_sync(kFull, mine != nullptr);
    // The next group: up to 4 valid rows of this batch, in slot order (nullptr past the valid ones).
    const auto take = [&](const void*(&rows)[kKeysPerGroup]) {
#pragma unroll
      for (int c = 0; c < kKeysPerGroup; ++c) {
        const int src = valid ? __ffs(valid) - 1 : 0;
        const unsigned long long ptr = __shfl_sync(kFull, reinterpret_cast<unsigned long long>(mine), src);
        rows[c] = valid ? reinterpret_cast<const void*>(ptr) : nullptr;
        valid &= valid - 1;
      }
    };
    const auto load = [&](const void* const(&rows)[kKeysPerGroup], float(&key)[kKeysPerGroup][kPer]) {
#pragma unroll
      for (int c = 0; c < kKeysPerGroup; ++c) {
        if (rows[c]) {
          load_row<kPer, kVec, kPools>(rows[c], hd, lane, key[c]);
        } else {
#pragma unroll
          for (int e = 0; e < kPer; ++e) key[c][e] = 0.0f;
        }
      }
    };
    // One group's dots, online softmax and accumulation.
    const auto group = [&](const void* const(&rows)[kKeysPerGroup], const float(&key)[kKeysPerGroup][kPer]) {
      // v[hh·4 + c]: this lane's part of q_hh · key_c.
      float v[kHeadsPerWarp * kKeysPerGroup];
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh)
#pragma unroll
        for (int c = 0; c < kKeysPerGroup; ++c) {
          float acc = 0.0f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) acc = fmaf(q[hh][e], key[c][e], acc);
          v[hh * kKeysPerGroup + c] = acc;
        }
      // Reduce-scatter: after it, lane L holds the full dot of index (L >> 2) & 7.
      {
        const bool hi4 = lane & 16, hi3 = lane & 8, hi2 = lane & 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float send = hi4 ? v[i] : v[i + 4], keep = hi4 ? v[i + 4] : v[i];
          v[i] = keep + __shfl_xor_sync(kFull, send, 16);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float send = hi3 ? v[i] : v[i + 2], keep = hi3 ? v[i + 2] : v[i];
          v[i] = keep + __shfl_xor_sync(kFull, send, 8);
        }
        const float send = hi2 ? v[0] : v[1], keep = hi2 ? v[1] : v[0];
        v[0] = keep + __shfl_xor_sync(kFull, send, 4);
        v[0] += __shfl_xor_sync(kFull, v[0], 2);
        v[0] += __shfl_xor_sync(kFull, v[0], 1);
      }
      const float mine_dot = v[0];
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
        float logit[kKeysPerGroup];
        float mx = m[hh];
#pragma unroll
        for (int c = 0; c < kKeysPerGroup; ++c) {
          logit[c] = __shfl_sync(kFull, mine_dot, (hh * kKeysPerGroup + c) * 4) * p.scale;
          if (rows[c]) mx = fmaxf(mx, logit[c]);
        }
        const float corr = expf(m[hh] - mx);  // m = −inf before the first key: 0
        float w[kKeysPerGroup], sum = 0.0f;
#pragma unroll
        for (int c = 0; c < kKeysPerGroup; ++c) {
          w[c] = rows[c] ? expf(logit[c] - mx) : 0.0f;
          sum += w[c];
        }
        l[hh] = l[hh] * corr + sum;
        m[hh] = mx;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          float acc = o[hh][e] * corr;
#pragma unroll
          for (int c = 0; c < kKeysPerGroup; ++c) acc = fmaf(w[c], key[c][e], acc);
          o[hh][e] = acc;
        }
      }
    };
    if constexpr (kPrefetch) {
      // The next group's rows are requested before this group is computed (the same groups and arithmetic: only the
      // loads move), so each group's load latency overlaps the previous group's arithmetic instead of following it.
      if (!valid) continue;
      const void* rows[kKeysPerGroup];
      float key[kKeysPerGroup][kPer];
      take(rows);
      load(rows, key);
      for (;;) {
        const bool more = valid != 0;
        const void* next_rows[kKeysPerGroup];
        float next_key[kKeysPerGroup][kPer];
        take(next_rows);  // all nullptr (nothing loaded) after the last group
        load(next_rows, next_key);
        group(rows, key);
        if (!more) break;
#pragma unroll
        for (int c = 0; c < kKeysPerGroup; ++c) {
          rows[c] = next_rows[c];
#pragma unroll
          for (int e = 0; e < kPer; ++e) key[c][e] = next_key[c][e];
        }
      }
    } else {
      while (valid) {
        const void* rows[kKeysPerGroup];
        take(rows);
        float key[kKeysPerGroup][kPer];
        load(rows, key);
        group(rows, key);
      }
    }
  }

#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int h = h0 + hh;
    if (h >= p.heads) break;
    const int64_t th = t * p.heads + h;
    if (p.splits == 1 && !p.always_combine) {
      // The sink joins the denominator only: out = Σ w·v / (Σ w + exp(sink − M)) with M = max(m, sink).
      const float sink = p.sinks[h], mx = fmaxf(m[hh], sink);
      const float denom = l[hh] * expf(m[hh] - mx) + expf(sink - mx);
      store_row<kPer, kVec>(p.out + th * p.hd, hd, lane, o[hh], expf(m[hh] - mx) / denom);
    } else {
      const int64_t at = th * p.splits + split;
      store_row<kPer, kVec>(p.part_o + at * p.hd, hd, lane, o[hh], 1.0f);
      if (lane == 0) {
        p.part_m[at] = m[hh];
        p.part_l[at] = l[hh];
      }
    }
  }
}

// One block per (token, head): merges the splits' partials in split order and applies the sink. Each split's
// factor expf(m_s - max) is evaluated once into shared memory (not once per output element and split: 18 µs a
// call at batch 1 on the H200, ncu), then every thread runs its elements' sums in split order as before.
__global__ void paged_attention_combine_kernel(PagedSinkAttentionKernelParams p) {
  extern __shared__ float factor[];  // [splits]
  __shared__ float inv_denom;
  const int64_t th = blockIdx.x;
  const int h = static_cast<int>(th % p.heads);
  const float* pm = p.part_m + th * p.splits;
  const float* pl = p.part_l + th * p.splits;
  const float sink = p.sinks[h];
  float mx = sink;
  for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, pm[s]);
  for (int s = threadIdx.x; s < p.splits; s += blockDim.x) factor[s] = expf(pm[s] - mx);
  __syncthreads();
  if (threadIdx.x == 0) {
    float denom = expf(sink - mx);
    for (int s = 0; s < p.splits; ++s) denom += pl[s] * factor[s];
    inv_denom = 1.0f / denom;
  }
  __syncthreads();
  const float inv = inv_denom;
  for (int64_t i = threadIdx.x; i < p.hd; i += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      // A split without keys adds exactly nothing (skipping it also keeps a −0 sum's sign): batch-invariant
      // mode merges a query's splits with the empty ones that a longer query of the call needed.
      if (pm[s] == -INFINITY) continue;
      acc = fmaf(p.part_o[(th * p.splits + s) * p.hd + i], factor[s], acc);
    }
    p.out[th * p.hd + i] = acc * inv;
  }
}

// paged_attention_combine_kernel with its serial parts spread: the split maximum over a warp (fmaxf is exact, so
// the order does not matter), each thread one float4 of the row (hd <= 1024), and a thread's partials loaded
// kCombineBatch splits at a time before they are summed (the loop above stored each output element between the
// loads of the next: a chain of dependent global round trips per thread, 14.6 µs a call at batch 1, ncu). The
// factors, the denominator (thread 0, split order) and every element's fmaf chain in split order are the ones
// above: the same bits.
// kCombineBatch: the splits a thread has in flight, the smallest of 2 / 8 / 16 / 32 that covers the call's splits (32
// float4 are 128 registers: at 32 for every call, batches 16 and 64 with their 7 / 2 splits ran 3-7% slower than the
// previous kernel for the lost occupancy, H200 bench).
constexpr int kCombineVecMaxThreads = 256;
template <int kCombineBatch>
__global__ void __launch_bounds__(kCombineVecMaxThreads)
    paged_attention_combine_vec_kernel(PagedSinkAttentionKernelParams p) {
  extern __shared__ float factor[];  // [splits] factors, then [splits] 1 / 0: the split has keys
  __shared__ float inv_denom, max_all;
  float* has_keys = factor + p.splits;
  const int64_t th = blockIdx.x;
  const int h = static_cast<int>(th % p.heads);
  const float* pm = p.part_m + th * p.splits;
  const float* pl = p.part_l + th * p.splits;
  const int64_t i = 4 * static_cast<int64_t>(threadIdx.x);
  const bool mine = i < p.hd;
  const float* src = p.part_o + th * p.splits * p.hd + i;
  // The first kCombineBatch splits' partials are requested before the factors are worked out (they do not depend
  // on them), so their latency overlaps the max / factor / denominator steps.
  float4 v[kCombineBatch];
  const auto load = [&](int s0) {
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j)
      v[j] = mine && s0 + j < p.splits ? __ldg(reinterpret_cast<const float4*>(src + (s0 + j) * p.hd))
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  load(0);
  const float sink = p.sinks[h];
  if (threadIdx.x < 32) {
    float mx = sink;
    for (int s = threadIdx.x; s < p.splits; s += 32) mx = fmaxf(mx, pm[s]);
    mx = warp_max(mx);
    if (threadIdx.x == 0) max_all = mx;
  }
  __syncthreads();
  const float mx = max_all;
  // A split without keys (m = −inf) gets factor 0 here and is skipped below, as above.
  for (int s = threadIdx.x; s < p.splits; s += blockDim.x) {
    factor[s] = expf(pm[s] - mx);
    has_keys[s] = pm[s] == -INFINITY ? 0.0f : 1.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float denom = expf(sink - mx);
    for (int s = 0; s < p.splits; ++s) denom += pl[s] * factor[s];
    inv_denom = 1.0f / denom;
  }
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = 0;;) {
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const int s = s0 + j;
      if (s >= p.splits) break;
      if (has_keys[s] == 0.0f) continue;
      const float f = factor[s];
      acc.x = fmaf(v[j].x, f, acc.x);
      acc.y = fmaf(v[j].y, f, acc.y);
      acc.z = fmaf(v[j].z, f, acc.z);
      acc.w = fmaf(v[j].w, f, acc.w);
    }
    s0 += kCombineBatch;
    if (s0 >= p.splits) break;
    load(s0);
  }
  __syncthreads();
  const float inv = inv_denom;
  if (mine)
    *reinterpret_cast<float4*>(p.out + th * p.hd + i) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

template <int kPer, bool kVec, SlotPools kPools>
void launch_pools(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(p.heads, kHeadsPerBlock)), static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>(p.splits));
  // The lookahead costs registers (240 against 161 at hd 512: 2 blocks an SM instead of 3), so it is taken only while
  // the grid fits in one wave of 2 blocks an SM (batch 1: 160 blocks); at batch 16 (896 blocks) it ran 4% slower.
  int device = 0, sms = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (blocks <= 2ll * sms)
    paged_attention_kernel<kPer, kVec, true, kPools><<<grid, kWarps * 32, 0, stream>>>(p);
  else
    paged_attention_kernel<kPer, kVec, false, kPools><<<grid, kWarps * 32, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

template <int kPer, bool kVec>
void launch(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  switch (slot_pools_of(p)) {
    case SlotPools::kF32:
      launch_pools<kPer, kVec, SlotPools::kF32>(p, stream);
      break;
    case SlotPools::kBf16:
      launch_pools<kPer, kVec, SlotPools::kBf16>(p, stream);
      break;
    case SlotPools::kRecords:
      launch_pools<kPer, kVec, SlotPools::kRecords>(p, stream);
      break;
  }
}

void launch_simt(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  switch (p.hd) {
    case 512:
      launch<16, true>(p, stream);
      break;
    case 256:
      launch<8, true>(p, stream);
      break;
    case 128:
      launch<4, true>(p, stream);
      break;
    default:
      if (p.hd <= 64)
        launch<2, false>(p, stream);
      else
        launch<16, false>(p, stream);
  }
}

}  // namespace

int paged_attention_splits(int64_t tokens, int64_t heads, int64_t max_slots, int sm_count) {
  // Enough blocks for ~3 per SM in two waves; a split keeps at least 32 slots (one slot group of a warp). It was 64:
  // at batch 1 (V4.1: 64 heads, 128 + 512 slots) that gave 10 splits, 80 blocks on 132 SMs, each warp walking 16
  // dependent 4-key loads (24.5 µs a call, ncu).
  const int64_t blocks = std::max<int64_t>(1, tokens * ceil_div(heads, kHeadsPerBlock));
  const int64_t want = ceil_div(6ll * sm_count, blocks);
  const int64_t min_slots = 32;
  const int64_t most = std::max<int64_t>(1, ceil_div(max_slots, min_slots));
  return static_cast<int>(std::max<int64_t>(1, std::min({want, most, int64_t{64}})));
}

void run_paged_sink_attention(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  DI_CHECK_CODE(p.hd <= 512 && p.hd % 32 == 0, ErrorCode::kUnsupported)
      << "paged_sink_attention: head dim " << p.hd << " must be a multiple of 32 and <= 512 on CUDA";
  DI_CHECK_INTERNAL(p.splits >= 1 && ((p.splits == 1 && !p.always_combine) || (p.part_o && p.part_m && p.part_l)))
      << "paged_sink_attention: " << p.splits << " splits without partial buffers";
  if (p.tokens * p.heads == 0) return;
  if (paged_attention_use_mma(p)) {
    launch_paged_attention_mma(p, stream);
  } else {
    launch_simt(p, stream);
  }
  if (p.splits > 1 || p.always_combine) {
    const size_t smem = sizeof(float) * static_cast<size_t>(p.splits);
    DI_CHECK_CODE(smem <= 48 * 1024, ErrorCode::kUnsupported)
        << "paged_sink_attention: " << p.splits << " splits to combine (at most " << 48 * 1024 / sizeof(float) << ")";
    const bool aligned = (reinterpret_cast<uintptr_t>(p.out) | reinterpret_cast<uintptr_t>(p.part_o)) % 16 == 0;
    if (p.hd % 4 == 0 && p.hd <= 4 * kCombineVecMaxThreads && 2 * smem <= 48 * 1024 && aligned) {
      const int threads = static_cast<int>(std::max<int64_t>(32, ceil_div(p.hd / 4, 32) * 32));
      const unsigned blocks = static_cast<unsigned>(p.tokens * p.heads);
      if (p.splits <= 2)
        paged_attention_combine_vec_kernel<2><<<blocks, threads, 2 * smem, stream>>>(p);
      else if (p.splits <= 8)
        paged_attention_combine_vec_kernel<8><<<blocks, threads, 2 * smem, stream>>>(p);
      else if (p.splits <= 16)
        paged_attention_combine_vec_kernel<16><<<blocks, threads, 2 * smem, stream>>>(p);
      else
        paged_attention_combine_vec_kernel<32><<<blocks, threads, 2 * smem, stream>>>(p);
    } else {
      paged_attention_combine_kernel<<<static_cast<unsigned>(p.tokens * p.heads), 128, smem, stream>>>(p);
    }
    DI_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace deepinfer::cuda
