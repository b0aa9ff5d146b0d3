// The committed tiny model (models/deepinfer-tiny-v3, see its README.md): it validates and loads, its MTP layer
// is in DeepSeek-V3's checkpoint layout, greedy generation is finite, deterministic and equal to transformers'
// greedy ids, and our tokenizer encodes text exactly as Hugging Face `tokenizers` does with its tokenizer.json
// (the held-out split when tools/prepare_train_data.sh has written it, and always our own docs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/weight_schema.h"
#include "deepinfer/tokenizer/tokenizer.h"
#include "test_util.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

const std::string kModelDir = DEEPINFER_SOURCE_DIR "/models/deepinfer-tiny-v3";

// `python3 tools/tiny_model_eval.py hf-greedy --prompt "The meaning of life is" --max-tokens 32`
// (transformers 5.17 DeepseekV3ForCausalLM, fp32, eager attention).
const std::vector<int64_t> kPromptIds = {587, 2535, 305, 2607, 307};
const std::vector<int64_t> kTransformersGreedy = {412, 201, 259,  263, 291, 489, 836,  383, 295,  2680, 1998,
                                                  16,  393, 1128, 307, 710, 589, 305,  263, 2291, 1059, 307,
                                                  201, 259, 412,  285, 395, 269, 2091, 362, 269,  1128};

struct Greedy {
  std::vector<int64_t> ids;
  std::vector<float> last_logits;
  bool finite = true;
};

Greedy greedy(const DeepseekV3Model& model, const std::vector<int64_t>& prompt, int n) {
  Greedy g;
  auto seq = model.new_sequence();
  HostTensor logits = model.forward(seq, prompt);
  const int64_t V = model.config().vocab_size;
  for (int step = 0; step < n; ++step) {
    const float* row = logits.data<float>() + (logits.shape()[0] - 1) * V;
    int64_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      g.finite = g.finite && std::isfinite(row[v]);
      if (row[v] > row[best]) best = v;
    }
    g.ids.push_back(best);
    g.last_logits.assign(row, row + V);
    if (step + 1 < n) logits = model.forward(seq, std::vector<int64_t>{best});
  }
  return g;
}

TEST(TinyModel, CheckpointValidatesWithMtpLayerInV3Layout) {
  const ModelConfig c = load_model_config(kModelDir + "/config.json");
  ASSERT_EQ(c.family, ModelFamily::kDeepseekV3);
  EXPECT_EQ(c.draft.kind, DraftKind::kMTP);
  EXPECT_EQ(c.draft.num_layers, 1);
  auto ck = Checkpoint::open(kModelDir);
  const WeightCheck check = check_weights(c, *ck);
  EXPECT_TRUE(check.problems.empty()) << (check.problems.empty() ? "" : check.problems.front());
  // The V3 forward has no MTP yet: its tensors are the only ones it leaves unused, and all of them are there in
  // DeepSeek-V3's layout (MODELS.md Part B §5, §7) at layer index num_hidden_layers.
  const std::string L = "model.layers." + std::to_string(c.num_layers) + ".";
  for (const auto& n : check.unused) EXPECT_EQ(n.rfind(L, 0), 0u) << n;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const std::vector<std::pair<std::string, Shape>> mtp = {
      {"enorm.weight", {D}},
      {"hnorm.weight", {D}},
      {"eh_proj.weight", {D, 2 * D}},
      {"shared_head.norm.weight", {D}},
      {"shared_head.head.weight", {V, D}},
      {"embed_tokens.weight", {V, D}},
      {"input_layernorm.weight", {D}},
      {"self_attn.kv_b_proj.weight", {c.num_heads * (c.mla.qk_nope_head_dim + c.mla.v_head_dim), c.mla.kv_lora_rank}},
      {"mlp.gate.weight", {c.moe.n_routed_experts, D}},
      {"mlp.gate.e_score_correction_bias", {c.moe.n_routed_experts}},
      {"mlp.experts.3.down_proj.weight", {D, c.moe.moe_intermediate_size}},
      {"mlp.shared_experts.up_proj.weight", {c.moe.moe_intermediate_size * c.moe.n_shared_experts, D}},
  };
  for (const auto& [name, shape] : mtp) {
    const SafetensorsEntry* e = ck->find(L + name);
    ASSERT_NE(e, nullptr) << L + name;
    EXPECT_EQ(e->shape, shape) << L + name;
  }
}

