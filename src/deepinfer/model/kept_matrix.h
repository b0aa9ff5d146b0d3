// A projection matrix as a model keeps it: dequantized to f32 (the CPU reference, expert parallelism,
// `--weight-format f32`) or in the checkpoint's stored block format (FP8 e4m3 + block scales, MXFP4 + per-32
// scales), read in place by linear_quant / moe_quant on a device: 1 byte (FP8) or half a byte (MXFP4) a weight
// instead of 4. Shared by the V3 and V4 families.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

class WeightLoader;

// Bytes of an owned tensor (0 when empty): the weight-footprint sums of the model families.
int64_t owned_bytes(const OwnedTensor& t);

struct KeptMatrix {
  OwnedTensor f32;            // kept in f32
  OwnedTensor codes, scales;  // kept quantized: e4m3 [N, K] or packed e2m1 [N, K/2]; their scales
  QuantMatrix quant;          // views into codes / scales
  bool block_format = false;  // the checkpoint stores it FP8 block-scaled or MXFP4 (kept quantized or not)
  // How products with it round their inputs (set_act_quant): the reference's FP8 / MXFP4 GEMMs quantize them.
  ActQuant act_quant = ActQuant::kNone;
  bool quantized() const { return codes.view().data() != nullptr; }
  bool empty() const { return !quantized() && f32.view().data() == nullptr; }
  int64_t rows() const { return quantized() ? quant.rows() : f32.view().dim(0); }
  int64_t bytes() const;
  // The matrix as a QuantMatrix whatever its storage (kFloat over the f32 tensor when not quantized): what
  // moe_quant takes for a shared expert kept f32 beside quantized routed experts.
  QuantMatrix as_quant() const;
};

// `name` from the checkpoint: in its stored block format when `keep_quant` and it is stored so (FP8 block or
// MXFP4), else dequantized to f32.
KeptMatrix load_kept(const WeightLoader& ld, const std::string& name, bool keep_quant);

// The reference's activation rounding for products with w: q when w is stored in a block format, else none (the
// reference quantizes the inputs of its FP8 / FP4 GEMMs only).
void set_act_quant(KeptMatrix& w, ActQuant q);

// out = in · Wᵀ through linear_quant (quantized) or linear (f32), with w.act_quant.
void kept_linear(Backend& backend, const Tensor& in, const KeptMatrix& w, const Tensor& out);

// The same into a new [x.rows, N] f32 tensor of `mem`.
OwnedTensor kept_project(Backend& backend, TensorMemory& mem, const Tensor& x, const KeptMatrix& w);

// Rows [r0, r1) of w as a view (quantized: the block-scale rows too, so r0 and r1 must be multiples of the
// block height; row_slice_ok says whether they are).
bool kept_row_slice_ok(const KeptMatrix& w, int64_t r0, int64_t r1);
void kept_linear_rows(Backend& backend, const Tensor& in, const KeptMatrix& w, int64_t r0, int64_t r1,
                      const Tensor& out);

// Moves w into `mem` (device upload), re-pointing the quantized views.
void upload_kept(TensorMemory& mem, KeptMatrix& w);

}  // namespace deepinfer
