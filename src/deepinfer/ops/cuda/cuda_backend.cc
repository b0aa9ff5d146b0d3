// CudaBackend: validates each op's params at the boundary (ops.h validate + "is it on this device"), takes
// scratch from the workspace arena, fills the kernel params (kernels.h) and enqueues on the backend stream.
// GEMMs in f32/bf16 go to cuBLASLt; block-quantized GEMMs and everything else to the own kernels.
#include "deepinfer/ops/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include "deepinfer/ops/cuda/dequant_bf16.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_rows_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/indexer_mma.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/swiglu_bf16.h"

namespace deepinfer {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr size_t kCublasWorkspaceBytes = 32ull << 20;
// Batch-invariant MoE calls of at least this many (token, expert) slots get bf16 copies of x and h (run_moe).
constexpr int64_t kInvariantBf16Slots = 64;
// Tokens a MoE call takes in one chunk at least, whatever its intermediates weigh (run_moe).
constexpr int64_t kMoeChunkTokens = 8192;

void expect_on(const char* op, const char* field, const Tensor& t, const Device& dev) {
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
void validate_quant(const char* op, const char* field, const QuantMatrix& m, const Device& dev) {
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

// Device tensors of one backend: allocations from its caching allocator (freed blocks are reused by later work
// on the same stream, which orders them), copies and fills on its stream.
class CudaMemory final : public TensorMemory {
 public:
  CudaMemory(Device device, cuda::DeviceAllocator& alloc, cudaStream_t stream, cuda::DeviceStatus& status)
      : device_(device), alloc_(alloc), stream_(stream), status_(status), staging_(kStagingBytes) {
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&lap_done_, cudaEventDisableTiming));
  }
  ~CudaMemory() override {
    if (lap_done_) cudaEventDestroy(lap_done_);
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  Device device() const override { return device_; }

  OwnedTensor zeros(DType dtype, Shape shape) override {
    OwnedTensor t = empty(dtype, std::move(shape));
    DI_CUDA_CHECK(cudaMemsetAsync(t.view().data(), 0, std::max<size_t>(t.view().nbytes(), 1), stream_));
    return t;
  }

  OwnedTensor empty(DType dtype, Shape shape) override {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(dtype_bytes(dtype, shape_numel(shape)), 1));
    void* p = alloc_.allocate(bytes);
    std::shared_ptr<void> storage(p, [alloc = &alloc_](void* q) { alloc->free(q); });
    return OwnedTensor(std::move(storage), Tensor(p, dtype, std::move(shape), device_));
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    DI_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape())
        << "copy: " << src.str() << " into " << dst.str();
    if (dst.numel() == 0) return;
    const bool dst_dev = on_device(dst), src_dev = on_device(src);
    const size_t bytes = static_cast<size_t>(dst.nbytes());
    if (dst_dev && src_dev) {
      if (dst.is_contiguous() && src.is_contiguous()) {
        DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream_));
      } else {
        strided(dst, src);
      }
    } else if (dst_dev) {
      DI_CHECK(src.is_contiguous() && dst.is_contiguous()) << "copy host -> device needs contiguous tensors";
      upload_bytes(dst.data(), src.data(), bytes);
    } else if (src_dev) {
      DI_CHECK(src.is_contiguous() && dst.is_contiguous()) << "copy device -> host needs contiguous tensors";
      DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToHost, stream_));
      status_.check(stream_);  // synchronises; a kernel's bad-input report surfaces with the data
    } else {
      host_memory().copy(dst, src);
    }
  }

  void fill(const Tensor& dst, float value) override {
    DI_CHECK(dst.dtype() == DType::kF32 && dst.is_contiguous() && on_device(dst)) << "fill: " << dst.str();
    cuda::run_fill_f32(dst.data_as<float>(), value, dst.numel(), stream_);
  }

  void add(const Tensor& dst, const Tensor& src) override {
    DI_CHECK(dst.dtype() == DType::kF32 && src.dtype() == DType::kF32 && dst.shape() == src.shape() &&
             dst.is_contiguous() && src.is_contiguous() && on_device(dst) && on_device(src))
        << "add: " << src.str() << " into " << dst.str();
    cuda::run_add_f32(dst.data_as<float>(), src.data_as<float>(), dst.numel(), stream_);
  }

  void synchronize() override { status_.check(stream_); }

 private:
  bool on_device(const Tensor& t) const {
    if (t.device().kind == DeviceKind::kCPU) return false;
    DI_CHECK(t.device() == device_) << "copy: tensor on cuda:" << t.device().index
                                    << ", backend on cuda:" << device_.index;
    return true;
  }

  // The source is pageable host memory that the caller may free or reuse at once. Small uploads (positions,
  // ids, masks: a few per layer) are staged in a pinned ring and copied asynchronously; a region of the ring is
  // rewritten only after the stream has passed every copy of the previous lap (one wait per lap). Larger ones
  // (weights at load) copy directly and wait.
  void upload_bytes(void* dst, const void* src, size_t bytes) {
    const size_t padded = (bytes + 255) / 256 * 256;
    if (padded > kStagingBytes) {
      DI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
      DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    if (staging_at_ + padded > kStagingBytes) {
      DI_CUDA_CHECK(cudaEventRecord(lap_done_, stream_));
      DI_CUDA_CHECK(cudaEventSynchronize(lap_done_));
      staging_at_ = 0;
    }
    auto* slot = static_cast<uint8_t*>(staging_.data()) + staging_at_;
    std::memcpy(slot, src, bytes);
    DI_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream_));
    staging_at_ += padded;
  }

  void strided(const Tensor& dst, const Tensor& src) {
    const int r = dst.rank();
    DI_CHECK(r >= 1 && r <= 4) << "copy: strided copies take rank 1..4, got " << dst.str();
    cuda::StridedCopyKernelParams k;
    for (int i = 0; i < r; ++i) {
      k.shape[4 - r + i] = dst.shape()[i];
      k.dst_strides[4 - r + i] = dst.strides()[i];
      k.src_strides[4 - r + i] = src.strides()[i];
    }
    k.dst = dst.data();
    k.src = src.data();
    k.elem_bytes = static_cast<int>(dtype_bits(dst.dtype()) / 8);
    cuda::run_strided_copy(k, stream_);
  }

  static constexpr size_t kStagingBytes = 4ull << 20;
  Device device_;
  cuda::DeviceAllocator& alloc_;
  cudaStream_t stream_;
  cuda::DeviceStatus& status_;
  cuda::PinnedBuffer staging_;
  size_t staging_at_ = 0;
  cudaEvent_t lap_done_ = nullptr;
};

}  // namespace

struct CudaBackend::Impl {
  cuda::DeviceInfo info;
  Device device;
  cuda::Stream stream;
  cuda::DeviceAllocator alloc;
  cuda::WorkspaceArena arena{alloc};  // the shared one; ws() is the one ops use now
  cuda::WorkspaceArena* active_arena = &arena;
  cuda::DeviceStatus status{alloc};
  cublasLtHandle_t lt = nullptr;
  cuda::DeviceBuffer lt_workspace;
  // hc_mix's per-token-tile arrival counters (zero between calls: the kernel resets them). Allocated here, not on
  // first use, because a first use may be inside a recording, where nothing may be uploaded.
  cuda::DeviceBuffer hc_mix_arrivals;
  CudaMemory memory{device, alloc, stream.get(), status};
  LinearPrecision linear_precision = LinearPrecision::kF32;
  bool batch_invariant = false;  // set_batch_invariant
  cuda::KernelChoices choices;   // set_kernel_choices

  // Device copies of per-expert pointer tables, keyed by the host vector they describe; re-uploaded only
  // when the pointers change (weights are static, so normally once per layer).
  struct PtrTable {
    std::vector<const void*> host;
    cuda::DeviceBuffer dev;
  };
  std::unordered_map<const void*, PtrTable> tables[6];

