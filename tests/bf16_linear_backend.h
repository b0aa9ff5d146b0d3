// A Backend that forwards every op to another one, except that linear() first rounds its input and weight to
// bf16 (RNE) and runs the inner linear on the rounded copies in fp32: the CPU reference of
// CudaBackend::set_linear_precision(LinearPrecision::kBF16) (bf16 products are exact in fp32, so only the
// summation order differs). Host memory only.
#pragma once

#include <memory>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/ops.h"
#include "forwarding_backend.h"

namespace deepinfer::testing {

class Bf16LinearBackend final : public ForwardingBackend {
 public:
  explicit Bf16LinearBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}

  void linear(const LinearParams& p) override {
    DI_CHECK(p.act_quant == ActQuant::kNone) << "act_quant is not emulated here";
    auto rounded = [](const Tensor& t) {
      HostTensor h(DType::kF32, t.shape());
      const float* src = t.data_as<float>();
      for (int64_t i = 0; i < t.numel(); ++i) h.data<float>()[i] = round_bf16(src[i]);
      return h;
    };
    DI_CHECK(p.in.is_contiguous() && p.weight.is_contiguous()) << "bf16 linear: contiguous in and weight only";
    HostTensor in = rounded(p.in), w = rounded(p.weight);
    inner_->linear({in, w, p.out});
  }
};

}  // namespace deepinfer::testing
