// deepinfer: command-line entry point. Each subcommand lives in its own file (cli/*_cmd.cc) and registers
// itself here; errors become a message on stderr and a non-zero exit.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"

int main(int argc, char** argv) {
  deepinfer::init_logging();
  CLI::App app{"DeepInfer: an inference engine for the DeepSeek model family"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off");
  deepinfer::cli::CommandRegistry registry;
  deepinfer::cli::register_commands(app, registry);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    deepinfer::set_log_level(log_level);
    return registry.run_selected();
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return e.code() == deepinfer::ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer: internal error: %s\n", e.what());
    return 3;
  }
}
