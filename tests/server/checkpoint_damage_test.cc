// Fault injection on disk: a checkpoint that was truncated or whose header was changed after it was written fails
// to load with an error that names the file or the tensor, never a crash or a model that runs on garbage shapes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/server/model_host.h"
#include "test_util.h"

namespace deepinfer::testing {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The golden V4.1 fixture with its weights copied (not linked), so that the test can damage them.
std::string copy_model(const std::string& dir) {
  const std::string src = test_data_dir() + "/golden/deepseek_v41";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "model.safetensors"})
    fs::copy_file(src + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  return dir;
}

std::string load_error(const std::string& dir) {
  server::ModelHostOptions o;
  o.model_dir = dir;
  o.threads = 1;
  o.kv_budget_mb = 16;
  try {
    server::ModelHost::load(o);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(CheckpointDamage, TheUndamagedCopyLoads) {
  TempDir dir;
  EXPECT_EQ(load_error(copy_model(dir.file("m"))), "");
}

TEST(CheckpointDamage, TruncatedWeightsNameTheFile) {
  TempDir dir;
  const std::string m = copy_model(dir.file("m"));
  const std::string w = m + "/model.safetensors";
  const auto size = fs::file_size(w);
  for (uintmax_t keep : {size - 1, size / 2, uintmax_t{100}, uintmax_t{0}}) {
    fs::resize_file(w, keep);
    const std::string err = load_error(m);
    EXPECT_NE(err, "") << "loaded a checkpoint cut to " << keep << " bytes";
    EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  }
}

TEST(CheckpointDamage, ChangedHeaderNamesTheTensor) {
  TempDir dir;
  const std::string m = copy_model(dir.file("m"));
  const std::string w = m + "/model.safetensors";
  std::string bytes = read_bytes(w);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  // Swap the dimensions of the first non-square 2-D tensor: the byte ranges stay valid, the shape is wrong.
  std::string name;
  for (auto& [k, v] : header.items()) {
    if (k == "__metadata__" || v["shape"].size() != 2 || v["shape"][0] == v["shape"][1]) continue;
    std::swap(v["shape"][0], v["shape"][1]);
    name = k;
    break;
  }
  ASSERT_FALSE(name.empty());
  std::string text = header.dump();
  ASSERT_LE(text.size(), n);
  text.resize(n, ' ');  // the same header length: padding with spaces is allowed
  bytes.replace(8, n, text);
  std::ofstream(w, std::ios::binary | std::ios::trunc) << bytes;
  const std::string err = load_error(m);
  EXPECT_NE(err.find(name), std::string::npos) << "the error should name " << name << ": " << err;
}

TEST(CheckpointDamage, ChangedConfigIsAClearError) {
  TempDir dir;
  const std::string m = copy_model(dir.file("m"));
  auto cfg = nlohmann::ordered_json::parse(read_bytes(m + "/config.json"));
  auto& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;  // V4.1 nests the language model's config
  text["num_hidden_layers"] = text["num_hidden_layers"].get<int>() + 1;  // a layer the weights do not have
  std::ofstream(m + "/config.json", std::ios::trunc) << cfg.dump();
  EXPECT_NE(load_error(m), "");
  std::ofstream(m + "/config.json", std::ios::trunc) << "{\"model_type\": ";
  EXPECT_NE(load_error(m).find("config.json"), std::string::npos) << load_error(m);
}

}  // namespace
}  // namespace deepinfer::testing