  explicit Impl(int index) : info(cuda::select_device(index)), device(Device::cuda(index)) {
    DI_CUBLAS_CHECK(cublasLtCreate(&lt));
    lt_workspace = cuda::DeviceBuffer(alloc, kCublasWorkspaceBytes);
    hc_mix_arrivals = cuda::DeviceBuffer(alloc, sizeof(unsigned) * cuda::kHcMixArrivalSlots);
    // A plain cudaMemset runs on the legacy default stream, which the backend's non-blocking stream does not wait
    // for: finish it before any kernel can read the counters.
    DI_CUDA_CHECK(cudaMemset(hc_mix_arrivals.data(), 0, hc_mix_arrivals.size()));
    DI_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Impl() {
    for (auto& [unused, p] : lt_plans) destroy(p);
    if (lt) cublasLtDestroy(lt);
  }

  cudaStream_t s() const { return stream.get(); }
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

  // A cuBLASLt matmul for one (M, N, K, type): descriptors and the heuristic's algorithm, built once. Decode
  // repeats the same few shapes every token, and the heuristic query costs more than the tiny GEMM itself.
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, LtPlan> lt_plans;
  static constexpr size_t kMaxLtPlans = 4096;  // prefill chunk lengths vary: bound the cache

  static void destroy(LtPlan& p) {
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
  }

  const LtPlan& lt_plan(cudaDataType_t type, int64_t m, int64_t n, int64_t k) {
    const auto key = std::make_tuple(m, n, k, static_cast<int>(type));
    if (auto it = lt_plans.find(key); it != lt_plans.end()) return it->second;
    if (lt_plans.size() >= kMaxLtPlans) {
      for (auto& [unused, p] : lt_plans) destroy(p);
      lt_plans.clear();
    }
    LtPlan p;
    cublasLtMatmulPreference_t pref = nullptr;
    try {
      // f32 x f32 uses full fp32 (no TF32): the f32 Backend::linear promises CPU-level accuracy.
      DI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, k, n, k));
      DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, k, m, k));
      DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, m, n));
      DI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = lt_workspace.size();
      DI_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      DI_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &heur, &found));
      DI_CHECK_CODE(found > 0, ErrorCode::kUnsupported)
          << "cuBLASLt has no algorithm for " << m << "x" << n << "x" << k;
      p.algo = heur.algo;
    } catch (...) {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      destroy(p);
      throw;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return lt_plans.emplace(key, p).first->second;
  }

  // out[M, N] (f32, row-major) = x[M, K] · w[N, K]ᵀ with x and w both f32 or both bf16, fp32 accumulate;
  // `accumulate`: out += x · wᵀ (beta 1: the epilogue adds the fp32 product to out, one rounding).
  // Row-major C = X·Wᵀ is column-major Cᵀ = W·Xᵀ: A = W (transposed), B = X, no copies.
  void lt_matmul(const void* x, const void* w, cudaDataType_t type, float* out, int64_t m, int64_t n, int64_t k,
                 bool accumulate = false) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      if (!accumulate) DI_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * m * n, s()));
      return;
    }
    const LtPlan& p = lt_plan(type, m, n, k);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    DI_CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                   lt_workspace.data(), lt_workspace.size(), s()));
  }

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
  // Fills the weight fields of a dense GEMM from a QuantMatrix (non-float formats).
  static void set_weight(cuda::GemmKernelParams& g, const QuantMatrix& w) {
    g.format = w.format;
    g.b = w.weight.data();
    g.b_scale = w.scale.data();
    g.scale_e8m0 = w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0;
    g.block_n = w.block_n;
    g.block_k = w.block_k;
    g.scale_cols = w.scale.rank() == 2 ? w.scale.dim(1) : 0;
    g.n = w.rows();
    g.k = w.cols();
  }

  // out[M, N] = in[M, K] · dequant(w)ᵀ; bf16 and f32 weights through cuBLASLt. split_in (bf16 weights,
  // QuantLinearParams): `in` as two bf16 terms, near-f32 products.
  void quant_linear(const float* in, const QuantMatrix& w, float* out, int64_t m, bool split_in = false) {
    const int64_t n = w.rows(), k = w.cols();
    if (batch_invariant) {
      // Exact fp32 products (bf16 weights widened), whatever split_in asks: nothing nearer to ask for.
      cuda::WorkspaceArena::Scope scope(ws());
      shared_gemm(in, k, w, out, n, m, invariant_tile(w, m) ? bf16_copy(in, m * k) : nullptr);
      return;
    }
    if (w.format == QuantFormat::kFloat && w.weight.dtype() == DType::kF32) {
      lt_matmul(in, w.weight.data(), CUDA_R_32F, out, m, n, k);
    } else if (w.format == QuantFormat::kFloat && split_in) {
      // Two GEMMs of M rows (the second adds into out through beta) rather than one of 2M rows and a sum of its
      // halves: the same products and one rounding of the sum, 3·M·N floats moved instead of 5. W is read twice,
      // from L2 the second time for a compressor's few MB.
      cuda::WorkspaceArena::Scope scope(ws());
      void* hi = ws().take(sizeof(uint16_t) * m * k);
      void* lo = ws().take(sizeof(uint16_t) * m * k);
      cuda::run_split_f32_to_bf16(in, hi, lo, m * k, s());
      lt_matmul(hi, w.weight.data(), CUDA_R_16BF, out, m, n, k);
      lt_matmul(lo, w.weight.data(), CUDA_R_16BF, out, m, n, k, /*accumulate=*/true);
    } else if (w.format == QuantFormat::kFloat) {
      cuda::WorkspaceArena::Scope scope(ws());
      void* in_bf16 = ws().take(sizeof(uint16_t) * m * k);
      cuda::run_cast_f32_to_bf16(in, in_bf16, m * k, s());
      lt_matmul(in_bf16, w.weight.data(), CUDA_R_16BF, out, m, n, k);
    } else if (dense_scratch(w, m)) {
      // Opt-in (wgmma_split_k = always), short of the device fill, up to decode_direct's rows: the wgmma kernel split
      // along K, from the stored codes. Else the weight is read once either way, so dequantizing it to a
      // bf16 scratch (N·K·2 bytes written and read once more) costs little next to the GEMM, and cuBLASLt's bf16
      // kernels are near peak.
      cuda::WorkspaceArena::Scope scope(ws());
      const void* in_bf16 = bf16_copy(in, m * k);
      cuda::GemmKernelParams g = split_k_params(in, in_bf16, k, w, out, n, m);
      if (g.k_splits > 1) {
        run_split_k(g);
        return;
      }
      void* w_bf16 = ws().take(sizeof(uint16_t) * n * k);
      dequantize_bf16(w, w_bf16);
      lt_matmul(in_bf16, w_bf16, CUDA_R_16BF, out, m, n, k);
    } else {
      // Few rows (the streaming kernels), 9-64 rows (the rows kernel, gemm_rows_mma.h), or a decode batch whose tiles
      // fill the device: the tensor-core kernels then decode the stored codes themselves (run_gemm: wgmma on sm_90a,
      // else the mma.sync kernel) from a bf16 copy of A, reading N·K bytes once where the bf16 scratch above moves
      // N·K + 4·N·K before cuBLASLt's compute; the same bf16 A and exact bf16 weights. (The rows kernel rounds f32
      // rows itself as it stages them: no cast kernel a call, unless rows_mma_bf16_a.)
      cuda::WorkspaceArena::Scope scope(ws());
      const bool cast = m >= lt_min_rows(w) && (choices.gemm.rows_mma_bf16_a || !rows_direct(w, m));
      run_gemm(dense_params(in, cast ? bf16_copy(in, m * k) : nullptr, k, w, out, n, m));
    }
  }
  // Batch-invariant mode: whether a GEMM of `rows` rows (per group) with weight w takes the invariant tile kernel
  // (gemm_invariant_mma.h), which reads a bf16 copy of A when it gets one (the same values it would round itself).
  static bool invariant_tile(const QuantMatrix& w, int64_t rows) {
    const bool e8m0 = w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0;
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
  // against the scratch path).
  int64_t lt_min_rows(const QuantMatrix& w) const {
    if (w.scale.dtype() != DType::kE8M0) return cuda::kGemmSkinnyRows + 1;
    return std::max(choices.gemm.stream_mma_max_rows, cuda::kGemmStreamMmaMaxRows) + 1;
  }
  // Whether a dense block-format GEMM of m rows against w goes through cuBLASLt over a bf16 scratch of dequant(w)
  // (quant_linear, the shared expert) rather than the own kernels (default mode).
  bool dense_scratch(const QuantMatrix& w, int64_t m) const {
    return m >= lt_min_rows(w) && !decode_direct(m, w.rows()) && !rows_direct(w, m);
  }
  // Whether a dense block-format GEMM of m rows against w takes the rows kernel (gemm_rows_mma.h; default mode).
  bool rows_direct(const QuantMatrix& w, int64_t m) const {
    const bool e8m0 = w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0;
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
  };
  void run_moe(const float* x, const float* weights, const int32_t* indices, float* out, int64_t tokens, int64_t d,
               int64_t k, int64_t inter, int experts, const MoeWeights& mw, const QuantExpertWeights* shared,
               float limit, bool before_w2) {
    // Many rows per expert in block formats: the mma.sync kernel reads bf16 copies of x and of the SwiGLU output
    // (batch-invariant mode: the invariant tile kernel past the streaming kernel's rows, and the streaming kernel
    // from kInvariantBf16Slots slots on: each of its blocks stages all of K of its group's rows for one 16-row tile
    // at the weight's fixed K slices, half the bytes in bf16).
    const int64_t rows_per_expert = ceil_div(tokens * k, std::min<int64_t>(experts, std::max<int64_t>(tokens * k, 1)));
    const bool bf16_inputs =
        mw.format != QuantFormat::kFloat &&
        (batch_invariant ? (rows_per_expert > cuda::kGemmStreamMmaMaxRows || tokens * k >= kInvariantBf16Slots) &&
                               (cuda::gemm_invariant_mma_takes(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, d) ||
                                cuda::gemm_invariant_mma_takes(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, inter))
                         : rows_per_expert >= cuda::kGemmMmaMinRows);
    // The shared expert is a dense GEMM of the chunk's rows: the same kernel once its tiles fill the device (with
    // its own bf16 copy of the SwiGLU output); batch-invariant mode: the invariant tile kernel's rows.
    const bool shared_bf16 =
        shared && shared->w1.format != QuantFormat::kFloat &&
        (batch_invariant ? invariant_tile(shared->w1, tokens) : cuda::gemm_mma_dense_fills(tokens, shared->w1.rows()));
    const int64_t per_token = k * (3 * inter + d) * 4 + (shared ? (3 * inter + d) * 4 : 0) +
                              (bf16_inputs ? k * inter * 2 : 0) + (bf16_inputs || shared_bf16 ? d * 2 : 0) +
                              (shared_bf16 ? shared->w1.rows() * 2 : 0) +
                              // the rows kernel's bf16 copies of x and h (shared_rows below)
                              (shared && tokens <= cuda::kGemmRowsMmaMaxRows ? (d + shared->w1.rows()) * 2 : 0);
    // Chunks of at least kMoeChunkTokens tokens (a typical prefill chunk) even past 1 GiB of intermediates (~2.6
    // GiB for V4-Flash, ~3.5 GiB for V3 at 8192 tokens; the engine reserves 5% of the device for activations): with
    // 1 GiB chunks an 8192-token V4-Flash prefill ran in three chunks of ~78 rows an expert, so most experts' second
    // 64-row tensor-core tile was mostly empty (H200, slice prefill 8192: V4-Flash 98.3 -> 78.4 ms, V4.1 252.2 ->
    // 185.1 ms). Equal chunks when there are several, for the same reason.
    const int64_t cap = std::max<int64_t>({kMoeChunkTokens, (1ll << 30) / per_token});
    const int64_t chunk = ceil_div(tokens, std::max<int64_t>(1, ceil_div(tokens, cap)));
    for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
      const int64_t tc = std::min(chunk, tokens - t0), slots = tc * k;
      cuda::WorkspaceArena::Scope scope(ws());
      int32_t* perm = ws().take_as<int32_t>(std::max<int64_t>(slots, 1));
      int32_t* group_offsets = ws().take_as<int32_t>(experts + 1);
      int32_t* tile_offsets = ws().take_as<int32_t>(experts + 1);
      int32_t* active_groups = ws().take_as<int32_t>(experts + 1);
      const int64_t pass_capacity = cuda::moe_pass_capacity(slots, experts, cuda::kGemmStreamMmaMaxRows);
      int32_t* active_passes = ws().take_as<int32_t>(pass_capacity + 1);
      float* gu = ws().take_as<float>(slots * 2 * inter);
      float* h = ws().take_as<float>(slots * inter);
      float* y_slot = ws().take_as<float>(slots * d);
      const float* xc = x + t0 * d;
      void* xc16 = nullptr;
      void* h16 = nullptr;
      if (bf16_inputs) h16 = ws().take(sizeof(uint16_t) * slots * inter);
      const bool shared_mma = shared_bf16 && (batch_invariant ? invariant_tile(shared->w1, tc)
                                                              : cuda::gemm_mma_dense_fills(tc, shared->w1.rows()));
      // Past the streaming kernel's rows and short of filling the device with tiles, the shared expert goes as
      // quant_linear's many-row case: gate and up dequantized into one bf16 [2·I, D] scratch and one cuBLASLt GEMM
      // (its [rows, 2·I] output is the SwiGLU's gate | up layout), down through quant_linear. The own kernels' only
      // fallback there was the SIMT tile kernel (H200, V4-Flash slice: 90 us a call, ~0.8 ms of a b64-b256 step).
      // With wgmma_split_k = always, gate and up up to decode_direct's rows take the wgmma kernel split along K
      // (split_k_params) instead, as quant_linear does.
      const bool shared_lt = shared && !batch_invariant && !shared_mma && shared->w1.format != QuantFormat::kFloat &&
                             shared->w3.format == shared->w1.format && dense_scratch(shared->w1, tc);
      // 9-64 rows: gate, up and down through the rows kernel (gemm_rows_mma.h), from x's bf16 copy when there is one
      // (or rows_mma_bf16_a asks for it), and from h's (the SwiGLU writes it in the same pass).
      const bool shared_rows = shared && !shared_mma && rows_direct(shared->w1, tc) && rows_direct(shared->w3, tc);
      if (bf16_inputs || shared_mma || shared_lt || (shared_rows && choices.gemm.rows_mma_bf16_a)) {
        xc16 = ws().take(sizeof(uint16_t) * tc * d);
        cuda::run_cast_f32_to_bf16(xc, xc16, tc * d, s());
      }
      const float* wc = weights + t0 * k;
      const int32_t* ic = indices + t0 * k;

      cuda::MoePlanKernelParams plan;
      plan.indices = ic;
      plan.slots = slots;
      plan.experts = experts;
      plan.perm = perm;
      plan.group_offsets = group_offsets;
      plan.tile_offsets = tile_offsets;
      plan.active_groups = active_groups;
      plan.active_passes = active_passes;
      plan.pass_rows = static_cast<int>(cuda::kGemmStreamMmaMaxRows);
      plan.pass_capacity = pass_capacity;
      plan.status = status.word();
      cuda::run_moe_plan(plan, s());

      cuda::GemmKernelParams g;
      g.format = mw.format;
      g.scale_e8m0 = mw.scale_e8m0;
      g.block_n = mw.block_n;
      g.block_k = mw.block_k;
      g.groups = experts;
      g.group_offsets = group_offsets;
      g.tile_offsets = tile_offsets;
      g.max_tiles_m = ceil_div(slots, cuda::kGemmTileM) + experts;
      g.active_groups = active_groups;
      g.active_passes = active_passes;
      g.pass_rows = plan.pass_rows;
      g.pass_capacity = pass_capacity;
      g.tables_aligned16 = mw.aligned16;
      g.batch_invariant = batch_invariant;
      // Average rows per used expert, assuming spread routing: decode batches (a row or two per expert)
      // stream weights; prefill (tens of rows per expert) takes the tensor cores. Skew only costs speed.
      g.rows_hint = ceil_div(slots, std::min<int64_t>(experts, slots));
      g.m = slots;
      // gate and up: gathered token rows -> gu[pos, 0:I] and gu[pos, I:2I]
      g.a = xc;
      g.a_bf16 = bf16_inputs ? xc16 : nullptr;
      g.lda = d;
      g.a_rows = perm;
      g.a_row_div = static_cast<int>(k);
      g.ldc = 2 * inter;
      g.n = inter;
      g.k = d;
      for (int which = 0; which < 2; ++which) {
        g.c = gu + which * inter;
        g.b_table = mw.w[which];
        g.b_scale_table = mw.s[which];
        g.scale_cols = mw.scale_cols[which];
        run_gemm(g);
      }
      cuda::SwigluKernelParams sw;
      sw.gu = gu;
      sw.h = h;
      sw.rows = slots;
      sw.inter = inter;
      sw.limit = limit;
      sw.weights = before_w2 ? wc : nullptr;
      sw.weight_rows = perm;
      sw.rows_used = group_offsets + experts;
      if (h16)
        cuda::run_swiglu_bf16(sw, h16, s());  // h and its bf16 copy in one pass
      else
        cuda::run_swiglu(sw, s());
      // down: h[pos] -> y_slot[perm[pos]]
      g.a = h;
      g.a_bf16 = h16;
      g.lda = inter;
      g.a_rows = nullptr;
      g.a_row_div = 1;
      g.c = y_slot;
      g.ldc = d;
      g.c_rows = perm;
      g.n = d;
      g.k = inter;
      g.b_table = mw.w[2];
      g.b_scale_table = mw.s[2];
      g.scale_cols = mw.scale_cols[2];
      run_gemm(g);

      float* shared_out = nullptr;
      if (shared) {
        const int64_t si = shared->w1.rows();
        float* sgu = ws().take_as<float>(tc * 2 * si);
        float* sh = ws().take_as<float>(tc * si);
        shared_out = ws().take_as<float>(tc * d);
        const cuda::GemmKernelParams split_gate =
            shared_lt ? split_k_params(xc, xc16, d, shared->w1, sgu, 2 * si, tc) : cuda::GemmKernelParams{};
        const cuda::GemmKernelParams split_up =
            shared_lt ? split_k_params(xc, xc16, d, shared->w3, sgu + si, 2 * si, tc) : cuda::GemmKernelParams{};
        if (split_gate.k_splits > 1 && split_up.k_splits > 1) {
          // gate and up into the two halves of sgu, each from its stored codes (as quant_linear's split case).
          run_split_k(split_gate);
          run_split_k(split_up);
        } else if (shared_lt) {
          void* w13 = ws().take(sizeof(uint16_t) * 2 * si * d);
          dequantize_bf16(shared->w1, w13);
          dequantize_bf16(shared->w3, static_cast<uint16_t*>(w13) + si * d);
          lt_matmul(xc16, w13, CUDA_R_16BF, sgu, tc, 2 * si, d);
        } else {
          // gate/up into the two halves of sgu: run each as a dense GEMM with ldc = 2·I.
          for (int which = 0; which < 2; ++which) {
            const QuantMatrix& w = which == 0 ? shared->w1 : shared->w3;
            shared_gemm(xc, d, w, sgu + which * si, 2 * si, tc, shared_mma || shared_rows ? xc16 : nullptr);
          }
        }
        cuda::SwigluKernelParams ssw;
        ssw.gu = sgu;
        ssw.h = sh;
        ssw.rows = tc;
        ssw.inter = si;
        ssw.limit = limit;
        void* sh16 = nullptr;
        if (shared_mma || shared_rows) {
          sh16 = ws().take(sizeof(uint16_t) * tc * si);
          cuda::run_swiglu_bf16(ssw, sh16, s());
        } else {
          cuda::run_swiglu(ssw, s());
        }
        if (shared_lt)
          quant_linear(sh, shared->w2, shared_out, tc);
        else
          shared_gemm(sh, si, shared->w2, shared_out, d, tc, sh16);
      }
      cuda::MoeCombineKernelParams cb;
      cb.y_slot = y_slot;
      cb.indices = ic;
      cb.weights = before_w2 ? nullptr : wc;
      cb.shared = shared_out;
      cb.out = out + t0 * d;
      cb.tokens = tc;
      cb.k = k;
      cb.d = d;
      cb.experts = experts;
      cuda::run_moe_combine(cb, s());
    }
  }

  // c[m, ldc] (first w.rows() columns) = a[m, lda] · dequant(w)ᵀ, any format, through the own GEMM so that
  // a strided output is fine (and batch-invariant when the backend is). Takes scratch from ws(): the caller
  // holds the scope. a_bf16: an optional bf16 copy of a (same lda) for the mma.sync kernel (block formats).
  void shared_gemm(const float* a, int64_t lda, const QuantMatrix& w, float* c, int64_t ldc, int64_t m,
                   const void* a_bf16 = nullptr) {
    cuda::GemmKernelParams g;
    g.a = a;
    g.a_bf16 = a_bf16;
    g.lda = lda;
    g.c = c;
    g.ldc = ldc;
    g.m = m;
    g.batch_invariant = batch_invariant;
    if (w.format == QuantFormat::kFloat && w.weight.dtype() == DType::kBF16) {
      // The own GEMM reads f32 weights only in kFloat; dequantize bf16 once into scratch.
      float* wf = ws().take_as<float>(w.rows() * w.cols());
      cuda::DequantizeKernelParams dq;
      dq.weight = w.weight.data();
      dq.format = QuantFormat::kFloat;
      dq.float_kind = cuda::FloatKind::kBF16;
      dq.n = w.rows();
      dq.k = w.cols();
      dq.out = wf;
      cuda::run_dequantize(dq, s());
      g.format = QuantFormat::kFloat;
      g.b = wf;
      g.n = w.rows();
      g.k = w.cols();
    } else {
      set_weight(g, w);
    }
    run_gemm(g);
  }
};

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>(device)) {}
CudaBackend::~CudaBackend() = default;

