// mHC (manifold-constrained hyper-connections) on the CPU: site coefficients with Sinkhorn mixing, the V4
// head's collapse weights, collapse and expand. All fp32, one token at a time (the work is tiny).
#include <cmath>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// m = fn · (f / rms(f)) for one token's flattened streams f of length n.
void mix_logits(const float* f, int64_t n, const float* fn, int64_t rows, float eps, float* m) {
  const float inv = 1.0f / std::sqrt(dot_f32(f, f, n) / static_cast<float>(n) + eps);
  std::vector<float> normed(n);
  for (int64_t i = 0; i < n; ++i) normed[i] = f[i] * inv;
  for (int64_t r = 0; r < rows; ++r) m[r] = dot_f32(fn + r * n, normed.data(), n);
}

}  // namespace

void CpuBackend::hc_mix(const HcMixParams& p) {
  validate(p);
  const int64_t tokens = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2), mix = (2 + hc) * hc;
  const float* scale = p.scale.data_as<float>();
  const float* base = p.base.data_as<float>();
  parallel_for(tokens, tokens * mix * hc * d, [&](int64_t begin, int64_t end) {
    std::vector<float> m(mix);
    for (int64_t t = begin; t < end; ++t) {
      mix_logits(p.streams.data_as<float>() + t * hc * d, hc * d, p.fn.data_as<float>(), mix, p.norm_eps, m.data());
      float* pre = p.pre.data_as<float>() + t * hc;
      float* post = p.post.data_as<float>() + t * hc;
      float* c = p.comb.data_as<float>() + t * hc * hc;  // c[j*hc + k]
      for (int64_t k = 0; k < hc; ++k) {
        pre[k] = sigmoid(m[k] * scale[0] + base[k]) + p.hc_eps;
        post[k] = 2.0f * sigmoid(m[hc + k] * scale[1] + base[hc + k]);
      }
      // Row softmax over k, + eps, then one column normalisation; the remaining iterations alternate
      // row and column normalisations (each denominator + eps).
      for (int64_t j = 0; j < hc; ++j) {
        float* row = c + j * hc;
        float mx = -INFINITY;
        for (int64_t k = 0; k < hc; ++k) {
          row[k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
          mx = std::max(mx, row[k]);
        }
        float sum = 0.0f;
        for (int64_t k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
        for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + p.hc_eps;
      }
      auto normalize_columns = [&] {
        for (int64_t k = 0; k < hc; ++k) {
          float sum = 0.0f;
          for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
          for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= sum + p.hc_eps;
        }
      };
      auto normalize_rows = [&] {
        for (int64_t j = 0; j < hc; ++j) {
          float sum = 0.0f;
          for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k];
          for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= sum + p.hc_eps;
        }
      };
      normalize_columns();
      for (int it = 1; it < p.sinkhorn_iters; ++it) {
        normalize_rows();
        normalize_columns();
      }
    }
  });
}

void CpuBackend::hc_head(const HcHeadParams& p) {
  validate(p);
  const int64_t tokens = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2);
  std::vector<float> m(hc);
  for (int64_t t = 0; t < tokens; ++t) {
    mix_logits(p.streams.data_as<float>() + t * hc * d, hc * d, p.fn.data_as<float>(), hc, p.norm_eps, m.data());
    for (int64_t k = 0; k < hc; ++k)
      p.pre.data_as<float>()[t * hc + k] =
          sigmoid(m[k] * p.scale.data_as<float>()[0] + p.base.data_as<float>()[k]) + p.hc_eps;
  }
}

void CpuBackend::hc_collapse(const HcCollapseParams& p) {
  validate(p);
  const int64_t tokens = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = p.streams.data_as<float>() + t * hc * d;
    const float* pre = p.pre.data_as<float>() + t * hc;
    float* out = p.out.data_as<float>() + t * d;
    for (int64_t i = 0; i < d; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < hc; ++k) acc += pre[k] * x[k * d + i];
      out[i] = acc;
    }
  }
}

void CpuBackend::hc_expand(const HcExpandParams& p) {
  validate(p);
  const int64_t tokens = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2);
  std::vector<float> mixed(hc * d);
  for (int64_t t = 0; t < tokens; ++t) {
    float* x = p.streams.data_as<float>() + t * hc * d;
    const float* y = p.x.data_as<float>() + t * d;
    const float* post = p.post.data_as<float>() + t * hc;
    const float* c = p.comb.data_as<float>() + t * hc * hc;
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t i = 0; i < d; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += c[j * hc + k] * x[j * d + i];
        mixed[k * d + i] = post[k] * y[i] + acc;
      }
    std::copy(mixed.begin(), mixed.end(), x);
  }
}

}  // namespace deepinfer
