// The MXFP4 weight stream of the decode MoE through a shared-memory ring.
//
// Why: at decode batches of 64-256 tokens the routed experts' streaming GEMM (gemm_stream_mma_cuda.cu) is 68-76% of
// a V4 slice's step and runs at 71% of the copy rate (ncu, H100, session 45). Its warps wait on their oldest
// prefetched step: 128 bytes a lane in flight in registers, at 127 of the 128 registers two blocks an SM allow. Here
// the same tiles and mma sequence take their weights from a ring of shared-memory stages filled by cp.async, so the
// bytes in flight no longer cost registers (the indexer's ring, session 44: 363 GB/s -> 2.14 TB/s). The activation
// rows, which the streaming kernel stages whole (8 rows x K bf16: 64-80 KB a block), are staged a K range at a time
// with the weights, so that the ring fits two blocks an SM:
// - a stage is 256 K values (2 steps of 4 chunks of 32): each warp's 16-row tile (16 KB a block), the tile rows'
//   UE8M0 scale bytes (1 KB) and the pass's 8 activation rows (4 KB); 5 stages, 4 in flight (64 KB of weights a block
//   against the streaming kernel's 32 KB);
// - each lane copies the same 16-byte chunks it would have loaded (rows g and g + 8 of its warp's tile, chunk t of
//   each step) and reads back only its own, so the weights need no barrier of their own; the scale bytes and the
//   activations are shared, so a stage ends at one block barrier (which also frees the slot that the next copy fills);
// - the activations land in 16-byte groups of 8 consecutive k, [step][group][row][chunk], so that a warp's 32 reads of
//   a group are 512 contiguous bytes (no bank conflict), and two byte permutes a mma pair them the way the weights'
//   decode pairs codes (i and i + 4 of a word: gemm_stream_decode.cuh), the streaming kernel's fragment order.
// The ring runs through the block's (pass, tile group, stage) sequence, so the copies of a tile group's first stages
// go out under the previous group's last ones.
#include "deepinfer/ops/cuda/gemm_stream_ring.h"

#include <cuda_bf16.h>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_stream_decode.cuh"

