// CudaBackend: validates each op's params at the boundary (ops.h validate + "is it on this device"), takes
// scratch from the workspace arena, fills the kernel params (kernels.h) and enqueues on the backend stream.
// GEMMs in f32/bf16 go to cuBLASLt; block-quantized GEMMs and everything else to the own kernels.
#include "deepinfer/ops/cuda/cuda_backend.h"

#include <cstring>
#include <memory>

#include "deepinfer/ops/cuda/cuda_backend_impl.h"

namespace deepinfer {

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
  k.dst = p.dst.data();
  k.dst_format = cuda::pool_format_of(p.dst.dtype(), p.record);
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
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const float* in = impl_->act_quant_rows(p.in.data_as<float>(), m, k, p.act_quant);
  if (impl_->linear_precision == LinearPrecision::kBF16) {
    void* w_bf16 = impl_->ws().take(sizeof(uint16_t) * n * k);
    void* in_bf16 = impl_->ws().take(sizeof(uint16_t) * m * k);
    cuda::run_cast_f32_to_bf16(p.weight.data_as<float>(), w_bf16, n * k, impl_->s());
    cuda::run_cast_f32_to_bf16(in, in_bf16, m * k, impl_->s());
    impl_->lt_matmul(in_bf16, w_bf16, CUDA_R_16BF, p.out.data_as<float>(), m, n, k);
    return;
  }
  impl_->f32_matmul(in, p.weight.data_as<float>(), p.out.data_as<float>(), m, n, k);
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

void CudaBackend::grouped_linear_quant(const GroupedQuantLinearParams& p) {
  if (!impl_->choices.grouped_output_one_launch) return Backend::grouped_linear_quant(p);  // validates
  validate(p);
  const int64_t g_count = p.groups, t = p.in.dim(0) / g_count, n = p.weight.rows() / g_count;
  const auto key =
      std::make_tuple(p.weight.weight.data(), p.weight.scale.data(), g_count, t, p.weight.rows(), p.weight.cols());
  auto it = impl_->grouped_plans.find(key);
  if (it == impl_->grouped_plans.end()) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    DI_CUDA_CHECK(cudaStreamIsCapturing(impl_->s(), &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return Backend::grouped_linear_quant(p);  // no upload in a capture
    std::vector<QuantMatrix> groups;
    for (int64_t g = 0; g < g_count; ++g) groups.push_back(quant_rows(p.weight, g * n, (g + 1) * n));
    cuda::ScopedAllocatorPool shared(impl_->alloc, nullptr);  // the plan outlives a recording's eager run that makes it
    it = impl_->grouped_plans.emplace(key, plan_grouped_linear(*this, std::move(groups), t)).first;
  }
  deepinfer::grouped_linear_quant(*this, p.in, *it->second, p.out, p.act_quant);
}

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
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  if (impl_->fp8_linear(p.in.data_as<float>(), p.weight, p.out.data_as<float>(), p.in.dim(0), p.act_quant, p.split_in))
    return;
  const float* in = impl_->act_quant_rows(p.in.data_as<float>(), p.in.dim(0), p.in.dim(1), p.act_quant);
  // Under --activation-quant fp8 the few-row tensor-core kernel over f32-scaled weights reads the rows' e4m3 codes and
  // scales (exact) instead of the rounded rows, which are not bf16 values.
  const ActCodes codes =
      p.split_in ? ActCodes{} : impl_->stream_act_codes(p.in.data_as<float>(), p.in.dim(0), p.weight, p.act_quant);
  impl_->quant_linear(in, p.weight, p.out.data_as<float>(), p.in.dim(0), p.split_in, codes);
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

}  // namespace deepinfer
