// Shared by the activation-rounding model tests: how far two logits tensors of the same shape are apart (the largest
// absolute difference, the largest magnitude of the reference and their cosine; every value of `got` must be finite),
// and a prefill-then-decode run that gives the logits to compare.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <span>
#include <vector>

#include "deepinfer/core/tensor.h"

namespace deepinfer::testing {

struct LogitDiff {
  double max_abs = 0, max_ref = 0, cosine = 0;
};

inline LogitDiff logit_diff(const HostTensor& got, const HostTensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  LogitDiff d;
  double dot = 0, ng = 0, nr = 0;
  for (int64_t j = 0; j < std::min(got.numel(), ref.numel()); ++j) {
    const double x = got.data<float>()[j], y = ref.data<float>()[j];
    EXPECT_TRUE(std::isfinite(x)) << "value " << j;
    d.max_abs = std::max(d.max_abs, std::fabs(x - y));
    d.max_ref = std::max(d.max_ref, std::fabs(y));
    dot += x * y;
    ng += x * x;
    nr += y * y;
  }
  d.cosine = dot / std::sqrt(ng * nr);
  return d;
}

// A prefill of `prompt_len` tokens ((37 i + 11) mod vocab), then three decode steps (5, 301, 77): the logits of each.
template <class Model>
std::vector<HostTensor> prefill_then_decode(const Model& m, int prompt_len, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int i = 0; i < prompt_len; ++i) ids.push_back((i * 37 + 11) % vocab);
  std::vector<HostTensor> out;
  auto seq = m.new_sequence();
  out.push_back(m.forward(seq, ids));
  for (int64_t tok : {5, 301, 77}) out.push_back(m.forward(seq, std::span<const int64_t>(&tok, 1)));
  return out;
}

}  // namespace deepinfer::testing
