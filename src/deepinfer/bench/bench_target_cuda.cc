// The CUDA backend as a bench target: weights stay in their block formats on the device (FP8 e4m3 with
// UE8M0 block scales for the dense projections and the shared expert, MXFP4 for the routed experts), filled
// by a random kernel on the device; linear_quant / moe_quant read them. Ceilings: a device-to-device copy,
// and cuBLASLt bf16 and FP8 (unit scales) GEMMs at 8192³, all in the same process.
#include "deepinfer/bench/bench_target.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/kernel_choice_args.h"

#ifdef DEEPINFER_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/grouped_linear.h"
#endif

namespace deepinfer::bench {

#ifdef DEEPINFER_WITH_CUDA
namespace {

struct CudaWeight final : BenchWeight {
  std::vector<OwnedTensor> storage;
  QuantMatrix m;
  BenchFormat format = BenchFormat::kF32;
};
struct CudaGroupedWeight final : BenchGroupedWeight {
  std::map<int64_t, std::unique_ptr<GroupedLinearPlan>> plans;  // by rows per group
};
struct CudaExperts final : BenchExperts {
  std::vector<OwnedTensor> storage;
  std::vector<QuantExpertWeights> routed;
  QuantExpertWeights shared;
  bool has_shared = false;
  BenchFormat routed_format = BenchFormat::kF32;
};

class CudaTarget final : public BenchTarget {
 public:
  CudaTarget(int device, bool batch_invariant, const cuda::KernelChoices& choices) : be_(make_cuda_backend(device)) {
    be_->set_batch_invariant(batch_invariant);
    be_->set_kernel_choices(choices);
  }
  std::string describe() const override {
    const auto& i = be_->device_info();
    const std::string choices = describe_kernel_choices(be_->kernel_choices());
    return i.name + " (" + std::to_string(i.sm_count) + " SMs, " + std::to_string(i.total_memory >> 20) + " MiB)" +
           (be_->batch_invariant() ? ", batch-invariant mode" : "") +
           (choices.empty() ? "" : ", kernel choices: " + choices);
  }
  Backend& backend() override { return *be_; }

  OwnedTensor random(Shape shape, uint64_t seed, float range) override {
    OwnedTensor t = be_->memory().zeros(DType::kF32, std::move(shape));
    be_->fill_random({t.view(), seed, range});
    return t;
  }

  OwnedTensor codes(DType dtype, Shape shape, uint64_t seed, int e8m0_low = 117) {
    OwnedTensor t = be_->memory().zeros(dtype, std::move(shape));
    RandomFillParams p;
    p.out = t.view();
    p.seed = seed;
    p.e8m0_low = e8m0_low;
    p.e8m0_span = 2;
    be_->fill_random(p);
    return t;
  }

  // One [n, k] matrix in format f, its storage kept in `keep`.
  QuantMatrix matrix(BenchFormat f, int64_t n, int64_t k, int block, uint64_t seed, std::vector<OwnedTensor>& keep) {
    switch (f) {
      case BenchFormat::kFP8Block:
        // |e4m3| reaches 448 and a random code's rms is ~100: scales 2^-12..2^-11 keep outputs O(1).
        keep.push_back(codes(DType::kF8E4M3, {n, k}, seed));
        if (act_quant_block128(activation_quant())) {
          // The V3 family's mode: f32 block scales, as its checkpoints store them (cuBLASLt's block-scaled GEMM reads
          // those), of the same range.
          const int64_t nb = (n + block - 1) / block, kb = (k + block - 1) / block;
          std::vector<float> s(static_cast<size_t>(nb * kb));
          for (size_t i = 0; i < s.size(); ++i)
            s[i] = std::ldexp(1.0f + static_cast<float>((i * 7 + seed) % 8) / 8, -12);
          keep.push_back(be_->memory().from_host(DType::kF32, {nb, kb}, s.data()));
          return QuantMatrix{keep[keep.size() - 2].view(), keep.back().view(), QuantFormat::kFP8Block, block, block};
        }
        keep.push_back(codes(DType::kE8M0, {(n + block - 1) / block, (k + block - 1) / block}, seed + 1, 115));
        return QuantMatrix{keep[keep.size() - 2].view(), keep.back().view(), QuantFormat::kFP8Block, block, block};
      case BenchFormat::kMXFP4:
        // e2m1 codes have rms ~3: scales 2^-8..2^-7.
        keep.push_back(codes(DType::kU8, {n, k / 2}, seed));
        keep.push_back(codes(DType::kE8M0, {n, k / 32}, seed + 1, 119));
        return QuantMatrix{keep[keep.size() - 2].view(), keep.back().view(), QuantFormat::kMXFP4};
      case BenchFormat::kBF16:
        keep.push_back(codes(DType::kBF16, {n, k}, seed));
        return QuantMatrix{keep.back().view(), Tensor{}, QuantFormat::kFloat};
      case BenchFormat::kF32:
        keep.push_back(random({n, k}, seed, 1.0f / std::sqrt(static_cast<float>(k))));
        return QuantMatrix{keep.back().view(), Tensor{}, QuantFormat::kFloat};
    }
    DI_FAIL(ErrorCode::kInternal) << "bench: unknown weight format";
  }

