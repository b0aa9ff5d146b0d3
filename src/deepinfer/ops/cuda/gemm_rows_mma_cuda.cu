// Dense decode GEMMs of 9-64 rows for the block formats: the weights read once, all rows in one pass.
//
// Why: a decode batch of 16-64 tokens sends every projection (q_a, kv, q_b, the o_a groups, o_b, the indexer's, the
// shared expert's) through here. The streaming kernel (gemm_stream_mma_cuda.cu) stages all of K for at most 8 rows,
// so 64 rows streamed the weights 8 times; the cuBLASLt path dequantized each weight to a bf16 scratch per call
// (the FP8 bytes read, twice as many written and read back) and then ran cuBLASLt's small-M kernels (ncu, H200,
// session 21, V4-Flash b64 step: 782 us of dequant and 621 us of cuBLASLt for ~390 MB of FP8 weights, which stream
// in ~93 us at the copy rate). Here:
// - a warp owns 16 weight rows (the mma's m16 operand), decoded in registers exactly as the streaming kernel does
//   (its K walk, its fragment order, its bf16 placement and scale multiply: gemm_stream_decode.cuh), and each decoded
//   fragment feeds one mma per 8 activation rows, so the decode and the weight bytes do not grow with the rows;
// - a block's warps (4, 8 or 16) share one K range of all the call's rows, staged once in shared memory in fragment
//   order (one conflict-free 8-byte load per mma and lane); A is read from L2 once per block, which is why the rule
//   prefers wide blocks (session 23's sweep: A's reads, not the weights', set the time at 32-64 rows). As a chosen
//   shape the warps may also split the block's K range (kw), their partial tiles summed in shared memory in order;
// - K splits over the blocks of a thread-block cluster (Hopper) when the weight tiles alone would not give the device
//   enough blocks; the blocks then add their partial tiles through distributed shared memory, each summing a slice of
//   the tile over the cluster's ranks in rank order: deterministic, and no partials through global memory. A
//   cluster's blocks share one GPC, so fewer clusters fit at once than SMs suggest (15 of 8 one-block SMs on the H100):
//   the rule counts those waves (gemm_rows_mma.h);
// - above 32 rows, the warpgroup form: a warpgroup's 4 warps decode their 64 weight rows as before and multiply them
//   by all the rows with register-A wgmmas reading the staged rows straight from shared memory (the kernel's kWg).
#include "deepinfer/ops/cuda/gemm_rows_mma.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_stream_decode.cuh"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma_device.cuh"

