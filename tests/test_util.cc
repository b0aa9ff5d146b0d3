#include "test_util.h"

#include <algorithm>
#include <cmath>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

namespace deepinfer::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
  std::random_device rd;
  for (;;) {
    path_ = (fs::temp_directory_path() / ("deepinfer_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd())))
                .string();
    if (fs::create_directory(path_)) break;
  }
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string shared_dir() { return DEEPINFER_SHARED_DIR; }
bool shared_available() { return fs::exists(shared_dir() + "/golden"); }
std::string test_data_dir() { return DEEPINFER_TEST_DATA_DIR; }

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << content;
}

std::string read_file_or_empty(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

CommandResult run_cli(const std::string& args) {
#ifdef DEEPINFER_CLI_PATH
  const std::string cmd = std::string(DEEPINFER_CLI_PATH) + " " + args + " 2>&1";
#else
  const std::string cmd = "deepinfer " + args + " 2>&1";
#endif
  CommandResult r{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string ids_csv(const Tensor& t) {
  std::ostringstream os;
  for (int64_t i = 0; i < t.numel(); ++i) os << (i ? "," : "") << t.data_as<int64_t>()[i];
  return os.str();
}

std::map<int, std::string> parse_offline_samples(const std::string& out) {
  std::map<int, std::string> m;
  std::regex head(R"(\[sample (\d+)\][^\n]*\n  ids: ([0-9,]*))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), head); it != std::sregex_iterator(); ++it)
    m[std::stoi((*it)[1])] = (*it)[2];
  return m;
}

double worst_row_rel(const HostTensor& a, const HostTensor& b, int64_t v) {
  double worst = 0;
  for (int64_t r = 0; r < a.numel() / v; ++r) {
    double diff = 0, scale = 0;
    for (int64_t j = 0; j < v; ++j) {
      const double d = std::fabs(double(a.data<float>()[r * v + j]) - b.data<float>()[r * v + j]);
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
      scale = std::max(scale, std::fabs(double(b.data<float>()[r * v + j])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace deepinfer::testing
