// A Hugging Face checkpoint directory: config.json, one or more safetensors shards (with
// model.safetensors.index.json when sharded), tokenizer.json. Tensor lookup by name across shards.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/io/safetensors.h"

namespace deepinfer {

class Checkpoint {
 public:
  // Opens every shard and validates the index: each file it names exists, each tensor it maps is in that
  // file, and no tensor is in two shards. Throws NotFound / InvalidArgument naming the path.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr if absent
  Tensor tensor(const std::string& name) const;                 // throws NotFound
  std::vector<std::string> names() const;                       // sorted
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::pair<size_t, const SafetensorsEntry*>> index_;
};

struct ResolvedModel {
  std::string dir;
  std::string source;  // "--model", "DEEPINFER_HF_MODEL_DIR" or "embedded default"
};

// --model wins over DEEPINFER_HF_MODEL_DIR, which wins over the embedded default. The chosen directory must
// contain config.json; the error names the path, where it came from and what is missing.
ResolvedModel resolve_model_dir(const std::optional<std::string>& flag, const std::optional<std::string>& env,
                                const std::string& embedded_default);

// Reads a whole text file; NotFound naming the path if it cannot.
std::string read_text_file(const std::string& path);

}  // namespace deepinfer