  std::unique_ptr<BenchWeight> weight(BenchFormat f, int64_t n, int64_t k, int block, uint64_t seed) override {
    auto w = std::make_unique<CudaWeight>();
    w->m = matrix(f, n, k, block, seed, w->storage);
    w->format = f;
    return w;
  }

  void linear(const Tensor& in, const BenchWeight& w, const Tensor& out) override {
    const auto& cw = static_cast<const CudaWeight&>(w);
    QuantLinearParams p{in, cw.m, out};
    p.act_quant = act_quant_for(cw.format);
    be_->linear_quant(p);
  }

  std::unique_ptr<BenchGroupedWeight> grouped_weight(BenchFormat f, int64_t groups, int64_t n, int64_t k, int block,
                                                     uint64_t seed) override {
    DI_CHECK(groups >= 1) << "bench: a grouped weight needs groups >= 1, got " << groups;
    auto w = std::make_unique<CudaGroupedWeight>();
    for (int64_t g = 0; g < groups; ++g) w->groups.push_back(weight(f, n, k, block, seed + 2 * g));
    return w;
  }

  void plan_grouped(BenchGroupedWeight& w, int64_t rows) override {
    auto& cw = static_cast<CudaGroupedWeight&>(w);
    if (cw.plans.count(rows)) return;
    std::vector<QuantMatrix> mats;
    for (const auto& g : cw.groups) mats.push_back(static_cast<const CudaWeight&>(*g).m);
    cw.plans[rows] = plan_grouped_linear(*be_, std::move(mats), rows);
  }

  void grouped_linear(const Tensor& in, const BenchGroupedWeight& w, const Tensor& out) override {
    const auto& cw = static_cast<const CudaGroupedWeight&>(w);
    const int64_t g_count = static_cast<int64_t>(cw.groups.size());
    DI_CHECK(in.rank() == 2 && in.dim(0) % g_count == 0)
        << "bench: grouped linear of " << g_count << " groups: in " << in.str() << " must be [G·rows, k]";
    const auto plan = cw.plans.find(in.dim(0) / g_count);
    DI_CHECK(plan != cw.plans.end()) << "bench: grouped linear with " << in.dim(0) / g_count
                                     << " rows per group was not planned";
    grouped_linear_quant(*be_, in, *plan->second, out,
                         act_quant_for(static_cast<const CudaWeight&>(*cw.groups.front()).format));
  }

  std::unique_ptr<BenchExperts> experts(const ExpertSpec& spec, uint64_t seed) override {
    auto e = std::make_unique<CudaExperts>();
    e->routed_format = spec.routed;
    e->storage.reserve(6 * spec.count + 6);  // views point into it: no reallocation
    uint64_t sd = seed;
    auto one = [&](BenchFormat f, int64_t inter) {
      QuantExpertWeights x;
      x.w1 = matrix(f, inter, spec.d, spec.block, sd += 2, e->storage);
      x.w3 = matrix(f, inter, spec.d, spec.block, sd += 2, e->storage);
      x.w2 = matrix(f, spec.d, inter, spec.block, sd += 2, e->storage);
      return x;
    };
    for (int64_t i = 0; i < spec.count; ++i) e->routed.push_back(one(spec.routed, spec.inter));
    if (spec.shared_inter > 0) {
      e->shared = one(spec.shared, spec.shared_inter);
      e->has_shared = true;
    }
    return e;
  }

  void moe(const Tensor& x, const Tensor& weights, const Tensor& indices, const BenchExperts& e, const Tensor& out,
           float swiglu_limit, bool weight_before_w2) override {
    const auto& ce = static_cast<const CudaExperts&>(e);
    be_->moe_quant({x, weights, indices, &ce.routed, ce.has_shared ? &ce.shared : nullptr, out, swiglu_limit,
                    weight_before_w2, act_quant_for(ce.routed_format)});
  }

