// Where `deepinfer bench` runs: the few things the slice needs beyond the Backend ops, for the CPU reference
// (f32 weights, dequantized from the same formats) and for the CUDA backend (weights kept in their block
// formats and read by linear_quant / moe_quant). Each target also measures its own ceilings in the same run.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/bench/bench_model.h"
#include "deepinfer/ops/cuda/kernel_choices.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::bench {

// A weight [n, k] as the target keeps it (opaque to the slice).
struct BenchWeight {
  virtual ~BenchWeight() = default;
};
// G weights [n, k] of one format that BenchTarget::grouped_linear multiplies in one call; groups[g] is group g's
// weight, usable on its own by BenchTarget::linear (the test of the grouped call against per-group calls).
struct BenchGroupedWeight {
  virtual ~BenchGroupedWeight() = default;
  std::vector<std::unique_ptr<BenchWeight>> groups;
};
// The routed experts (+ an optional shared expert) of one MoE layer.
struct BenchExperts {
  virtual ~BenchExperts() = default;
};

// What BenchTarget::experts makes: `count` routed SwiGLU experts w1, w3 [inter, d], w2 [d, inter] in one format
// (moe_quant takes one format for all routed experts) and a shared expert of width shared_inter (0: none).
struct ExpertSpec {
  int64_t count = 0, d = 0, inter = 0;
  BenchFormat routed = BenchFormat::kMXFP4;
  int64_t shared_inter = 0;
  BenchFormat shared = BenchFormat::kFP8Block;
  int block = 128;  // FP8 block tile (square)
};

// The rates a step is compared with, measured on the target in the same run.
struct Ceilings {
  double copy_bytes_per_s = 0;   // device copy, bytes read + written
  double gemm_flops_per_s = 0;   // dense GEMM in the target's best format for the slice's GEMMs
  double gemm2_flops_per_s = 0;  // a second dense rate (CUDA: FP8 through cuBLASLt), 0 when not measured
  std::string gemm_label, gemm2_label, copy_label;
};

class BenchTarget {
 public:
  virtual ~BenchTarget() = default;
  virtual std::string describe() const = 0;
  virtual Backend& backend() = 0;
  TensorMemory& memory() { return backend_memory(backend()); }

  // Uniform random f32 in [-range, range).
  virtual OwnedTensor random(Shape shape, uint64_t seed, float range) = 0;
  // A random [n, k] weight in format f (FP8: e4m3 codes with block×block UE8M0 scales chosen to keep outputs
  // O(1); bf16/f32: values O(1/sqrt(k))). Throws Unsupported for a format the target cannot multiply by.
  virtual std::unique_ptr<BenchWeight> weight(BenchFormat f, int64_t n, int64_t k, int block, uint64_t seed) = 0;
  std::unique_ptr<BenchWeight> fp8_weight(int64_t n, int64_t k, int block, uint64_t seed) {
    return weight(BenchFormat::kFP8Block, n, k, block, seed);
  }
  virtual void linear(const Tensor& in, const BenchWeight& w, const Tensor& out) = 0;

  // A grouped projection (V4's output projection: o_groups weights, each over its chunk of the attention output).
  // A target-level op rather than a Backend one: the engine's wo_a is f32 through Backend::linear, so only the bench
  // multiplies quantized groups; CUDA runs it through grouped_linear_quant (ops/cuda/grouped_linear.h), which needs
  // device arrays made once per row count (plan_grouped), never inside a call, so that a step stays capturable.
  // `groups` random weights as weight() draws them.
  virtual std::unique_ptr<BenchGroupedWeight> grouped_weight(BenchFormat f, int64_t groups, int64_t n, int64_t k,
                                                             int block, uint64_t seed) = 0;
  // Readies w for grouped_linear calls of `rows` rows per group (CUDA: uploads; call it outside a capture, e.g. in
  // SliceState::prepare). Any number of row counts may be planned; planning one twice is a no-op.
  virtual void plan_grouped(BenchGroupedWeight& w, int64_t rows) = 0;
  // in [G·r, k], out [G·r, n] with r a planned row count (InvalidArgument otherwise): out rows [g·r, (g+1)·r) =
  // in rows [g·r, (g+1)·r) · dequant(W_g)ᵀ. CUDA: one GEMM launch where per-group calls would each be one
  // (grouped_linear_quant); CPU: linear() per group.
  virtual void grouped_linear(const Tensor& in, const BenchGroupedWeight& w, const Tensor& out) = 0;
  virtual std::unique_ptr<BenchExperts> experts(const ExpertSpec& spec, uint64_t seed) = 0;
  virtual void moe(const Tensor& x, const Tensor& weights, const Tensor& indices, const BenchExperts& e,
                   const Tensor& out, float swiglu_limit, bool weight_before_w2) = 0;

  // Median milliseconds of fn over `iters` runs after `warmup` runs (each run waited for).
  virtual double time_ms(const std::function<void()>& fn, int warmup, int iters) = 0;
  virtual Ceilings measure_ceilings() = 0;
  // Bytes a slice may keep on the target (`bench --fill-device`); 0 where the target does not say (the CPU).
  virtual double memory_budget_bytes() { return 0; }

  // Where one run's time goes: profile_mark(seg) charges the time since the previous mark (or
  // profile_begin) to segment seg; profile_end returns milliseconds per segment (device time on CUDA: events
  // between the ops on the stream).
  virtual void profile_begin() = 0;
  virtual void profile_mark(int segment) = 0;
  virtual std::vector<double> profile_end(int segments) = 0;

  // Records the device work `fn` enqueues as a graph for replay() (CUDA graphs); false when the target has
  // none. fn is not executed by the capture. Throws when the work cannot be captured.
  virtual bool capture(const std::function<void()>& fn) {
    (void)fn;
    return false;
  }
  virtual void replay() {}

  // --activation-quant: how the GEMMs over FP8 / MXFP4 weights round their inputs (Backend ops' act_quant).
  void set_activation_quant(ActQuant q) { act_quant_ = q; }
  ActQuant activation_quant() const { return act_quant_; }

 protected:
  // The rounding a GEMM over a weight in format f takes (the reference rounds the inputs of block formats only).
  ActQuant act_quant_for(BenchFormat f) const {
    return f == BenchFormat::kFP8Block || f == BenchFormat::kMXFP4 ? act_quant_ : ActQuant::kNone;
  }

 private:
  ActQuant act_quant_ = ActQuant::kNone;
};

std::unique_ptr<BenchTarget> make_cpu_target(int threads);
// Throws Unsupported in a build without CUDA, NotFound without a device. batch_invariant: the backend's
// batch-invariant mode (CudaBackend::set_batch_invariant), to measure its cost; choices: the backend's kernel choices
// (CudaBackend::set_kernel_choices), to measure another kernel.
std::unique_ptr<BenchTarget> make_cuda_target(int device, bool batch_invariant = false,
                                              const cuda::KernelChoices& choices = {});

}  // namespace deepinfer::bench