std::unique_ptr<CudaBackend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

void CudaBackend::synchronize() { impl_->status.check(impl_->s()); }

CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void CudaGraph::replay() { DI_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

namespace {

// The work `enqueue` puts on stream `s`, captured and instantiated. `memory_moved` (checked after the capture) names
// memory the work took inside it, which a replay would not own; any failure is InvalidArgument prefixed by `op`.
std::unique_ptr<CudaGraph> capture_on(cudaStream_t s, const char* op, const std::function<void()>& enqueue,
                                      const std::function<const char*()>& memory_moved) {
  DI_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    enqueue();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  (void)cudaGetLastError();
  if (failure.empty() && end != cudaSuccess) failure = std::string("capture failed: ") + cudaGetErrorString(end);
  if (failure.empty()) {
    if (const char* moved = memory_moved()) failure = moved;
  }
  if (!failure.empty()) {
    if (graph) cudaGraphDestroy(graph);
    DI_FAIL(ErrorCode::kInvalidArgument) << op << ": " << failure;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DI_CUDA_CHECK(inst);
  return std::make_unique<CudaGraph>(exec, s);
}

}  // namespace

std::unique_ptr<CudaGraph> CudaBackend::capture_graph(const std::function<void()>& enqueue) {
  const size_t allocs = impl_->alloc.allocate_calls(), chunks = impl_->arena.chunk_count();
  const void* base = impl_->arena.base();
  return capture_on(impl_->s(), "capture_graph", enqueue, [&]() -> const char* {
    const bool moved =
        impl_->alloc.allocate_calls() != allocs || impl_->arena.chunk_count() != chunks || impl_->arena.base() != base;
    return moved ? "device memory was allocated inside the capture (run the work once eagerly first)" : nullptr;
  });
}

namespace {

// A recording pool: allocator blocks and a workspace arena of its own, so that nothing outside the recordings
// ever gets the addresses they replay.
class CudaRecordingPool final : public RecordingPool {
 public:
  explicit CudaRecordingPool(cuda::DeviceAllocator& alloc) : alloc_(alloc) {
    cuda::ScopedAllocatorPool mine(alloc_, &pool_);
    arena_ = std::make_unique<cuda::WorkspaceArena>(alloc_, 1ull << 20);
  }
  ~CudaRecordingPool() override {
    arena_.reset();
    alloc_.release_pool(pool_);
  }
  cuda::AllocatorPool& pool() { return pool_; }
  cuda::WorkspaceArena& arena() { return *arena_; }

 private:
  cuda::DeviceAllocator& alloc_;
  cuda::AllocatorPool pool_;
  std::unique_ptr<cuda::WorkspaceArena> arena_;
};

class CudaRecordedWork final : public RecordedWork {
 public:
  explicit CudaRecordedWork(std::unique_ptr<CudaGraph> graph) : graph_(std::move(graph)) {}
  void replay() override { graph_->replay(); }

 private:
  std::unique_ptr<CudaGraph> graph_;
};

}  // namespace

std::unique_ptr<RecordingPool> CudaBackend::new_recording_pool() {
  return std::make_unique<CudaRecordingPool>(impl_->alloc);
}

std::unique_ptr<RecordedWork> CudaBackend::record(const std::function<void()>& enqueue, RecordingPool& pool) {
  auto* rp = dynamic_cast<CudaRecordingPool*>(&pool);
  DI_CHECK(rp != nullptr) << "record: the pool was not made by this backend";
  cuda::ScopedAllocatorPool mine(impl_->alloc, &rp->pool());
  struct ArenaSwap {
    Impl& impl;
    cuda::WorkspaceArena* prev;
    ~ArenaSwap() { impl.active_arena = prev; }
  } swap{*impl_, impl_->active_arena};
  impl_->active_arena = &rp->arena();
  // Eager runs until one takes no new device memory: the pool then holds every block the work needs, and the
  // capture, starting from the same free pool, takes the same blocks without a cudaMalloc (which a capture
  // forbids). The arena merges its chunks when its outermost scope closes, so it settles in the same way.
  for (int run = 0;; ++run) {
    const size_t mallocs = impl_->alloc.cuda_malloc_calls();
    const void* base = rp->arena().base();
    enqueue();
    if (impl_->alloc.cuda_malloc_calls() == mallocs && rp->arena().base() == base) break;
    DI_CHECK_INTERNAL(run < 4) << "record: the work still takes new device memory after " << run + 1 << " runs";
  }
  const size_t mallocs = impl_->alloc.cuda_malloc_calls();
  return std::make_unique<CudaRecordedWork>(capture_on(impl_->s(), "record", enqueue, [&]() -> const char* {
    return impl_->alloc.cuda_malloc_calls() != mallocs ? "the recorded work took new device memory on its last run"
                                                       : nullptr;
  }));
}

void CudaBackend::scatter_rows(const ScatterRowsParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"src", &p.src}, {"index", &p.index}, {"dst", &p.dst}})
    expect_on("scatter_rows", name, *t, dev);
  cuda::ScatterRowsKernelParams k;
  k.src = p.src.data_as<float>();
  k.index = p.index.data_as<int64_t>();
  k.dst = p.dst.data_as<float>();
  k.rows = p.src.dim(0);
  k.width = p.src.dim(1);
  k.dst_rows = p.dst.dim(0);
  k.status = impl_->status.word();
  cuda::run_scatter_rows(k, impl_->s());
}

