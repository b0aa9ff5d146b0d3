// Logging through spdlog. Messages go to stderr so that stdout stays the program's output (generated text,
// JSON from `inspect --json`). Level from set_log_level or the CLI's --log-level.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace deepinfer {

// "trace", "debug", "info", "warn", "error", "off"; throws InvalidArgument for anything else.
void set_log_level(std::string_view level);
void init_logging();  // idempotent: a stderr logger named "deepinfer" as spdlog's default

}  // namespace deepinfer

#define DI_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define DI_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define DI_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define DI_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
