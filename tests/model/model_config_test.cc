#include "deepinfer/model/model_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/model_summary.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using nlohmann::json;

std::string config_path(const std::string& family) {
  return testing::test_data_dir() + "/configs/" + family + ".json";
}

std::string error_of(const std::string& text) {
  try {
    parse_model_config(text, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, V41LayerPlanOfTheGoldenModel) {
  ModelConfig c = load_model_config(config_path("deepseek_v41"));
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV41);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.hc.hc_mult, 4);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-20);
  ASSERT_EQ(c.layers.size(), 6u);
  EXPECT_EQ(c.layers[0].attention, AttentionKind::kSlidingWindow);
  EXPECT_FALSE(c.layers[0].compress_rope);
  EXPECT_EQ(c.layers[1].csa2_role, Csa2Role::kFull);
  EXPECT_EQ(c.layers[2].kv_source, 1);
  EXPECT_EQ(c.layers[2].index_source, 2);
  EXPECT_EQ(c.layers[3].csa2_role, Csa2Role::kFull);
  EXPECT_TRUE(c.layers[3].candidate_source);
  EXPECT_EQ(c.layers[4].csa2_role, Csa2Role::kReuse);
  EXPECT_EQ(c.layers[4].index_source, 3);
  EXPECT_EQ(c.layers[5].csa2_role, Csa2Role::kReindex);
  EXPECT_TRUE(c.layers[1].engram && c.layers[4].engram);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.theta, 160000.0);
  EXPECT_EQ(c.compress_rope.dim, 16);
  EXPECT_EQ(c.engram.num_embeddings, (std::vector<int64_t>{700, 700}));
  EXPECT_EQ(c.image_token_id, 129264);
}

TEST(ModelConfig, V4LayerTypesAndHashRouting) {
  ModelConfig c = load_model_config(config_path("deepseek_v4"));
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV4);
  EXPECT_TRUE(c.attn.q_head_norm);
  std::vector<int> ratios;
  for (const auto& p : c.layers) ratios.push_back(p.compress_ratio);
  EXPECT_EQ(ratios, (std::vector<int>{0, 4, 16, 4, 16}));
  EXPECT_EQ(c.layers[1].attention, AttentionKind::kCSA);
  EXPECT_EQ(c.layers[2].attention, AttentionKind::kHCA);
  EXPECT_EQ(c.layers[0].routing, RoutingKind::kHash);
  EXPECT_EQ(c.layers[2].routing, RoutingKind::kTopK);
}

TEST(ModelConfig, V3MlaYarnScaleAndDenseLayers) {
  ModelConfig c = load_model_config(config_path("deepseek_v3"));
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV3);
  EXPECT_EQ(c.layers[0].routing, RoutingKind::kDense);
  EXPECT_EQ(c.layers[1].routing, RoutingKind::kTopK);
  EXPECT_EQ(c.mla.kv_lora_rank, 32);
  EXPECT_EQ(c.draft.kind, DraftKind::kMTP);
  // 48^-0.5 * (0.1 * ln 4 + 1)^2
  const double m = 0.1 * std::log(4.0) + 1.0;
  EXPECT_NEAR(attention_softmax_scale(c), m * m / std::sqrt(48.0), 1e-12);
}

// The real DeepSeek-V3 config (dims from MODELS.md Part B §1): MLA cache = 576 values = 1152 B per layer in bf16.
TEST(ModelConfig, RealV3KvBytesAndScale) {
  json j = {{"model_type", "deepseek_v3"}, {"vocab_size", 129280}, {"hidden_size", 7168},
            {"intermediate_size", 18432}, {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61},
            {"num_attention_heads", 128}, {"n_routed_experts", 256}, {"n_shared_experts", 1},
            {"num_experts_per_tok", 8}, {"n_group", 8}, {"topk_group", 4}, {"first_k_dense_replace", 3},
            {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
            {"v_head_dim", 128}, {"rope_theta", 10000},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                              {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
            {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}}}};
  ModelConfig c = parse_model_config(j.dump());
  auto kinds = cache_kinds(c);
  ASSERT_EQ(kinds.size(), 1u);
  EXPECT_DOUBLE_EQ(kinds[0].bytes_per_token, 1152.0 * 61);
  EXPECT_NEAR(attention_softmax_scale(c), 0.1352338, 1e-6);
  EXPECT_TRUE(c.quant.fp8);
  EXPECT_FALSE(c.quant.scale_ue8m0);
  EXPECT_EQ(c.layers[2].routing, RoutingKind::kDense);
  EXPECT_EQ(c.layers[3].routing, RoutingKind::kTopK);
}

