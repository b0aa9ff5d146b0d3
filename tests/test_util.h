// Helpers shared by the unit tests: temporary directories, fixture paths, running the CLI.
#pragma once

#include <algorithm>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"

namespace deepinfer::testing {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ../shared beside the checkout (absent on a user's machine: tests that need it skip).
std::string shared_dir();
bool shared_available();
// tests/data in the source tree.
std::string test_data_dir();

void write_file(const std::string& path, const std::string& content);
std::string read_file_or_empty(const std::string& path);

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};
// Runs build/bin/deepinfer with the given argument string (shell-quoted by the caller).
CommandResult run_cli(const std::string& args);

// An integer tensor as "a,b,c" (the CLI's --prompt-ids / "ids:" format).
std::string ids_csv(const Tensor& t);
// sample index -> generated ids, from `deepinfer offline`'s "[sample i] ..." / "  ids: ..." lines.
std::map<int, std::string> parse_offline_samples(const std::string& out);
// Logits rows [n, v] against a reference: the largest over rows of max |a - b| / max |b| (NaN counts as inf).
double worst_row_rel(const HostTensor& a, const HostTensor& b, int64_t v);

// A new sequence of `model` fed `ids` in chunks of `splits` (then the rest at once): the logits rows [n, v] of every
// chunk, concatenated (chunked prefill = one shot tests; any model with new_sequence() / forward(seq, ids)).
template <class Model>
std::vector<float> chunked_logits(Model& model, std::span<const int64_t> ids, const std::vector<int64_t>& splits,
                                  int64_t v) {
  const int64_t n = static_cast<int64_t>(ids.size());
  auto seq = model.new_sequence();
  std::vector<float> rows;
  int64_t at = 0;
  for (size_t i = 0; at < n; ++i) {
    const int64_t len = std::min(n - at, i < splits.size() ? splits[i] : n);
    HostTensor part = model.forward(seq, ids.subspan(static_cast<size_t>(at), static_cast<size_t>(len)));
    rows.insert(rows.end(), part.data<float>(), part.data<float>() + len * v);
    at += len;
  }
  return rows;
}

}  // namespace deepinfer::testing
