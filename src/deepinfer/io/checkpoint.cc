#include "deepinfer/io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "deepinfer/core/error.h"

namespace deepinfer {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK_CODE(in.good(), ErrorCode::kNotFound) << "cannot read '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  DI_CHECK_CODE(fs::is_directory(dir), ErrorCode::kNotFound) << "checkpoint directory '" << dir << "' does not exist";
  auto ck = std::unique_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    json idx;
    try {
      idx = json::parse(read_text_file(index_path));
    } catch (const json::exception& e) {
      DI_FAIL(ErrorCode::kInvalidArgument) << index_path << ": not valid JSON (" << e.what() << ")";
    }
    DI_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object())
        << index_path << ": missing object 'weight_map'";
    std::set<std::string> uniq;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      DI_CHECK(it.value().is_string()) << index_path << ": weight_map['" << it.key() << "'] is not a file name";
      std::string f = it.value().get<std::string>();
      DI_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty())
          << index_path << ": shard name '" << f << "' must be a plain file name";
      weight_map[it.key()] = f;
      uniq.insert(f);
    }
    files.assign(uniq.begin(), uniq.end());
  } else if (fs::exists(dir + "/model.safetensors")) {
    // A single-file checkpoint; other *.safetensors beside it (fixtures, adapters) are not weights.
    files.push_back("model.safetensors");
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().filename().string());
    }
    std::sort(files.begin(), files.end());
  }
  DI_CHECK_CODE(!files.empty(), ErrorCode::kNotFound) << "checkpoint directory '" << dir << "' has no *.safetensors";
  std::map<std::string, size_t> file_index;
  for (const auto& f : files) {
    const std::string path = dir + "/" + f;
    DI_CHECK_CODE(fs::exists(path), ErrorCode::kNotFound)
        << "shard '" << path << "' named in model.safetensors.index.json does not exist";
    file_index[f] = ck->shards_.size();
    ck->shards_.push_back(SafetensorsFile::open(path));
  }
  for (size_t s = 0; s < ck->shards_.size(); ++s) {
    for (const auto& e : ck->shards_[s]->entries()) {
      auto [it, inserted] = ck->index_.emplace(e.name, std::make_pair(s, &e));
      DI_CHECK(inserted) << dir << ": tensor '" << e.name << "' appears in both '" << ck->shards_[it->second.first]->path()
                         << "' and '" << ck->shards_[s]->path() << "'";
    }
  }
  for (const auto& [name, f] : weight_map) {
    auto it = ck->index_.find(name);
    DI_CHECK(it != ck->index_.end() && it->second.first == file_index[f])
        << index_path << ": tensor '" << name << "' is mapped to '" << f << "' but is not in that file";
  }
  return ck;
}

const SafetensorsEntry* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.second;
}

Tensor Checkpoint::tensor(const std::string& name) const {
  auto it = index_.find(name);
  DI_CHECK_CODE(it != index_.end(), ErrorCode::kNotFound) << dir_ << ": missing tensor '" << name << "'";
  return shards_[it->second.first]->tensor(*it->second.second);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : index_) out.push_back(n);
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [_, v] : index_) n += v.second->end - v.second->begin;
  return n;
}

ResolvedModel resolve_model_dir(const std::optional<std::string>& flag, const std::optional<std::string>& env,
                                const std::string& embedded_default) {
  ResolvedModel r;
  if (flag && !flag->empty()) {
    r = {*flag, "--model"};
  } else if (env && !env->empty()) {
    r = {*env, "DEEPINFER_HF_MODEL_DIR"};
  } else {
    r = {embedded_default, "embedded default"};
  }
  DI_CHECK_CODE(fs::is_directory(r.dir), ErrorCode::kNotFound)
      << "model directory '" << r.dir << "' (from " << r.source << ") does not exist"
      << (r.source == "embedded default" ? "; build it with ./build.sh or pass --model DIR" : "");
  DI_CHECK_CODE(fs::exists(r.dir + "/config.json"), ErrorCode::kNotFound)
      << "model directory '" << r.dir << "' (from " << r.source << ") has no config.json";
  return r;
}

}  // namespace deepinfer
