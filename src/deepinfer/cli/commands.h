// Subcommand registration: each *_cmd.cc adds its CLI11 subcommand and a function to run when selected.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace deepinfer::cli {

class CommandRegistry {
 public:
  void add(CLI::App* sub, std::function<int()> run) { commands_.push_back({sub, std::move(run)}); }
  int run_selected() const {
    for (const auto& c : commands_)
      if (c.sub->parsed()) return c.run();
    return 2;
  }

 private:
  struct Entry {
    CLI::App* sub;
    std::function<int()> run;
  };
  std::vector<Entry> commands_;
};

// The embedded default model directory (generated at build time until a trained model is committed).
std::string embedded_model_dir();

// --weight-format, --activation-quant, --enforce-eager, --batch-invariant, --kernel-choice and --kv-cache-dtype,
// spelled and checked the same in offline, generate and serve (defined in engine_setup.cc, next to the options they
// set).
void add_device_execution_flags(CLI::App* sub, std::string& weight_format, std::string& activation_quant,
                                bool& enforce_eager, bool& batch_invariant, std::vector<std::string>& kernel_choices,
                                std::string& kv_cache_dtype);

void register_inspect(CLI::App& app, CommandRegistry& reg);
void register_make_checkpoint(CLI::App& app, CommandRegistry& reg);
void register_generate(CLI::App& app, CommandRegistry& reg);
void register_score(CLI::App& app, CommandRegistry& reg);
void register_offline(CLI::App& app, CommandRegistry& reg);
void register_tokenize(CLI::App& app, CommandRegistry& reg);
void register_bench(CLI::App& app, CommandRegistry& reg);
// `bench serve`, a subcommand of `bench` (registered by register_bench before `bench` itself, so it is matched first).
void register_bench_serve(CLI::App* bench_cmd, CommandRegistry& reg);
void register_structured_check(CLI::App& app, CommandRegistry& reg);
void register_serve(CLI::App& app, CommandRegistry& reg);

inline void register_commands(CLI::App& app, CommandRegistry& reg) {
  register_inspect(app, reg);
  register_make_checkpoint(app, reg);
  register_structured_check(app, reg);
  register_generate(app, reg);
  register_score(app, reg);
  register_offline(app, reg);
  register_tokenize(app, reg);
  register_bench(app, reg);
  register_serve(app, reg);
}

}  // namespace deepinfer::cli