namespace deepinfer::cuda {
namespace {

using namespace stream_decode;
namespace cg = cooperative_groups;

constexpr int kMaxWarps = 16;  // 512 threads of <= 128 registers: one block an SM
constexpr int kPrefetch = 4;   // steps of weight loads in flight a lane: 2 rows x 16 bytes each, 128 bytes
constexpr int kMaxSplits = 8;  // the portable cluster size
constexpr int kMinSplitSteps = 8;
// A block's shared memory at most (one block an SM still fits; 227 KB is the sm_90 limit).
constexpr size_t kMaxSmem = 200 * 1024;
constexpr int kSlotDevices = 64;  // devices whose cluster slots gemm_rows_mma_cluster_slots keeps
constexpr int kPartPad = 4;       // floats of padding a partial-tile row: the accumulator stores hit distinct banks
// Warpgroup form (kWg): bytes of padding after each step's staged rows, so that the staging stores of a warp's 8 steps
// (one row, consecutive chunks) hit distinct banks.
constexpr int kWgStepPad = 16;

struct KernelShape {
  int splits, split_steps, lbn, lbk;
  int kw, warp_steps;  // warps along K in a block, each over warp_steps of the block's split_steps
  int share;           // blocks of a cluster along N that stage A together (each a 1/share of it, into all)
  bool a_vec;          // f32 A rows 16-byte aligned (when there is no bf16 copy)
  bool pdl;            // launched with programmatic stream serialization (GemmChoices::rows_mma_pdl)
};

// Grid: x = blocks of warps / kw 16-row weight tiles, y = K splits (a cluster of `splits` blocks along y). Warp w
// holds tile w % (warps / kw) over the block's steps [w / (warps / kw) · warp_steps, + warp_steps).
// Dynamic shared memory: the block's K range of the R = 8·RG rows as bf16 fragments, [step][mma][row][lane % 4] x
// 8 bytes; afterwards the warps' partial tiles, kw x R rows x (16·warps / kw + kPartPad) floats.
// kF32S: FP8 blocks with f32 scales (GemmChoices::f32_scale_mma): each weight is scaled in fp32 and rounded to bf16
// in registers (bf16x2_scaled: dequantize_bf16's values, which the cuBLASLt scratch path it replaces multiplies).
// kWg: the warpgroup form (GemmChoices::rows_mma_wgmma, gemm_rows_mma.h; warps / kw a multiple of 4, so a warpgroup's
// warps share one K range on 4 consecutive tiles): each warp decodes its 16 weight rows into registers as before, and
// the warpgroup multiplies its 64 rows by all R activation rows with one register-A wgmma (m64 nR k16) a k16 slice,
// which reads the staged rows from shared memory itself: no shared-memory loads or per-8-row mma issues in the warps.
// The rows are then staged as wgmma's K-major no-swizzle operand: for step s and mma mi, R rows x the mma's 16 logical
// k (the same pairs place_pairs makes, P in k 0..7, Q in k 8..15), in 8-row x 16-byte core matrices (K-adjacent 128
// bytes apart, 8-row groups 256), kWgStepPad bytes after each step. The accumulators are the mma's C fragments as
// before.
template <QuantFormat F, int RG, bool kBf16A, bool kShare, bool kF32S = false, bool kWg = false>
__global__ void __launch_bounds__(32 * kMaxWarps, 1) gemm_rows_mma_kernel(GemmKernelParams p, KernelShape sh) {
  static_assert(!kF32S || F == QuantFormat::kFP8Block, "f32 scales: FP8 blocks");
  constexpr int R = 8 * RG, kMi = kMmas<F>, kC = kChunkK<F>;
  constexpr int kStepWords = (kMi * R * 32 + kWgStepPad) / 4;  // kWg: a step's staged rows and padding
  extern __shared__ __align__(16) uint2 xs[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tiles = (blockDim.x >> 5) / sh.kw, cols = 16 * tiles, ld = cols + kPartPad;
  const int tile = warp % tiles, kslice = warp / tiles;
  const int chunks = static_cast<int>(p.k / kC), steps = (chunks + 3) / 4;
  const int split = blockIdx.y;
  const int s_begin = split * sh.split_steps, s_end = min(steps, s_begin + sh.split_steps);
  const int64_t n_block = static_cast<int64_t>(blockIdx.x) * cols, n0 = n_block + 16 * tile;
  // (With share > 1 the grid rounds up to whole clusters: a block past N only stages its part of A.)
  const int w_begin = s_begin + kslice * sh.warp_steps;
  const int w_end = n_block < p.n ? min(s_end, w_begin + sh.warp_steps) : w_begin;
  const uint8_t* b = static_cast<const uint8_t*>(p.b);
  const uint8_t* s = static_cast<const uint8_t*>(p.b_scale);
  WeightRows<F, 2, true, kF32S> wr;  // weight rows g and g + 8 of the warp's tile
  wr.set(p, b, s, n0, g, t, chunks, sh.lbn);
  const auto load = [&](int st, StepData<2>& d) { wr.load(st, w_end, chunks, t, sh.lbk, d); };
  // The first steps' weight loads go out before the rows are staged, so they are in flight meanwhile.
  StepData<2> buf[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) load(w_begin + u, buf[u]);
  // Stores into another block's shared memory need that block running (CUDA programming guide, distributed shared
  // memory): arrive on the cluster barrier here, wait for the others just before staging.
  if constexpr (kShare) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  // A programmatic launch may start before the previous kernel's writes (A) are visible: wait for them here, after
  // the weight loads (static data) are out. C is written only after this too.
  if (sh.pdl) asm volatile("griddepcontrol.wait;\n" ::: "memory");

  // A thread per (row, chunk) of the block's K range, consecutive threads on consecutive chunks of a row (a row's
  // bytes in few sectors; threads on consecutive rows made 39% of the sectors excess: ncu, H200, V4-Flash o_b at 64
  // rows): kStage chunks' activations in one round of loads, then their kMi fragment entries each (one load round
  // per chunk made the staging a chain of L2 round trips: 8 at 64 rows). Rows past m stage zeros.
  // (MXFP4's chunks are twice as long: half as many a round, or its bf16-A kernel spills.)
  constexpr int kStage = (kBf16A ? 4 : 2) / (F == QuantFormat::kMXFP4 ? 2 : 1);
  // With share > 1, block x of the cluster stages items [x·I/share, (x+1)·I/share) into every block's shared memory
  // (A read from L2 once a cluster instead of once a block).
  const int range_chunks = 4 * max(s_end - s_begin, 0), items = R * range_chunks;
  // (kShare: share > 1, a separate instantiation so that the unshared kernel's code stays as measured.)
  const int share = kShare ? sh.share : 1, cx = kShare ? blockIdx.x % share : 0;
  const int i_begin = cx * items / share, i_end = (cx + 1) * items / share;
  if constexpr (kShare) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  for (int q0 = i_begin + tid; q0 < i_end; q0 += kStage * blockDim.x) {
    using Chunk = std::conditional_t<kBf16A, uint32_t[kC / 2], float[kC]>;
    Chunk v[kStage];
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int q = q0 + u * blockDim.x, r = q / range_chunks;
      const int64_t row = q < i_end && r < p.m ? r : -1;
      if constexpr (kBf16A)
        load_chunk<F>(p, row, 4 * s_begin + q % range_chunks, chunks, v[u]);
      else
        load_chunk<F>(p, row, 4 * s_begin + q % range_chunks, chunks, sh.a_vec, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int q = q0 + u * blockDim.x, r = q / range_chunks, cl = q % range_chunks;
      if (q >= i_end) continue;
      if constexpr (kWg) {
        uint2 pq[kMi];
        place_pairs<F>(v[u], pq, 1);
        const int w0 = (cl >> 2) * kStepWords + (r >> 3) * 64 + (r & 7) * 4 + (cl & 3);
        const auto put = [&](uint32_t* dst) {
#pragma unroll
          for (int mi = 0; mi < kMi; ++mi) {
            dst[w0 + mi * R * 8] = pq[mi].x;
            dst[w0 + mi * R * 8 + 32] = pq[mi].y;
          }
        };
        if constexpr (!kShare) {
          put(reinterpret_cast<uint32_t*>(xs));
        } else {
          cg::cluster_group cluster = cg::this_cluster();
          for (int j = 0; j < share; ++j)
            put(cluster.map_shared_rank(reinterpret_cast<uint32_t*>(xs), j + share * split));
        }
      } else {
        const int off = ((cl >> 2) * kMi * R + r) * 4 + (cl & 3);
        if constexpr (!kShare) {
          place_pairs<F>(v[u], xs + off, R * 4);
        } else {
          cg::cluster_group cluster = cg::this_cluster();
          for (int j = 0; j < share; ++j)
            place_pairs<F>(v[u], cluster.map_shared_rank(xs, j + share * split) + off, R * 4);
        }
      }
    }
  }
  // kWg: the staged rows (generic-proxy stores, here or from the cluster's other blocks) made visible to wgmma's
  // async-proxy reads: a proxy fence by every writer before the barrier and by every reader after it.
  if constexpr (kWg) asm volatile("fence.proxy.async;\n" ::: "memory");
  if constexpr (kShare)
    cg::this_cluster().sync();
  else
    __syncthreads();
  if constexpr (kWg) asm volatile("fence.proxy.async;\n" ::: "memory");

  // One accumulator chain per 8 rows: RG independent chains already.
  float acc[RG][4] = {};
  for (int st0 = w_begin; st0 < w_end; st0 += kPrefetch) {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int st = st0 + u;
      if (st < w_end) {
        StepData<2>& d = buf[u];
        FormatScale<F> sc[2];
        sc[0].set(kF32S ? 127u : d.e[0]);  // kF32S: the codes' values (x 1), scaled below
        sc[1].set(kF32S ? 127u : d.e[1]);
        const uint2* xrow = xs + (st - s_begin) * (kMi * R * 4) + lane;
        uint32_t wa[kWg ? kMi : 1][4];  // kWg: the step's A fragments, all decoded before the warpgroup's wgmmas
        const auto mmas = [&]<bool kMaybeTwo>() {
#pragma unroll
          for (int mi = 0; mi < kMi; ++mi) {
            uint32_t wp[2], wq[2];
            weight_pairs<F, kMaybeTwo>(d.q[0], sc[0], mi, wp[0], wq[0]);
            weight_pairs<F, kMaybeTwo>(d.q[1], sc[1], mi, wp[1], wq[1]);
            if constexpr (kF32S) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                wp[h] = bf16x2_scaled(wp[h], __uint_as_float(d.e[h]));
                wq[h] = bf16x2_scaled(wq[h], __uint_as_float(d.e[h]));
              }
            }
            if constexpr (kWg) {
              wa[mi][0] = wp[0];
              wa[mi][1] = wp[1];
              wa[mi][2] = wq[0];
              wa[mi][3] = wq[1];
            } else {
              const uint32_t a[4] = {wp[0], wp[1], wq[0], wq[1]};
#pragma unroll
              for (int rg = 0; rg < RG; ++rg) {
                const uint2 x = xrow[mi * R * 4 + rg * 32];
                mma_bf16(acc[rg], a, x.x, x.y);
              }
            }
          }
        };
        // (As the streaming kernel: a scale past bf16's range for one multiply takes the two-multiply decode.)
        if constexpr (kF32S)
          mmas.template operator()<false>();
        else if (__any_sync(0xffffffffu, sc[0].two || sc[1].two))
          mmas.template operator()<true>();
        else
          mmas.template operator()<false>();
        if constexpr (kWg) {
          // The warpgroup's 64 weight rows x R activation rows over the step's kMi k16 slices; done before the
          // registers of wa are written again (the next step) or the accumulators read.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
          float(&d4)[R / 2] = reinterpret_cast<float(&)[R / 2]>(acc);
          const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(xs)) + (st - s_begin) * kStepWords * 4;
          wgmma::pin(d4);
          wgmma::wgmma_fence();
#pragma unroll
          for (int mi = 0; mi < kMi; ++mi)
            wgmma::wgmma_m64nNk16_reg_a<R>(d4, wa[mi], wgmma::smem_desc_plain(base + mi * R * 32, 128, 256));
          wgmma::wgmma_commit();
          wgmma::wgmma_wait<0>();
          wgmma::pin(d4);
#else
          __trap();
#endif
        }
        // Refills two steps at a time, so that a row's 64-byte halves of one 128-byte line leave back to back (the
        // streaming kernel's measured order).
        if (u & 1) {
          load(st - 1 + kPrefetch, buf[u - 1]);
          load(st + kPrefetch, d);
        }
      }
    }
  }
  __syncthreads();  // every warp is done with the staged rows: the partial tile takes their place

  // acc[rg]: 0 / 1 weight row g, rows 8·rg + 2t / 2t + 1; 2 / 3 the same for weight row g + 8.
  float* part = reinterpret_cast<float*>(xs);
  float* mine = part + kslice * R * ld;
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int i = 0; i < 4; ++i) mine[(8 * rg + 2 * t + (i & 1)) * ld + 16 * tile + g + (i >= 2 ? 8 : 0)] = acc[rg][i];
  const int elems = R * cols;
  if (sh.kw > 1) {  // the K slices' tiles summed in slice order into the first
    __syncthreads();
    for (int e = tid; e < elems; e += blockDim.x) {
      const int o = (e / cols) * ld + e % cols;
      float sum = part[o];
      for (int j = 1; j < sh.kw; ++j) sum += part[j * R * ld + o];
      part[o] = sum;
    }
  }
  // Rank j of the cluster sums elements [j·E/S, (j+1)·E/S) of the R x cols tile over ranks 0..S-1 in that order.
  const int e_begin = split * elems / sh.splits, e_end = (split + 1) * elems / sh.splits;
  if (sh.splits > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    for (int e = e_begin + tid; e < e_end; e += blockDim.x) {
      const int r = e / cols, cc = e % cols;
      float v[kMaxSplits];  // all ranks' loads in flight together, then summed in rank order
#pragma unroll
      for (int j = 0; j < kMaxSplits; ++j)
        v[j] = j < sh.splits ? cluster.map_shared_rank(part, cx + share * j)[r * ld + cc] : 0.0f;
      float sum = v[0];
#pragma unroll
      for (int j = 1; j < kMaxSplits; ++j)
        if (j < sh.splits) sum += v[j];
      if (r < p.m && n_block + cc < p.n) p.c[r * p.ldc + n_block + cc] = sum;
    }
    cluster.sync();  // no block leaves while another still reads its tile
  } else {
    __syncthreads();
    for (int e = tid; e < elems; e += blockDim.x) {
      const int r = e / cols, cc = e % cols;
      if (r < p.m && n_block + cc < p.n) p.c[r * p.ldc + n_block + cc] = part[r * ld + cc];
    }
  }
}

