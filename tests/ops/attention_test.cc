// Sink attention against a naive double-precision reference (window visibility, compressed mask, sinks).
#include <gtest/gtest.h>

#include "op_test_util.h"

namespace deepinfer {
namespace {

TEST(SinkAttentionOp, WindowPlusMaskedCompressedEntries) {
  auto backend = make_cpu_backend(2);
  const int64_t T = 5, H = 3, hd = 16, S = 12, N = 4;
  const int window = 6;
  const float scale = 0.25f;
  HostTensor q = testing::random_tensor({T, H, hd}, 1), kv = testing::random_tensor({S, hd}, 2);
  HostTensor comp = testing::random_tensor({N, hd}, 3), sinks = testing::random_tensor({H}, 4);
  std::vector<int64_t> kvp(S);
  for (int64_t s = 0; s < S; ++s) kvp[s] = s;
  HostTensor kv_pos = testing::positions_tensor(kvp), q_pos = testing::positions_tensor({7, 8, 9, 10, 11});
  HostTensor mask(DType::kU8, {T, N});
  for (int64_t i = 0; i < T * N; ++i) mask.data<uint8_t>()[i] = (i * 7) % 3 != 0;
  HostTensor out(DType::kF32, {T, H, hd});
  SinkAttentionParams p;
  p.q = q.view();
  p.q_positions = q_pos.view();
  p.window_kv = kv.view();
  p.kv_positions = kv_pos.view();
  p.compressed = comp.view();
  p.comp_mask = mask.view();
  p.sinks = sinks.view();
  p.out = out.view();
  p.window = window;
  p.scale = scale;
  backend->sink_attention(p);
  std::vector<double> ref(T * H * hd);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::pair<double, const float*>> logits;
      auto add = [&](const float* k) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(q.data<float>()[(t * H + h) * hd + i]) * k[i];
        logits.push_back({d * scale, k});
      };
      for (int64_t s = 0; s < S; ++s)
        if (kvp[s] <= q_pos.data<int64_t>()[t] && kvp[s] > q_pos.data<int64_t>()[t] - window)
          add(kv.data<float>() + s * hd);
      for (int64_t n = 0; n < N; ++n)
        if (mask.data<uint8_t>()[t * N + n]) add(comp.data<float>() + n * hd);
      double den = std::exp(double(sinks.data<float>()[h]));
      for (auto& l : logits) den += std::exp(l.first);
      for (auto& l : logits)
        for (int64_t i = 0; i < hd; ++i) ref[(t * H + h) * hd + i] += std::exp(l.first) / den * l.second[i];
    }
  EXPECT_LT(testing::max_rel_error(out.data<float>(), ref), 1e-5);
}

}  // namespace
}  // namespace deepinfer
