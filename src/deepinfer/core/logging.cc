#include "deepinfer/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

#include "deepinfer/core/error.h"

namespace deepinfer {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("deepinfer");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
  });
}

void set_log_level(std::string_view level) {
  init_logging();
  auto l = spdlog::level::from_str(std::string(level));
  DI_CHECK(l != spdlog::level::off || level == "off")
      << "unknown log level '" << level << "' (trace, debug, info, warn, error, off)";
  spdlog::set_level(l);
}

}  // namespace deepinfer
