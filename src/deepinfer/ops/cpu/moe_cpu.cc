// Router (optionally group-limited) and clamped-SwiGLU MoE on the CPU. Routed contributions are summed in
// expert-id order (as the reference's per-expert dispatch loop does), in fp32, then the shared expert is added.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

float score_fn(RouterScoring s, float x) {
  switch (s) {
    case RouterScoring::kSigmoid:
      return 1.0f / (1.0f + std::exp(-x));
    case RouterScoring::kSqrtSoftplus:
      return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));  // torch softplus
    case RouterScoring::kSoftmax:
      return x;  // normalised over the row below
  }
  return x;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// y += expert(x) · (weight applied before or after w2); h is scratch for [I] values. x arrives rounded as act_quant
// asks (the caller rounds it once for all of a token's experts); h is rounded here, after the routing weight.
void run_expert(const ExpertWeights& e, const float* x, int64_t d, float weight, bool before_w2, float limit,
                ActQuant act_quant, std::vector<float>& h, float* y) {
  const int64_t inter = e.w1.dim(0);
  h.resize(inter);
  for (int64_t i = 0; i < inter; ++i) {
    float g = dot_f32(e.w1.data_as<float>() + i * d, x, d);
    float u = dot_f32(e.w3.data_as<float>() + i * d, x, d);
    if (limit > 0) {
      u = std::clamp(u, -limit, limit);
      g = std::min(g, limit);
    }
    h[i] = silu(g) * u;
    if (before_w2) h[i] *= weight;
  }
  if (act_quant != ActQuant::kNone) fake_quant_rows(h.data(), 1, inter, act_quant_kind(act_quant));
  for (int64_t o = 0; o < d; ++o) {
    const float v = dot_f32(e.w2.data_as<float>() + o * inter, h.data(), inter);
    y[o] += before_w2 ? v : v * weight;
  }
}

// Group-limited routing: experts outside the topk_group best groups get −inf (so, unlike a 0.0 fill, they
// can never be picked even when every kept score is negative). Ties between groups go to the lower index.
void mask_dropped_groups(const RouterParams& p, std::vector<float>& biased) {
  const int64_t groups = p.n_group, per_group = static_cast<int64_t>(biased.size()) / groups;
  std::vector<float> group_score(groups);
  for (int64_t g = 0; g < groups; ++g) {
    const float* s = biased.data() + g * per_group;
    if (p.group_score == GroupScore::kMax) {
      group_score[g] = *std::max_element(s, s + per_group);
    } else {
      float first = -INFINITY, second = -INFINITY;
      for (int64_t i = 0; i < per_group; ++i) {
        if (s[i] > first) {
          second = first;
          first = s[i];
        } else if (s[i] > second) {
          second = s[i];
        }
      }
      group_score[g] = first + second;
    }
  }
  std::vector<int64_t> order(groups);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
  for (int64_t j = p.topk_group; j < groups; ++j)
    std::fill(biased.begin() + order[j] * per_group, biased.begin() + (order[j] + 1) * per_group, -INFINITY);
}

}  // namespace

void CpuBackend::router(const RouterParams& p) {
  validate(p);
  const int64_t tokens = p.x.dim(0), d = p.x.dim(1), experts = p.weight.dim(0), k = p.weights.dim(1);
  std::vector<float> scores(experts), biased(experts);
  std::vector<int64_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = p.x.data_as<float>() + t * d;
    for (int64_t e = 0; e < experts; ++e)
      scores[e] = score_fn(p.scoring, dot_f32(x, p.weight.data_as<float>() + e * d, d) / p.gate_temp);
    if (p.scoring == RouterScoring::kSoftmax) {
      const float mx = *std::max_element(scores.begin(), scores.end());
      float sum = 0.0f;
      for (float& s : scores) sum += (s = std::exp(s - mx));
      for (float& s : scores) s /= sum;
    }
    int32_t* idx = p.indices.data_as<int32_t>() + t * k;
    if (p.hash_table.data()) {
      const int64_t tok = p.token_ids.data_as<int64_t>()[t];
      DI_CHECK(tok >= 0 && tok < p.hash_table.dim(0)) << "router: token id " << tok << " outside the hash table";
      for (int64_t j = 0; j < k; ++j)
        idx[j] = static_cast<int32_t>(load_as_f32(p.hash_table.data(), p.hash_table.dtype(), tok * k + j));
    } else {
      for (int64_t e = 0; e < experts; ++e) biased[e] = scores[e] + (p.bias.data() ? p.bias.data_as<float>()[e] : 0.f);
      if (p.n_group > 1) mask_dropped_groups(p, biased);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
        return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
      });
      for (int64_t j = 0; j < k; ++j) idx[j] = static_cast<int32_t>(order[j]);
    }
    float* w = p.weights.data_as<float>() + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      DI_CHECK(idx[j] >= 0 && idx[j] < experts) << "router: expert id " << idx[j] << " out of range";
      sum += (w[j] = scores[idx[j]]);
    }
    for (int64_t j = 0; j < k; ++j) w[j] = (p.normalize ? w[j] / (sum + 1e-20f) : w[j]) * p.route_scale;
  }
}

void CpuBackend::moe(const MoeParams& p) {
  validate(p);
  const int64_t tokens = p.x.dim(0), d = p.x.dim(1), k = p.weights.dim(1);
  const int64_t inter = (*p.experts)[0].w1.dim(0);
  parallel_for(tokens, tokens * (k + 1) * 3 * d * inter, [&](int64_t begin, int64_t end) {
    std::vector<float> h, rounded;  // per thread: a token's rounded x (act_quant)
    std::vector<int64_t> order(k);
    for (int64_t t = begin; t < end; ++t) {
      const float* x = p.x.data_as<float>() + t * d;
      if (p.act_quant != ActQuant::kNone) {
        rounded.assign(x, x + d);
        fake_quant_rows(rounded.data(), 1, d, act_quant_kind(p.act_quant));
        x = rounded.data();
      }
      float* y = p.out.data_as<float>() + t * d;
      std::fill(y, y + d, 0.0f);
      const int32_t* idx = p.indices.data_as<int32_t>() + t * k;
      const float* w = p.weights.data_as<float>() + t * k;
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
      for (int64_t j : order) {
        DI_CHECK(idx[j] >= 0 && idx[j] < static_cast<int64_t>(p.experts->size())) << "moe: expert id " << idx[j];
        run_expert((*p.experts)[idx[j]], x, d, w[j], p.weight_before_w2, p.swiglu_limit, p.act_quant, h, y);
      }
      if (p.shared) run_expert(*p.shared, x, d, 1.0f, true, p.swiglu_limit, p.act_quant, h, y);
    }
  });
}

}  // namespace deepinfer
