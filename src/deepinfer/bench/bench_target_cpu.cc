// The CPU reference as a bench target: weights are drawn in their block formats (FP8 e4m3 + UE8M0, MXFP4)
// and dequantized to f32 once, since the CPU ops take f32 weights. Meant for tiny dims (the plumbing test).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "deepinfer/bench/bench_target.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

struct CpuWeight final : BenchWeight {
  HostTensor w;  // f32 [n, k]
  BenchFormat format = BenchFormat::kF32;
};
struct CpuGroupedWeight final : BenchGroupedWeight {
  std::set<int64_t> planned;  // row counts per group readied by plan_grouped
};
struct CpuExperts final : BenchExperts {
  std::vector<HostTensor> storage;
  std::vector<ExpertWeights> routed;
  ExpertWeights shared;
  bool has_shared = false;
  BenchFormat routed_format = BenchFormat::kF32;
};

class CpuTarget final : public BenchTarget {
 public:
  explicit CpuTarget(int threads) : threads_(threads), be_(make_cpu_backend(threads)) {}
  std::string describe() const override {
    const int n = threads_ > 0 ? threads_ : static_cast<int>(std::thread::hardware_concurrency());
    return "CPU reference backend (" + std::to_string(n) + " threads)";
  }
  Backend& backend() override { return *be_; }

