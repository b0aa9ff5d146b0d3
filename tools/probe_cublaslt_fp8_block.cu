// Probe (device tool, standalone): does this cuBLASLt run DeepSeek-V3's FP8 recipe on the GPU at hand — activations
// e4m3 with one f32 scale per 128 values of a row (VEC128_32F), weights e4m3 with one f32 scale per 128 x 128 block
// (BLK128x128_32F) — which scale layouts it reads, which output types it takes, and how fast, against a bf16
// cuBLASLt GEMM of the same shape in the same run. Also asks for MXFP8 (VEC32_UE8M0), which Hopper is expected to
// refuse.
//   nvcc -O2 -std=c++17 -arch=sm_90a tools/probe_cublaslt_fp8_block.cu -lcublasLt -o /tmp/probe && /tmp/probe
// Output: one line per check / shape. Not part of the build: the engine's path is
// CudaBackend::Impl::lt_matmul_fp8_block (ops/cuda/cuda_backend_impl.h).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

static uint32_t rng = 12345u;
static float frand() {  // [-1, 1)
  rng = rng * 1664525u + 1013904223u;
  return static_cast<float>((rng >> 8) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

struct Problem {
  int m, n, k;
  int kb() const { return (k + 127) / 128; }
  int nb() const { return (n + 127) / 128; }
};

// Reference: out[i][j] = sum_kb sa[kb][i] * sw[j/128][kb] * sum_{k in kb} a[i][k] * w[j][k] (doubles on the host).
static std::vector<double> reference(const Problem& p, const std::vector<__nv_fp8_e4m3>& a,
                                     const std::vector<float>& sa, const std::vector<__nv_fp8_e4m3>& w,
                                     const std::vector<float>& sw, int sw_ld) {
  std::vector<double> out(static_cast<size_t>(p.m) * p.n);
  for (int i = 0; i < p.m; ++i)
    for (int j = 0; j < p.n; ++j) {
      double acc = 0;
      for (int b = 0; b < p.kb(); ++b) {
        double part = 0;
        for (int kk = b * 128; kk < std::min(p.k, b * 128 + 128); ++kk)
          part += static_cast<double>(static_cast<float>(a[static_cast<size_t>(i) * p.k + kk])) *
                  static_cast<float>(w[static_cast<size_t>(j) * p.k + kk]);
        acc += part * sa[static_cast<size_t>(b) * p.m + i] * sw[static_cast<size_t>(j / 128) * sw_ld + b];
      }
      out[static_cast<size_t>(i) * p.n + j] = acc;
    }
  return out;
}

struct Lt {
  cublasLtHandle_t h;
  void* ws;
  size_t ws_bytes = 64ull << 20;
  Lt() {
    cublasLtCreate(&h);
    CK(cudaMalloc(&ws, ws_bytes));
  }
};

// D[n x m col-major] = W (k x n col-major, op T) x A (k x m col-major): out row-major [m][n]. Descriptors and the
// heuristic's first algorithm are made once; run() only launches.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la, lb, lc, ld;
  cublasLtMatmulHeuristicResult_t res[8] = {};
  int got = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  Lt* lt;
  const void *w, *a;
  void* d;
  Plan(Lt& l, const Problem& p, cudaDataType_t ab_type, const void* w_, const void* a_, const void* sw, const void* sa,
       int sw_mode, int sa_mode, cudaDataType_t d_type, void* d_)
      : lt(&l), w(w_), a(a_), d(d_) {
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn));
    if (sw) {
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sw_mode, sizeof(sw_mode));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sa_mode, sizeof(sa_mode));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof(sa));
    }
    cublasLtMatrixLayoutCreate(&la, ab_type, p.k, p.n, p.k);
    cublasLtMatrixLayoutCreate(&lb, ab_type, p.k, p.m, p.k);
    cublasLtMatrixLayoutCreate(&lc, d_type, p.n, p.m, p.n);
    cublasLtMatrixLayoutCreate(&ld, d_type, p.n, p.m, p.n);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &l.ws_bytes,
                                         sizeof(l.ws_bytes));
    status = cublasLtMatmulAlgoGetHeuristic(l.h, op, la, lb, lc, ld, pref, 8, res, &got);
    if (status == CUBLAS_STATUS_SUCCESS && got == 0) status = CUBLAS_STATUS_NOT_SUPPORTED;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  cublasStatus_t run() {
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt->h, op, &alpha, w, la, a, lb, &beta, d, lc, d, ld, &res[0].algo, lt->ws, lt->ws_bytes, 0);
  }
  ~Plan() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
  }
};

