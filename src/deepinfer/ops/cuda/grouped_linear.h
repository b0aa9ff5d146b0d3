// Grouped quantized linear on CudaBackend: out_g = in_g · dequant(W_g)ᵀ for G weights of one format and shape,
// where in_g / out_g are the g-th of G equal, contiguous row blocks of one input / output (group-major rows). It is
// the grouped output projection of DeepSeek V4 (o_groups weights wo_a[g], each over its chunk of the attention
// output) as one GEMM launch instead of G: decode at batch 1 is launch-bound (docs/PERF.md).
//
// Why a plan: the grouped GEMM (cuda::run_gemm with groups) reads device arrays: the weight and scale pointer
// tables, the group and tile offsets and the list of non-empty groups. Uploading them per call would put a host
// copy into every call (not capturable in a CUDA graph, and as costly as the launches it saves). A plan uploads
// them once for one row count; a call then only launches.
//
// Why not a Backend op (ops/ops.h): the engine keeps its wo_a in f32 and runs Backend::linear per group
// (model/v4_grouped_output.cc), so the bench is the only caller of a quantized grouped linear today, and a plan type
// in ops.h would rebuild every file. The CPU side of the same math is a loop of Backend::linear_quant (the bench's
// CPU target does that); tests/cuda/cuda_grouped_linear_test.cc compares the two.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

class GroupedLinearPlan {
 public:
  int groups() const { return static_cast<int>(weights_.size()); }
  int64_t rows() const { return rows_; }  // rows per group
  int64_t n() const { return weights_.front().rows(); }
  int64_t k() const { return weights_.front().cols(); }
  const QuantMatrix& weight(int g) const { return weights_.at(g); }
  // Whether a call is one grouped launch (else one linear_quant per group; see grouped_linear_quant).
  bool one_launch(bool batch_invariant, const cuda::KernelChoices& choices) const;

 private:
  friend std::unique_ptr<GroupedLinearPlan> plan_grouped_linear(CudaBackend& be, std::vector<QuantMatrix> weights,
                                                                int64_t rows);
  friend void grouped_linear_quant(CudaBackend& be, const Tensor& in, const GroupedLinearPlan& plan, const Tensor& out,
                                   ActQuant act_quant);
  std::vector<QuantMatrix> weights_;
  int64_t rows_ = 0;
  bool aligned16_ = false;  // every weight and scale pointer 16-byte aligned (vector loads)
  OwnedTensor tables_;      // i64 [2G]: weight pointers, then scale pointers
  OwnedTensor offsets_;     // i32 [3(G+1)]: group_offsets, tile_offsets, active_groups (count at [G])
};

// Checks that the weights share format, dtypes, shape, blocks and scale shape (InvalidArgument otherwise) and uploads
// the device arrays for calls of `rows` rows per group. Uploads: call it outside a graph capture. The weights'
// storage must outlive the plan.
std::unique_ptr<GroupedLinearPlan> plan_grouped_linear(CudaBackend& be, std::vector<QuantMatrix> weights, int64_t rows);

// in f32 [G·rows, K], out f32 [G·rows, N] (contiguous, on the device): group g's rows [g·rows, (g+1)·rows).
// One launch of the own grouped GEMM where it is the kernel linear_quant would pick for a group alone — block formats
// and f32 weights at <= cuda::kGemmSkinnyRows rows per group (decode: the weight-streaming kernels, A rounded to bf16
// for UE8M0 scales as in linear_quant), or any row count in batch-invariant mode (the same fp32 chain per output);
// otherwise (many rows: cuBLASLt on a bf16 copy of each weight; bf16 weights) one linear_quant per group, as before.
// Neither path synchronises, uploads or allocates beyond the workspace: capturable. act_quant: as linear_quant's.
void grouped_linear_quant(CudaBackend& be, const Tensor& in, const GroupedLinearPlan& plan, const Tensor& out,
                          ActQuant act_quant = ActQuant::kNone);

// Rows per group up to which a call (default mode) is one grouped launch: cuda::kGemmStreamMmaMaxRows, or
// choices.grouped_one_launch_rows when set: 0 runs every call per group, a larger value sends more rows of UE8M0 block
// formats through one grouped tensor-core launch (a bf16 copy of A, then gemm_mma or the WMMA tile; the same products
// as the per-group cuBLASLt path, which rounds A to bf16 too) instead of 3 launches per group.
int64_t grouped_one_launch_rows(const cuda::KernelChoices& choices);

}  // namespace deepinfer