// V4.1-Flash's published schedule: 890 B/token of persistent compressed cache (MODELS.md §3.4).
TEST(ModelConfig, RealV41FlashPlanAndCacheBytes) {
  json t = json::parse(testing::read_file_or_empty(config_path("deepseek_v41")))["text_config"];
  t["hidden_size"] = 5120;
  t["num_hidden_layers"] = 40;
  t["num_attention_heads"] = 64;
  t["head_dim"] = 512;
  t["qk_rope_head_dim"] = 64;
  t["q_lora_rank"] = 1280;
  t["o_groups"] = 8;
  t["o_lora_rank"] = 1024;
  t["sliding_window"] = 128;
  t["index_n_heads"] = 32;
  t["index_head_dim"] = 128;
  t["index_topk"] = 512;
  t["n_routed_experts"] = 384;
  t["num_experts_per_tok"] = 6;
  t["moe_intermediate_size"] = 2304;
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  t["compress_ratios"] = ratios;
  t["kv_source_layer_ids"] = {2, 8, 14, 20};
  t["index_source_layer_ids"] = {2, 8, 14, 20, 24, 28, 32, 36};
  t["candidate_source_layer_id"] = 20;
  t["candidate_topk_blocks"] = 2048;
  t["engram_layer_ids"] = {1, 14};
  t["engram_num_embeddings"] = {384006168, 384016682};
  t["num_nextn_predict_layers"] = 3;
  t["dspark_target_layer_ids"] = {37, 38, 39};
  json j = {{"model_type", "deepseek_v41"}, {"text_config", t}};
  ModelConfig c = parse_model_config(j.dump());
  EXPECT_EQ(c.layers[2].csa2_role, Csa2Role::kFull);
  EXPECT_EQ(c.layers[5].csa2_role, Csa2Role::kReuse);
  EXPECT_EQ(c.layers[5].kv_source, 2);
  EXPECT_EQ(c.layers[20].csa2_role, Csa2Role::kFull);
  EXPECT_TRUE(c.layers[20].candidate_source);
  EXPECT_EQ(c.layers[24].csa2_role, Csa2Role::kReindex);
  EXPECT_EQ(c.layers[24].kv_source, 20);
  EXPECT_EQ(c.layers[25].index_source, 24);
  EXPECT_EQ(c.layers[21].csa2_role, Csa2Role::kReuse);
  EXPECT_EQ(c.draft.kind, DraftKind::kDSpark);
  double persistent = 0;
  for (const auto& k : cache_kinds(c))
    if (k.name == "compressed_kv" || k.name == "index_keys") persistent += k.bytes_per_token;
  EXPECT_DOUBLE_EQ(persistent, 890.0);
  for (const auto& k : cache_kinds(c))
    if (k.name == "swa_ring") EXPECT_EQ(k.bytes_per_sequence, 128 * 528 * 43);
}

TEST(ModelConfig, ClearErrorsForBadConfigs) {
  EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"vocab_size": 3})").find("missing 'model_type'"), std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "llama"})").find("'llama' is not supported"), std::string::npos);
  json v3 = json::parse(testing::read_file_or_empty(config_path("deepseek_v3")));
  json bad = v3;
  bad.erase("hidden_size");
  EXPECT_NE(error_of(bad.dump()).find("'hidden_size'"), std::string::npos);
  bad = v3;
  bad["hidden_size"] = "big";
  EXPECT_NE(error_of(bad.dump()).find("'hidden_size' must be an integer"), std::string::npos);
  // Found by fuzz_model_config: an integer too large for int64 (parsed as a double) must not be converted.
  std::string huge = v3.dump();
  huge.replace(huge.find("\"bos_token_id\":0"), 16, "\"bos_token_id\":99999999999999999999990");
  EXPECT_NE(error_of(huge).find("int64 range"), std::string::npos) << error_of(huge);
  bad = v3;
  bad["bos_token_id"] = 18446744073709551615ull;
  EXPECT_NE(error_of(bad.dump()).find("int64 range"), std::string::npos);
  bad = v3;
  bad["num_experts_per_tok"] = 99;
  EXPECT_NE(error_of(bad.dump()).find("num_experts_per_tok"), std::string::npos);
  bad = v3;
  bad["n_group"] = 3;
  EXPECT_NE(error_of(bad.dump()).find("n_group"), std::string::npos);
  bad = v3;
  bad["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_NE(error_of(bad.dump()).find("'gptq' is not supported"), std::string::npos);
  json v41 = json::parse(testing::read_file_or_empty(config_path("deepseek_v41")));
  bad = v41;
  bad["text_config"]["kv_source_layer_ids"] = {0};
  EXPECT_NE(error_of(bad.dump()).find("kv_source_layer_ids entry 0"), std::string::npos);
  bad = v41;
  bad["text_config"]["kv_source_layer_ids"] = {3};
  EXPECT_NE(error_of(bad.dump()).find("no preceding kv source"), std::string::npos);
  bad = v41;
  bad["text_config"]["num_attention_heads"] = 3;
  EXPECT_NE(error_of(bad.dump()).find("o_groups"), std::string::npos);
  bad = v41;
  bad.erase("text_config");
  EXPECT_NE(error_of(bad.dump()).find("text_config"), std::string::npos);
  json v4 = json::parse(testing::read_file_or_empty(config_path("deepseek_v4")));
  bad = v4;
  bad["layer_types"][1] = "mystery_attention";
  EXPECT_NE(error_of(bad.dump()).find("mystery_attention"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
