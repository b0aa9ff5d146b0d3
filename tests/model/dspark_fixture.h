// Generated checkpoints with draft weights, shared by the DSpark and V4 MTP tests: DeepSeek-V4.1 / V4-0731-shaped
// with DSpark draft weights (the golden tiny config of a family plus 3 draft layers), and V4-Flash-base-shaped with
// one MTP module. Built once per family per test binary.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "random_checkpoint_util.h"
#include "test_util.h"

namespace deepinfer::testing {

// A generated checkpoint of the golden tiny config of `family` with 3 DSpark draft layers (vocabulary size `vocab`
// when > 0).
struct DraftFixture {
  TempDir tmp;
  std::string dir;
  std::vector<int64_t> token_map;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV4Model> model;
};

// `vocab` > 0 replaces the golden vocabulary size (a small vocabulary makes a random model's sampled
// distribution broad enough for random drafts to be accepted now and then).
inline nlohmann::json dspark_config(const std::string& family, int64_t vocab = 0) {
  nlohmann::json root =
      nlohmann::json::parse(read_file_or_empty(test_data_dir() + "/golden/" + family + "/config.json"));
  nlohmann::json& c = root.contains("text_config") ? root["text_config"] : root;
  if (vocab > 0) {
    c["vocab_size"] = vocab;
    // The fixture's token map (id % 256) then has only `vocab` compressed ids.
    if (c.contains("engram_compressed_vocab_size")) c["engram_compressed_vocab_size"] = std::min<int64_t>(vocab, 256);
  }
  const int64_t V = c["vocab_size"].get<int64_t>();
  const int layers = c["num_hidden_layers"].get<int>();
  c["num_nextn_predict_layers"] = 3;
  c["dspark_block_size"] = 5;
  c["dspark_noise_token_id"] = V - 3;
  c["dspark_target_layer_ids"] = {layers - 3, layers - 2, layers - 1};
  c["dspark_markov_rank"] = 32;
  c["dspark_n_routed_experts"] = 4;
  c["dspark_num_experts_per_tok"] = 2;
  return root;
}

inline DraftFixture& dspark_fixture(const std::string& family, int64_t vocab = 0) {
  static std::map<std::pair<std::string, int64_t>, std::unique_ptr<DraftFixture>> cache;
  auto& f = cache[{family, vocab}];
  if (!f) {
    f = std::make_unique<DraftFixture>();
    const nlohmann::json cfg = dspark_config(family, vocab);
    f->dir = write_random_checkpoint_of(f->tmp, cfg, 5);
    f->backend = make_cpu_backend(0);
    const nlohmann::json& c = cfg.contains("text_config") ? cfg["text_config"] : cfg;
    f->token_map.resize(c["vocab_size"].get<size_t>());
    for (size_t i = 0; i < f->token_map.size(); ++i) f->token_map[i] = static_cast<int64_t>(i % 256);
    f->model = DeepseekV4Model::load(f->dir, *f->backend, f->token_map);
  }
  return *f;
}

// A generated DeepSeek-V4-Flash-base-shaped checkpoint (the golden tiny V4 config) with one MTP module
// (`mtp.0.*`); `vocab` > 0 replaces the vocabulary size. Built once per vocabulary per test binary.
inline DraftFixture& v4_mtp_fixture(int64_t vocab = 0) {
  static std::map<int64_t, std::unique_ptr<DraftFixture>> cache;
  auto& f = cache[vocab];
  if (!f) {
    f = std::make_unique<DraftFixture>();
    nlohmann::json cfg = nlohmann::json::parse(read_file_or_empty(test_data_dir() + "/golden/deepseek_v4/config.json"));
    if (vocab > 0) cfg["vocab_size"] = vocab;
    cfg["num_nextn_predict_layers"] = 1;
    f->dir = write_random_checkpoint_of(f->tmp, cfg, 9);
    f->backend = make_cpu_backend(0);
    f->model = DeepseekV4Model::load(f->dir, *f->backend);
  }
  return *f;
}

inline std::vector<int64_t> dspark_prompt(int n, int64_t V) {
  std::vector<int64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % (V - 8));
  return ids;
}

inline int64_t argmax_of(std::span<const float> row) { return std::max_element(row.begin(), row.end()) - row.begin(); }

}  // namespace deepinfer::testing