int64_t chunk_k(QuantFormat f) { return f == QuantFormat::kMXFP4 ? 32 : 16; }
int row_groups(int64_t rows) { return rows <= 16 ? 2 : (rows <= 32 ? 4 : 8); }

// Bytes of a block's shared memory: its K range of R rows (8 bytes a row, mma and chunk: 2·K_range·R; the warpgroup
// form's padding after each step), or the K slices' partial tiles when larger.
size_t rows_smem(QuantFormat f, int warps, int kw, int split_steps, int64_t rows, bool wg) {
  const int64_t r = 8 * row_groups(rows), mmas = chunk_k(f) / 4;
  const int64_t stage = int64_t{split_steps} * (4 * mmas * r * 8 + (wg ? kWgStepPad : 0));
  const int64_t part = kw * r * (16 * warps / kw + kPartPad) * 4;
  return static_cast<size_t>(std::max(stage, part));
}

template <QuantFormat F, int RG, bool kBf16A, bool kShare, bool kF32S, bool kWg>
void launch(const GemmKernelParams& p, const RowsMmaShape& shape, const KernelShape& ks, cudaStream_t stream) {
  auto kernel = gemm_rows_mma_kernel<F, RG, kBf16A, kShare, kF32S, kWg>;
  if (shape.smem > 48 * 1024)
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shape.smem)));
  cudaLaunchConfig_t cfg = {};
  const int64_t tiles = ceil_div(p.n, int64_t{16} * (shape.warps / shape.kw));
  cfg.gridDim =
      dim3(static_cast<unsigned>(ceil_div(tiles, int64_t{ks.share}) * ks.share), static_cast<unsigned>(ks.splits));
  cfg.blockDim = dim3(32 * shape.warps);
  cfg.dynamicSmemBytes = shape.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned attrs = 0;
  if (ks.splits * ks.share > 1) {
    attr[attrs].id = cudaLaunchAttributeClusterDimension;
    attr[attrs].val.clusterDim.x = static_cast<unsigned>(ks.share);
    attr[attrs].val.clusterDim.y = static_cast<unsigned>(ks.splits);
    attr[attrs].val.clusterDim.z = 1;
    ++attrs;
  }
  if (ks.pdl) {
    attr[attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[attrs].val.programmaticStreamSerializationAllowed = 1;
    ++attrs;
  }
  cfg.attrs = attr;
  cfg.numAttrs = attrs;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, ks));
}