  double time_ms(const std::function<void()>& fn, int warmup, int iters) override {
    for (int i = 0; i < warmup; ++i) fn();
    be_->synchronize();
    cudaEvent_t a, b;
    DI_CUDA_CHECK(cudaEventCreate(&a));
    DI_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      DI_CUDA_CHECK(cudaEventRecord(a, be_->stream()));
      fn();
      DI_CUDA_CHECK(cudaEventRecord(b, be_->stream()));
      be_->synchronize();
      float v = 0;
      DI_CUDA_CHECK(cudaEventElapsedTime(&v, a, b));
      ms.push_back(v);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  void profile_begin() override {
    marks_.clear();
    if (events_.empty()) events_.push_back(new_event());
    DI_CUDA_CHECK(cudaEventRecord(events_[0], be_->stream()));
  }
  void profile_mark(int segment) override {
    marks_.push_back(segment);
    if (events_.size() <= marks_.size()) events_.push_back(new_event());
    DI_CUDA_CHECK(cudaEventRecord(events_[marks_.size()], be_->stream()));
  }
  std::vector<double> profile_end(int segments) override {
    be_->synchronize();
    std::vector<double> ms(segments, 0.0);
    for (size_t i = 0; i < marks_.size(); ++i) {
      float v = 0;
      DI_CUDA_CHECK(cudaEventElapsedTime(&v, events_[i], events_[i + 1]));
      ms.at(marks_[i]) += v;
    }
    return ms;
  }
  bool capture(const std::function<void()>& fn) override {
    graph_.reset();
    graph_ = be_->capture_graph(fn);
    return true;
  }
  void replay() override { graph_->replay(); }

  ~CudaTarget() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  // 90% of the memory free now (before the ceilings and the slice), less 4 GiB for the ceilings' buffers, the
  // activations and the workspaces.
  double memory_budget_bytes() override {
    size_t free = 0, total = 0;
    DI_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return std::max(0.0, 0.9 * static_cast<double>(free) - 4.0 * (1ull << 30));
  }

  Ceilings measure_ceilings() override {
    Ceilings c;
    {
      const int64_t bytes = 2ll << 30;
      OwnedTensor src = codes(DType::kU8, {bytes}, 11), dst = be_->memory().zeros(DType::kU8, {bytes});
      const double ms = time_ms([&] { be_->memory().copy(dst.view(), src.view()); }, 2, 10);
      c.copy_label = "HBM device copy (2 GiB, read+write)";
      c.copy_bytes_per_s = 2.0 * bytes / (ms / 1000.0);
    }
    const int64_t n = 8192;
    OwnedTensor out = be_->memory().zeros(DType::kF32, {n, n});
    {
      OwnedTensor x = codes(DType::kBF16, {n, n}, 21), w = codes(DType::kBF16, {n, n}, 22);
      const double ms = time_ms([&] { be_->lt_gemm({x.view(), w.view(), out.view()}); }, 3, 10);
      c.gemm_label = "cuBLASLt bf16 GEMM 8192^3";
      c.gemm_flops_per_s = 2.0 * n * n * n / (ms / 1000.0);
    }
    try {
      OwnedTensor x = codes(DType::kF8E4M3, {n, n}, 23), w = codes(DType::kF8E4M3, {n, n}, 24);
      const double ms = time_ms([&] { be_->lt_gemm({x.view(), w.view(), out.view()}); }, 3, 10);
      c.gemm2_label = "cuBLASLt FP8 e4m3 GEMM 8192^3 (unit scales)";
      c.gemm2_flops_per_s = 2.0 * n * n * n / (ms / 1000.0);
    } catch (const Error& e) {
      c.gemm2_label = std::string("cuBLASLt FP8 GEMM unavailable: ") + e.what();
    }
    return c;
  }

 private:
  static cudaEvent_t new_event() {
    cudaEvent_t e;
    DI_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }

  std::unique_ptr<CudaBackend> be_;
  std::unique_ptr<CudaGraph> graph_;
  std::vector<cudaEvent_t> events_;
  std::vector<int> marks_;
};

}  // namespace

std::unique_ptr<BenchTarget> make_cuda_target(int device, bool batch_invariant, const cuda::KernelChoices& choices) {
  DI_CHECK_CODE(cuda::device_count() > 0, ErrorCode::kNotFound)
      << "bench --device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  return std::make_unique<CudaTarget>(device, batch_invariant, choices);
}
#else
std::unique_ptr<BenchTarget> make_cuda_target(int, bool, const cuda::KernelChoices&) {
  DI_FAIL(ErrorCode::kUnsupported) << "bench --device cuda: this deepinfer was built without CUDA (configure with "
                                      "-DDEEPINFER_ACCELERATOR=nvidia)";
}
#endif

}  // namespace deepinfer::bench
