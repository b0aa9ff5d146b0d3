// Reads a checkpoint's tensors as fp32 host tensors by their canonical schema name (model/weight_schema.h):
// validates the whole checkpoint against the config first (failing with every problem listed), then
// dequantizes each requested tensor exactly (FP8 block scales, MXFP4, FP8 row scales) through the backend.
#pragma once

#include <map>
#include <string>

#include "deepinfer/core/tensor.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/model/weight_schema.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

class WeightLoader {
 public:
  // Throws InvalidArgument listing every problem when the checkpoint does not match `config`.
  WeightLoader(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend);

  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  // The checkpoint carries the config's draft tensors (WeightSpec::draft; all of them, or the constructor threw).
  bool has_draft() const { return check_.has_draft; }
  // The tensor named `name` (canonical) as f32 in its logical shape.
  HostTensor f32(const std::string& name) const;
  // Whether `name` is stored FP8 e4m3 with per-block scales (kFP8Block, not an Engram row table).
  bool is_fp8_block(const std::string& name) const;
  // `name` as stored when it is a block-format matrix (FP8 with block scales, or MXFP4): its codes and scales as
  // views into the checkpoint (valid while it is open) with the format and block shape; false otherwise.
  bool stored_quant(const std::string& name, QuantMatrix* q) const;
  // `name` as stored when it is a bf16 float tensor: a view into the checkpoint (valid while it is open) in its
  // logical shape; false otherwise (f32 / f16 / block formats).
  bool stored_bf16(const std::string& name, Tensor* t) const;
  // The same as a host copy (the checkpoint's mapping closes after loading); an empty tensor when not stored bf16.
  HostTensor bf16_copy(const std::string& name) const;
  // An integer table (hash routing) as i64.
  HostTensor i64(const std::string& name) const;

 private:
  const ModelConfig& config_;
  const Checkpoint& ckpt_;
  Backend& backend_;
  WeightCheck check_;
  std::map<std::string, const ResolvedWeight*> by_name_;
};

}  // namespace deepinfer
