// Sampling on the device: the CPU Sampler's processor chain from the token mask on (mask → temperature →
// top-k → top-p → min-p, sampling/logits_processors.h) and its inverse-CDF draw with the same counter-based
// Philox uniform (sampling/rng.h), so a seeded row gives the CPU's token whenever the logits agree.
//
// One block per row, no scratch memory. Every filter is a threshold on one total order of the tokens: the key
// (logit bits made monotone, ~id), higher = better, which is exactly the CPU's "descending logit, lower id first
// on ties". top-k keeps keys >= the k-th largest key and top-p keeps keys >= the key of the token whose
// cumulative probability (in that order) first reaches top_p; both thresholds are found by a 64-step binary
// search over the key bits, each step one pass over the row with a fixed-order block reduction, so the result
// does not depend on scheduling (no atomics). Masses are summed in double as on the CPU, in another order: a
// decision can differ from the CPU's only when a cumulative mass lies within rounding (~1e-16 relative) of
// its threshold. Correct first: 64 passes per filter is slow for a 129k vocabulary (a radix select would do 8).
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// rng_uniform() of sampling/rng.cc: Philox4x32-10 keyed by the seed, counter (position, draw 0, stream).
__device__ double philox_uniform(uint64_t seed, uint64_t stream, uint64_t position) {
  uint32_t c0 = static_cast<uint32_t>(position), c1 = 0, c2 = static_cast<uint32_t>(stream),
           c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const uint64_t bits = (static_cast<uint64_t>(c0) << 32 | c1) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

// The order key of token i with (processed) logit x: monotone logit bits above, ~i below. -0 is +0 (the CPU
// compares floats, so they tie). Never 0 for a non-NaN x, so 0 can mean "no token".
__device__ __forceinline__ uint64_t order_key(float x, int64_t i) {
  uint32_t b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0;
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return static_cast<uint64_t>(b) << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ int64_t key_token(uint64_t key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key); }

// Fixed-order block reductions (warp xor tree, then warp 0 over the per-warp values); every thread gets the
// result. `smem` holds kWarps values; each call starts with a barrier so consecutive calls may share it.
template <typename T, typename Op>
__device__ T block_reduce(T v, T* smem, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  T r = smem[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, smem[w]);
  return r;
}

struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

struct Row {
  const float* logits;
  const uint32_t* allowed;
  int64_t vocab;
  bool scale;  // temperature processor enabled
  float inv_temperature;
  // The logit after the mask and the temperature, as TokenMaskProcessor and TemperatureProcessor leave it.
  __device__ float x(int64_t i) const {
    if (allowed && !((allowed[i >> 5] >> (i & 31)) & 1u)) return -INFINITY;
    const float v = logits[i];
    return scale && v != -INFINITY ? v * inv_temperature : v;
  }
};

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleKernelParams p) {
  __shared__ unsigned long long red_u[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ float red_f[kWarps];
  __shared__ double chunk_sum[kThreads];
  __shared__ int chosen;
  const int64_t row = blockIdx.x, V = p.vocab, tid = threadIdx.x;
  const float temperature = p.temperature[row];
  Row r{p.logits + row * V, p.allowed ? p.allowed + row * p.mask_words : nullptr, V,
        temperature > 0.0f && temperature != 1.0f, 1.0f / temperature};
  const uint64_t* rng = p.rng + row * 3;
  const bool position_ok = rng[2] < (1ull << 32);

  // Rows the CPU would not sample: non-finite logits (StepExecutor's kNonFinite), nothing allowed.
  unsigned long long bad = 0, any = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float v = r.logits[i];
    bad |= (isnan(v) || v == INFINITY) ? 1ull : 0ull;
    any |= (!r.allowed || ((r.allowed[i >> 5] >> (i & 31)) & 1u)) ? 1ull : 0ull;
  }
  bad = block_reduce(bad, red_u, Max{});
  any = block_reduce(any, red_u, Max{});
  if (!position_ok || bad || !any) {
    if (tid == 0) {
      p.out[row] = -1;
      if (!position_ok) atomicOr(p.status, kStatusSampleRange);
    }
    return;
  }

  if (temperature == 0.0f) {  // greedy: argmax after the mask, lowest id on ties
    unsigned long long best = 0;
    for (int64_t i = tid; i < V; i += kThreads) {
      const float v = r.x(i);
      if (v != -INFINITY) best = max(best, static_cast<unsigned long long>(order_key(v, i)));
    }
    best = block_reduce(best, red_u, Max{});
    if (tid == 0) p.out[row] = best == 0 ? -1 : static_cast<int32_t>(key_token(best));
    return;
  }

  // top-k over every token (the CPU's nth_element ranks -inf entries too; they stay -inf).
  uint64_t k_floor = 0;
  const int32_t top_k = p.top_k[row];
  if (top_k > 0 && top_k < V) {
    for (int bit = 63; bit >= 0; --bit) {
      const uint64_t cand = k_floor | (1ull << bit);
      unsigned long long n = 0;
      for (int64_t i = tid; i < V; i += kThreads) n += order_key(r.x(i), i) >= cand;
      n = block_reduce(n, red_u, Add{});
      if (n >= static_cast<unsigned long long>(top_k)) k_floor = cand;
    }
  }
  auto alive_k = [&](int64_t i, float v) { return v != -INFINITY && order_key(v, i) >= k_floor; };
  float mx = -INFINITY;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float v = r.x(i);
    if (alive_k(i, v)) mx = fmaxf(mx, v);
  }
  mx = block_reduce(mx, red_f, Max{});
  if (mx == -INFINITY) {
    if (tid == 0) p.out[row] = -1;
    return;
  }
  const double dmx = mx;

  // top-p: keep the tokens down to the one whose cumulative mass (key order) first reaches top_p · total.
  uint64_t p_floor = 0;
  const float top_p = p.top_p[row];
  if (top_p < 1.0f) {
    double total = 0;
    for (int64_t i = tid; i < V; i += kThreads) {
      const float v = r.x(i);
      if (alive_k(i, v)) total += exp(static_cast<double>(v) - dmx);
    }
    total = block_reduce(total, red_d, Add{});
    const double target = static_cast<double>(top_p) * total;
    for (int bit = 63; bit >= 0; --bit) {
      const uint64_t cand = p_floor | (1ull << bit);
      double mass = 0;
      for (int64_t i = tid; i < V; i += kThreads) {
        const float v = r.x(i);
        if (alive_k(i, v) && order_key(v, i) >= cand) mass += exp(static_cast<double>(v) - dmx);
      }
      mass = block_reduce(mass, red_d, Add{});
      if (mass >= target) p_floor = cand;
    }
  }
  const uint64_t floor_key = max(k_floor, p_floor);
  // min-p: p_t >= min_p · p_max  <=>  x_t - x_max >= log(min_p); the max token is never dropped.
  const float min_p = p.min_p[row];
  const double min_logp = min_p > 0.0f ? log(static_cast<double>(min_p)) : -INFINITY;
  auto alive = [&](int64_t i, float v) {
    return v != -INFINITY && order_key(v, i) >= floor_key && static_cast<double>(v) - dmx >= min_logp;
  };

  // Inverse CDF in id order: each thread owns a contiguous chunk; thread 0 scans the chunk sums in order and
  // picks the chunk where the cumulative mass first exceeds u · total; that thread walks its chunk.
  const int64_t chunk = (V + kThreads - 1) / kThreads, lo = tid * chunk, hi = min(V, lo + chunk);
  double s = 0;
  int64_t last = -1;
  for (int64_t i = lo; i < hi; ++i) {
    const float v = r.x(i);
    if (alive(i, v)) {
      s += exp(static_cast<double>(v) - dmx);
      last = i;
    }
  }
  chunk_sum[tid] = s;
  const unsigned long long last_any = block_reduce(static_cast<unsigned long long>(last + 1), red_u, Max{});
  const double u = philox_uniform(rng[0], rng[1], rng[2]);
  if (tid == 0) {
    double total = 0;
    for (int t = 0; t < kThreads; ++t) total += chunk_sum[t];
    const double target = u * total;
    double cum = 0;
    chosen = -1;
    for (int t = 0; t < kThreads && chosen < 0; ++t) {
      if (cum + chunk_sum[t] > target)
        chosen = t;
      else
        cum += chunk_sum[t];
    }
    // chunk_sum[t] now holds the mass before the chosen chunk and the target, for its walk.
    chunk_sum[0] = cum;
    chunk_sum[1] = target;
    if (chosen < 0) p.out[row] = static_cast<int32_t>(last_any) - 1;  // rounding: the last allowed token
  }
  __syncthreads();
  if (tid == chosen) {
    double cum = chunk_sum[0];
    const double target = chunk_sum[1];
    int64_t pick = last;  // rounding inside the chunk: its last allowed token
    for (int64_t i = lo; i < hi; ++i) {
      const float v = r.x(i);
      if (!alive(i, v)) continue;
      cum += exp(static_cast<double>(v) - dmx);
      if (cum > target) {
        pick = i;
        break;
      }
    }
    p.out[row] = static_cast<int32_t>(pick);
  }
}

}  // namespace

void run_sample(const SampleKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  sample_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
