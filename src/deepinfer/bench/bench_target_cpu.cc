// The CPU reference as a bench target: weights are drawn in their block formats (FP8 e4m3 + UE8M0, MXFP4)
// and dequantized to f32 once, since the CPU ops take f32 weights. Meant for tiny dims (the plumbing test).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "deepinfer/bench/bench_target.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

struct CpuWeight final : BenchWeight {
  HostTensor w;  // f32 [n, k]
};
struct CpuExperts final : BenchExperts {
  std::vector<HostTensor> storage;
  std::vector<ExpertWeights> routed;
  ExpertWeights shared;
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

  std::unique_ptr<BenchWeight> fp8_weight(int64_t n, int64_t k, int block, uint64_t seed) override {
    std::mt19937_64 rng(seed);
    HostTensor q(DType::kF8E4M3, {n, k}), s(DType::kE8M0, {(n + block - 1) / block, (k + block - 1) / block});
    for (int64_t i = 0; i < q.numel(); ++i) {
      uint8_t c = static_cast<uint8_t>(rng());
      q.data<uint8_t>()[i] = (c & 0x7F) == 0x7F ? 0x38 : c;
    }
    for (int64_t i = 0; i < s.numel(); ++i) s.data<uint8_t>()[i] = static_cast<uint8_t>(115 + rng() % 2);
    auto w = std::make_unique<CpuWeight>();
    w->w = dequant(q, s, QuantFormat::kFP8Block, n, k, block);
    return w;
  }

  void linear(const Tensor& in, const BenchWeight& w, const Tensor& out) override {
    be_->linear({in, static_cast<const CpuWeight&>(w).w.view(), out});
  }

  std::unique_ptr<BenchExperts> experts(int64_t count, int64_t d, int64_t inter, int block, uint64_t seed) override {
    auto e = std::make_unique<CpuExperts>();
    e->storage.reserve(3 * count + 3);
    std::mt19937_64 rng(seed);
    auto mxfp4 = [&](int64_t n, int64_t k) -> Tensor {
      HostTensor q(DType::kU8, {n, k / 2}), s(DType::kE8M0, {n, k / 32});
      for (int64_t i = 0; i < q.numel(); ++i) q.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
      for (int64_t i = 0; i < s.numel(); ++i) s.data<uint8_t>()[i] = static_cast<uint8_t>(119 + rng() % 2);
      e->storage.push_back(dequant(q, s, QuantFormat::kMXFP4, n, k, 32));
      return e->storage.back().view();
    };
    for (int64_t i = 0; i < count; ++i) e->routed.push_back({mxfp4(inter, d), mxfp4(inter, d), mxfp4(d, inter)});
    auto fp8 = [&](int64_t n, int64_t k) -> Tensor {
      auto w = fp8_weight(n, k, block, rng());
      e->storage.push_back(std::move(static_cast<CpuWeight&>(*w).w));
      return e->storage.back().view();
    };
    e->shared = {fp8(inter, d), fp8(inter, d), fp8(d, inter)};
    return e;
  }

  void moe(const Tensor& x, const Tensor& weights, const Tensor& indices, const BenchExperts& e, const Tensor& out,
           float swiglu_limit, bool weight_before_w2) override {
    const auto& ce = static_cast<const CpuExperts&>(e);
    be_->moe({x, weights, indices, &ce.routed, &ce.shared, out, swiglu_limit, weight_before_w2});
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