cudaStream_t CudaBackend::stream() const { return impl_->s(); }
cuda::DeviceAllocator& CudaBackend::allocator() { return impl_->alloc; }
cuda::WorkspaceArena& CudaBackend::workspace() { return impl_->ws(); }
const cuda::DeviceInfo& CudaBackend::device_info() const { return impl_->info; }
Device CudaBackend::device() const { return impl_->device; }
TensorMemory& CudaBackend::memory() { return impl_->memory; }

// ============================================================================ linear family
void CudaBackend::dequantize(const DequantizeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("dequantize", "weight", p.weight, dev);
  expect_on("dequantize", "scale", p.scale, dev);
  expect_on("dequantize", "out", p.out, dev);
  cuda::DequantizeKernelParams k;
  k.weight = p.weight.data();
  k.scale = p.scale.data();
  k.scale_e8m0 = !p.scale.data() || p.scale.dtype() == DType::kE8M0;
  k.format = p.format;
  k.float_kind = p.weight.dtype() == DType::kBF16  ? cuda::FloatKind::kBF16
                 : p.weight.dtype() == DType::kF16 ? cuda::FloatKind::kF16
                                                   : cuda::FloatKind::kF32;
  k.n = p.out.dim(0);
  k.k = p.out.dim(1);
  k.scale_cols = p.scale.rank() == 2 ? p.scale.dim(1) : 0;
  k.block_n = p.block_n;
  k.block_k = p.block_k;
  k.out = p.out.data_as<float>();
  cuda::run_dequantize(k, impl_->s());
}

void CudaBackend::linear(const LinearParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("linear", "in", p.in, dev);
  expect_on("linear", "weight", p.weight, dev);
  expect_on("linear", "out", p.out, dev);
  const int64_t m = p.in.dim(0), n = p.weight.dim(0), k = p.in.dim(1);
  if (impl_->linear_precision == LinearPrecision::kBF16) {
    cuda::WorkspaceArena::Scope scope(impl_->ws());
    void* w_bf16 = impl_->ws().take(sizeof(uint16_t) * n * k);
    void* in_bf16 = impl_->ws().take(sizeof(uint16_t) * m * k);
    cuda::run_cast_f32_to_bf16(p.weight.data_as<float>(), w_bf16, n * k, impl_->s());
    cuda::run_cast_f32_to_bf16(p.in.data_as<float>(), in_bf16, m * k, impl_->s());
    impl_->lt_matmul(in_bf16, w_bf16, CUDA_R_16BF, p.out.data_as<float>(), m, n, k);
    return;
  }
  impl_->f32_matmul(p.in.data_as<float>(), p.weight.data_as<float>(), p.out.data_as<float>(), m, n, k);
}

