// The bf16 tensor-core tile for many rows (WMMA 16x16x16 on 64x128x32 tiles: weights dequantized into shared memory as
// bf16, A rounded to bf16, fp32 accumulation), and the dequantization of block formats to bf16 for cuBLASLt
// (dequant_bf16.h).
#include "deepinfer/ops/cuda/dequant_bf16.h"
#include "deepinfer/ops/cuda/gemm_common.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"

#include <mma.h>

#include <algorithm>

namespace deepinfer::cuda {
namespace {

// ---------------------------------------------------------------------------- bf16 tensor-core kernel
constexpr int kTcM = kGemmTileM, kTcN = 128, kTcK = 32, kTcThreads = 256, kTcLd = kTcK + 8, kTcLdC = kTcN + 4;
struct TcInputs {
  __nv_bfloat16 a[kTcM][kTcLd];
  __nv_bfloat16 b[kTcN][kTcLd];
};
union TcShared {
  TcInputs in;
  float c[kTcM][kTcLdC];
};

// One k-step's global data held in registers while the previous step computes (vector path only).
struct TcStage {
  float4 a[2];
  uint4 b;  // FP8: 16 codes; MXFP4: 16 codes in .x/.y
  float bs;
};

template <QuantFormat F>
__device__ __forceinline__ void tc_load(const GemmKernelParams& p, const void* b, const void* s, const int64_t* a_row,
                                        int64_t n0, int64_t k0, TcStage& st) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int idx = tid + e * kTcThreads, r = idx / 8;
    const int64_t k = k0 + (idx % 8) * 4, ar = a_row[r];
    st.a[e] =
        (ar >= 0 && k < p.k) ? __ldg(reinterpret_cast<const float4*>(p.a + ar * p.lda + k)) : make_float4(0, 0, 0, 0);
  }
  const int r = tid / 2, half = tid % 2;
  const int64_t n = n0 + r;
  st.b = make_uint4(0, 0, 0, 0);
  st.bs = 0.0f;
  if constexpr (F == QuantFormat::kMXFP4) {
    const int64_t k = k0 + 16 * half;
    if (n < p.n && k < p.k) {
      const uint2 q = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(b) + n * (p.k / 2) + k / 2));
      st.b.x = q.x;
      st.b.y = q.y;
      st.bs = block_scale(s, p, F, n, k);
    }
  } else {
    const int64_t k = k0 + 16 * half;
    if (n < p.n && k < p.k) {
      st.b = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(b) + n * p.k + k));
      st.bs = block_scale(s, p, F, n, k);
    }
  }
}

template <QuantFormat F>
__device__ __forceinline__ void tc_store(const TcStage& st, TcInputs& in) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int idx = tid + e * kTcThreads, r = idx / 8, c = (idx % 8) * 4;
    in.a[r][c] = __float2bfloat16_rn(st.a[e].x);
    in.a[r][c + 1] = __float2bfloat16_rn(st.a[e].y);
    in.a[r][c + 2] = __float2bfloat16_rn(st.a[e].z);
    in.a[r][c + 3] = __float2bfloat16_rn(st.a[e].w);
  }
  const int r = tid / 2, c0 = 16 * (tid % 2);
  float w[16];
  float sc = st.bs;
  if constexpr (F == QuantFormat::kMXFP4) {
    const uint32_t words[2] = {st.b.x, st.b.y};
    decode_fp4<8>(words, w);
    sc *= kFp4Unscale;
  } else {
    decode_fp8x16(st.b, w);
  }
#pragma unroll
  for (int j = 0; j < 16; j += 2)
    *reinterpret_cast<__nv_bfloat162*>(&in.b[r][c0 + j]) = __floats2bfloat162_rn(w[j] * sc, w[j + 1] * sc);
}

// Scalar staging for shapes the vector path does not cover (odd K, unaligned rows): correct, slow.
template <QuantFormat F>
__device__ __forceinline__ void tc_stage_scalar(const GemmKernelParams& p, const void* b, const void* s,
                                                const int64_t* a_row, int64_t n0, int64_t k0, TcInputs& in) {
  for (int idx = threadIdx.x; idx < kTcM * kTcK; idx += kTcThreads) {
    const int r = idx / kTcK, kk = idx % kTcK;
    const int64_t k = k0 + kk, ar = a_row[r];
    in.a[r][kk] = __float2bfloat16_rn((ar >= 0 && k < p.k) ? p.a[ar * p.lda + k] : 0.0f);
  }
  for (int idx = threadIdx.x; idx < kTcN * kTcK; idx += kTcThreads) {
    const int r = idx / kTcK, kk = idx % kTcK;
    const int64_t k = k0 + kk, n = n0 + r;
    in.b[r][kk] = __float2bfloat16_rn((n < p.n && k < p.k) ? load_weight<F>(b, s, p, n, k) : 0.0f);
  }
}

