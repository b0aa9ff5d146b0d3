// Backend::linear_quant / moe_quant on the CPU reference (the Backend defaults): FP8 block-scaled weights are
// dequantized exactly and run through the f32 op, so the result equals dequantize + linear / moe bit for bit;
// a bad weight is rejected by name.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "deepinfer/core/dtype.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

using testing::random_tensor;

struct Fp8 {
  HostTensor q, s, f32;
  QuantMatrix m() const { return QuantMatrix{q.view(), s.view(), QuantFormat::kFP8Block, 32, 32}; }
};

// Random finite e4m3 codes with 32×32 E8M0 scales (partial edge tiles), and their exact f32 values.
Fp8 fp8(Backend& be, int64_t n, int64_t k, uint32_t seed) {
  Fp8 w{HostTensor(DType::kF8E4M3, {n, k}), HostTensor(DType::kE8M0, {(n + 31) / 32, (k + 31) / 32}),
        HostTensor(DType::kF32, {n, k})};
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n * k; ++i) w.q.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 0x7E);
  for (int64_t i = 0; i < w.s.numel(); ++i) w.s.data<uint8_t>()[i] = static_cast<uint8_t>(118 + rng() % 4);
  be.dequantize({w.q.view(), w.s.view(), QuantFormat::kFP8Block, 32, 32, w.f32.view()});
  return w;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)) == 0;
}

TEST(QuantOps, LinearQuantIsDequantizePlusLinear) {
  auto be = make_cpu_backend(1);
  const Fp8 w = fp8(*be, 70, 50, 1);
  HostTensor x = random_tensor({5, 50}, 2), y(DType::kF32, {5, 70}), ref(DType::kF32, {5, 70});
  be->linear_quant({x.view(), w.m(), y.view()});
  be->linear({x.view(), w.f32.view(), ref.view()});
  EXPECT_TRUE(same_bits(y, ref));
  double sum = 0;
  for (int64_t i = 0; i < y.numel(); ++i) sum += std::fabs(y.data<float>()[i]);
  EXPECT_GT(sum, 0.0);
  // bf16 weights (kFloat) take the same path.
  HostTensor wb(DType::kBF16, {70, 50}), wf(DType::kF32, {70, 50});
  for (int64_t i = 0; i < wb.numel(); ++i) {
    wb.data<uint16_t>()[i] = f32_to_bf16(w.f32.data<float>()[i]);
    wf.data<float>()[i] = bf16_to_f32(wb.data<uint16_t>()[i]);
  }
  be->linear_quant({x.view(), QuantMatrix{wb.view(), Tensor{}, QuantFormat::kFloat}, y.view()});
  be->linear({x.view(), wf.view(), ref.view()});
  EXPECT_TRUE(same_bits(y, ref));
}

TEST(QuantOps, MoeQuantIsDequantizePlusMoe) {
  auto be = make_cpu_backend(1);
  const int64_t e = 4, d = 48, inter = 40, t = 6, k = 2;
  std::vector<Fp8> store;
  for (int64_t i = 0; i < 3 * (e + 1); ++i)
    store.push_back(i % 3 == 2 ? fp8(*be, d, inter, 10 + i) : fp8(*be, inter, d, 10 + i));
  std::vector<QuantExpertWeights> q;
  std::vector<ExpertWeights> f;
  for (int64_t i = 0; i < e; ++i) {
    q.push_back({store[3 * i].m(), store[3 * i + 1].m(), store[3 * i + 2].m()});
    f.push_back({store[3 * i].f32.view(), store[3 * i + 1].f32.view(), store[3 * i + 2].f32.view()});
  }
  const QuantExpertWeights qs{store[3 * e].m(), store[3 * e + 1].m(), store[3 * e + 2].m()};
  const ExpertWeights fs{store[3 * e].f32.view(), store[3 * e + 1].f32.view(), store[3 * e + 2].f32.view()};
  HostTensor x = random_tensor({t, d}, 3), wts = random_tensor({t, k}, 4), idx(DType::kI32, {t, k});
  for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 3 + i / k) % e);
  HostTensor y(DType::kF32, {t, d}), ref(DType::kF32, {t, d});
  be->moe_quant({x.view(), wts.view(), idx.view(), &q, &qs, y.view(), 7.0f, false});
  be->moe({x.view(), wts.view(), idx.view(), &f, &fs, ref.view(), 7.0f, false});
  EXPECT_TRUE(same_bits(y, ref));
}

// Only the selected experts are dequantized: an expert no token picks may be absent (not resident, as under expert
// parallelism) and the result is still the full expansion's; selecting an absent one is an error by name.
TEST(QuantOps, MoeQuantExpandsOnlyTheSelectedExperts) {
  auto be = make_cpu_backend(1);
  const int64_t e = 6, d = 32, inter = 64, t = 3, k = 2;
  std::vector<Fp8> store;
  for (int64_t i = 0; i < 3 * e; ++i)
    store.push_back(i % 3 == 2 ? fp8(*be, d, inter, 40 + i) : fp8(*be, inter, d, 40 + i));
  std::vector<QuantExpertWeights> q;
  std::vector<ExpertWeights> f;
  for (int64_t i = 0; i < e; ++i) {
    q.push_back({store[3 * i].m(), store[3 * i + 1].m(), store[3 * i + 2].m()});
    f.push_back({store[3 * i].f32.view(), store[3 * i + 1].f32.view(), store[3 * i + 2].f32.view()});
  }
  HostTensor x = random_tensor({t, d}, 5), wts = random_tensor({t, k}, 6), idx(DType::kI32, {t, k});
  const int32_t picks[] = {4, 1, 1, 5, 4, 5};  // experts 0, 2 and 3 unused; unsorted within a token
  std::memcpy(idx.data<int32_t>(), picks, sizeof(picks));
  HostTensor y(DType::kF32, {t, d}), ref(DType::kF32, {t, d});
  be->moe({x.view(), wts.view(), idx.view(), &f, nullptr, ref.view(), 0.0f, true});
  for (int64_t unused : {0, 2, 3}) q[unused] = QuantExpertWeights{};
  be->moe_quant({x.view(), wts.view(), idx.view(), &q, nullptr, y.view(), 0.0f, true});
  EXPECT_TRUE(same_bits(y, ref));
  idx.data<int32_t>()[3] = 2;
  try {
    be->moe_quant({x.view(), wts.view(), idx.view(), &q, nullptr, y.view(), 0.0f, true});
    ADD_FAILURE() << "an absent expert was selected without an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("expert 2 is not resident"), std::string::npos) << err.what();
  }
}

TEST(QuantOps, BadQuantWeightIsRejected) {
  auto be = make_cpu_backend(1);
  const Fp8 w = fp8(*be, 70, 50, 1);
  QuantMatrix bad = w.m();
  bad.scale = Tensor{};  // FP8 without its scales
  HostTensor x = random_tensor({2, 50}, 2), y(DType::kF32, {2, 70});
  EXPECT_THROW(be->linear_quant({x.view(), bad, y.view()}), Error);
  HostTensor x_bad = random_tensor({2, 49}, 2);
  EXPECT_THROW(be->linear_quant({x_bad.view(), w.m(), y.view()}), Error);
}

}  // namespace
}  // namespace deepinfer