namespace deepinfer::cuda {
namespace {

using namespace stream_decode;

constexpr QuantFormat kF = QuantFormat::kMXFP4;
constexpr int kWarps = 8;            // a 16-row tile each
constexpr int kStageSteps = 2;       // steps of 4 chunks (128 K) a stage
constexpr int kStageK = 256;         // K values a stage
constexpr int kStageChunks = 8;      // 16-byte chunks (32 K each) a row and stage
constexpr int kStages = 5;           // 4 in flight while one is read
constexpr int kRowsMax = 8;          // activation rows a pass (the mma's n8 operand)

struct Stage {
  uint4 w[kWarps][kStageSteps][2][32];  // lane's chunk t of each step, rows g (h = 0) and g + 8 (h = 1)
  uint2 s[kWarps][16];                  // the tile rows' scale bytes of the stage's 8 chunks
  uint4 x[kStageSteps][4][kRowsMax][4];  // activations: [step][group of 8 k][row][chunk], 8 bf16 each
};

__device__ __forceinline__ void cp_async16_stream(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// Where the block's sequence of stages is: pass ps of its rows, tile group f, K stage st.
struct Cursor {
  int ps = 0, f = 0, st = 0;
  __device__ __forceinline__ void next(int groups, int stages) {
    if (++st < stages) return;
    st = 0;
    if (++f < groups) return;
    f = 0;
    ++ps;
  }
};

// Grid: x = blocks of tile_groups groups of 8 tiles, y = group slots (or the plan's passes). rows: a pass's rows.
__global__ void __launch_bounds__(32 * kWarps, 2)
    gemm_stream_ring_kernel(GemmKernelParams p, int rows, int tile_groups) {
  extern __shared__ __align__(16) uint8_t ring_raw[];
  Stage* ring = reinterpret_cast<Stage*>(ring_raw);
  // As the streaming kernel: the slot's group (or pass), read together with the count.
  int grp = 0, pass = -1;
  if (p.group_offsets) {
    if (p.active_passes) {
      const int count = p.active_passes[p.pass_capacity], entry = p.active_passes[blockIdx.y];
      if (static_cast<int>(blockIdx.y) >= count) return;
      grp = entry & 0xFFFF;
      pass = entry >> 16;
    } else {
      const int count = p.active_groups[p.groups], slot_group = p.active_groups[blockIdx.y];
      if (static_cast<int>(blockIdx.y) >= count) return;
      grp = slot_group;
    }
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint8_t* b = static_cast<const uint8_t*>(p.b_table ? p.b_table[grp] : p.b);
  const uint8_t* s = static_cast<const uint8_t*>(p.b_scale_table ? p.b_scale_table[grp] : p.b_scale);
  const int chunks = static_cast<int>(p.k / 32), stages = static_cast<int>(p.k / kStageK);
  const int64_t tiles = (p.n + 15) / 16, first_tile = static_cast<int64_t>(blockIdx.x) * tile_groups * kWarps;
  // The block's groups that hold a tile below N (the grid's last block may have fewer).
  const int64_t left = (tiles - first_tile + kWarps - 1) / kWarps;
  const int groups = left < tile_groups ? static_cast<int>(left) : tile_groups;

  // The copies of one stage into ring slot `slot`: the weights (and scales) of tile group c.f and / or the
  // activations of pass c.ps, K stage c.st. Rows past N read row 0 (their outputs are never written); activation rows
  // past the pass are zero-filled.
  const auto copy_weights = [&](const Cursor& c, int slot) {
    const int64_t n0 = (first_tile + c.f * kWarps + warp) * 16;
    Stage& sg = ring[slot];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + g + 8 * h;
      const uint8_t* row = b + (n < p.n ? n : 0) * chunks * 16;
#pragma unroll
      for (int u = 0; u < kStageSteps; ++u)
        cp_async16_stream(&sg.w[warp][u][h][lane], row + (c.st * kStageChunks + 4 * u + t) * 16);
    }
    if (lane < 16) {
      const int64_t n = n0 + lane;
      cp_async8(&sg.s[warp][lane], s + (n < p.n ? n : 0) * chunks + c.st * kStageChunks);
    }
  };
  // The thread's activation piece: row ar = tid / 32, 16 bytes at k = 8 · (tid % 32) of the stage.
  const int ar = tid >> 5, aq = tid & 31, au = aq >> 4, at = (aq >> 2) & 3, aj = aq & 3;
  int64_t begin = p.group_offsets ? p.group_offsets[grp] : 0, end = p.group_offsets ? p.group_offsets[grp + 1] : p.m;
  int a_pass = -1;
  int64_t a_src = -1;  // the thread's row of A for pass a_pass (-1: past the pass)
  const __nv_bfloat16* a16 = static_cast<const __nv_bfloat16*>(p.a_bf16);
  const auto copy_rows = [&](const Cursor& c, int slot) {
    if (c.ps != a_pass) {
      a_pass = c.ps;
      const int64_t i = begin + static_cast<int64_t>(c.ps) * rows + ar;
      a_src = ar < rows && i < end ? (p.a_rows ? p.a_rows[i] / p.a_row_div : i) : -1;
    }
    const int64_t k = int64_t{c.st} * kStageK + 8 * aq;
    cp_async16(&ring[slot].x[au][aj][ar][at], a16 + (a_src >= 0 ? a_src * p.lda + k : 0), a_src >= 0);
  };

  // The first kStages - 1 stages' weights go out before the rows are resolved (they wait on the plan's offsets).
  Cursor issue;
  const int prologue = kStages - 1;
  for (int i = 0; i < prologue; ++i) {
    if (issue.ps == 0) copy_weights(issue, i);
    issue.next(groups, stages);
  }
  if (pass >= 0) {
    begin += static_cast<int64_t>(pass) * rows;
    end = end < begin + rows ? end : begin + rows;
  }
  const int passes = static_cast<int>((end - begin + rows - 1) / rows);
  const int total = passes * groups * stages;
  {
    Cursor c;
    for (int i = 0; i < prologue; ++i) {
      if (i < total) {
        if (c.ps > 0) copy_weights(c, i);  // a later pass's (stages past the first pass: a short K)
        copy_rows(c, i);
      }
      c.next(groups, stages);
    }
  }
  cp_async_commit();

  Cursor cur;
  float acc[4][4] = {};
  for (int it = 0; it < total; ++it) {
    if (it == 0)
      cp_async_wait<0>();
    else
      cp_async_wait<kStages - 2>();
    __syncthreads();  // stage it landed for every thread; every thread is past stage it - 1, whose slot refills now
    if (it + prologue < total) {
      copy_weights(issue, (it + prologue) % kStages);
      copy_rows(issue, (it + prologue) % kStages);
    }
    issue.next(groups, stages);
    cp_async_commit();  // (an empty group past the end keeps the count of pending groups per stage)

    const Stage& sg = ring[it % kStages];
    const uint8_t* sb = reinterpret_cast<const uint8_t*>(sg.s[warp]);
#pragma unroll
    for (int u = 0; u < kStageSteps; ++u) {
      const uint4 q[2] = {sg.w[warp][u][0][lane], sg.w[warp][u][1][lane]};
      FormatScale<kF> sc[2];
      sc[0].set(sb[g * 8 + 4 * u + t]);
      sc[1].set(sb[(g + 8) * 8 + 4 * u + t]);
      const auto mmas = [&]<bool kMaybeTwo>() {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4 xv = sg.x[u][j][g][t];  // k 8j .. 8j + 7 of chunk t, row g: words (k, k + 1) pairs
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const int mi = 2 * j + m;
            // Pair P = (k m·2, m·2 + 4), Q = (m·2 + 1, m·2 + 5) of the group: the streaming kernel's place_pairs.
            const uint32_t lo = m ? xv.y : xv.x, hi = m ? xv.w : xv.z;
            uint32_t wp[2], wq[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) weight_pairs<kF, kMaybeTwo>(q[h], sc[h], mi, wp[h], wq[h]);
            const uint32_t a[4] = {wp[0], wp[1], wq[0], wq[1]};
            mma_bf16(acc[mi % 4], a, __byte_perm(lo, hi, 0x5410), __byte_perm(lo, hi, 0x7632));
          }
        }
      };
      if (__any_sync(0xffffffffu, sc[0].two || sc[1].two))
        mmas.template operator()<true>();
      else
        mmas.template operator()<false>();
    }

    if (cur.st + 1 == stages) {
      // The tile group's outputs: acc 0 / 1 weight row g, activation rows 2t / 2t + 1; acc 2 / 3 row g + 8.
      const int64_t n0 = (first_tile + cur.f * kWarps + warp) * 16, r0 = begin + static_cast<int64_t>(cur.ps) * rows;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float sum = (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
        const int r = 2 * t + (i & 1);
        const int64_t row = r0 + r, col = n0 + g + (i >= 2 ? 8 : 0);
        if (r < rows && row < end && col < p.n) {
          const int64_t c_row = p.c_rows ? p.c_rows[row] : row;
          if (c_row >= 0) p.c[c_row * p.ldc + col] = sum;
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    }
    cur.next(groups, stages);
  }
  cp_async_wait<0>();  // nothing of the ring outlives the block (the empty groups only)
}

}  // namespace

bool gemm_stream_ring_takes(const GemmKernelParams& p) {
  const auto aligned = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  return p.choices.stream_mma_ring && p.format == QuantFormat::kMXFP4 && p.scale_e8m0 && !p.batch_invariant &&
         p.k > 0 && p.k % kStageK == 0 && p.a_bf16 && p.lda % 8 == 0 && aligned(p.a_bf16, 16) &&
         (p.b_table ? p.tables_aligned16 : aligned(p.b, 16) && aligned(p.b_scale, 8));
}

void run_gemm_stream_ring(const GemmKernelParams& p, int rows, int64_t slots, int tile_groups, cudaStream_t stream) {
  DI_CHECK(rows >= 1 && rows <= kRowsMax && tile_groups >= 1) << "gemm_stream_ring: " << rows << " rows a pass, "
                                                              << tile_groups << " tile groups";
  const int64_t tiles = ceil_div(p.n, int64_t{16});
  const size_t smem = sizeof(Stage) * kStages;
  DI_CUDA_CHECK(
      cudaFuncSetAttribute(gemm_stream_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(ceil_div(tiles, int64_t{kWarps} * tile_groups)), static_cast<unsigned>(slots));
  gemm_stream_ring_kernel<<<grid, 32 * kWarps, smem, stream>>>(p, rows, tile_groups);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
