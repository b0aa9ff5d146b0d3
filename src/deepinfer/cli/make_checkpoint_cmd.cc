// deepinfer make-checkpoint --config FILE --out DIR [--seed N] [--shard-mb M] [--threads T] [--distinct-experts N]
#include "deepinfer/cli/commands.h"
#include "deepinfer/model/random_checkpoint.h"

namespace deepinfer::cli {

void register_make_checkpoint(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("make-checkpoint", "write a random-weight checkpoint in the real formats");
  auto opts = std::make_shared<RandomCheckpointOptions>();
  auto shard_mb = std::make_shared<int64_t>(4096);
  sub->add_option("--config", opts->config_path, "config.json to realise")->required();
  sub->add_option("--out", opts->out_dir, "output directory")->required();
  sub->add_option("--seed", opts->seed, "random seed");
  sub->add_option("--shard-mb", *shard_mb, "maximum shard size in MB (several shards get an index)");
  sub->add_option("--threads", opts->threads, "tensors realised at once (0 = all cores; the files do not depend on it)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--distinct-experts", opts->distinct_experts,
                  "0: every routed expert random; N > 0: expert e >= N of a layer repeats expert e % N (same bytes, "
                  "own tensors: a real-size benchmark checkpoint in seconds)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  reg.add(sub, [opts, shard_mb] {
    opts->shard_bytes = *shard_mb * 1000 * 1000;
    write_random_checkpoint(*opts);
    return 0;
  });
}

}  // namespace deepinfer::cli