void CudaBackend::set_linear_precision(LinearPrecision p) {
  DI_CHECK(p == LinearPrecision::kF32 || !impl_->batch_invariant)
      << "CudaBackend: bf16 linear precision and batch-invariant mode do not combine";
  impl_->linear_precision = p;
}

void CudaBackend::set_batch_invariant(bool on) {
  DI_CHECK(!on || impl_->linear_precision == LinearPrecision::kF32)
      << "CudaBackend: bf16 linear precision and batch-invariant mode do not combine";
  impl_->batch_invariant = on;
}

bool CudaBackend::batch_invariant() const { return impl_->batch_invariant; }

void CudaBackend::set_kernel_choices(const cuda::KernelChoices& choices) { impl_->choices = choices; }
const cuda::KernelChoices& CudaBackend::kernel_choices() const { return impl_->choices; }

void CudaBackend::linear_quant(const QuantLinearParams& p) {
  const char* op = "linear_quant";
  const Device& dev = impl_->device;
  validate_quant(op, "weight", p.weight, dev);
  DI_CHECK(p.in.dtype() == DType::kF32 && p.in.rank() == 2 && p.in.is_contiguous()) << op << ": in must be f32 [M, K]";
  DI_CHECK(p.in.dim(1) == p.weight.cols()) << op << ": in " << p.in.str() << " vs weight K " << p.weight.cols();
  DI_CHECK(p.out.dtype() == DType::kF32 && p.out.shape() == Shape({p.in.dim(0), p.weight.rows()}) &&
           p.out.is_contiguous())
      << op << ": out must be f32 [" << p.in.dim(0) << ", " << p.weight.rows() << "], got " << p.out.str();
  DI_CHECK(p.out.data() != p.in.data() || p.out.numel() == 0) << op << ": out must not alias in";
  check_split_in(p, op);
  expect_on(op, "in", p.in, dev);
  expect_on(op, "out", p.out, dev);
  impl_->quant_linear(p.in.data_as<float>(), p.weight, p.out.data_as<float>(), p.in.dim(0), p.split_in);
}

void CudaBackend::embedding(const EmbeddingParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("embedding", "table", p.table, dev);
  expect_on("embedding", "ids", p.ids, dev);
  expect_on("embedding", "out", p.out, dev);
  cuda::EmbeddingKernelParams k;
  k.table = p.table.data_as<float>();
  k.ids = p.ids.data_as<int64_t>();
  k.out = p.out.data_as<float>();
  k.tokens = p.ids.dim(0);
  k.vocab = p.table.dim(0);
  k.dim = p.table.dim(1);
  k.status = impl_->status.word();
  cuda::run_embedding(k, impl_->s());
}

// ============================================================================ norms, rope, fake quant
void CudaBackend::rms_norm(const RmsNormParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("rms_norm", "in", p.in, dev);
  expect_on("rms_norm", "weight", p.weight, dev);
  expect_on("rms_norm", "out", p.out, dev);
  cuda::RmsNormKernelParams k;
  k.in = p.in.data_as<float>();
  k.weight = cptr<float>(p.weight);
  k.out = p.out.data_as<float>();
  k.rows = p.in.dim(0);
  k.dim = p.in.dim(1);
  k.eps = p.eps;
  cuda::run_rms_norm(k, impl_->s());
}

void CudaBackend::rope(const RopeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("rope", "x", p.x, dev);
  expect_on("rope", "positions", p.positions, dev);
  expect_on("rope", "inv_freq", p.inv_freq, dev);
  cuda::RopeKernelParams k;
  k.x = p.x.data_as<float>();
  k.positions = p.positions.data_as<int64_t>();
  k.inv_freq = p.inv_freq.data_as<float>();
  k.tokens = p.x.dim(0);
  k.heads = p.x.dim(1);
  k.hd = p.x.dim(2);
  k.half = p.inv_freq.dim(0);
  k.inverse = p.inverse;
  cuda::run_rope(k, impl_->s());
}

void CudaBackend::fake_quant(const FakeQuantParams& p) {
  validate(p);
  expect_on("fake_quant", "x", p.x, impl_->device);
  cuda::FakeQuantKernelParams k;
  k.x = p.x.data_as<float>();
  k.rows = p.x.dim(0);
  k.cols = p.x.dim(1);
  k.kind = p.kind;
  cuda::run_fake_quant(k, impl_->s());
}

// ============================================================================ mHC
void CudaBackend::hc_mix(const HcMixParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams},
                         {"fn", &p.fn},
                         {"base", &p.base},
                         {"scale", &p.scale},
                         {"pre", &p.pre},
                         {"post", &p.post},
                         {"comb", &p.comb}})
    expect_on("hc_mix", name, *t, dev);
  cuda::HcMixKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.fn = p.fn.data_as<float>();
  k.base = p.base.data_as<float>();
  k.scale = p.scale.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.post = p.post.data_as<float>();
  k.comb = p.comb.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.norm_eps = p.norm_eps;
  k.hc_eps = p.hc_eps;
  k.sinkhorn_iters = p.sinkhorn_iters;
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  k.splits = cuda::hc_mix_splits(k.hc, k.d);
  k.partial =
      impl_->ws().take_as<float>(std::max<int64_t>(1, k.splits * k.tokens * ((k.head ? k.hc : (2 + k.hc) * k.hc) + 1)));
  k.arrivals = impl_->hc_mix_arrivals.data_as<unsigned>();
  cuda::run_hc_mix(k, impl_->s());
}

void CudaBackend::hc_head(const HcHeadParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] :
       {std::pair{"streams", &p.streams}, {"fn", &p.fn}, {"base", &p.base}, {"scale", &p.scale}, {"pre", &p.pre}})
    expect_on("hc_head", name, *t, dev);
  cuda::HcMixKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.fn = p.fn.data_as<float>();
  k.base = p.base.data_as<float>();
  k.scale = p.scale.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.norm_eps = p.norm_eps;
  k.hc_eps = p.hc_eps;
  k.head = true;
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  k.splits = cuda::hc_mix_splits(k.hc, k.d);
  k.partial =
      impl_->ws().take_as<float>(std::max<int64_t>(1, k.splits * k.tokens * ((k.head ? k.hc : (2 + k.hc) * k.hc) + 1)));
  k.arrivals = impl_->hc_mix_arrivals.data_as<unsigned>();
  cuda::run_hc_mix(k, impl_->s());
}

void CudaBackend::hc_collapse(const HcCollapseParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("hc_collapse", "streams", p.streams, dev);
  expect_on("hc_collapse", "pre", p.pre, dev);
  expect_on("hc_collapse", "out", p.out, dev);
  cuda::HcCollapseKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  cuda::run_hc_collapse(k, impl_->s());
}

void CudaBackend::hc_expand(const HcExpandParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams}, {"x", &p.x}, {"post", &p.post}, {"comb", &p.comb}})
    expect_on("hc_expand", name, *t, dev);
  cuda::HcExpandKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.x = p.x.data_as<float>();
  k.post = p.post.data_as<float>();
  k.comb = p.comb.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  cuda::run_hc_expand(k, impl_->s());
}

// ============================================================================ fused decode ops
void CudaBackend::hc_collapse_norm(const HcCollapseNormParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams}, {"pre", &p.pre}, {"weight", &p.weight}, {"out", &p.out}})
    expect_on("hc_collapse_norm", name, *t, dev);
  cuda::HcCollapseNormKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.weight = cptr<float>(p.weight);
  k.out = p.out.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.eps = p.eps;
  cuda::run_hc_collapse_norm(k, impl_->s());
}

void CudaBackend::hc_expand_mix(const HcExpandMixParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  const HcExpandParams& e = p.expand;
  const HcMixParams& m = p.mix;
  for (auto [name, t] : {std::pair{"expand.streams", &e.streams},
                         {"expand.x", &e.x},
                         {"expand.post", &e.post},
                         {"expand.comb", &e.comb},
                         {"mix.fn", &m.fn},
                         {"mix.base", &m.base},
                         {"mix.scale", &m.scale},
                         {"mix.pre", &m.pre},
                         {"mix.post", &m.post},
                         {"mix.comb", &m.comb}})
    expect_on("hc_expand_mix", name, *t, dev);
  cuda::HcMixKernelParams k;
  k.streams = m.streams.data_as<float>();
  k.fn = m.fn.data_as<float>();
  k.base = m.base.data_as<float>();
  k.scale = m.scale.data_as<float>();
  k.pre = m.pre.data_as<float>();
  k.post = m.post.data_as<float>();
  k.comb = m.comb.data_as<float>();
  k.tokens = m.streams.dim(0);
  k.hc = m.streams.dim(1);
  k.d = m.streams.dim(2);
  k.norm_eps = m.norm_eps;
  k.hc_eps = m.hc_eps;
  k.sinkhorn_iters = m.sinkhorn_iters;
  k.expand_streams = e.streams.data_as<float>();
  k.expand_x = e.x.data_as<float>();
  k.expand_post = e.post.data_as<float>();
  k.expand_comb = e.comb.data_as<float>();
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  k.splits = cuda::hc_mix_splits(k.hc, k.d);
  k.partial = impl_->ws().take_as<float>(std::max<int64_t>(1, k.splits * k.tokens * ((2 + k.hc) * k.hc + 1)));
  k.arrivals = impl_->hc_mix_arrivals.data_as<unsigned>();
  cuda::run_hc_expand_mix(k, impl_->s());
}

