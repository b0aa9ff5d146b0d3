#include "deepinfer/model/output_head.h"

#include "deepinfer/core/error.h"
#include "deepinfer/model/weight_loader.h"

namespace deepinfer {

HostTensor load_output_head(const WeightLoader& ld, const std::string& name, bool keep_stored) {
  HostTensor h = keep_stored ? ld.bf16_copy(name) : HostTensor{};
  return h.view().data() != nullptr ? std::move(h) : ld.f32(name);
}

void head_linear(Backend& backend, const Tensor& in, const Tensor& head, const Tensor& out) {
  if (head.dtype() == DType::kF32) {
    backend.linear({in, head, out});
    return;
  }
  DI_CHECK_INTERNAL(head.dtype() == DType::kBF16) << "output head must be f32 or bf16, got " << head.str();
  backend.linear_quant({in, QuantMatrix{head, Tensor{}, QuantFormat::kFloat}, out});
}

}  // namespace deepinfer