template <QuantFormat F, bool kVec>
__global__ void __launch_bounds__(kTcThreads) gemm_tc_kernel(GemmKernelParams p) {
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(128) TcShared sm;
  __shared__ int64_t a_row[kTcM], c_row[kTcM];

  int g;
  int64_t row_begin, row_end;
  if (!gemm_tile_rows(p, blockIdx.x, 1, g, row_begin, row_end)) return;
  const void* b = p.b_table ? p.b_table[g] : p.b;
  const void* s = p.b_scale_table ? p.b_scale_table[g] : p.b_scale;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTcN;
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / 4, wn = warp % 4;
  if (tid < kTcM) {
    const int64_t i = row_begin + tid;
    const bool valid = i < row_end;
    a_row[tid] = !valid ? -1 : (p.a_rows ? p.a_rows[i] / p.a_row_div : i);
    c_row[tid] = !valid ? -1 : (p.c_rows ? p.c_rows[i] : i);
  }
  __syncthreads();

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  TcStage st;
  if constexpr (kVec) tc_load<F>(p, b, s, a_row, n0, 0, st);
  for (int64_t k0 = 0; k0 < p.k; k0 += kTcK) {
    if constexpr (kVec) {
      tc_store<F>(st, sm.in);
    } else {
      tc_stage_scalar<F>(p, b, s, a_row, n0, k0, sm.in);
    }
    __syncthreads();
    if constexpr (kVec) {
      if (k0 + kTcK < p.k) tc_load<F>(p, b, s, a_row, n0, k0 + kTcK, st);  // in flight during the MMAs
    }
#pragma unroll
    for (int kk = 0; kk < kTcK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sm.in.a[wm * 32 + i * 16][kk], kTcLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sm.in.b[wn * 32 + j * 16][kk], kTcLd);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&sm.c[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kTcLdC, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kTcM * kTcN; idx += kTcThreads) {
    const int r = idx / kTcN, cc = idx % kTcN;
    const int64_t cr = c_row[r], n = n0 + cc;
    if (cr >= 0 && n < p.n) p.c[cr * p.ldc + n] = sm.c[r][cc];
  }
}

// ---------------------------------------------------------------------------- dequantize to bf16 (vector path)
// One 16-byte weight chunk per thread step (16 FP8 or 32 MXFP4 values), written as bf16 with 16-byte stores.
template <QuantFormat F>
__global__ void dequant_bf16_kernel(GemmKernelParams p, __nv_bfloat16* out) {
  constexpr int kVals = F == QuantFormat::kMXFP4 ? 32 : 16;
  const int64_t per_row = p.k / kVals, total = p.n * per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = idx / per_row, k = (idx - n * per_row) * kVals;
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(p.b) + idx);
    float w[kVals];
    float sc = block_scale(p.b_scale, p, F, n, k);
    if constexpr (F == QuantFormat::kMXFP4) {
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      decode_fp4<16>(words, w);
      sc *= kFp4Unscale;
    } else {
      decode_fp8x16(q, w);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + n * p.k + k);
#pragma unroll
    for (int v = 0; v < kVals / 8; ++v) {
      uint32_t packed[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(w[8 * v + 2 * j] * sc, w[8 * v + 2 * j + 1] * sc);
        packed[j] = *reinterpret_cast<const uint32_t*>(&h);
      }
      dst[v] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
}

template <QuantFormat F>
void launch_tc(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  const int64_t tiles_m = p.group_offsets ? p.max_tiles_m : ceil_div(p.m, kTcM);
  const int64_t tiles_n = ceil_div(p.n, kTcN);
  DI_CHECK(tiles_n <= 65535) << "gemm: n = " << p.n << " is too large for one launch";
  const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n));
  if (vec)
    gemm_tc_kernel<F, true><<<grid, kTcThreads, 0, stream>>>(p);
  else
    gemm_tc_kernel<F, false><<<grid, kTcThreads, 0, stream>>>(p);
}

}  // namespace

void run_gemm_tc(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  static_assert(kTcM == kGemmTileM, "grouped tile offsets are counted in kGemmTileM rows");
  with_format(p.format, [&](auto f) { launch_tc<decltype(f)::value>(p, vec, stream); });
}

bool run_dequantize_bf16(const GemmKernelParams& p, void* out, cudaStream_t stream) {
  if (p.b_table || !gemm_vector_ok(p, false) || reinterpret_cast<uintptr_t>(out) % 16 != 0) return false;
  if (p.n * p.k == 0) return true;
  const int64_t chunks = p.n * p.k / (p.format == QuantFormat::kMXFP4 ? 32 : 16);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(chunks, 256), 4 * 65536));
  auto* o = static_cast<__nv_bfloat16*>(out);
  switch (p.format) {
    case QuantFormat::kFP8Block:
      dequant_bf16_kernel<QuantFormat::kFP8Block><<<blocks, 256, 0, stream>>>(p, o);
      break;
    case QuantFormat::kMXFP4:
      dequant_bf16_kernel<QuantFormat::kMXFP4><<<blocks, 256, 0, stream>>>(p, o);
      break;
    case QuantFormat::kFP8Row32:
      dequant_bf16_kernel<QuantFormat::kFP8Row32><<<blocks, 256, 0, stream>>>(p, o);
      break;
    default:
      return false;
  }
  DI_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace deepinfer::cuda
