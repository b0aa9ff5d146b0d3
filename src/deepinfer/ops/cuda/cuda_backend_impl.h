// CudaBackend's state and what its ops share (not a public API): the checks of an op's tensors, the stream,
// allocator, workspace and cuBLASLt plans, and the dense / grouped GEMM paths (cuda_backend_impl.cc). The ops are in
// cuda_backend*.cc, a file a family.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/cuda/dequant_bf16.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_rows_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/gemm_wgmma_fp8.h"
#include "deepinfer/ops/cuda/grouped_linear.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/tensor_memory_cuda.h"

namespace deepinfer {

// The helpers the backend's files share (internal: this header is included by cuda_backend*.cc only).
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr size_t kCublasWorkspaceBytes = 32ull << 20;
// Batch-invariant MoE calls of at least this many (token, expert) slots get bf16 copies of x and h (run_moe).
constexpr int64_t kInvariantBf16Slots = 64;
// Tokens a MoE call takes in one chunk at least, whatever its intermediates weigh (run_moe).
constexpr int64_t kMoeChunkTokens = 8192;

inline void expect_on(const char* op, const char* field, const Tensor& t, const Device& dev) {
  if (t.data() == nullptr) return;  // an absent optional field (Tensor{}) or an empty tensor
  DI_CHECK(t.device() == dev) << op << ": '" << field << "' must be on cuda:" << dev.index << ", got "
                              << (t.device().kind == DeviceKind::kCPU ? std::string("cpu")
                                                                      : "cuda:" + std::to_string(t.device().index));
}

template <typename T>
const T* cptr(const Tensor& t) {
  return t.data() ? t.data_as<T>() : nullptr;
}

// Validates one quantized matrix of logical shape [n, k] (k = -1: any).
inline void validate_quant(const char* op, const char* field, const QuantMatrix& m, const Device& dev) {
  DI_CHECK(m.weight.data() && m.weight.rank() == 2) << op << ": '" << field << "' weight must be a matrix";
  DI_CHECK(m.weight.is_contiguous()) << op << ": '" << field << "' must be contiguous";
  expect_on(op, field, m.weight, dev);
  const int64_t n = m.weight.dim(0), k = m.cols();
  switch (m.format) {
    case QuantFormat::kFloat:
      DI_CHECK(m.weight.dtype() == DType::kF32 || m.weight.dtype() == DType::kBF16)
          << op << ": '" << field << "' float weight must be f32 or bf16, got " << m.weight.str();
      break;
    case QuantFormat::kFP8Block:
    case QuantFormat::kFP8Row32: {
      DI_CHECK(m.weight.dtype() == DType::kF8E4M3) << op << ": '" << field << "' must be fp8_e4m3";
      DI_CHECK(m.scale.dtype() == DType::kE8M0 || m.scale.dtype() == DType::kF32) << op << ": scale dtype";
      const bool block = m.format == QuantFormat::kFP8Block;
      DI_CHECK(!block || (m.block_n > 0 && m.block_k > 0)) << op << ": block sizes must be positive";
      const Shape want = block ? Shape{ceil_div(n, m.block_n), ceil_div(k, m.block_k)} : Shape{n, ceil_div(k, 32)};
      DI_CHECK(m.scale.shape() == want && m.scale.is_contiguous())
          << op << ": '" << field << "' scale must be " << shape_str(want) << ", got " << m.scale.str();
      expect_on(op, field, m.scale, dev);
      break;
    }
    case QuantFormat::kMXFP4:
      DI_CHECK(m.weight.dtype() == DType::kU8 || m.weight.dtype() == DType::kI8) << op << ": MXFP4 weight is u8/i8";
      DI_CHECK(m.scale.dtype() == DType::kE8M0 && m.scale.shape() == Shape({n, k / 32}) && m.scale.is_contiguous())
          << op << ": '" << field << "' MXFP4 scale must be e8m0 [" << n << ", " << k / 32 << "], got "
          << m.scale.str();
      expect_on(op, field, m.scale, dev);
      break;
  }
}

// A GEMM's activation rows as e4m3 codes with one f32 scale a row and 128-K block (act_codes' block-128 form, row
// stride K), for the streaming kernel over f32-scaled FP8 weights (gemm_stream_mma.h); empty: none.
struct ActCodes {
  const uint8_t* e4m3 = nullptr;
  const uint8_t* scale = nullptr;
  explicit operator bool() const { return e4m3 != nullptr; }
};

struct CudaBackend::Impl {
  cuda::DeviceInfo info;
  Device device;
  cuda::Stream stream;
  // A second stream for work that may run beside the stream's (on_side_stream), and the events that fork it from the
  // stream and join it back (both recordable inside a graph capture: the fork brings the side stream into it).
  cuda::Stream side_stream;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;
  cudaStream_t active_stream = nullptr;  // while on_side_stream runs: the side stream, which s() then returns
  cuda::DeviceAllocator alloc;
  cuda::WorkspaceArena arena{alloc};  // the shared one; ws() is the one ops use now
  cuda::WorkspaceArena* active_arena = &arena;
  cuda::DeviceStatus status{alloc};
  cublasLtHandle_t lt = nullptr;
  cuda::DeviceBuffer lt_workspace;
  // hc_mix's per-token-tile arrival counters (zero between calls: the kernel resets them). Allocated here, not on
  // first use, because a first use may be inside a recording, where nothing may be uploaded.
  cuda::DeviceBuffer hc_mix_arrivals;
  cuda::DeviceTensorMemory memory{device, alloc, stream.get(), status};
  LinearPrecision linear_precision = LinearPrecision::kF32;
  bool batch_invariant = false;  // set_batch_invariant
  cuda::KernelChoices choices;   // set_kernel_choices
  // grouped_linear_quant's plans (grouped_output_one_launch), by weight, scales, groups, rows a group and the weight's
  // shape: made on a call's first use outside a capture (a plan uploads its tables) from the shared cache (not a
  // recording's pool), kept while the backend lives (weights are static).
  std::map<std::tuple<const void*, const void*, int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<GroupedLinearPlan>>
      grouped_plans;