template <QuantFormat F, int RG, bool kF32S, bool kWg>
void launch_a(const GemmKernelParams& p, const RowsMmaShape& shape, KernelShape ks, cudaStream_t stream) {
  const bool a16 = p.a_bf16 && p.lda % 8 == 0 && reinterpret_cast<uintptr_t>(p.a_bf16) % 16 == 0;
  ks.a_vec = p.lda % 4 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0;
  if (ks.share > 1) {
    if (a16)
      launch<F, RG, true, true, kF32S, kWg>(p, shape, ks, stream);
    else
      launch<F, RG, false, true, kF32S, kWg>(p, shape, ks, stream);
  } else if (a16) {
    launch<F, RG, true, false, kF32S, kWg>(p, shape, ks, stream);
  } else {
    launch<F, RG, false, false, kF32S, kWg>(p, shape, ks, stream);
  }
}

template <QuantFormat F, int RG, bool kF32S>
void launch_wg(const GemmKernelParams& p, const RowsMmaShape& shape, const KernelShape& ks, cudaStream_t stream) {
  if (shape.wg)
    launch_a<F, RG, kF32S, true>(p, shape, ks, stream);
  else
    launch_a<F, RG, kF32S, false>(p, shape, ks, stream);
}

template <QuantFormat F, bool kF32S = false>
void dispatch(const GemmKernelParams& p, const RowsMmaShape& shape, const KernelShape& ks, cudaStream_t stream) {
  switch (row_groups(p.m)) {
    case 2:
      launch_wg<F, 2, kF32S>(p, shape, ks, stream);
      break;
    case 4:
      launch_wg<F, 4, kF32S>(p, shape, ks, stream);
      break;
    default:
      launch_wg<F, 8, kF32S>(p, shape, ks, stream);
      break;
  }
}

}  // namespace

