#include "deepinfer/model/v4_grouped_output.h"

#include "deepinfer/core/error.h"

namespace deepinfer {

OwnedTensor v4_grouped_output(Backend& backend, TensorMemory& mem, const Tensor& heads, const KeptMatrix& wo_a,
                              const KeptMatrix& wo_b, int64_t groups, int64_t o_lora) {
  const int64_t T = heads.dim(0), width = heads.dim(1), gw = width / groups, D = wo_b.rows();
  DI_CHECK_INTERNAL(width % groups == 0) << "grouped output: " << width << " head values in " << groups << " groups";
  OwnedTensor z = mem.zeros(DType::kF32, {T, groups * o_lora}), og = mem.zeros(DType::kF32, {T, gw});
  OwnedTensor zg = mem.zeros(DType::kF32, {T, o_lora});
  for (int64_t g = 0; g < groups; ++g) {
    mem.copy(og.view(), narrow(heads, 1, g * gw, (g + 1) * gw));
    kept_linear_rows(backend, og.view(), wo_a, g * o_lora, (g + 1) * o_lora, zg.view());
    mem.copy(narrow(z.view(), 1, g * o_lora, (g + 1) * o_lora), zg.view());
  }
  OwnedTensor out = mem.zeros(DType::kF32, {T, D});
  kept_linear(backend, z.view(), wo_b, out.view());
  return out;
}

}  // namespace deepinfer
