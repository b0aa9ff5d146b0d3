#include "deepinfer/ops/cuda/cuda_step_hooks.h"

#include <cuda_runtime.h>

#include <cstring>
#include <optional>
#include <vector>

#include "deepinfer/core/logging.h"
#include "deepinfer/engine/gpu_idle.h"
#include "deepinfer/ops/cuda/argmax_cuda.h"
#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/cuda/cuda_check.h"

namespace deepinfer {
namespace {

class CudaStepHooks final : public DeviceStepHooks {
 public:
  explicit CudaStepHooks(CudaBackend& backend)
      : backend_(backend),
        timeline_([this](int a, int b) { return elapsed(a, b); }, [this](int e) { free_.push_back(e); }) {}
  ~CudaStepHooks() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  void step_begin() override {
    // A step_begin without its step_end (an exception between them) leaves a start event unused: reuse it.
    if (start_ < 0) start_ = take_event();
    if (start_ >= 0 && cudaEventRecord(events_[start_], backend_.stream()) != cudaSuccess) timing_failed();
  }

  // Called from a destructor (the runner pairs it with step_begin even when the step throws): never throws; a
  // failure only stops the timeline.
  void step_end(bool decode) override {
    if (start_ < 0) return;
    const int end = take_event();
    if (end < 0) return timing_failed();
    if (cudaEventRecord(events_[end], backend_.stream()) != cudaSuccess) return timing_failed();
    const int start = start_;
    start_ = -1;
    try {
      timeline_.step(start, end, decode);
    } catch (const std::exception& e) {
      DI_LOG_WARN("GPU timeline stopped: {}", e.what());
      broken_ = true;
    }
  }

  int64_t timed_decode_steps() const override { return timeline_.meter().decode_steps(); }
  double decode_gap_seconds() const override { return timeline_.meter().gap_seconds(); }
  double decode_span_seconds() const override { return timeline_.meter().span_seconds(); }

  void argmax(const Tensor& logits, const ArgmaxRows& out) override {
    DI_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2 && logits.is_contiguous() &&
             logits.device() == backend_.device())
        << "argmax: logits must be contiguous f32 [rows, vocab] on the backend's device, got " << logits.str();
    const int64_t rows = logits.dim(0);
    const bool lp = out.wants_logprobs();
    DI_CHECK_INTERNAL(static_cast<int64_t>(out.tokens.size()) == rows &&
                      static_cast<int64_t>(out.non_finite.size()) == rows &&
                      (!lp || static_cast<int64_t>(out.logprobs.size()) == rows))
        << "argmax: " << out.tokens.size() << " tokens, " << out.non_finite.size() << " flags, " << out.logprobs.size()
        << " logprobs for " << rows << " rows";
    if (rows == 0) return;
    // One i32 buffer, one copy back: ids, flags, then (when wanted) the logprobs' float bits.
    const int64_t words = (lp ? 3 : 2) * rows;
    TensorMemory& mem = backend_.memory();
    // (An empty OwnedTensor's numel() is 1, the empty product: test the data too.)
    if (!out_.data<int32_t>() || out_.numel() < words) out_ = mem.zeros(DType::kI32, {3 * rows});
    cuda::ArgmaxKernelParams p;
    p.logits = logits.data_as<float>();
    p.rows = rows;
    p.vocab = logits.dim(1);
    p.out = out_.data<int32_t>();
    p.logprobs = lp ? reinterpret_cast<float*>(out_.data<int32_t>() + 2 * rows) : nullptr;
    if (lp) {
      const int64_t scratch = cuda::argmax_logprob_scratch(rows, p.vocab);
      if (!partial_.data<double>() || partial_.numel() < scratch) partial_ = mem.zeros(DType::kF64, {scratch});
      p.partial = partial_.data<double>();
    }
    cuda::run_argmax(p, backend_.stream());
    host_.resize(static_cast<size_t>(words));
    // Waits, and raises what kernels of the step reported (as the logits copy it replaces would).
    mem.copy(Tensor(host_.data(), DType::kI32, {words}), out_.view().slice(0, words));
    for (int64_t r = 0; r < rows; ++r) {
      out.tokens[r] = host_[r];
      out.non_finite[r] = host_[rows + r] ? 1 : 0;
      if (lp) std::memcpy(&out.logprobs[r], &host_[2 * rows + r], sizeof(float));
    }
  }

 private:
  // Seconds from event a to event b once both have completed; nullopt before (never blocks).
  std::optional<double> elapsed(int a, int b) {
    for (int e : {a, b}) {
      const cudaError_t q = cudaEventQuery(events_[e]);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error: keep it from surfacing at the next launch check
        return std::nullopt;
      }
      DI_CUDA_CHECK(q);
    }
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
    return 1e-3 * static_cast<double>(ms);
  }

  // An event index (a new event when none is free), -1 once timing has failed.
  int take_event() {
    if (broken_) return -1;
    if (!free_.empty()) {
      const int e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t ev = nullptr;
    if (cudaEventCreate(&ev) != cudaSuccess) {
      timing_failed();
      return -1;
    }
    events_.push_back(ev);
    return static_cast<int>(events_.size()) - 1;
  }

  void timing_failed() {
    (void)cudaGetLastError();
    if (!broken_) DI_LOG_WARN("GPU timeline stopped: recording a CUDA event failed");
    broken_ = true;
    start_ = -1;
  }

  CudaBackend& backend_;
  std::vector<cudaEvent_t> events_;
  std::vector<int> free_;
  int start_ = -1;
  bool broken_ = false;
  StepTimeline timeline_;
  OwnedTensor out_;      // i32 [3 * rows]: argmax ids, non-finite flags, logprobs (float bits)
  OwnedTensor partial_;  // f64: the logprob sums' chunks (argmax_cuda.h)
  std::vector<int32_t> host_;
};

}  // namespace

std::unique_ptr<DeviceStepHooks> make_cuda_step_hooks(CudaBackend& backend) {
  return std::make_unique<CudaStepHooks>(backend);
}

}  // namespace deepinfer