RowsMmaShape gemm_rows_mma_shape(QuantFormat format, int64_t n, int64_t k, int64_t rows, int sms,
                                 const GemmChoices& pick, const ClusterSlots& cluster_slots) {
  const int64_t steps = ceil_div(k / chunk_k(format), int64_t{4});
  RowsMmaShape s;
  // The widest block (16, 8 or 4 warps: every block stages its K range of all the rows, so fewer, wider blocks read
  // less of A) whose tiles and splits make a third of the SMs' worth of blocks. Splits while the blocks
  // stay under the SMs (16-warp blocks, one an SM: under half of them) and each keeps 8 steps: more splits cost more
  // in the cluster's reduction and each block's staging than they gain (H200, V4-Flash projections at 16-64 rows,
  // docs/PERF.md session 23).
  const auto max_splits = [&](int64_t tiles, int warps) {
    int sp = 1;
    const auto fewer = [&] { return warps == 16 ? 2 * tiles * sp <= sms / 2 : tiles * sp < sms; };
    while (sp < kMaxSplits && fewer() && steps >= int64_t{2} * sp * kMinSplitSteps) sp *= 2;
    return sp;
  };
  s.warps = 16;
  const auto blocks = [&](int warps) {
    const int64_t tiles = ceil_div(n, int64_t{16} * warps);
    return tiles * max_splits(tiles, warps);
  };
  while (s.warps > 4 && blocks(s.warps) < sms / 3) s.warps /= 2;
  if (pick.rows_mma_warps == 4 || pick.rows_mma_warps == 8 || pick.rows_mma_warps == 16) s.warps = pick.rows_mma_warps;
  if (pick.rows_mma_kw > 0 && pick.rows_mma_kw <= s.warps && s.warps % pick.rows_mma_kw == 0) s.kw = pick.rows_mma_kw;
  const int64_t tiles = ceil_div(n, int64_t{16} * (s.warps / s.kw));
  const bool forced = pick.rows_mma_splits > 0;
  // The warpgroup form needs whole warpgroups on one K range: warps / kw a multiple of 4.
  const bool wg_rows = pick.rows_mma_wgmma == KernelPick::kAlways ||
                       (pick.rows_mma_wgmma == KernelPick::kAuto && rows > kGemmRowsWgmmaAutoRows);
  s.wg = wg_rows && (s.warps / s.kw) % 4 == 0;
  if (pick.rows_mma_share == 2 || pick.rows_mma_share == 4 || pick.rows_mma_share == 8) s.share = pick.rows_mma_share;
  const int max_splits_here = kMaxSplits / s.share;  // a cluster holds share x splits blocks, 8 at most
  s.splits = std::min(forced ? pick.rows_mma_splits : max_splits(tiles, s.warps), max_splits_here);
  // More splits while a block's K range does not fit its shared memory (a chosen split count stays: then the call
  // is declined).
  for (;;) {
    s.split_steps = static_cast<int>(ceil_div(steps, int64_t{s.splits}));
    s.warp_steps = static_cast<int>(ceil_div(s.split_steps, s.kw));
    if (s.kw > 1) s.warp_steps += s.warp_steps & 1;  // whole 128-byte lines of a row per warp
    s.smem = rows_smem(format, s.warps, s.kw, s.split_steps, rows, s.wg);
    if (forced || s.smem <= kMaxSmem || s.splits >= max_splits_here || s.split_steps < 2) break;
    s.splits *= 2;
  }
  // Pairs of 16-warp blocks along N stage A together when the cluster has room: 0-6% faster on every V4-Flash
  // projection of 16-64 rows that takes 16-warp blocks and at most 4 splits, never slower; four blocks a cluster
  // lose (docs/PERF.md session 24).
  if (pick.rows_mma_share == 0 && s.warps == 16 && s.kw == 1 && s.splits <= kMaxSplits / 2 && tiles >= 2) s.share = 2;
  // Clusters past one wave (e.g. V4-Flash o_b at 33-64 rows: K = 8192 fits shared memory in 8 splits, 16 clusters of
  // 8, of which the H100 runs 15 at once, so the 16th runs alone after them: 53.0 us, 37.7 in 6 splits, one wave;
  // H100, session 43, docs/PERF.md): the shape of fewest waves x (steps a block + kBlockFixedSteps), each block
  // latency-bound. Not for a chosen shape. The fixed part is a block's staging, cluster barriers and reduction: without
  // it the rule took V4-Flash's q_b + wq_idx (40960 x 1024, 64 rows: 80 pairs of 16 steps, two waves) to 8 splits of
  // 2 steps, 160 clusters of 8 in eleven waves: 111 us against 54 (H100, session 44, ncu of the slice).
  constexpr int64_t kBlockFixedSteps = 8;
  const bool chosen = pick.rows_mma_warps || pick.rows_mma_kw || forced || pick.rows_mma_share;
  // Blocks of one an SM: 16 warps (the registers), or past half an SM's 228 KB of shared memory (1 KB a block kept).
  const auto waves = [&](const RowsMmaShape& c) {
    const int size = c.splits * c.share;
    const int64_t clusters = ceil_div(ceil_div(n, int64_t{16} * (c.warps / c.kw)), int64_t{c.share});
    const bool one_an_sm = c.warps == 16 || c.smem > 113 * 1024;
    if (size <= 1 || !one_an_sm || clusters * size <= sms / 2) return int64_t{1};  // one wave on any GPC layout
    const int slots = cluster_slots(size);
    return slots > 0 ? ceil_div(clusters, int64_t{slots}) : int64_t{1};
  };
  if (chosen || !pick.rows_mma_waves || !cluster_slots || s.smem > kMaxSmem || waves(s) <= 1) return s;
  RowsMmaShape best = s;
  int64_t best_cost = waves(s) * (s.split_steps + kBlockFixedSteps);
  for (int sp = 2; sp <= kMaxSplits; ++sp) {
    RowsMmaShape c;
    c.warps = 16;
    c.splits = sp;
    c.split_steps = c.warp_steps = static_cast<int>(ceil_div(steps, int64_t{sp}));
    c.wg = wg_rows;
    c.smem = rows_smem(format, c.warps, 1, c.split_steps, rows, c.wg);
    if (c.smem > kMaxSmem) continue;
    const int64_t cost = waves(c) * (c.split_steps + kBlockFixedSteps);
    if (cost < best_cost) {
      best = c;
      best_cost = cost;
    }
  }
  return best;
}

