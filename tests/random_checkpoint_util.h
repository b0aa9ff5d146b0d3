// A random checkpoint of a config for tests (model/random_checkpoint.h, the writer behind `deepinfer
// make-checkpoint`): the config goes to TMP/in.json, the checkpoint to TMP/ckpt (names overridable).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "deepinfer/model/random_checkpoint.h"
#include "test_util.h"

namespace deepinfer::testing {

// Writes `cfg` and a random checkpoint of it (weights from `seed`); returns the checkpoint directory.
inline std::string write_random_checkpoint_of(const TempDir& tmp, const nlohmann::json& cfg, uint64_t seed,
                                              const std::string& dir_name = "ckpt",
                                              const std::string& config_name = "in.json") {
  write_file(tmp.file(config_name), cfg.dump());
  RandomCheckpointOptions opts;
  opts.config_path = tmp.file(config_name);
  opts.out_dir = tmp.path() + "/" + dir_name;
  opts.seed = seed;
  write_random_checkpoint(opts);
  return opts.out_dir;
}

}  // namespace deepinfer::testing
