// `deepinfer make-checkpoint` and `deepinfer inspect` end to end, through the real binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "deepinfer/io/checkpoint.h"
#include "deepinfer/io/safetensors.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

using nlohmann::json;
using testing::run_cli;
using testing::TempDir;

std::string config_path(const std::string& family) { return testing::test_data_dir() + "/configs/" + family + ".json"; }

// Writes `family`'s config with an optional quantization_config into dir/config.json-src.
std::string variant_config(const TempDir& d, const std::string& family, const json& quant) {
  json j = json::parse(testing::read_file_or_empty(config_path(family)));
  if (!quant.is_null()) j["quantization_config"] = quant;
  const std::string p = d.file(family + "-src.json");
  testing::write_file(p, j.dump(2));
  return p;
}

struct Variant {
  std::string family;
  json quant;
  std::string expect_storage;
};

TEST(InspectCli, GeneratedCheckpointsOfEveryFamilyAndFormatAreComplete) {
  const json fp8_v4 = testing::v4_quantization_config();
  const json fp8_v3 = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  const std::vector<Variant> variants = {
      {"deepseek_v41", nullptr, "float BF16"}, {"deepseek_v41", fp8_v4, "mxfp4 I8"},
      {"deepseek_v4", nullptr, "int I64"},     {"deepseek_v4", fp8_v4, "fp8-block F8_E4M3"},
      {"deepseek_v3", nullptr, "float BF16"},  {"deepseek_v3", fp8_v3, "fp8-block F8_E4M3"},
  };
  for (const auto& v : variants) {
    TempDir d;
    const std::string cfg = variant_config(d, v.family, v.quant);
    auto gen = run_cli("make-checkpoint --config " + cfg + " --out " + d.file("ck") + " --seed 3");
    ASSERT_EQ(gen.exit_code, 0) << gen.output;
    auto r = run_cli("inspect " + d.file("ck"));
    EXPECT_EQ(r.exit_code, 0) << v.family << "\n" << r.output;
    EXPECT_NE(r.output.find("family: " + v.family), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(v.expect_storage), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("required tensors present"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("not used by this build"), std::string::npos) << r.output;
  }
}

TEST(InspectCli, ReportsEveryProblemAtOnce) {
  TempDir d;
  ASSERT_EQ(run_cli("make-checkpoint --config " + config_path("deepseek_v41") + " --out " + d.file("ck")).exit_code, 0);
  // Rewrite the checkpoint without one tensor, with another in a wrong dtype and a third in a wrong shape.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> keep;
  std::vector<SafetensorsWriteItem> items;
  {
    auto f = SafetensorsFile::open(d.file("ck/model.safetensors"));
    for (const auto& e : f->entries()) {
      if (e.name == "layers.2.attn.wq_a.weight") continue;
      Tensor t = f->tensor(e);
      keep.push_back({e.name, std::vector<uint8_t>(static_cast<uint8_t*>(t.data()),
                                                   static_cast<uint8_t*>(t.data()) + t.nbytes())});
    }
  }
  for (auto& [name, bytes] : keep) {
    auto f = SafetensorsFile::open(d.file("ck/model.safetensors"));
    const auto* e = f->find(name);
    DType t = e->dtype;
    Shape s = e->shape;
    if (name == "layers.0.attn.wkv.weight") t = DType::kI16;    // same byte size, wrong dtype
    if (name == "layers.1.ffn_norm.weight") s = {s[0] / 2, 2};  // same bytes, wrong shape
    items.push_back({name, t, s, bytes.data()});
  }
  write_safetensors(d.file("ck/model.safetensors"), items);
  auto r = run_cli("inspect --model " + d.file("ck"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("3 problem(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("missing tensor 'layers.2.attn.wq_a.weight'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'layers.0.attn.wkv.weight' is I16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'layers.1.ffn_norm.weight' is BF16[64, 2]: expected shape [128]"), std::string::npos)
      << r.output;
}

TEST(InspectCli, ShardedCheckpointsLoadThroughTheIndex) {
  TempDir d;
  auto gen =
      run_cli("make-checkpoint --config " + config_path("deepseek_v4") + " --out " + d.file("ck") + " --shard-mb 1");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(std::filesystem::exists(d.file("ck/model.safetensors.index.json")));
  auto ck = Checkpoint::open(d.file("ck"));
  EXPECT_GT(ck->shards().size(), 1u);
  auto r = run_cli("inspect " + d.file("ck"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Tensors are realised on several threads and appended in spec order: the shards and the index are the same
// bytes whatever the thread count (V4 with FP8 / MXFP4, so every kind of tensor is realised).
TEST(InspectCli, CheckpointBytesDoNotDependOnTheThreadCount) {
  TempDir d;
  const json fp8_v4 = testing::v4_quantization_config();
  const std::string cfg = variant_config(d, "deepseek_v4", fp8_v4);
  for (const char* t : {"1", "3"}) {
    auto gen = run_cli("make-checkpoint --config " + cfg + " --out " + d.file(std::string("ck") + t) +
                       " --shard-mb 1 --seed 5 --threads " + t);
    ASSERT_EQ(gen.exit_code, 0) << gen.output;
  }
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.file("ck1"))) {
    const std::string name = e.path().filename().string();
    const std::string a = testing::read_file_or_empty(e.path().string());
    EXPECT_FALSE(a.empty()) << name;
    EXPECT_EQ(a, testing::read_file_or_empty(d.file("ck3/" + name))) << name;
    ++files;
  }
  EXPECT_GT(files, 3);  // config, index, several shards
  auto r = run_cli("make-checkpoint --config " + cfg + " --out " + d.file("bad") + " --threads -1");
  EXPECT_NE(r.exit_code, 0);
}

// --distinct-experts N: routed expert e >= N of a layer holds expert e % N's bytes under its own names (weights and
// scales), the checkpoint is complete, and the experts below N are as without the option.
TEST(InspectCli, RepeatedExpertsCopyTheirSourceBytes) {
  TempDir d;
  const json fp8_v4 = testing::v4_quantization_config();
  const std::string cfg = variant_config(d, "deepseek_v4", fp8_v4);
  ASSERT_EQ(run_cli("make-checkpoint --config " + cfg + " --out " + d.file("all") + " --seed 2").exit_code, 0);
  auto gen = run_cli("make-checkpoint --config " + cfg + " --out " + d.file("rep") + " --seed 2 --distinct-experts 3");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  auto r = run_cli("inspect " + d.file("rep"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("required tensors present"), std::string::npos) << r.output;
  auto all = Checkpoint::open(d.file("all")), rep = Checkpoint::open(d.file("rep"));
  auto bytes = [](const Checkpoint& ck, const std::string& name) {
    const Tensor t = ck.tensor(name);
    return std::string(static_cast<const char*>(t.data()), static_cast<size_t>(t.nbytes()));
  };
  const json c = json::parse(testing::read_file_or_empty(cfg));
  const int experts = c["n_routed_experts"].get<int>();
  ASSERT_GT(experts, 4);
  for (const std::string layer : {"layers.0.", "layers.2."})
    for (const std::string m : {"w1", "w2", "w3"})
      for (const std::string part : {".weight", ".scale"}) {
        auto name = [&](int e) { return layer + "ffn.experts." + std::to_string(e) + "." + m + part; };
        for (int e = 0; e < experts; ++e) {
          EXPECT_EQ(bytes(*rep, name(e)), bytes(*all, name(e % 3))) << name(e);
          if (e >= 3 && part == ".weight") {
            EXPECT_NE(bytes(*all, name(e)), bytes(*all, name(e % 3))) << name(e);
          }
        }
      }
  // Everything else is as without the option.
  EXPECT_EQ(bytes(*rep, "layers.1.attn.wq_b.weight"), bytes(*all, "layers.1.attn.wq_b.weight"));
  EXPECT_EQ(bytes(*rep, "layers.1.ffn.shared_experts.w2.weight"), bytes(*all, "layers.1.ffn.shared_experts.w2.weight"));
}

TEST(InspectCli, ClearErrorsForBadInput) {
  TempDir d;
  auto r = run_cli("inspect " + d.file("nothing"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  testing::write_file(d.file("bad.json"), R"({"model_type": "gpt2"})");
  r = run_cli("make-checkpoint --config " + d.file("bad.json") + " --out " + d.file("o"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'gpt2' is not supported"), std::string::npos) << r.output;
  r = run_cli("inspect");  // env unset in the test, embedded default may or may not exist: must not crash
  EXPECT_TRUE(r.exit_code == 0 || r.output.find("error") != std::string::npos) << r.output;
}

TEST(InspectCli, GoldenCheckpointsFromShared) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared/golden not present";
  for (const std::string f : {"deepseek_v41", "deepseek_v4", "deepseek_v3"}) {
    auto r = run_cli("inspect " + testing::shared_dir() + "/golden/" + f);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("layer plan:"), std::string::npos);
  }
  auto r = run_cli("inspect " + testing::shared_dir() + "/golden/deepseek_v41");
  EXPECT_NE(r.output.find("reindex"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace deepinfer