namespace {
// gemm_rows_mma_takes but for the shared memory its launch shape needs.
bool takes_kind(QuantFormat format, bool scale_e8m0, int block_n, int block_k, int64_t n, int64_t k, int64_t rows,
                const GemmChoices& choices) {
  if (choices.rows_mma == KernelPick::kNever) return false;
  if (rows <= kGemmStreamMmaMaxRows || rows > kGemmRowsMmaMaxRows || n <= 0 || k <= 0) return false;
  if (choices.rows_mma == KernelPick::kAuto && rows > kGemmRowsMmaAutoRows) return false;
  // f32 block scales (f32_scale_mma): FP8 blocks of the shapes the UE8M0 decode takes.
  const bool f32_blocks = choices.f32_scale_mma && format == QuantFormat::kFP8Block;
  return (scale_e8m0 || f32_blocks) && decodes_layout(format, block_n, block_k, k);
}
}  // namespace

bool gemm_rows_mma_takes(QuantFormat format, bool scale_e8m0, int block_n, int block_k, int64_t n, int64_t k,
                         int64_t rows, const GemmChoices& choices) {
  return takes_kind(format, scale_e8m0, block_n, block_k, n, k, rows, choices) &&
         gemm_rows_mma_shape(format, n, k, rows, device_sm_count(), choices).smem <= kMaxSmem;
}