  // Device copies of per-expert pointer tables, keyed by the host vector they describe; re-uploaded only
  // when the pointers change (weights are static, so normally once per layer).
  struct PtrTable {
    std::vector<const void*> host;
    cuda::DeviceBuffer dev;
  };
  std::unordered_map<const void*, PtrTable> tables[6];
  // The FP8 expert GEMM's fold exponents (gemm_wgmma_fp8.h) of MXFP4 routed experts, per matrix (w1, w3, w2) and
  // experts vector, built by the fold kernel on first use (weights are static), with one sync to learn whether every
  // row folds exactly.
  struct FoldTable {
    std::vector<const void*> host;  // the code pointers it was built from
    cuda::DeviceBuffer refs;        // [experts, rows]
    bool fits = false;
  };
  std::unordered_map<const void*, FoldTable> folds[3];

  explicit Impl(int index) : info(cuda::select_device(index)), device(Device::cuda(index)) {
    DI_CUBLAS_CHECK(cublasLtCreate(&lt));
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
    lt_workspace = cuda::DeviceBuffer(alloc, kCublasWorkspaceBytes);
    hc_mix_arrivals = cuda::DeviceBuffer(alloc, sizeof(unsigned) * cuda::kHcMixArrivalSlots);
    // A plain cudaMemset runs on the legacy default stream, which the backend's non-blocking stream does not wait
    // for: finish it before any kernel can read the counters.
    DI_CUDA_CHECK(cudaMemset(hc_mix_arrivals.data(), 0, hc_mix_arrivals.size()));
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    // The rows kernel's rule asks these per launch: asked here first, so never first inside a graph capture.
    for (int size = 2; size <= 8; ++size) cuda::gemm_rows_mma_cluster_slots(size);
  }
  ~Impl() {
    for (auto& [unused, p] : lt_plans) destroy(p);
    for (auto& [unused, p] : lt_batched_plans) destroy(p);
    if (lt) cublasLtDestroy(lt);
    if (join_event) cudaEventDestroy(join_event);
    if (fork_event) cudaEventDestroy(fork_event);
  }

  cudaStream_t s() const { return active_stream ? active_stream : stream.get(); }
  // Enqueues fn's work (everything it sends to s()) on the side stream, after all the stream holds so far; the stream
  // goes on without waiting until join_side_stream. fn must not use what the stream's later work writes, nor cuBLASLt
  // (one workspace for both).
  template <class Fn>
  void on_side_stream(Fn&& fn) {
    DI_CHECK_INTERNAL(!active_stream) << "on_side_stream: already on the side stream";
    DI_CUDA_CHECK(cudaEventRecord(fork_event, stream.get()));
    DI_CUDA_CHECK(cudaStreamWaitEvent(side_stream.get(), fork_event, 0));
    struct Restore {
      cudaStream_t& active;
      ~Restore() { active = nullptr; }
    } restore{active_stream};
    active_stream = side_stream.get();
    fn();
    DI_CUDA_CHECK(cudaEventRecord(join_event, side_stream.get()));
  }
  // The stream waits for the side stream's work so far.
  void join_side_stream() { DI_CUDA_CHECK(cudaStreamWaitEvent(stream.get(), join_event, 0)); }
  // Scratch of the ops: the shared arena, or a recording pool's own while recording.
  cuda::WorkspaceArena& ws() { return *active_arena; }

