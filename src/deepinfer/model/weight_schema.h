// The tensors a config needs: canonical name, accepted alias names (the other naming scheme of the family),
// logical shape and storage kind. One list drives `inspect` (completeness and dtype checks), the checkpoint
// generator (what to write) and the weight loader (what to read).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/model_config.h"

namespace deepinfer {

enum class WeightKind {
  kVector,       // norms, biases, sinks, mHC base/scale/fn, compressor position biases: any float dtype
  kEmbedding,    // token embedding / head: any float dtype (never quantized)
  kLinear,       // [out, in] float, or F8_E4M3 + block scale when the config quantizes it
  kExpert,       // routed expert matrix: as kLinear, or MXFP4 (packed I8/U8 [out, in/2] + E8M0 [out, in/32])
  kEngramTable,  // [rows, dim] float, or F8_E4M3 + E8M0 [rows, dim/32]
  kIntTable,     // hash-routing table: I32/I64
};

struct WeightSpec {
  std::string name;                  // canonical (what make-checkpoint writes)
  std::vector<std::string> aliases;  // other accepted names
  Shape shape;                       // logical (dequantized) shape
  WeightKind kind = WeightKind::kVector;
  bool quantized = false;  // kLinear/kExpert/kEngramTable: the config stores it quantized
  int layer = -1;          // -1: global
  bool expert = false;     // a routed expert (counts toward active params only top-k / n_routed)
  // Draft-model tensor (DSpark `mtp.*`): all-or-none. A checkpoint without any of them is complete (the draft is
  // then unavailable); one with some of them must have all.
  bool draft = false;
};

// Storage the checkpoint actually uses for one spec.
enum class WeightFormat { kFloat, kFP8Block, kMXFP4, kInt };
std::string_view weight_format_name(WeightFormat f);

struct ResolvedWeight {
  const WeightSpec* spec = nullptr;
  std::string name;  // the name found in the checkpoint
  WeightFormat format = WeightFormat::kFloat;
  const SafetensorsEntry* weight = nullptr;
  const SafetensorsEntry* scale = nullptr;  // FP8 / MXFP4 / quantized Engram tables
  uint64_t bytes = 0;                       // weight + scale
};

std::vector<WeightSpec> expected_weights(const ModelConfig& c);

// Scale tensor names for a quantized weight named `weight_name` ("x.weight" -> "x.scale",
// "x.weight_scale_inv"); the first existing one is used.
std::vector<std::string> scale_names(const std::string& weight_name);
// Block-scale grid of an FP8 matrix.
Shape fp8_scale_shape(const Shape& shape, const QuantConfig& q);

// Finds every spec in the checkpoint and validates dtype and shape (including scale shapes). Every problem
// is collected; `problems` is empty when the checkpoint is complete. Unused checkpoint tensors are listed in
// `unused` (not an error: e.g. draft or vision weights this build does not run).
struct WeightCheck {
  std::vector<WeightSpec> specs;
  std::vector<ResolvedWeight> found;  // spec pointers point into `specs`
  std::vector<std::string> problems;
  std::vector<std::string> unused;
  bool has_draft = false;  // the draft tensors are present (and valid unless `problems` says otherwise)
};
WeightCheck check_weights(const ModelConfig& c, const Checkpoint& ck);

}  // namespace deepinfer