namespace {
// Clusters of 16-warp blocks (one an SM: a 512-thread block takes the SM's registers) that the runtime says fit at
// once; any instance, they share the launch bounds. 0 when it does not say.
int ask_cluster_slots(int size) {
  const auto kernel = gemm_rows_mma_kernel<QuantFormat::kFP8Block, 8, false, false, false, false>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxSmem)) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, static_cast<unsigned>(size));
  cfg.blockDim = dim3(32 * kMaxWarps);
  cfg.dynamicSmemBytes = kMaxSmem;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = static_cast<unsigned>(size);
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}
}  // namespace

int gemm_rows_mma_cluster_slots(int size) {
  if (size < 2 || size > kMaxSplits) return 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kSlotDevices) return ask_cluster_slots(size);
  // A device constant kept per device as answer + 1 (0: not asked yet); racing first asks store the same answer.
  static std::atomic<int> known[kSlotDevices][kMaxSplits + 1];
  int v = known[dev][size].load(std::memory_order_relaxed) - 1;
  if (v < 0) {
    v = ask_cluster_slots(size);
    known[dev][size].store(v + 1, std::memory_order_relaxed);
  }
  return v;
}

bool run_gemm_rows_mma(const GemmKernelParams& p, cudaStream_t stream) {
  if (p.batch_invariant || p.group_offsets || p.a_rows || p.c_rows || p.b_table) return false;
  if (!takes_kind(p.format, p.scale_e8m0, p.block_n, p.block_k, p.n, p.k, p.m, p.choices)) return false;
  if (reinterpret_cast<uintptr_t>(p.b) % 16 != 0) return false;
  if (!p.scale_e8m0 && reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0) return false;
  // The wave rule only replaces a shape that fits with one that fits: declined exactly when gemm_rows_mma_takes says.
  const RowsMmaShape shape =
      gemm_rows_mma_shape(p.format, p.n, p.k, p.m, device_sm_count(), p.choices, gemm_rows_mma_cluster_slots);
  if (shape.smem > kMaxSmem) return false;
  KernelShape ks{shape.splits, shape.split_steps,     0, 0, shape.kw, shape.warp_steps, shape.share,
                 false,        p.choices.rows_mma_pdl};
  switch (p.format) {
    case QuantFormat::kMXFP4:
      dispatch<QuantFormat::kMXFP4>(p, shape, ks, stream);
      break;
    case QuantFormat::kFP8Row32:
      dispatch<QuantFormat::kFP8Row32>(p, shape, ks, stream);
      break;
    default:
      ks.lbn = log2_exact(p.block_n);
      ks.lbk = log2_exact(p.block_k);
      if (p.scale_e8m0)
        dispatch<QuantFormat::kFP8Block>(p, shape, ks, stream);
      else
        dispatch<QuantFormat::kFP8Block, true>(p, shape, ks, stream);
      break;
  }
  return true;
}

}  // namespace deepinfer::cuda
