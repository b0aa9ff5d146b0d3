#include "deepinfer/model/weight_loader.h"

#include <cstring>
#include <sstream>

namespace deepinfer {

WeightLoader::WeightLoader(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend)
    : config_(config), ckpt_(ckpt), backend_(backend), check_(check_weights(config, ckpt)) {
  if (!check_.problems.empty()) {
    std::ostringstream os;
    os << ckpt.dir() << ": checkpoint does not match the " << family_name(config.family) << " config ("
       << check_.problems.size() << " problem(s)):";
    for (const auto& p : check_.problems) os << "\n  " << p;
    DI_FAIL(ErrorCode::kInvalidArgument) << os.str();
  }
  for (const auto& r : check_.found) by_name_[r.spec->name] = &r;
}

HostTensor WeightLoader::f32(const std::string& name) const {
  auto it = by_name_.find(name);
  // An optional (draft) tensor the checkpoint lacks lands here too, so this is the user's error, not ours.
  DI_CHECK(it != by_name_.end()) << ckpt_.dir() << ": weight '" << name
                                 << "' is missing from the checkpoint (or not in the schema of this config)";
  const ResolvedWeight& r = *it->second;
  HostTensor out(DType::kF32, r.spec->shape);
  const Tensor w = ckpt_.tensor(r.name);
  DequantizeParams p;
  p.out = out.view();
  p.weight = w;
  switch (r.format) {
    case WeightFormat::kFloat:
      // Any-rank float tensor: dequantize as one row.
      p.format = QuantFormat::kFloat;
      p.weight = w.reshape({1, w.numel()});
      p.out = out.view().reshape({1, out.numel()});
      break;
    case WeightFormat::kFP8Block:
      p.scale = ckpt_.tensor(r.scale->name);
      if (r.spec->kind == WeightKind::kEngramTable) {
        p.format = QuantFormat::kFP8Row32;
      } else {
        p.format = QuantFormat::kFP8Block;
        p.block_n = config_.quant.block_n;
        p.block_k = config_.quant.block_k;
      }
      break;
    case WeightFormat::kMXFP4:
      p.format = QuantFormat::kMXFP4;
      p.scale = ckpt_.tensor(r.scale->name);
      break;
    case WeightFormat::kInt:
      DI_FAIL(ErrorCode::kInternal) << "weight '" << name << "' is an integer table";
  }
  backend_.dequantize(p);
  return out;
}

bool WeightLoader::is_fp8_block(const std::string& name) const {
  auto it = by_name_.find(name);
  return it != by_name_.end() && it->second->format == WeightFormat::kFP8Block &&
         it->second->spec->kind != WeightKind::kEngramTable && it->second->scale != nullptr;
}

bool WeightLoader::stored_quant(const std::string& name, QuantMatrix* q) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end() || it->second->scale == nullptr) return false;
  const ResolvedWeight& r = *it->second;
  if (r.format == WeightFormat::kFP8Block && r.spec->kind != WeightKind::kEngramTable) {
    *q = QuantMatrix{ckpt_.tensor(r.name), ckpt_.tensor(r.scale->name), QuantFormat::kFP8Block, config_.quant.block_n,
                     config_.quant.block_k};
    return true;
  }
  if (r.format == WeightFormat::kMXFP4) {
    *q = QuantMatrix{ckpt_.tensor(r.name), ckpt_.tensor(r.scale->name), QuantFormat::kMXFP4};
    return true;
  }
  return false;
}

bool WeightLoader::stored_bf16(const std::string& name, Tensor* t) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end() || it->second->format != WeightFormat::kFloat) return false;
  const ResolvedWeight& r = *it->second;
  const Tensor w = ckpt_.tensor(r.name);
  if (w.dtype() != DType::kBF16 || w.numel() != shape_numel(r.spec->shape)) return false;
  *t = w.reshape(r.spec->shape);
  return true;
}

HostTensor WeightLoader::bf16_copy(const std::string& name) const {
  Tensor stored;
  if (!stored_bf16(name, &stored)) return HostTensor{};
  HostTensor h(DType::kBF16, stored.shape());
  std::memcpy(h.data<uint8_t>(), stored.data(), static_cast<size_t>(stored.nbytes()));
  return h;
}

HostTensor WeightLoader::i64(const std::string& name) const {
  auto it = by_name_.find(name);
  // An optional (draft) tensor the checkpoint lacks lands here too, so this is the user's error, not ours.
  DI_CHECK(it != by_name_.end()) << ckpt_.dir() << ": weight '" << name
                                 << "' is missing from the checkpoint (or not in the schema of this config)";
  const ResolvedWeight& r = *it->second;
  const Tensor w = ckpt_.tensor(r.name);
  HostTensor out(DType::kI64, r.spec->shape);
  for (int64_t i = 0; i < w.numel(); ++i)
    out.data<int64_t>()[i] = w.dtype() == DType::kI64 ? w.data_as<int64_t>()[i] : w.data_as<int32_t>()[i];
  return out;
}

}  // namespace deepinfer