  const void* const* table(int role, const void* key, const std::vector<const void*>& ptrs) {
    PtrTable& t = tables[role][key];
    if (t.host != ptrs || !t.dev.data()) {
      cuda::ScopedAllocatorPool shared(alloc, nullptr);  // the table outlives any recording that first needs it
      t.dev = cuda::DeviceBuffer(alloc, sizeof(void*) * ptrs.size());
      DI_CUDA_CHECK(
          cudaMemcpyAsync(t.dev.data(), ptrs.data(), sizeof(void*) * ptrs.size(), cudaMemcpyHostToDevice, s()));
      // The source is pageable host memory; wait so that the vector may change right after (rare path).
      DI_CUDA_CHECK(cudaStreamSynchronize(s()));
      t.host = ptrs;
    }
    return t.dev.data_as<const void* const>();
  }

  // Matrix `which`'s fold exponents ([groups, n]; codes / scales: the device pointer tables of `ptrs` and of their
  // scales), or nullptr when some row does not fold into e4m3 exactly (those matrices take the bf16 kernel) or when
  // they are not built yet and the stream is recording (a first use builds them outside a recording).
  const uint8_t* mxfp4_fold(int which, const void* key, const std::vector<const void*>& ptrs, const void* const* codes,
                            const void* const* scales, int64_t n, int64_t k);

  // A cuBLASLt matmul for one (M, N, K, type): descriptors and the heuristic's algorithm, built once. Decode
  // repeats the same few shapes every token, and the heuristic query costs more than the tiny GEMM itself.
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // m, n, k, ldc, C's alignment (0: the default 256 bytes), type
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int, int>, LtPlan> lt_plans;
  static constexpr size_t kMaxLtPlans = 4096;  // prefill chunk lengths vary: bound the cache

  static void destroy(LtPlan& p) {
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
  }

  // block_scaled (type e4m3): DeepSeek-V3's FP8 recipe, the weight (cuBLASLt's A) with one f32 scale a 128 x 128 block
  // (BLK128x128_32F), the activations (B) one a row's 128 values (VEC128_32F); the scale pointers are set per call.
  // ldc: out's row stride (0: n); c_align: the alignment in bytes of out and its rows when less than cuBLASLt's
  // default 256 (0: the default).
  const LtPlan& lt_plan(cudaDataType_t type, int64_t m, int64_t n, int64_t k, bool block_scaled = false,
                        int64_t ldc = 0, int c_align = 0);
  // p.algo: the heuristic's first algorithm for p's descriptors within the workspace (kUnsupported when it has none;
  // `shape` names the call in the error), for C and D aligned to c_align bytes when set.
  void pick_algo(LtPlan& p, const std::string& shape, int c_align = 0);