void CudaBackend::norm_rope(const NormRopeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("norm_rope", "positions", p.positions, dev);
  expect_on("norm_rope", "inv_freq", p.inv_freq, dev);
  cuda::NormRopeKernelParams k;
  for (int i = 0; i < 2; ++i) {
    const NormRopePart& part = p.parts[i];
    if (part.x.data() == nullptr) continue;
    expect_on("norm_rope", "x", part.x, dev);
    expect_on("norm_rope", "weight", part.weight, dev);
    k.parts[i].x = part.x.data_as<float>();
    k.parts[i].weight = cptr<float>(part.weight);
    k.parts[i].heads = part.x.dim(1);
    k.parts[i].hd = part.x.dim(2);
    k.parts[i].norm = part.norm;
    k.parts[i].rope = part.rope;
    k.parts[i].fake_quant = part.fake_quant;
    k.parts[i].quant = part.quant;
  }
  k.positions = p.positions.data_as<int64_t>();
  k.inv_freq = p.inv_freq.data_as<float>();
  k.tokens = p.positions.dim(0);
  k.half = p.inv_freq.dim(0);
  k.eps = p.eps;
  cuda::run_norm_rope(k, impl_->s());
}

// ============================================================================ compressor, indexer, top-k
void CudaBackend::compress_pool(const CompressPoolParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("compress_pool", "kv", p.kv, dev);
  expect_on("compress_pool", "gate", p.gate, dev);
  expect_on("compress_pool", "out", p.out, dev);
  cuda::CompressPoolKernelParams k;
  k.kv = p.kv.data_as<float>();
  k.gate = p.gate.data_as<float>();
  k.out = p.out.data_as<float>();
  k.groups = p.kv.dim(0);
  k.slots = p.kv.dim(1);
  k.ch = p.kv.dim(2);
  cuda::run_compress_pool(k, impl_->s());
}

namespace {
// The fields indexer_scores and paged_indexer_scores share: queries, weights, positions, output, scales.
cuda::IndexerScoresKernelParams indexer_kernel_params(const Tensor& q, const Tensor& weights, const Tensor& positions,
                                                      const Tensor& out, int ratio, float score_scale,
                                                      float weight_scale) {
  cuda::IndexerScoresKernelParams k;
  k.q = q.data_as<float>();
  k.weights = weights.data_as<float>();
  k.positions = positions.data_as<int64_t>();
  k.out = out.data_as<float>();
  k.tokens = q.dim(0);
  k.heads = q.dim(1);
  k.dim = q.dim(2);
  k.ratio = ratio;
  k.score_scale = score_scale;
  k.weight_scale = weight_scale;
  return k;
}

// The tensor-core kernel for prefill-like calls (indexer_mma.h), else the SIMT kernels.
void launch_indexer_scores(const cuda::IndexerScoresKernelParams& k, bool batch_invariant, cudaStream_t stream) {
  if (cuda::indexer_scores_use_mma(k, batch_invariant))
    cuda::launch_indexer_scores_mma(k, stream);
  else
    cuda::run_indexer_scores(k, stream);
}
}  // namespace

void CudaBackend::indexer_scores(const IndexerScoreParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] :
       {std::pair{"q", &p.q}, {"keys", &p.keys}, {"weights", &p.weights}, {"positions", &p.positions}, {"out", &p.out}})
    expect_on("indexer_scores", name, *t, dev);
  cuda::IndexerScoresKernelParams k =
      indexer_kernel_params(p.q, p.weights, p.positions, p.out, p.ratio, p.score_scale, p.weight_scale);
  k.keys = p.keys.data_as<float>();
  k.n = p.keys.dim(0);
  k.mma = impl_->choices.indexer_mma;
  launch_indexer_scores(k, impl_->batch_invariant, impl_->s());
}

void CudaBackend::paged_indexer_scores(const PagedIndexerScoreParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"weights", &p.weights},
                         {"positions", &p.positions},
                         {"q_seq", &p.q_seq},
                         {"n_entries", &p.n_entries},
                         {"block_tables", &p.block_tables},
                         {"key_pool", &p.key_pool},
                         {"out", &p.out}})
    expect_on("paged_indexer_scores", name, *t, dev);
  cuda::IndexerScoresKernelParams k =
      indexer_kernel_params(p.q, p.weights, p.positions, p.out, p.ratio, p.score_scale, p.weight_scale);
  k.keys = p.key_pool.data_as<float>();
  k.n = p.out.dim(1);
  k.q_seq = p.q_seq.data_as<int32_t>();
  k.n_entries = p.n_entries.data_as<int64_t>();
  k.block_tables = p.block_tables.data_as<int32_t>();
  k.seqs = p.block_tables.dim(0);
  k.max_blocks = p.block_tables.dim(1);
  k.pool_rows = p.key_pool.dim(0);
  k.block_size = p.block_size;
  k.key_ratio = p.key_ratio;
  k.status = impl_->status.word();
  k.mma = impl_->choices.indexer_mma;
  launch_indexer_scores(k, impl_->batch_invariant, impl_->s());
}

void CudaBackend::candidate_blocks(const CandidateBlocksParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("candidate_blocks", "scores", p.scores, dev);
  expect_on("candidate_blocks", "positions", p.positions, dev);
  expect_on("candidate_blocks", "keep", p.keep, dev);
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const int64_t tokens = p.scores.dim(0), n = p.scores.dim(1), blocks = ceil_div(n, p.block_size);
  cuda::CandidateBlocksKernelParams k;
  k.scores = p.scores.data_as<float>();
  k.positions = p.positions.data_as<int64_t>();
  k.keep = p.keep.data_as<uint8_t>();
  k.block_scores = impl_->ws().take_as<float>(std::max<int64_t>(tokens * blocks, 1));
  k.block_keep = impl_->ws().take_as<uint8_t>(std::max<int64_t>(tokens * blocks, 1));
  k.tokens = tokens;
  k.n = n;
  k.ratio = p.ratio;
  k.topk_blocks = p.topk_blocks;
  k.block_size = p.block_size;
  k.small_blocks = impl_->choices.topk_small_blocks;
  cuda::run_candidate_blocks(k, impl_->s());
}

void CudaBackend::topk_mask(const TopKMaskParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("topk_mask", "scores", p.scores, dev);
  expect_on("topk_mask", "allowed", p.allowed, dev);
  expect_on("topk_mask", "out", p.out, dev);
  cuda::TopKMaskKernelParams k;
  k.scores = p.scores.data_as<float>();
  k.allowed = cptr<uint8_t>(p.allowed);
  k.out = p.out.data_as<uint8_t>();
  k.tokens = p.scores.dim(0);
  k.n = p.scores.dim(1);
  k.k = p.k;
  k.small_blocks = impl_->choices.topk_small_blocks;
  cuda::run_topk_mask(k, impl_->s());
}

// ============================================================================ attention
void CudaBackend::sink_attention(const SinkAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"window_kv", &p.window_kv},
                         {"kv_positions", &p.kv_positions},
                         {"compressed", &p.compressed},
                         {"comp_mask", &p.comp_mask},
                         {"sinks", &p.sinks},
                         {"out", &p.out}})
    expect_on("sink_attention", name, *t, dev);
  cuda::SinkAttentionKernelParams k;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.window_kv = cptr<float>(p.window_kv);
  k.kv_positions = cptr<int64_t>(p.kv_positions);
  k.compressed = cptr<float>(p.compressed);
  k.comp_mask = cptr<uint8_t>(p.comp_mask);
  k.sinks = p.sinks.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.hd = p.q.dim(2);
  k.s = p.window_kv.dim(0);
  k.n_comp = p.compressed.data() ? p.compressed.dim(0) : 0;
  k.window = p.window;
  k.scale = p.scale;
  cuda::run_sink_attention(k, impl_->s());
}

void CudaBackend::paged_sink_attention(const PagedSinkAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"q_seq", &p.q_seq},
                         {"block_tables", &p.block_tables},
                         {"window_pool", &p.window_pool},
                         {"window_begin", &p.window_begin},
                         {"comp_pool", &p.comp_pool},
                         {"comp_idx", &p.comp_idx},
                         {"comp_mask", &p.comp_mask},
                         {"sinks", &p.sinks},
                         {"out", &p.out}})
    expect_on("paged_sink_attention", name, *t, dev);
  cuda::PagedSinkAttentionKernelParams k;
  k.mma = impl_->choices.attn_mma;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.q_seq = p.q_seq.data_as<int32_t>();
  k.block_tables = p.block_tables.data_as<int32_t>();
  k.window_pool = cptr<float>(p.window_pool);
  k.window_begin = p.window_begin.data_as<int64_t>();
  k.comp_pool = cptr<float>(p.comp_pool);
  k.comp_idx = cptr<int32_t>(p.comp_idx);
  k.comp_mask = cptr<uint8_t>(p.comp_mask);
  k.sinks = p.sinks.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.hd = p.q.dim(2);
  k.seqs = p.block_tables.dim(0);
  k.max_blocks = p.block_tables.dim(1);
  k.window_rows = p.window_pool.dim(0);
  k.comp_rows = p.comp_pool.data() ? p.comp_pool.dim(0) : 0;
  k.k_sel = !p.comp_pool.data() ? 0 : (p.comp_mask.data() ? p.comp_mask.dim(1) : p.comp_idx.dim(1));
  k.block_size = p.block_size;
  k.comp_ratio = p.comp_ratio;
  k.window = p.window;
  k.scale = p.scale;
  k.status = impl_->status.word();
  const int64_t max_slots = p.window + k.k_sel;
  if (impl_->batch_invariant) {
    // Split boundaries fixed in slot space: a query's partition depends on its own slots only.
    k.slots_per_split = cuda::kBatchInvariantSlotsPerSplit;
    k.splits = static_cast<int>(std::max<int64_t>(1, ceil_div(max_slots, k.slots_per_split)));
    k.always_combine = true;
  } else {
    k.splits = cuda::paged_attention_splits(k.tokens, k.heads, max_slots, impl_->info.sm_count);
    k.slots_per_split = ceil_div(ceil_div(max_slots, k.splits), 32) * 32;
    k.splits = static_cast<int>(ceil_div(max_slots, k.slots_per_split));
  }
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  if (k.splits > 1 || k.always_combine) {
    const int64_t parts = k.tokens * k.heads * k.splits;
    k.part_o = impl_->ws().take_as<float>(parts * k.hd);
    k.part_m = impl_->ws().take_as<float>(parts);
    k.part_l = impl_->ws().take_as<float>(parts);
  }
  cuda::run_paged_sink_attention(k, impl_->s());
}

