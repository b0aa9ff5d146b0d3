#include "deepinfer/parallel/attention_merge.h"

#include <cmath>
#include <limits>

#include "deepinfer/core/error.h"

namespace deepinfer {

AttentionPartial partial_attention(const Tensor& q, const Tensor& q_positions, const Tensor& kv,
                                   const Tensor& kv_positions, int64_t window, float scale) {
  DI_CHECK(q.rank() == 3 && kv.rank() == 2 && q.dim(2) == kv.dim(1))
      << "partial_attention: q " << q.str() << " and kv " << kv.str() << " must be [T, H, d] and [S, d]";
  DI_CHECK(q_positions.numel() == q.dim(0) && kv_positions.numel() == kv.dim(0))
      << "partial_attention: positions " << q_positions.str() << ", " << kv_positions.str() << " for q " << q.str()
      << ", kv " << kv.str();
  DI_CHECK(q.dtype() == DType::kF32 && kv.dtype() == DType::kF32 && q.is_contiguous() && kv.is_contiguous())
      << "partial_attention: q and kv must be contiguous f32";
  const int64_t T = q.dim(0), H = q.dim(1), d = q.dim(2), S = kv.dim(0);
  const int64_t* qp = q_positions.data_as<int64_t>();
  const int64_t* kp = kv_positions.data_as<int64_t>();
  AttentionPartial p{HostTensor(DType::kF32, {T, H, d}), HostTensor(DType::kF32, {T, H})};
  std::vector<float> logits(static_cast<size_t>(S));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qv = q.data_as<float>() + (t * H + h) * d;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < S; ++s) {
        const bool visible = kp[s] <= qp[t] && (window <= 0 || kp[s] > qp[t] - window);
        float l = -std::numeric_limits<float>::infinity();
        if (visible) {
          l = 0.0f;
          for (int64_t i = 0; i < d; ++i) l += qv[i] * kv.data_as<float>()[s * d + i];
          l *= scale;
        }
        logits[s] = l;
        mx = std::max(mx, l);
      }
      float* out = p.out.data<float>() + (t * H + h) * d;
      float& lse = p.lse.data<float>()[t * H + h];
      if (mx == -std::numeric_limits<float>::infinity()) {
        lse = mx;  // nothing visible: out stays 0
        continue;
      }
      double denom = 0.0;
      for (int64_t s = 0; s < S; ++s)
        if (logits[s] != -std::numeric_limits<float>::infinity())
          denom += std::exp(static_cast<double>(logits[s] - mx));
      for (int64_t s = 0; s < S; ++s) {
        if (logits[s] == -std::numeric_limits<float>::infinity()) continue;
        const float w = static_cast<float>(std::exp(static_cast<double>(logits[s] - mx)) / denom);
        for (int64_t i = 0; i < d; ++i) out[i] += w * kv.data_as<float>()[s * d + i];
      }
      lse = mx + static_cast<float>(std::log(denom));
    }
  }
  return p;
}

HostTensor merge_attention_partials(const std::vector<AttentionPartial>& partials, const Tensor& sinks) {
  DI_CHECK(!partials.empty()) << "merge_attention_partials: no partials";
  const Shape& shape = partials[0].out.shape();
  const int64_t T = shape[0], H = shape[1], d = shape[2];
  for (const AttentionPartial& p : partials)
    DI_CHECK(p.out.shape() == shape && p.lse.shape() == Shape({T, H}))
        << "merge_attention_partials: partial shapes " << shape_str(p.out.shape()) << " / " << shape_str(p.lse.shape())
        << " differ from " << shape_str(shape);
  const bool has_sinks = sinks.data() != nullptr;
  DI_CHECK(!has_sinks || (sinks.dtype() == DType::kF32 && sinks.numel() == H))
      << "merge_attention_partials: sinks " << sinks.str() << " must be f32 [" << H << "]";
  HostTensor out(DType::kF32, {T, H, d});
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t th = 0; th < T * H; ++th) {
    const float sink = has_sinks ? sinks.data_as<float>()[th % H] : kNegInf;
    float mx = sink;
    for (const AttentionPartial& p : partials) mx = std::max(mx, p.lse.data<float>()[th]);
    if (mx == kNegInf) continue;  // no key and no sink: 0, as an empty softmax is taken to be
    // The sink's subset contributes exp(sink − mx) to the denominator and nothing to the numerator.
    double denom = has_sinks ? std::exp(static_cast<double>(sink - mx)) : 0.0;
    for (const AttentionPartial& p : partials) {
      const float lse = p.lse.data<float>()[th];
      if (lse != kNegInf) denom += std::exp(static_cast<double>(lse - mx));
    }
    float* o = out.data<float>() + th * d;
    for (const AttentionPartial& p : partials) {
      const float lse = p.lse.data<float>()[th];
      if (lse == kNegInf) continue;
      const float w = static_cast<float>(std::exp(static_cast<double>(lse - mx)) / denom);
      const float* po = p.out.data<float>() + th * d;
      for (int64_t i = 0; i < d; ++i) o[i] += w * po[i];
    }
  }
  return out;
}

}  // namespace deepinfer