  // out[M, N] (f32, row-major) = x[M, K] · w[N, K]ᵀ with x and w both f32 or both bf16, fp32 accumulate;
  // `accumulate`: out += x · wᵀ (beta 1: the epilogue adds the fp32 product to out, one rounding). `ldc`: out's row
  // stride (0: n), e.g. gate and up written into the two halves of one [M, 2·I] SwiGLU input.
  // Row-major C = X·Wᵀ is column-major Cᵀ = W·Xᵀ: A = W (transposed), B = X, no copies.
  void lt_matmul(const void* x, const void* w, cudaDataType_t type, float* out, int64_t m, int64_t n, int64_t k,
                 bool accumulate = false, int64_t ldc = 0) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      if (!accumulate)
        DI_CUDA_CHECK(cudaMemset2DAsync(out, sizeof(float) * (ldc > 0 ? ldc : n), 0, sizeof(float) * n, m, s()));
      return;
    }
    // A strided out (a half of a wider row) may sit off cuBLASLt's assumed 256-byte alignment: tell the heuristic.
    int c_align = 0;
    if (ldc > 0) {
      const auto bits = reinterpret_cast<uintptr_t>(out) | static_cast<uintptr_t>(sizeof(float) * ldc) | 256;
      c_align = static_cast<int>(bits & (~bits + 1));  // the lowest set bit: the largest power of two dividing both
      if (c_align == 256) c_align = 0;                 // the default: the unstrided calls' plan
    }
    const LtPlan& p = lt_plan(type, m, n, k, false, ldc, c_align);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    DI_CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                   lt_workspace.data(), lt_workspace.size(), s()));
  }

  // out[M, N] (f32) = (x_codes · x_scales)[M, K] · (w_codes · w_scales)[N, K]ᵀ on cuBLASLt's block-scaled FP8 GEMM
  // (Hopper): x_scales block-major [K / 128][M] (VEC128_32F), w_scales [ceil(N / 128)][K / 128] row-major with K / 128
  // % 4 == 0 (BLK128x128_32F reads rows padded to 4 blocks: H100, cuBLAS 13.1, tools/probe_cublaslt_fp8_block.cu). The
  // tensor cores sum each k32 slice in less than fp32 and cuBLASLt promotes per 128 K, as DeepGEMM does.
  // p: its plan (lt_fp8_block_plan).
  void lt_matmul_fp8_block(const LtPlan& p, const uint8_t* x_codes, const float* x_scales, const void* w_codes,
                           const float* w_scales, float* out) {
    DI_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
    DI_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
    const float alpha = 1.0f, beta = 0.0f;
    DI_CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &alpha, w_codes, p.a, x_codes, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                   lt_workspace.data(), lt_workspace.size(), s()));
  }
  // The block-scaled FP8 plan of this shape, or nullptr where cuBLASLt has no algorithm (some row counts: M = 1 on the
  // H100 with cuBLAS 13.1, CUBLAS_STATUS_NOT_SUPPORTED); a refusal is remembered, so the question costs one heuristic
  // query a shape.
  std::set<std::tuple<int64_t, int64_t, int64_t>> lt_fp8_block_refused;
  const LtPlan* lt_fp8_block_plan(int64_t m, int64_t n, int64_t k) {
    const auto key = std::make_tuple(m, n, k);
    if (lt_fp8_block_refused.count(key)) return nullptr;
    try {
      return &lt_plan(CUDA_R_8F_E4M3, m, n, k, true);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) throw;
      lt_fp8_block_refused.insert(key);
      return nullptr;
    }
  }
  // Whether lt_matmul_fp8_block takes w (and rows of K values): FP8 blocks of 128 x 128 with f32 scales whose rows are
  // whole groups of 4 blocks, 16-byte aligned codes and scales, N % 4 == 0 (16-byte f32 output rows).
  static bool lt_fp8_block_weight(const QuantMatrix& w) {
    const int64_t k = w.cols();
    const auto a16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    return w.format == QuantFormat::kFP8Block && w.block_n == 128 && w.block_k == 128 && w.scale.data() &&
           w.scale.dtype() == DType::kF32 && w.scale.rank() == 2 && w.scale.is_contiguous() && k % 512 == 0 &&
           w.scale.dim(1) == k / 128 && w.rows() % 4 == 0 && a16(w.weight.data()) && a16(w.scale.data());
  }

  // Column-major D[b] (rows x cols, ldd) = op_a(A[b]) (rows x k) · op_b(B[b]) (k x cols) + beta · D[b] for b < batch,
  // each operand at its base + b · stride; f32 A and B computed in full fp32 (no TF32 unless asked), or bf16 A and B
  // (bf16 products, fp32 sums); D f32. Descriptors and algorithm built once a shape.
  struct LtBatched {
    bool trans_a = false, trans_b = false;
    int64_t rows = 0, cols = 0, k = 0, batch = 1;
    const void* a = nullptr;
    int64_t lda = 0, stride_a = 0;
    const void* b = nullptr;
    int64_t ldb = 0, stride_b = 0;
    float* d = nullptr;
    int64_t ldd = 0, stride_d = 0;
    bool tf32 = false;  // f32 A and B: TF32 tensor-core products (KernelChoices::mla_tf32) instead of full fp32
    bool bf16 = false;  // A and B are bf16
    float beta = 0.0f;
  };
  std::map<std::array<int64_t, 14>, LtPlan> lt_batched_plans;
  void lt_batched(const LtBatched& g);

  // The own GEMM (gemm_cuda.cu) under this backend's kernel choices.
  void run_gemm(cuda::GemmKernelParams g) {
    g.choices = choices.gemm;
    cuda::run_gemm(g, s());
  }

  // out[M, N] = x[M, K] · w[N, K]ᵀ, all f32: cuBLASLt in full fp32, or in batch-invariant mode the own GEMM
  // (cuBLASLt's algorithm, and so a row's summation order, changes with M).
  void f32_matmul(const float* x, const float* w, float* out, int64_t m, int64_t n, int64_t k) {
    if (!batch_invariant) {
      lt_matmul(x, w, CUDA_R_32F, out, m, n, k);
      return;
    }
    cuda::GemmKernelParams g;
    g.a = x;
    g.lda = k;
    g.c = out;
    g.ldc = n;
    g.m = m;
    g.n = n;
    g.k = k;
    g.b = w;
    g.batch_invariant = true;
    run_gemm(g);
  }

  // A dense GEMM out[m, ldc] (first w.rows() columns) = in[m, lda] · dequant(w)ᵀ (non-float formats; in_bf16: an
  // optional bf16 copy of in, same lda).
  static cuda::GemmKernelParams dense_params(const float* in, const void* in_bf16, int64_t lda, const QuantMatrix& w,
                                             float* out, int64_t ldc, int64_t m) {
    cuda::GemmKernelParams g;
    g.a = in;
    g.a_bf16 = in_bf16;
    g.lda = lda;
    g.c = out;
    g.ldc = ldc;
    g.m = m;
    set_weight(g, w);
    return g;
  }
  // Whether w's block scales are UE8M0 bytes (or it has none).
  static bool e8m0_scales(const QuantMatrix& w) { return w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0; }
  // Fills the weight fields of a dense GEMM from a QuantMatrix (non-float formats).
  static void set_weight(cuda::GemmKernelParams& g, const QuantMatrix& w) {
    g.format = w.format;
    g.b = w.weight.data();
    g.b_scale = w.scale.data();
    g.scale_e8m0 = e8m0_scales(w);
    g.block_n = w.block_n;
    g.block_k = w.block_k;
    g.scale_cols = w.scale.rank() == 2 ? w.scale.dim(1) : 0;
    g.n = w.rows();
    g.k = w.cols();
  }

  // out[M, N] = in[M, K] · dequant(w)ᵀ; bf16 and f32 weights through cuBLASLt. split_in (bf16 weights,
  // QuantLinearParams): `in` as two bf16 terms, near-f32 products.
  // Sets a GEMM's A codes to `codes` (none when empty); kernels other than the streaming one read g.a.
  static void attach_codes(cuda::GemmKernelParams& g, ActCodes codes) {
    g.a_e4m3 = codes.e4m3;
    g.a_scale = codes.scale;
    g.a_scale_block128 = static_cast<bool>(codes);
  }
  // Under --activation-quant fp8 (q block-128), the codes of x's [rows, w.cols()] rows in ws() (the caller holds the
  // scope) when a dense GEMM of them against w takes the streaming kernel over f32-scaled FP8 blocks; else none and
  // nothing enqueued.
  ActCodes stream_act_codes(const float* x, int64_t rows, const QuantMatrix& w, ActQuant q) {
    if (!stream_codes_take(w, rows, q) || !cuda::gemm_stream_mma_takes_shape(rows, w.rows(), 1, choices.gemm))
      return {};
    return group_act_codes(x, rows, w.cols(), q);
  }
  // Whether GEMMs of `rows` rows a weight (a group's, or a dense call's) against w read the codes under q.
  bool stream_codes_take(const QuantMatrix& w, int64_t rows, ActQuant q) const {
    return stream_codes_take(w.format, e8m0_scales(w), w.block_n, w.block_k, w.cols(), rows, q) &&
           rows < lt_min_rows(w);
  }
  bool stream_codes_take(QuantFormat format, bool e8m0, int block_n, int block_k, int64_t k, int64_t rows,
                         ActQuant q) const {
    return act_quant_block128(q) && !batch_invariant && !e8m0 && k % 128 == 0 && rows >= 1 &&
           rows <= cuda::kGemmStreamMmaMaxRows &&
           cuda::gemm_stream_mma_takes_f32_scales(format, block_n, block_k, k, choices.gemm);
  }
  // x's [rows, k] rows as q's block-128 codes in ws() (the caller holds the scope).
  ActCodes group_act_codes(const float* x, int64_t rows, int64_t k, ActQuant q) {
    uint8_t* codes = ws().take_as<uint8_t>(rows * k);
    uint8_t* scales = ws().take_as<uint8_t>(rows * k / 32);
    act_codes(x, rows, k, q, codes, scales);
    return {codes, scales};
  }
  void quant_linear(const float* in, const QuantMatrix& w, float* out, int64_t m, bool split_in = false,
                    ActCodes codes = {});
  // Batch-invariant mode: whether a GEMM of `rows` rows (per group) with weight w takes the invariant tile kernel
  // (gemm_invariant_mma.h), which reads a bf16 copy of A when it gets one (the same values it would round itself).
  static bool invariant_tile(const QuantMatrix& w, int64_t rows) {
    const bool e8m0 = e8m0_scales(w);
    return rows > cuda::kGemmStreamMmaMaxRows &&
           cuda::gemm_invariant_mma_takes(w.format, e8m0, w.block_n, w.block_k, w.cols());
  }
  // dequant(w) as bf16 [w.rows(), w.cols()] at out (block formats).
  void dequantize_bf16(const QuantMatrix& w, void* out) {
    cuda::GemmKernelParams wp;
    set_weight(wp, w);
    if (cuda::run_dequantize_bf16(wp, out, s())) return;
    cuda::DequantizeKernelParams dq;
    dq.weight = w.weight.data();
    dq.scale = w.scale.data();
    dq.scale_e8m0 = wp.scale_e8m0;
    dq.format = w.format;
    dq.n = w.rows();
    dq.k = w.cols();
    dq.scale_cols = wp.scale_cols;
    dq.block_n = w.block_n;
    dq.block_k = w.block_k;
    dq.out_bf16 = out;
    cuda::run_dequantize(dq, s());
  }
  // A bf16 (RNE) copy of n floats in scratch from ws(): the caller holds the scope.
  const void* bf16_copy(const float* in, int64_t n) {
    void* out = ws().take(sizeof(uint16_t) * n);
    cuda::run_cast_f32_to_bf16(in, out, n, s());
    return out;
  }

  // The most rows of a block-format linear that the own tensor-core kernels take from the stored codes when their
  // tiles fill the device; past it cuBLASLt's bf16 GEMM over a dequantized scratch, near the bf16 peak. H200, session
  // 17, slice decode projections (ms a step, scratch vs direct): V4-Flash b64 1.008 / 0.916, b128 1.017 / 0.984,
  // b256 1.201 / 1.252 (compute-bound there: cuBLASLt's rate wins); V4.1 b256 2.138 / 2.288.
  // GemmChoices::decode_direct_max_rows overrides it (a same-build A/B).
  static constexpr int64_t kDecodeDirectMaxRows = 128;
  int64_t decode_direct_rows() const {
    return choices.gemm.decode_direct_max_rows >= 0 ? choices.gemm.decode_direct_max_rows : kDecodeDirectMaxRows;
  }
  bool decode_direct(int64_t m, int64_t n) const {
    return m <= decode_direct_rows() && cuda::gemm_mma_dense_fills(m, n);
  }

  // The params of out[m, ldc] (first w.rows() columns) = in · dequant(w)ᵀ through the wgmma kernel split along K
  // (gemm_wgmma.h), with its k_splits: 1 when the call does not go that way (past decode_direct's rows, or a call the
  // kernel does not split), and then the caller takes another path. in_bf16: the bf16 copy of in (row stride lda).
  cuda::GemmKernelParams split_k_params(const float* in, const void* in_bf16, int64_t lda, const QuantMatrix& w,
                                        float* out, int64_t ldc, int64_t m) const {
    cuda::GemmKernelParams g = dense_params(in, in_bf16, lda, w, out, ldc, m);
    g.choices = choices.gemm;
    g.k_splits = m <= decode_direct_rows() ? cuda::gemm_wgmma_k_splits(g, info.sm_count) : 1;
    return g;
  }
  // Runs split_k_params' call with its partials in scratch from ws() (the caller holds the scope).
  void run_split_k(cuda::GemmKernelParams g) {
    g.split_part = ws().take_as<float>(static_cast<int64_t>(g.k_splits) * g.m * g.n);
    run_gemm(g);
  }

  // Rows from which a block-format linear goes through cuBLASLt (bf16 scratch) instead of the own kernels:
  // past the streaming kernel's few rows. The tensor-core kernel's 64x128 tiles leave most SMs idle for a
  // dense M of a few rows and N of a few thousand; it serves the grouped MoE, where tiles come from many
  // experts.
  // UE8M0 block formats stream through the tensor cores up to kGemmStreamMmaMaxRows rows (weights read once), or up
  // to GemmChoices::stream_mma_max_rows when that is larger (a same-build A/B of the streaming kernel's 8-row passes
  // against the scratch path); f32-scaled FP8 blocks too when the kernel takes them (f32_scale_mma).
  int64_t lt_min_rows(const QuantMatrix& w) const {
    if (w.scale.dtype() != DType::kE8M0 &&
        !cuda::gemm_stream_mma_takes_f32_scales(w.format, w.block_n, w.block_k, w.cols(), choices.gemm))
      return cuda::kGemmSkinnyRows + 1;
    return std::max(choices.gemm.stream_mma_max_rows, cuda::kGemmStreamMmaMaxRows) + 1;
  }
  // Whether a dense block-format GEMM of m rows against w goes through cuBLASLt over a bf16 scratch of dequant(w)
  // (quant_linear, the shared expert) rather than the own kernels (default mode).
  bool dense_scratch(const QuantMatrix& w, int64_t m) const {
    return m >= lt_min_rows(w) && !decode_direct(m, w.rows()) && !rows_direct(w, m);
  }
  // Whether a dense block-format GEMM of m rows against w takes the rows kernel (gemm_rows_mma.h; default mode).
  bool rows_direct(const QuantMatrix& w, int64_t m) const {
    const bool e8m0 = e8m0_scales(w);
    return !batch_invariant && w.format != QuantFormat::kFloat &&
           cuda::gemm_rows_mma_takes(w.format, e8m0, w.block_n, w.block_k, w.rows(), w.cols(), m, choices.gemm);
  }

  // The MoE pipeline shared by moe() (f32 experts) and moe_quant(): plan, grouped gate/up GEMMs, SwiGLU,
  // grouped down GEMM into per-slot rows, combine in expert-id order. Tokens go in chunks so that the
  // per-slot intermediates stay within ~1 GiB of workspace.
  struct MoeWeights {
    QuantFormat format;
    bool scale_e8m0;
    int block_n, block_k;
    int64_t scale_cols[3];  // w1, w3, w2
    const void* const* w[3];
    const void* const* s[3];
    bool aligned16 = false;  // every expert weight pointer is 16-byte aligned
    bool bf16 = false;       // kFloat weights stored bf16 (moe_quant), not f32 (moe)
    // MXFP4 under --activation-quant mxfp8 with GemmChoices::wgmma_fp8: each matrix's fold exponents (mxfp4_fold),
    // nullptr where that matrix keeps the bf16 kernels.
    const uint8_t* fold[3] = {nullptr, nullptr, nullptr};
  };
  void run_moe(const float* x, const float* weights, const int32_t* indices, float* out, int64_t tokens, int64_t d,
               int64_t k, int64_t inter, int experts, const MoeWeights& mw, const QuantExpertWeights* shared,
               float limit, bool before_w2, ActQuant act_quant);

  // The [rows, cols] rows at x as a GEMM with act_quant multiplies them: x itself for kNone (and for rows fake_quant
  // leaves as they are: cols % 32 != 0), else a rounded copy in ws() (the caller holds the scope), written in one pass
  // by the fake_quant kernel (bit for bit the CPU's rounding).
  const float* act_quant_rows(const float* x, int64_t rows, int64_t cols, ActQuant q) {
    if (q == ActQuant::kNone || rows * cols == 0 || cols % fake_quant_block_len(act_quant_kind(q)) != 0) return x;
    float* copy = ws().take_as<float>(rows * cols);
    cuda::FakeQuantKernelParams f;
    f.x = copy;
    f.in = x;
    f.rows = rows;
    f.cols = cols;
    f.kind = act_quant_kind(q);
    cuda::run_fake_quant(f, s());
    return copy;
  }
  // The [rows, cols] rows at x as MXFP8 (e4m3 codes and UE8M0 scales a block of 32): the values fake_quant rounds to.
  void mxfp8_codes(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales) {
    cuda::Mxfp8QuantizeKernelParams q;
    q.x = x;
    q.codes = codes;
    q.scales = scales;
    q.rows = rows;
    q.cols = cols;
    cuda::run_mxfp8_quantize(q, s());
  }
  // Under --activation-quant mxfp8 (q), a dense GEMM of many rows over 128 x 128 UE8M0 FP8-block weights on the FP8
  // GEMM (unless GemmChoices::wgmma_fp8 is kNever), `in` quantized to MXFP8 codes in ws() (the caller holds the scope):
  // where quant_linear would dequantize the weight to a bf16 scratch for cuBLASLt, and the 128 x 128 tiles fill the
  // device. False, enqueuing nothing, for every other call (the caller then rounds and runs quant_linear).
  bool fp8_linear(const float* in, const QuantMatrix& w, float* out, int64_t m, ActQuant q, bool split_in) {
    const int64_t n = w.rows(), k = w.cols();
    if (act_quant_block128(q)) return fp8_block_linear(in, w, out, m, q, split_in);
    // The kernel's own rule (gemm_wgmma_fp8_takes) checks the weight format, K, the choice and the device; here what
    // it cannot see: the mode, the row count's path, the quantizer's 16-byte input.
    if (q != ActQuant::kMxfp8 || !fp8_gemm_chosen() || split_in || w.format != QuantFormat::kFP8Block ||
        reinterpret_cast<uintptr_t>(in) % 16 != 0)
      return false;
    if (!dense_scratch(w, m) || ceil_div(m, 128) * ceil_div(n, 128) < info.sm_count) return false;
    uint8_t* codes = ws().take_as<uint8_t>(m * k);
    uint8_t* scales = ws().take_as<uint8_t>(m * k / 32);
    cuda::GemmKernelParams g = dense_params(in, nullptr, k, w, out, n, m);
    g.choices = fp8_choices();
    g.batch_invariant = batch_invariant;
    g.a_e4m3 = codes;
    g.a_scale = scales;
    if (!cuda::gemm_wgmma_fp8_takes(g)) return false;
    mxfp8_codes(in, m, k, codes, scales);
    run_fp8(g, codes, scales, nullptr);
    return true;
  }
  // Under --activation-quant fp8 (V3 family, q kFp8Block128 / kFp8Block128Ue8m0), a dense GEMM of the rows quant_linear
  // would widen the weight to a bf16 scratch for (dense_scratch) over an FP8 128 x 128 weight with f32 scales, on
  // cuBLASLt's block-scaled FP8 GEMM (not batch-invariant: its algorithm changes with M), `in` quantized in ws() (the
  // caller holds the scope). H100, same run: 1.02-1.47 PFLOP/s on V3's prefill shapes at 8192 rows against 0.75-0.91
  // for bf16 (docs/PERF.md, session 30). False, enqueuing nothing, for every other call (the caller then rounds the
  // rows with fake_quant and runs quant_linear: the same values, summed in fp32).
  bool fp8_block_linear(const float* in, const QuantMatrix& w, float* out, int64_t m, ActQuant q, bool split_in) {
    const int64_t n = w.rows(), k = w.cols();
    if (batch_invariant || split_in || choices.gemm.lt_fp8_block == cuda::KernelPick::kNever || m == 0 || n == 0 ||
        !lt_fp8_block_weight(w) || reinterpret_cast<uintptr_t>(in) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(out) % 16 != 0)
      return false;
    if (choices.gemm.lt_fp8_block != cuda::KernelPick::kAlways && !dense_scratch(w, m)) return false;
    const LtPlan* plan = lt_fp8_block_plan(m, n, k);
    if (!plan) return false;
    uint8_t* codes = ws().take_as<uint8_t>(m * k);
    float* scales = ws().take_as<float>(m * (k / 128));
    cuda::Fp8Block128QuantizeKernelParams qp;
    qp.x = in;
    qp.ldx = k;
    qp.codes = codes;
    qp.ldc = k;
    qp.scales = scales;
    qp.scale_row_stride = 1;  // VEC128_32F: block-major
    qp.scale_block_stride = m;
    qp.rows = m;
    qp.cols = k;
    qp.ue8m0 = q == ActQuant::kFp8Block128Ue8m0;
    cuda::run_fp8_block128_quantize(qp, s());
    lt_matmul_fp8_block(*plan, codes, scales, w.weight.data(), w.scale.data_as<float>(), out);
    return true;
  }
  // Under --activation-quant mxfp8 the FP8 GEMM is the default (kAuto) where its rules admit a call; kNever keeps the
  // bf16 kernels on the rounded values (H200 and H100, session 29: V4-Flash slice prefill 8192 75.5 -> 71.6 ms and
  // 78.0 -> 73.6 ms). The kernel itself takes only kAlways: the backend passes that once it has chosen.
  bool fp8_gemm_chosen() const { return choices.gemm.wgmma_fp8 != cuda::KernelPick::kNever; }
  cuda::GemmChoices fp8_choices() const {
    cuda::GemmChoices c = choices.gemm;
    c.wgmma_fp8 = cuda::KernelPick::kAlways;
    return c;
  }
  // A float matrix stored bf16 (a bf16 checkpoint's, kept as stored).
  static bool bf16_weight(const QuantMatrix& w) {
    return w.format == QuantFormat::kFloat && w.weight.dtype() == DType::kBF16;
  }
  // Whether the FP8 GEMM takes w for A as q's codes of w.cols() a row in ws(), once the mode and the choice hold:
  // 128 x 128 UE8M0 blocks under mxfp8, f32-scaled ones under fp8.
  static bool fp8_block_weight(const QuantMatrix& w, ActQuant q = ActQuant::kMxfp8) {
    return act_quant_block128(q)
               ? cuda::gemm_wgmma_fp8_block128_weight_takes(w.format, e8m0_scales(w), w.block_n, w.block_k, w.cols())
               : cuda::gemm_wgmma_fp8_block_weight_takes(w.format, e8m0_scales(w), w.block_n, w.block_k, w.cols());
  }
  // The [rows, cols] rows at x as the FP8 GEMM's A under q: MXFP8 codes with UE8M0 scales a block of 32, or (the V3
  // family) codes with an f32 scale a block of 128, row-major; rows · cols / 32 scale bytes either way. The values
  // fake_quant rounds to.
  void act_codes(const float* x, int64_t rows, int64_t cols, ActQuant q, uint8_t* codes, uint8_t* scales) {
    if (!act_quant_block128(q)) return mxfp8_codes(x, rows, cols, codes, scales);
    cuda::Fp8Block128QuantizeKernelParams p;
    p.x = x;
    p.ldx = cols;
    p.codes = codes;
    p.ldc = cols;
    p.scales = reinterpret_cast<float*>(scales);
    p.scale_row_stride = cols / 128;
    p.scale_block_stride = 1;
    p.rows = rows;
    p.cols = cols;
    p.ue8m0 = q == ActQuant::kFp8Block128Ue8m0;
    cuda::run_fp8_block128_quantize(p, s());
  }
  // g on the FP8 GEMM, A as q's codes (act_codes; the caller checked its shape rule).
  void run_fp8(cuda::GemmKernelParams g, const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* fold,
               ActQuant q = ActQuant::kMxfp8) {
    g.choices = fp8_choices();
    g.a_e4m3 = a_codes;
    g.a_scale = a_scales;
    g.b_fold = fold;
    g.a_scale_block128 = act_quant_block128(q);
    DI_CHECK(cuda::run_gemm_wgmma_fp8(g, s())) << "the FP8 GEMM declined a call its rule admitted";
  }
  void round_rows_in_place(float* x, int64_t rows, int64_t cols, ActQuant q) {
    if (q == ActQuant::kNone) return;
    cuda::FakeQuantKernelParams f;
    f.x = x;
    f.rows = rows;
    f.cols = cols;
    f.kind = act_quant_kind(q);
    cuda::run_fake_quant(f, s());
  }

  // c[m, ldc] (first w.rows() columns) = a[m, lda] · dequant(w)ᵀ, any format, through the own GEMM so that
  // a strided output is fine (and batch-invariant when the backend is). Takes scratch from ws(): the caller
  // holds the scope. a_bf16: an optional bf16 copy of a (same lda) for the mma.sync kernel (block formats).
  void shared_gemm(const float* a, int64_t lda, const QuantMatrix& w, float* c, int64_t ldc, int64_t m,
                   const void* a_bf16 = nullptr, ActCodes codes = {});
};

}  // namespace deepinfer
