// Writes random-weight checkpoints in the real storage formats (BF16, FP8 e4m3 + block scales, MXFP4 experts)
// under the real tensor names, for any supported config: what tests, benchmarks and the embedded default model
// run on until trained weights exist.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

struct RandomCheckpointOptions {
  std::string config_path;  // config.json to realise (copied to out_dir)
  std::string out_dir;
  uint64_t seed = 0;
  int64_t shard_bytes = int64_t{4} << 30;  // start a new shard past this size (index json when > 1 shard)
  int threads = 0;  // tensors realised at once (0 = all cores); every tensor has its own seed, so the files are the
                    // same whatever the count
  // > 0: routed expert e >= n of a layer repeats expert e % n's values (own tensors, same bytes): a real-size
  // checkpoint in seconds instead of minutes, for benchmarks (the kernels read every expert's own storage).
  int distinct_experts = 0;
  // A tensor of at least twice this many values is drawn in pieces on up to `threads` threads (the same values).
  int64_t piece_values = int64_t{1} << 24;
};

// Returns the number of bytes of tensor data written.
int64_t write_random_checkpoint(const RandomCheckpointOptions& opts);

}  // namespace deepinfer
