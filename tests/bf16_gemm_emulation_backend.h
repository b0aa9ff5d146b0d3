// A CPU Backend that reproduces the rounding of the CUDA backend's quantized GEMMs (linear_quant / moe_quant with FP8
// or other non-f32 weights), to tell rounding apart from bugs: the CUDA path takes exact fp32 products for few rows
// (<= 4 rows, or < 3 routed rows per used expert on average in a block format: the weight-streaming kernel) and,
// for more, rounds both the input and the dequantized weight to bf16 (RNE) before fp32 accumulation (tensor-core
// tiles / cuBLASLt on a bf16 weight copy); a bf16 weight (kFloat) takes cuBLASLt bf16 at any row count, with split_in
// (the V4 compressors in prefill) as two bf16 terms hi = bf16(x), lo = bf16(x − hi) summed in fp32. Here the same
// values are rounded and the products summed in fp32 on the CPU, so the two differ in summation order only. Every
// other op forwards to the inner backend. Host memory only (non-batch-invariant mode).
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/ops.h"
#include "forwarding_backend.h"

namespace deepinfer::testing {

class Bf16GemmEmulationBackend final : public ForwardingBackend {
 public:
  static constexpr int64_t kExactRows = 4;   // cuda::kGemmSkinnyRows
  static constexpr int64_t kMmaMinRows = 3;  // cuda::kGemmMmaMinRows

  explicit Bf16GemmEmulationBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}

  void linear_quant(const QuantLinearParams& p) override {
    DI_CHECK(p.act_quant == ActQuant::kNone) << "act_quant is not emulated here";
    const int64_t m = p.in.dim(0);
    HostTensor w = dequantized(p.weight);
    // A bf16 weight (the V4 output head beside kept block formats) goes through cuBLASLt bf16 at any row count.
    const bool bf16_weight = p.weight.format == QuantFormat::kFloat && p.weight.weight.dtype() == DType::kBF16;
    if (m <= kExactRows && !bf16_weight) return inner_->linear({p.in, w.view(), p.out});
    if (p.split_in) {
      HostTensor hi = rounded(p.in), lo(DType::kF32, p.in.shape()), part(DType::kF32, p.out.shape());
      for (int64_t i = 0; i < lo.numel(); ++i) {
        const float h = hi.data<float>()[i];
        lo.data<float>()[i] = std::isfinite(h) ? round_bf16(p.in.data_as<float>()[i] - h) : 0.0f;
      }
      inner_->linear({hi.view(), w.view(), p.out});
      inner_->linear({lo.view(), w.view(), part.view()});
      for (int64_t i = 0; i < part.numel(); ++i) p.out.data_as<float>()[i] += part.data<float>()[i];
      return;
    }
    HostTensor in = rounded(p.in);
    round_in_place(w);
    inner_->linear({in.view(), w.view(), p.out});
  }

  void moe_quant(const QuantMoeParams& p) override {
    DI_CHECK(p.act_quant == ActQuant::kNone) << "act_quant is not emulated here";
    DI_CHECK(p.experts != nullptr) << "moe_quant: experts are required";
    const int64_t T = p.x.dim(0), D = p.x.dim(1), k = p.weights.dim(1);
    const int64_t E = static_cast<int64_t>(p.experts->size()), slots = T * k;
    // Routed experts in a block format take the mma.sync kernel (bf16 x and h) from kMmaMinRows rows per used
    // expert on average (cuda::kGemmMmaMinRows), f32 ones the exact kernels up to kExactRows.
    const int64_t rows_per_expert = slots > 0 ? (slots + std::min(E, slots) - 1) / std::min(E, slots) : 0;
    const bool block_format = !p.experts->empty() && (*p.experts)[0].w1.format != QuantFormat::kFloat;
    const bool routed_bf16 = slots > 0 && rows_per_expert >= (block_format ? kMmaMinRows : kExactRows + 1);
    const bool shared_bf16 = T > kExactRows;
    std::vector<std::vector<HostTensor>> cache(static_cast<size_t>(E) + 1);
    auto weights_of = [&](int64_t e, const QuantExpertWeights& q, bool bf16) -> const std::vector<HostTensor>& {
      std::vector<HostTensor>& w = cache[e];
      if (w.empty())
        for (const QuantMatrix* m : {&q.w1, &q.w3, &q.w2}) {
          w.push_back(dequantized(*m));
          if (bf16) round_in_place(w.back());
        }
      return w;
    };
    const float* x = p.x.data_as<float>();
    float* out = p.out.data_as<float>();
    std::vector<float> xr(D), h, y(D);
    // One expert on one token row: y = W2·(silu(min(W1·x, L))·clamp(W3·x, ±L) [· weight]).
    auto expert = [&](const std::vector<HostTensor>& w, bool bf16, float weight_in_h) {
      const int64_t I = w[0].shape()[0];
      h.assign(I, 0.0f);
      for (int64_t i = 0; i < I; ++i) {
        float g = 0, u = 0;
        for (int64_t d = 0; d < D; ++d) {
          g += w[0].data<float>()[i * D + d] * xr[d];
          u += w[1].data<float>()[i * D + d] * xr[d];
        }
        if (p.swiglu_limit > 0) {
          g = std::min(g, p.swiglu_limit);
          u = std::clamp(u, -p.swiglu_limit, p.swiglu_limit);
        }
        const float v = g / (1.0f + std::exp(-g)) * u * weight_in_h;
        h[i] = bf16 ? round_bf16(v) : v;
      }
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int64_t i = 0; i < I; ++i) acc += w[2].data<float>()[d * I + i] * h[i];
        y[d] = acc;
      }
    };
    for (int64_t t = 0; t < T; ++t) {
      std::fill(out + t * D, out + (t + 1) * D, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = p.indices.data_as<int32_t>()[t * k + j];
        const float wt = p.weights.data_as<float>()[t * k + j];
        DI_CHECK(e >= 0 && e < E) << "moe_quant: expert id " << e;
        for (int64_t d = 0; d < D; ++d) xr[d] = routed_bf16 ? round_bf16(x[t * D + d]) : x[t * D + d];
        expert(weights_of(e, (*p.experts)[e], routed_bf16), routed_bf16, p.weight_before_w2 ? wt : 1.0f);
        for (int64_t d = 0; d < D; ++d) out[t * D + d] += p.weight_before_w2 ? y[d] : wt * y[d];
      }
      if (p.shared) {
        for (int64_t d = 0; d < D; ++d) xr[d] = shared_bf16 ? round_bf16(x[t * D + d]) : x[t * D + d];
        expert(weights_of(E, *p.shared, shared_bf16), shared_bf16, 1.0f);
        for (int64_t d = 0; d < D; ++d) out[t * D + d] += y[d];
      }
    }
  }

 private:
  HostTensor dequantized(const QuantMatrix& m) {
    HostTensor w(DType::kF32, {m.rows(), m.cols()});
    if (m.format == QuantFormat::kFloat && m.weight.dtype() == DType::kF32) {
      std::copy_n(m.weight.data_as<float>(), w.numel(), w.data<float>());
    } else {
      inner_->dequantize({m.weight, m.scale, m.format, m.block_n, m.block_k, w.view()});
    }
    return w;
  }
  static HostTensor rounded(const Tensor& t) {
    DI_CHECK(t.is_contiguous()) << "bf16 emulation: contiguous input only";
    HostTensor h(DType::kF32, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) h.data<float>()[i] = round_bf16(t.data_as<float>()[i]);
    return h;
  }
  static void round_in_place(HostTensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = round_bf16(t.data<float>()[i]);
  }
};

}  // namespace deepinfer::testing