  OwnedTensor random(Shape shape, uint64_t seed, float range) override {
    HostTensor t(DType::kF32, std::move(shape));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-range, range);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    return OwnedTensor(std::move(t));
  }

  std::unique_ptr<BenchWeight> weight(BenchFormat f, int64_t n, int64_t k, int block, uint64_t seed) override {
    auto w = std::make_unique<CpuWeight>();
    w->w = draw(f, n, k, block, seed);
    w->format = f;
    return w;
  }

  void linear(const Tensor& in, const BenchWeight& w, const Tensor& out) override {
    const auto& cw = static_cast<const CpuWeight&>(w);
    be_->linear({in, cw.w.view(), out, act_quant_for(cw.format)});
  }

  std::unique_ptr<BenchGroupedWeight> grouped_weight(BenchFormat f, int64_t groups, int64_t n, int64_t k, int block,
                                                     uint64_t seed) override {
    DI_CHECK(groups >= 1) << "bench: a grouped weight needs groups >= 1, got " << groups;
    auto w = std::make_unique<CpuGroupedWeight>();
    std::mt19937_64 rng(seed);
    for (int64_t g = 0; g < groups; ++g) w->groups.push_back(weight(f, n, k, block, rng()));
    return w;
  }

  // Nothing to upload on the CPU; the row count is recorded so that a slice that forgets to plan fails here as it
  // would on CUDA.
  void plan_grouped(BenchGroupedWeight& w, int64_t rows) override {
    DI_CHECK(rows >= 1) << "bench: grouped rows must be >= 1, got " << rows;
    static_cast<CpuGroupedWeight&>(w).planned.insert(rows);
  }

  void grouped_linear(const Tensor& in, const BenchGroupedWeight& w, const Tensor& out) override {
    const auto& cw = static_cast<const CpuGroupedWeight&>(w);
    const int64_t g_count = static_cast<int64_t>(cw.groups.size());
    DI_CHECK(in.rank() == 2 && out.rank() == 2 && in.dim(0) == out.dim(0) && in.dim(0) % g_count == 0)
        << "bench: grouped linear of " << g_count << " groups: in " << in.str() << " and out " << out.str()
        << " must be [G·rows, k] and [G·rows, n]";
    const int64_t r = in.dim(0) / g_count;
    DI_CHECK(cw.planned.count(r)) << "bench: grouped linear with " << r << " rows per group was not planned";
    for (int64_t g = 0; g < g_count; ++g)
      linear(in.slice(g * r, (g + 1) * r), *cw.groups[g], out.slice(g * r, (g + 1) * r));
  }

  std::unique_ptr<BenchExperts> experts(const ExpertSpec& spec, uint64_t seed) override {
    auto e = std::make_unique<CpuExperts>();
    e->routed_format = spec.routed;
    e->storage.reserve(3 * spec.count + 3);
    std::mt19937_64 rng(seed);
    auto one = [&](BenchFormat f, int64_t inter) {
      ExpertWeights x;
      Tensor* out[3] = {&x.w1, &x.w3, &x.w2};
      for (int i = 0; i < 3; ++i) {
        const bool down = i == 2;
        e->storage.push_back(draw(f, down ? spec.d : inter, down ? inter : spec.d, spec.block, rng()));
        *out[i] = e->storage.back().view();
      }
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
    const auto& ce = static_cast<const CpuExperts&>(e);
    be_->moe({x, weights, indices, &ce.routed, ce.has_shared ? &ce.shared : nullptr, out, swiglu_limit,
              weight_before_w2, act_quant_for(ce.routed_format)});
  }

  double time_ms(const std::function<void()>& fn, int warmup, int iters) override {
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  void profile_begin() override {
    marks_.clear();
    last_ = std::chrono::steady_clock::now();
  }
  void profile_mark(int segment) override {
    const auto now = std::chrono::steady_clock::now();
    marks_.push_back({segment, std::chrono::duration<double, std::milli>(now - last_).count()});
    last_ = now;
  }
  std::vector<double> profile_end(int segments) override {
    std::vector<double> ms(segments, 0.0);
    for (const auto& [seg, v] : marks_) ms.at(seg) += v;
    return ms;
  }

  Ceilings measure_ceilings() override {
    Ceilings c;
    c.copy_label = "host memcpy (16 MiB)";
    const size_t bytes = 16u << 20;
    std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
    const double copy_ms = time_ms([&] { std::memcpy(b.data(), a.data(), bytes); }, 1, 5);
    c.copy_bytes_per_s = 2.0 * bytes / (copy_ms / 1000.0);
    const int64_t n = 256;
    OwnedTensor x = random({n, n}, 1, 1.0f), w = random({n, n}, 2, 1.0f), y = random({n, n}, 3, 1.0f);
    const double gemm_ms = time_ms([&] { be_->linear({x.view(), w.view(), y.view()}); }, 1, 5);
    c.gemm_label = "f32 linear 256^3 (CpuBackend)";
    c.gemm_flops_per_s = 2.0 * n * n * n / (gemm_ms / 1000.0);
    return c;
  }

 private:
  // An f32 [n, k] weight with the values of format f: FP8/MXFP4 codes dequantized, bf16 rounded.
  HostTensor draw(BenchFormat f, int64_t n, int64_t k, int block, uint64_t seed) {
    std::mt19937_64 rng(seed);
    switch (f) {
      case BenchFormat::kFP8Block: {
        HostTensor q(DType::kF8E4M3, {n, k}), s(DType::kE8M0, {(n + block - 1) / block, (k + block - 1) / block});
        for (int64_t i = 0; i < q.numel(); ++i) {
          uint8_t c = static_cast<uint8_t>(rng());
          q.data<uint8_t>()[i] = (c & 0x7F) == 0x7F ? 0x38 : c;  // no NaN codes
        }
        for (int64_t i = 0; i < s.numel(); ++i) s.data<uint8_t>()[i] = static_cast<uint8_t>(115 + rng() % 2);
        return dequant(q, s, QuantFormat::kFP8Block, n, k, block);
      }
      case BenchFormat::kMXFP4: {
        DI_CHECK(k % 32 == 0) << "bench: MXFP4 weight needs k % 32 == 0, got " << k;
        HostTensor q(DType::kU8, {n, k / 2}), s(DType::kE8M0, {n, k / 32});
        for (int64_t i = 0; i < q.numel(); ++i) q.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
        for (int64_t i = 0; i < s.numel(); ++i) s.data<uint8_t>()[i] = static_cast<uint8_t>(119 + rng() % 2);
        return dequant(q, s, QuantFormat::kMXFP4, n, k, 32);
      }
      case BenchFormat::kBF16:
      case BenchFormat::kF32: {
        HostTensor t(DType::kF32, {n, k});
        const float range = 1.0f / std::sqrt(static_cast<float>(k));
        std::uniform_real_distribution<float> u(-range, range);
        for (int64_t i = 0; i < t.numel(); ++i) {
          const float v = u(rng);
          t.data<float>()[i] = f == BenchFormat::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
        }
        return t;
      }
    }
    DI_FAIL(ErrorCode::kInternal) << "bench: unknown weight format";
  }

  HostTensor dequant(const HostTensor& q, const HostTensor& s, QuantFormat f, int64_t n, int64_t k, int block) {
    HostTensor out(DType::kF32, {n, k});
    DequantizeParams p;
    p.weight = q.view();
    p.scale = s.view();
    p.format = f;
    p.block_n = block;
    p.block_k = block;
    p.out = out.view();
    be_->dequantize(p);
    return out;
  }

  int threads_;
  std::unique_ptr<Backend> be_;
  std::vector<std::pair<int, double>> marks_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

std::unique_ptr<BenchTarget> make_cpu_target(int threads) { return std::make_unique<CpuTarget>(threads); }

}  // namespace deepinfer::bench
