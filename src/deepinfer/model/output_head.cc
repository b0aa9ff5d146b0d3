#include "deepinfer/model/output_head.h"

#include <cstring>

#include "deepinfer/core/error.h"
#include "deepinfer/model/weight_loader.h"

namespace deepinfer {

HostTensor load_output_head(const WeightLoader& ld, const std::string& name, bool keep_stored) {
  Tensor stored;
  if (!keep_stored || !ld.stored_bf16(name, &stored)) return ld.f32(name);
  // A host copy: the checkpoint's mapping is closed after loading.
  HostTensor h(DType::kBF16, stored.shape());
  std::memcpy(h.data<uint8_t>(), stored.data(), static_cast<size_t>(stored.nbytes()));
  return h;
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
