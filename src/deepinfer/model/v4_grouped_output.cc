#include "deepinfer/model/v4_grouped_output.h"

#include "deepinfer/core/error.h"

namespace deepinfer {

// The head groups move to and from group-major buffers in one strided copy each (a copy in, a GEMM and a copy out
// per group before: 3·G + 1 launches a call, G + 3 now; decode is launch-bound), and each group's GEMM reads a
// contiguous block of the same values, so the results are the same bits.
OwnedTensor v4_grouped_output(Backend& backend, TensorMemory& mem, const Tensor& heads, const KeptMatrix& wo_a,
                              const KeptMatrix& wo_b, int64_t groups, int64_t o_lora) {
  const int64_t T = heads.dim(0), width = heads.dim(1), gw = width / groups, D = wo_b.rows();
  DI_CHECK_INTERNAL(width % groups == 0) << "grouped output: " << width << " head values in " << groups << " groups";
  DI_CHECK_INTERNAL(heads.rank() == 2 && heads.strides()[1] == 1) << "grouped output: heads " << heads.str();
  // Every buffer here is written in full (a copy, the group GEMMs, a copy, the GEMM) before it is read. One row (decode
  // at batch 1) is already group-major on both sides: the groups read the heads and write z in place (two launches
  // fewer a layer; the same values in the same places, so the same bits).
  OwnedTensor z = mem.empty(DType::kF32, {T, groups * o_lora});
  OwnedTensor og, zg;
  Tensor og_view, zg_view;  // [groups, T, gw], [groups, T, o_lora]
  if (T == 1) {
    og_view = Tensor(heads.data(), DType::kF32, {groups, 1, gw}, heads.device());
    zg_view = z.view().reshape({groups, 1, o_lora});
  } else {
    og = mem.empty(DType::kF32, {groups, T, gw});
    zg = mem.empty(DType::kF32, {groups, T, o_lora});
    og_view = og.view();
    zg_view = zg.view();
    mem.copy(og_view, Tensor(heads.data(), DType::kF32, {groups, T, gw}, {gw, heads.strides()[0], 1}, heads.device()));
  }
  if (wo_a.quantized()) {
    // One call for all groups (CUDA: one grouped launch where its choices allow; the same products per group). Loading
    // keeps wo_a quantized only where each group's rows are whole scale blocks, which the op checks.
    backend.grouped_linear_quant(
        {og_view.reshape({groups * T, gw}), wo_a.quant, groups, zg_view.reshape({groups * T, o_lora}), wo_a.act_quant});
  } else {
    for (int64_t g = 0; g < groups; ++g)
      kept_linear_rows(backend, og_view.row(g), wo_a, g * o_lora, (g + 1) * o_lora, zg_view.row(g));
  }
  if (T != 1)
    mem.copy(Tensor(z.view().data(), DType::kF32, {groups, T, o_lora}, {o_lora, groups * o_lora, 1}, z.view().device()),
             zg_view);
  OwnedTensor out = mem.empty(DType::kF32, {T, D});
  kept_linear(backend, z.view(), wo_b, out.view());
  return out;
}

}  // namespace deepinfer
