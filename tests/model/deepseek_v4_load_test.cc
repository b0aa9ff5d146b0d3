// Loading DeepSeek-V4 / V4.1 checkpoints: quantized storage (FP8 32×32 block scales, MXFP4 experts, FP8 Engram
// tables) runs through the forward, and a broken checkpoint fails at load with every problem listed.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "test_util.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

TEST(DeepseekV4Load, QuantizedV41CheckpointRunsAndChunksConsistently) {
  testing::TempDir tmp;
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir("deepseek_v41") + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"weight_block_size", {32, 32}},
                                {"scale_fmt", "ue8m0"},
                                {"expert_dtype", "fp4"}};
  testing::write_file(tmp.file("in.json"), cfg.dump());
  RandomCheckpointOptions opts;
  opts.config_path = tmp.file("in.json");
  opts.out_dir = tmp.path() + "/ckpt";
  write_random_checkpoint(opts);
  auto backend = make_cpu_backend(0);
  std::vector<int64_t> token_map(cfg["text_config"]["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>(i % 256);
  auto model = DeepseekV4Model::load(opts.out_dir, *backend, token_map);
  ASSERT_TRUE(model->config().quant.experts_fp4);
  std::vector<int64_t> ids;
  for (int i = 0; i < 45; ++i) ids.push_back((i * 37 + 11) % 512);
  auto one = model->new_sequence();
  HostTensor full = model->forward(one, ids);
  for (int64_t i = 0; i < full.numel(); ++i) ASSERT_TRUE(std::isfinite(full.data<float>()[i])) << i;
  auto chunked = model->new_sequence();
  std::vector<float> rows;
  for (size_t at = 0; at < ids.size();) {
    const size_t len = std::min<size_t>(at < 10 ? 3 : 1, ids.size() - at);
    HostTensor part = model->forward(chunked, std::span<const int64_t>(ids.data() + at, len));
    rows.insert(rows.end(), part.data<float>(), part.data<float>() + part.numel());
    at += len;
  }
  double err = 0, scale = 0;
  for (int64_t i = 0; i < full.numel(); ++i) {
    err = std::max(err, std::fabs(double(rows[i]) - full.data<float>()[i]));
    scale = std::max(scale, std::fabs(double(full.data<float>()[i])));
  }
  EXPECT_LE(err, 1e-5 * scale);
}

TEST(DeepseekV4Load, BrokenCheckpointListsEveryProblem) {
  testing::TempDir tmp;
  const std::string src = golden_dir("deepseek_v4");
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<SafetensorsWriteItem> items;
  HostTensor wrong(DType::kBF16, {63, 128});
  for (const auto& e : file->entries()) {
    if (e.name == "model.layers.1.attn.wq_a.weight") continue;  // missing
    if (e.name == "model.layers.2.attn.wkv.weight") {           // wrong shape
      items.push_back({e.name, DType::kBF16, {63, 128}, wrong.data<void>()});
      continue;
    }
    Tensor t = file->tensor(e);
    if (e.name == "model.layers.0.ffn.gate.tid2eid") {  // wrong dtype: float hash table
      items.push_back({e.name, DType::kF32, {t.shape()[0], t.shape()[1] * 2}, t.data()});
      continue;
    }
    items.push_back({e.name, e.dtype, e.shape, t.data()});
  }
  write_safetensors(tmp.file("model.safetensors"), items);
  testing::write_file(tmp.file("config.json"), testing::read_file_or_empty(src + "/config.json"));
  auto backend = make_cpu_backend(1);
  try {
    DeepseekV4Model::load(tmp.path(), *backend);
    FAIL() << "a broken checkpoint loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layers.1.attn.wq_a.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layers.2.attn.wkv.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tid2eid"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 problem(s)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace deepinfer