TEST(TinyModel, GreedyIsFiniteDeterministicAndMatchesTransformers) {
  auto backend = make_cpu_backend(0);
  auto model = DeepseekV3Model::load(kModelDir, *backend);
  auto tok = tokenizer::Tokenizer::from_file(kModelDir + "/tokenizer.json");
  const auto enc = tok->encode("The meaning of life is");
  ASSERT_EQ(std::vector<int64_t>(enc.begin(), enc.end()), kPromptIds);

  const Greedy a = greedy(*model, kPromptIds, 32);
  const Greedy b = greedy(*model, kPromptIds, 32);
  EXPECT_TRUE(a.finite && b.finite);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.last_logits, b.last_logits);  // bitwise: same inputs, same threads, same reduction order
  EXPECT_EQ(a.ids, kTransformersGreedy);
  const std::string text = tok->decode(std::vector<int32_t>(a.ids.begin(), a.ids.end()));
  EXPECT_NE(text.find("The term is also used"), std::string::npos) << text;
}

// Our tokenizer vs `tokenizers` (tools/tokenizer_reference.py reference) on `docs`; skips without python3 +
// tokenizers.
void expect_same_ids_as_tokenizers(const std::vector<std::string>& docs) {
  testing::TempDir dir;
  {
    std::ofstream f(dir.file("corpus.bin"), std::ios::binary);
    auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
    u32(static_cast<uint32_t>(docs.size()));
    for (const auto& d : docs) {
      u32(static_cast<uint32_t>(d.size()));
      f.write(d.data(), static_cast<std::streamsize>(d.size()));
    }
  }
  const std::string cmd = "python3 " DEEPINFER_SOURCE_DIR "/tools/tokenizer_reference.py reference --tokenizer '" +
                          kModelDir + "/tokenizer.json' --dir '" + dir.path() + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = pclose(p);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77) GTEST_SKIP() << out;
  ASSERT_EQ(code, 0) << out;

  std::ifstream r(dir.file("ref.bin"), std::ios::binary);
  auto u32 = [&] {
    uint32_t v = 0;
    r.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  ASSERT_EQ(u32(), docs.size());
  auto tok = tokenizer::Tokenizer::from_file(kModelDir + "/tokenizer.json");
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<int32_t> ref(u32());
    for (auto& id : ref) id = static_cast<int32_t>(u32());
    ASSERT_TRUE(r.good());
    tokens += ref.size();
    const auto got = tok->encode(docs[i]);
    if (got != ref && ++mismatches <= 3) {
      size_t k = 0;
      while (k < got.size() && k < ref.size() && got[k] == ref[k]) ++k;
      ADD_FAILURE() << "document " << i << " differs from tokenizers at token " << k;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  std::printf("%zu documents, %zu tokens: %zu mismatches\n", docs.size(), tokens, mismatches);
}

TEST(TinyModel, HeldOutTextTokenizesAsTokenizers) {
  const char* env = std::getenv("DEEPINFER_TINY_MODEL_DATA");
  const std::string data = env ? env : DEEPINFER_SOURCE_DIR "/build/tiny_model_data";
  std::ifstream f(data + "/val.jsonl");
  if (!f.good())
    GTEST_SKIP() << data << "/val.jsonl absent: run tools/prepare_train_data.sh " << data
                 << " (or set DEEPINFER_TINY_MODEL_DATA)";
  std::vector<std::string> docs;
  for (std::string line; std::getline(f, line);) docs.push_back(nlohmann::json::parse(line)["text"]);
  ASSERT_GT(docs.size(), 100u);
  expect_same_ids_as_tokenizers(docs);
}

TEST(TinyModel, OwnDocsTokenizeAsTokenizers) {
  std::vector<std::string> docs;
  for (const fs::path& p : {fs::path(DEEPINFER_SOURCE_DIR "/README.md"), fs::path(kModelDir + "/README.md")})
    docs.push_back(testing::read_file_or_empty(p.string()));
  for (const auto& e : fs::directory_iterator(DEEPINFER_SOURCE_DIR "/docs"))
    if (e.path().extension() == ".md") docs.push_back(testing::read_file_or_empty(e.path().string()));
  for (const auto& d : docs) ASSERT_FALSE(d.empty());
  expect_same_ids_as_tokenizers(docs);
}

}  // namespace
}  // namespace deepinfer