// ============================================================================ MLA
void CudaBackend::mla_attention_naive(const MlaAttentionParams& p) { mla_attention_absorbed(p); }

void CudaBackend::mla_attention_absorbed(const MlaAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"kv", &p.kv},
                         {"kv_positions", &p.kv_positions},
                         {"kv_b", &p.kv_b},
                         {"out", &p.out}})
    expect_on("mla_attention", name, *t, dev);
  cuda::MlaKernelParams k;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.kv = cptr<float>(p.kv);
  k.kv_positions = cptr<int64_t>(p.kv_positions);
  k.kv_b = p.kv_b.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.s = p.kv.dim(0);
  k.dr = p.rope_dim;
  k.dn = p.q.dim(2) - k.dr;
  k.r = p.kv.dim(1) - k.dr;
  k.dv = p.kv_b.dim(0) / k.heads - k.dn;
  k.scale = p.scale;
  if (impl_->batch_invariant) {
    k.keys_per_split = cuda::kBatchInvariantSlotsPerSplit;
    k.splits = static_cast<int>(std::max<int64_t>(1, ceil_div(k.s, k.keys_per_split)));
  } else {
    k.splits = cuda::mla_splits(k.tokens, k.heads, k.s, impl_->info.sm_count);
    k.keys_per_split = ceil_div(k.s, k.splits);
  }
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const int64_t th = std::max<int64_t>(1, k.tokens * k.heads), parts = th * k.splits;
  k.q_full = impl_->ws().take_as<float>(th * (k.r + k.dr));
  k.part_o = impl_->ws().take_as<float>(parts * k.r);
  k.part_m = impl_->ws().take_as<float>(parts);
  k.part_l = impl_->ws().take_as<float>(parts);
  cuda::run_mla_attention(k, impl_->s());
}

void CudaBackend::paged_mla_attention(const PagedMlaAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"q_seq", &p.q_seq},
                         {"block_tables", &p.block_tables},
                         {"kv_pool", &p.kv_pool},
                         {"kv_b", &p.kv_b},
                         {"out", &p.out}})
    expect_on("paged_mla_attention", name, *t, dev);
  cuda::PagedMlaKernelParams k;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.q_seq = p.q_seq.data_as<int32_t>();
  k.block_tables = p.block_tables.data_as<int32_t>();
  k.kv_pool = cptr<float>(p.kv_pool);
  k.kv_b = p.kv_b.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.seqs = p.block_tables.dim(0);
  k.max_blocks = p.block_tables.dim(1);
  k.pool_rows = p.kv_pool.dim(0);
  k.dr = p.rope_dim;
  k.dn = p.q.dim(2) - k.dr;
  k.r = p.kv_pool.dim(1) - k.dr;
  k.dv = p.kv_b.dim(0) / k.heads - k.dn;
  k.block_size = p.block_size;
  k.scale = p.scale;
  k.status = impl_->status.word();
  // The longest query the tables allow bounds the splits (positions live on the device).
  if (impl_->batch_invariant)
    std::tie(k.splits, k.tiles_per_split) = cuda::paged_mla_invariant_splits(k.max_blocks * k.block_size);
  else
    k.splits = cuda::paged_mla_splits(k.tokens, k.heads, k.max_blocks * k.block_size, impl_->info.sm_count);
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const int64_t th = std::max<int64_t>(1, k.tokens * k.heads), parts = th * k.splits;
  k.q_full = impl_->ws().take_as<float>(th * (k.r + k.dr));
  k.part_o = impl_->ws().take_as<float>(parts * k.r);
  k.part_m = impl_->ws().take_as<float>(parts);
  k.part_l = impl_->ws().take_as<float>(parts);
  cuda::run_paged_mla_attention(k, impl_->s());
}

// ============================================================================ router + MoE
void CudaBackend::router(const RouterParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"x", &p.x},
                         {"weight", &p.weight},
                         {"bias", &p.bias},
                         {"hash_table", &p.hash_table},
                         {"token_ids", &p.token_ids},
                         {"weights", &p.weights},
                         {"indices", &p.indices}})
    expect_on("router", name, *t, dev);
  const int64_t tokens = p.x.dim(0), experts = p.weight.dim(0);
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  float* logits = impl_->ws().take_as<float>(std::max<int64_t>(tokens * experts, 1));
  impl_->f32_matmul(p.x.data_as<float>(), p.weight.data_as<float>(), logits, tokens, experts, p.x.dim(1));
  cuda::RouterSelectKernelParams k;
  k.logits = logits;
  k.bias = cptr<float>(p.bias);
  k.hash_table = p.hash_table.data();
  k.hash_i64 = p.hash_table.dtype() == DType::kI64;
  k.hash_rows = p.hash_table.data() ? p.hash_table.dim(0) : 0;
  k.token_ids = cptr<int64_t>(p.token_ids);
  k.weights = p.weights.data_as<float>();
  k.indices = p.indices.data_as<int32_t>();
  k.tokens = tokens;
  k.experts = experts;
  k.k = p.weights.dim(1);
  k.scoring = p.scoring;
  k.gate_temp = p.gate_temp;
  k.route_scale = p.route_scale;
  k.normalize = p.normalize;
  k.n_group = p.n_group;
  k.topk_group = p.topk_group;
  k.group_score = p.group_score;
  k.status = impl_->status.word();
  cuda::run_router_select(k, impl_->s());
}

void CudaBackend::moe(const MoeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("moe", "x", p.x, dev);
  expect_on("moe", "weights", p.weights, dev);
  expect_on("moe", "indices", p.indices, dev);
  expect_on("moe", "out", p.out, dev);
  const auto& experts = *p.experts;
  std::vector<const void*> ptrs[3];
  for (const auto& e : experts) {
    expect_on("moe", "w1", e.w1, dev);
    expect_on("moe", "w3", e.w3, dev);
    expect_on("moe", "w2", e.w2, dev);
    DI_CHECK(e.w1.shape() == experts[0].w1.shape()) << "moe: experts must share one shape on CUDA";
    ptrs[0].push_back(e.w1.data());
    ptrs[1].push_back(e.w3.data());
    ptrs[2].push_back(e.w2.data());
  }
  Impl::MoeWeights mw{};
  mw.format = QuantFormat::kFloat;
  mw.scale_e8m0 = true;
  for (int i = 0; i < 3; ++i) {
    mw.w[i] = impl_->table(i, p.experts, ptrs[i]);
    mw.s[i] = nullptr;
  }
  QuantExpertWeights shared;
  if (p.shared) {
    for (auto [name, t] :
         {std::pair{"shared.w1", &p.shared->w1}, {"shared.w3", &p.shared->w3}, {"shared.w2", &p.shared->w2}})
      expect_on("moe", name, *t, dev);
    shared.w1.weight = p.shared->w1;
    shared.w3.weight = p.shared->w3;
    shared.w2.weight = p.shared->w2;
  }
  impl_->run_moe(p.x.data_as<float>(), p.weights.data_as<float>(), p.indices.data_as<int32_t>(), p.out.data_as<float>(),
                 p.x.dim(0), p.x.dim(1), p.weights.dim(1), experts[0].w1.dim(0), static_cast<int>(experts.size()), mw,
                 p.shared ? &shared : nullptr, p.swiglu_limit, p.weight_before_w2);
}

