#include <unistd.h>

#include <filesystem>

#include "deepinfer/cli/commands.h"

namespace deepinfer::cli {

// A committed model under <source>/models/default wins; otherwise the one ./build.sh generated next to the
// binary (<build>/models/default).
std::string embedded_model_dir() {
  namespace fs = std::filesystem;
  const fs::path committed = fs::path(DEEPINFER_SOURCE_DIR) / "models" / "default";
  if (fs::exists(committed / "config.json")) return committed.string();
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = '\0';
    return (fs::path(buf).parent_path().parent_path() / "models" / "default").string();
  }
  return "build/models/default";
}

}  // namespace deepinfer::cli