template <class T>
static T* upload(const std::vector<T>& v) {
  T* d;
  CK(cudaMalloc(&d, v.size() * sizeof(T)));
  CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Correctness of one layout guess: the weight scales' row stride (kb, or kb rounded up to 4).
static void check(Lt& lt, const Problem& p, bool pad4, cudaDataType_t d_type) {
  const int sw_ld = pad4 ? (p.kb() + 3) / 4 * 4 : p.kb();
  std::vector<__nv_fp8_e4m3> a(static_cast<size_t>(p.m) * p.k), w(static_cast<size_t>(p.n) * p.k);
  for (auto& x : a) x = __nv_fp8_e4m3(frand() * 8.0f);
  for (auto& x : w) x = __nv_fp8_e4m3(frand() * 8.0f);
  std::vector<float> sa(static_cast<size_t>(p.kb()) * p.m), sw(static_cast<size_t>(p.nb()) * sw_ld, 0.0f);
  for (auto& x : sa) x = std::ldexp(1.0f + 0.5f * frand(), static_cast<int>(frand() * 4));
  for (int r = 0; r < p.nb(); ++r)
    for (int b = 0; b < p.kb(); ++b)
      sw[static_cast<size_t>(r) * sw_ld + b] = std::ldexp(1.0f + 0.5f * frand(), static_cast<int>(frand() * 4));
  auto* da = upload(a);
  auto* dw = upload(w);
  auto* dsa = upload(sa);
  auto* dsw = upload(sw);
  const size_t esz = d_type == CUDA_R_32F ? 4 : 2;
  void* d;
  CK(cudaMalloc(&d, static_cast<size_t>(p.m) * p.n * esz));
  Plan plan(lt, p, CUDA_R_8F_E4M3, dw, da, dsw, dsa, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
            CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, d_type, d);
  cublasStatus_t s = plan.run();
  CK(cudaDeviceSynchronize());
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::printf("check m=%d n=%d k=%d pad4=%d out=%s: cublas status %d\n", p.m, p.n, p.k, pad4,
                d_type == CUDA_R_32F ? "f32" : "bf16", static_cast<int>(s));
  } else {
    std::vector<float> got(static_cast<size_t>(p.m) * p.n);
    if (d_type == CUDA_R_32F) {
      CK(cudaMemcpy(got.data(), d, got.size() * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<__nv_bfloat16> g16(got.size());
      CK(cudaMemcpy(g16.data(), d, got.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < got.size(); ++i) got[i] = __bfloat162float(g16[i]);
    }
    const auto ref = reference(p, a, sa, w, sw, sw_ld);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(got[i] - ref[i]));
      scale = std::max(scale, std::fabs(ref[i]));
    }
    std::printf("check m=%d n=%d k=%d pad4=%d out=%s: max |err| %.3g of max |ref| %.3g (rel %.2e) %s\n", p.m, p.n, p.k,
                pad4, d_type == CUDA_R_32F ? "f32" : "bf16", worst, scale, worst / scale,
                worst / scale < (d_type == CUDA_R_32F ? 1e-5 : 8e-3) ? "OK" : "MISMATCH");
  }
  cudaFree(da);
  cudaFree(dw);
  cudaFree(dsa);
  cudaFree(dsw);
  cudaFree(d);
}

static double time_ms(Lt& lt, const Problem& p, bool fp8, cudaDataType_t d_type) {
  const size_t ab = fp8 ? 1 : 2;
  void *a, *w, *d, *sa = nullptr, *sw = nullptr;
  CK(cudaMalloc(&a, static_cast<size_t>(p.m) * p.k * ab));
  CK(cudaMalloc(&w, static_cast<size_t>(p.n) * p.k * ab));
  CK(cudaMalloc(&d, static_cast<size_t>(p.m) * p.n * 4));
  CK(cudaMemset(a, 0x21, static_cast<size_t>(p.m) * p.k * ab));
  CK(cudaMemset(w, 0x1a, static_cast<size_t>(p.n) * p.k * ab));
  if (fp8) {
    std::vector<float> ones(static_cast<size_t>(p.kb()) * std::max(p.m, p.nb() * 4), 1.0f);
    sa = upload(ones);
    sw = upload(ones);
  }
  const cudaDataType_t t = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const int wm = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, am = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  double ms = -1;
  Plan plan(lt, p, t, w, a, fp8 ? sw : nullptr, sa, wm, am, d_type, d);
  if (plan.run() == CUBLAS_STATUS_SUCCESS) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int iters = 20;
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) plan.run();
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float f = 0;
    cudaEventElapsedTime(&f, e0, e1);
    ms = f / iters;
  }
  cudaFree(a);
  cudaFree(w);
  cudaFree(d);
  if (sa) cudaFree(sa);
  if (sw) cudaFree(sw);
  return ms;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s sm_%d%d, cublasLt %zu\n", prop.name, prop.major, prop.minor, cublasLtGetVersion());
  Lt lt;
  // Layout: kb = 8 (a multiple of 4: both guesses agree) and kb = 5 / 6 (they differ); out f32 and bf16.
  for (Problem p : {Problem{256, 384, 1024}, Problem{200, 300, 640}, Problem{64, 256, 768}})
    for (bool pad4 : {false, true})
      for (cudaDataType_t dt : {CUDA_R_32F, CUDA_R_16BF}) check(lt, p, pad4, dt);
  // MXFP8 on this GPU?
  {
    Problem p{256, 256, 256};
    int algos = -1;
    void *a, *w, *d, *s;
    CK(cudaMalloc(&a, 1 << 20));
    CK(cudaMalloc(&w, 1 << 20));
    CK(cudaMalloc(&d, 1 << 20));
    CK(cudaMalloc(&s, 1 << 20));
    Plan plan(lt, p, CUDA_R_8F_E4M3, w, a, s, s, CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
              CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, CUDA_R_16BF, d);
    algos = plan.got;
    const cublasStatus_t st = plan.status;
    std::printf("mxfp8 (VEC32_UE8M0) heuristic: status %d, %d algos\n", static_cast<int>(st), algos);
  }
  // Speed: V3 shapes at prefill 8192 tokens (q_a, q_b, kv_a, o, dense gate, expert-sized gate at 256 rows).
  const Problem shapes[] = {{8192, 1536, 7168},  {8192, 24576, 1536}, {8192, 576, 7168},  {8192, 7168, 16384},
                            {8192, 18432, 7168}, {8192, 7168, 18432}, {4096, 7168, 2048}, {256, 2048, 7168},
                            {2048, 2048, 7168},  {16384, 2048, 7168}};
  for (const Problem& p : shapes) {
    const double flop = 2.0 * p.m * p.n * p.k;
    const double f8 = time_ms(lt, p, true, CUDA_R_32F), f8b = time_ms(lt, p, true, CUDA_R_16BF),
                 b16 = time_ms(lt, p, false, CUDA_R_32F);
    std::printf(
        "m=%d n=%d k=%d: fp8 block (f32 out) %.3f ms %.0f TFLOP/s | fp8 block (bf16 out) %.3f ms %.0f | bf16 %.3f ms "
        "%.0f\n",
        p.m, p.n, p.k, f8, flop / f8 / 1e9, f8b, flop / f8b / 1e9, b16, flop / b16 / 1e9);
  }
  return 0;
}