void CudaBackend::moe_quant(const QuantMoeParams& p) {
  const char* op = "moe_quant";
  const Device& dev = impl_->device;
  DI_CHECK(p.experts && !p.experts->empty()) << op << ": experts are required";
  const auto& experts = *p.experts;
  DI_CHECK(p.x.dtype() == DType::kF32 && p.x.rank() == 2 && p.x.is_contiguous()) << op << ": x must be f32 [T, D]";
  const int64_t t = p.x.dim(0), d = p.x.dim(1);
  DI_CHECK(p.weights.dtype() == DType::kF32 && p.weights.rank() == 2 && p.weights.dim(0) == t &&
           p.weights.is_contiguous())
      << op << ": weights must be f32 [T, k]";
  const int64_t k = p.weights.dim(1);
  DI_CHECK(p.indices.dtype() == DType::kI32 && p.indices.shape() == Shape({t, k}) && p.indices.is_contiguous())
      << op << ": indices must be i32 [T, k]";
  DI_CHECK(p.out.dtype() == DType::kF32 && p.out.shape() == Shape({t, d}) && p.out.is_contiguous())
      << op << ": out must be f32 [T, D]";
  for (auto [name, tt] : {std::pair{"x", &p.x}, {"weights", &p.weights}, {"indices", &p.indices}, {"out", &p.out}})
    expect_on(op, name, *tt, dev);
  const QuantExpertWeights& e0 = experts[0];
  const int64_t inter = e0.w1.rows();
  auto check_expert = [&](const QuantExpertWeights& e, bool same_as_first) {
    validate_quant(op, "w1", e.w1, dev);
    validate_quant(op, "w3", e.w3, dev);
    validate_quant(op, "w2", e.w2, dev);
    const int64_t i = e.w1.rows();
    DI_CHECK(e.w1.cols() == d && e.w3.rows() == i && e.w3.cols() == d && e.w2.rows() == d && e.w2.cols() == i)
        << op << ": expert shapes must be w1/w3 [I, " << d << "], w2 [" << d << ", I]";
    if (same_as_first) {
      DI_CHECK(i == inter && e.w1.format == e0.w1.format && e.w3.format == e0.w1.format &&
               e.w2.format == e0.w1.format && e.w1.weight.dtype() == e0.w1.weight.dtype() &&
               e.w1.scale.dtype() == e0.w1.scale.dtype() && e.w1.block_n == e0.w1.block_n &&
               e.w1.block_k == e0.w1.block_k)
          << op << ": routed experts must share one shape and format";
    }
  };
  std::vector<const void*> ptrs[6];
  for (const auto& e : experts) {
    check_expert(e, true);
    const QuantMatrix* m[3] = {&e.w1, &e.w3, &e.w2};
    for (int i = 0; i < 3; ++i) {
      ptrs[i].push_back(m[i]->weight.data());
      ptrs[3 + i].push_back(m[i]->scale.data());
    }
  }
  if (p.shared) check_expert(*p.shared, false);
  DI_CHECK(!(e0.w1.format == QuantFormat::kFloat && e0.w1.weight.dtype() == DType::kBF16))
      << op << ": bf16 routed experts are not supported on CUDA yet (use f32 or a block format)";
  Impl::MoeWeights mw{};
  mw.aligned16 = true;
  for (const auto& v : ptrs)
    for (const void* q : v) mw.aligned16 = mw.aligned16 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
  mw.format = e0.w1.format;
  mw.scale_e8m0 = !e0.w1.scale.data() || e0.w1.scale.dtype() == DType::kE8M0;
  mw.block_n = e0.w1.block_n;
  mw.block_k = e0.w1.block_k;
  const QuantMatrix* m0[3] = {&e0.w1, &e0.w3, &e0.w2};
  for (int i = 0; i < 3; ++i) {
    mw.scale_cols[i] = m0[i]->scale.rank() == 2 ? m0[i]->scale.dim(1) : 0;
    mw.w[i] = impl_->table(i, p.experts, ptrs[i]);
    mw.s[i] = mw.format == QuantFormat::kFloat ? nullptr : impl_->table(3 + i, p.experts, ptrs[3 + i]);
  }
  impl_->run_moe(p.x.data_as<float>(), p.weights.data_as<float>(), p.indices.data_as<int32_t>(), p.out.data_as<float>(),
                 t, d, k, inter, static_cast<int>(experts.size()), mw, p.shared, p.swiglu_limit, p.weight_before_w2);
}

// ============================================================================ synthetic-run helpers
// ============================================================================ sampling
void CudaBackend::sample(const DeviceSampleParams& p) {
  const char* op = "sample";
  const Device& dev = impl_->device;
  DI_CHECK(p.logits.dtype() == DType::kF32 && p.logits.rank() == 2 && p.logits.is_contiguous())
      << op << ": logits must be contiguous f32 [rows, vocab], got " << p.logits.str();
  const int64_t rows = p.logits.dim(0), vocab = p.logits.dim(1);
  DI_CHECK(vocab > 0 && vocab < (int64_t{1} << 31)) << op << ": vocab " << vocab << " outside [1, 2^31)";
  auto check = [&](const char* field, const Tensor& t, DType dtype, Shape shape) {
    DI_CHECK(t.dtype() == dtype && t.shape() == shape && t.is_contiguous())
        << op << ": '" << field << "' must be contiguous " << dtype_name(dtype) << " " << shape_str(shape) << ", got "
        << t.str();
    expect_on(op, field, t, dev);
  };
  check("logits", p.logits, DType::kF32, {rows, vocab});
  check("temperature", p.temperature, DType::kF32, {rows});
  check("top_k", p.top_k, DType::kI32, {rows});
  check("top_p", p.top_p, DType::kF32, {rows});
  check("min_p", p.min_p, DType::kF32, {rows});
  check("rng", p.rng, DType::kI64, {rows, 3});
  check("out", p.out, DType::kI32, {rows});
  cuda::SampleKernelParams k;
  if (p.allowed.data()) {
    DI_CHECK(p.allowed.dtype() == DType::kI32 && p.allowed.rank() == 2 && p.allowed.dim(0) == rows &&
             p.allowed.dim(1) * 32 >= vocab && p.allowed.is_contiguous())
        << op << ": 'allowed' must be contiguous i32 [" << rows << ", >= " << ceil_div(vocab, 32) << "], got "
        << p.allowed.str();
    expect_on(op, "allowed", p.allowed, dev);
    k.allowed = p.allowed.data_as<uint32_t>();
    k.mask_words = p.allowed.dim(1);
  }
  k.logits = p.logits.data_as<float>();
  k.temperature = p.temperature.data_as<float>();
  k.top_k = p.top_k.data_as<int32_t>();
  k.top_p = p.top_p.data_as<float>();
  k.min_p = p.min_p.data_as<float>();
  k.rng = p.rng.data_as<uint64_t>();
  k.out = p.out.data_as<int32_t>();
  k.rows = rows;
  k.vocab = vocab;
  k.status = impl_->status.word();
  cuda::run_sample(k, impl_->s());
}

void CudaBackend::fill_random(const RandomFillParams& p) {
  expect_on("fill_random", "out", p.out, impl_->device);
  DI_CHECK(p.out.is_contiguous()) << "fill_random: out must be contiguous";
  DI_CHECK(p.e8m0_low >= 0 && p.e8m0_span >= 1 && p.e8m0_low + p.e8m0_span <= 255)
      << "fill_random: E8M0 range [" << p.e8m0_low << ", " << p.e8m0_low + p.e8m0_span << ") is not in [0, 255)";
  cuda::RandomFillKernelParams k;
  k.out = p.out.data();
  k.bytes = p.out.nbytes();
  k.seed = p.seed;
  k.range = p.range;
  k.e8m0_low = p.e8m0_low;
  k.e8m0_span = p.e8m0_span;
  switch (p.out.dtype()) {
    case DType::kF32:
      k.mode = cuda::RandomFillMode::kF32;
      break;
    case DType::kF8E4M3:
      k.mode = cuda::RandomFillMode::kE4M3;
      break;
    case DType::kE8M0:
      k.mode = cuda::RandomFillMode::kE8M0;
      break;
    case DType::kBF16:
      k.mode = cuda::RandomFillMode::kBF16;
      break;
    default:
      k.mode = cuda::RandomFillMode::kBytes;
      break;
  }
  cuda::run_fill_random(k, impl_->s());
}

void CudaBackend::lt_gemm(const LtGemmParams& p) {
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"x", &p.x}, {"w", &p.w}, {"out", &p.out}}) {
    expect_on("lt_gemm", name, *t, dev);
    DI_CHECK(t->rank() == 2 && t->is_contiguous()) << "lt_gemm: " << name << " must be a contiguous matrix";
  }
  DI_CHECK(p.x.dtype() == p.w.dtype() && (p.x.dtype() == DType::kBF16 || p.x.dtype() == DType::kF8E4M3))
      << "lt_gemm: x and w must both be bf16 or both f8_e4m3";
  const int64_t m = p.x.dim(0), k = p.x.dim(1), n = p.w.dim(0);
  DI_CHECK(p.w.dim(1) == k && p.out.dtype() == DType::kF32 && p.out.shape() == Shape({m, n}))
      << "lt_gemm: shapes x [M, K], w [N, K], out f32 [M, N]";
  impl_->lt_matmul(p.x.data(), p.w.data(), p.x.dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_8F_E4M3,
                   p.out.data_as<float>(), m, n, k);
}

// ============================================================================ Engram
void CudaBackend::engram_hash(const EngramHashParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"tokens", &p.tokens},
                         {"multipliers", &p.multipliers},
                         {"primes", &p.primes},
                         {"offsets", &p.offsets},
                         {"out", &p.out}})
    expect_on("engram_hash", name, *t, dev);
  cuda::EngramHashKernelParams k;
  k.tokens = p.tokens.data_as<int64_t>();
  k.multipliers = p.multipliers.data_as<int64_t>();
  k.primes = p.primes.data_as<int64_t>();
  k.offsets = p.offsets.data_as<int64_t>();
  k.out = p.out.data_as<int64_t>();
  k.count = p.tokens.dim(0);
  k.n = p.tokens.dim(1);
  k.heads = p.primes.dim(1);
  cuda::run_engram_hash(k, impl_->s());
}

void CudaBackend::engram_gate(const EngramGateParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams}, {"key", &p.key}, {"value", &p.value}, {"weight", &p.weight}})
    expect_on("engram_gate", name, *t, dev);
  cuda::EngramGateKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.key = p.key.data_as<float>();
  k.value = p.value.data_as<float>();
  k.weight = p.weight.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.eps = p.eps;
  cuda::run_engram_gate(k, impl_->s());
}

}  // namespace deepinfer
