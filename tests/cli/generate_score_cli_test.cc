// `deepinfer generate` and `deepinfer score` end to end on the V4 golden fixture; `score` on a V3-family model
// (the committed tiny model) with --logprobs.
#include <gtest/gtest.h>

#include <cmath>

#include "deepinfer/io/safetensors.h"
#include "test_util.h"

namespace deepinfer {
namespace {

std::string fixture() { return testing::test_data_dir() + "/golden/deepseek_v4"; }

std::vector<int64_t> golden_ids(const std::string& name) {
  auto g = SafetensorsFile::open(fixture() + "/golden.safetensors");
  Tensor t = g->tensor(name);
  return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
}

std::string join(const std::vector<int64_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

TEST(GenerateCli, GreedyIdsMatchTheFixture) {
  auto r = testing::run_cli("generate --model " + fixture() + " --prompt-ids " +
                            join(golden_ids("prompt1.input_ids"), ",") + " --max-tokens 16 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(join(golden_ids("prompt1.generated_ids"), ",")), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode_ppl"), std::string::npos) << r.output;
  EXPECT_NE(testing::run_cli("generate --model " + fixture() + " --prompt-ids 1,x").exit_code, 0);
}

TEST(ScoreCli, ChunkedAndDecodedLogitsMatchTheFixture) {
  testing::TempDir tmp;
  const auto p0 = golden_ids("prompt0.input_ids"), p1 = golden_ids("prompt1.input_ids");
  testing::write_file(tmp.file("ids.jsonl"), "[" + join(p0, ",") + "]\n[" + join(p1, ",") + "]\n");
  auto r = testing::run_cli("score --model " + fixture() + " --ids-file " + tmp.file("ids.jsonl") + " --out " +
                            tmp.file("out.safetensors") + " --chunk 7 --decode-from 40 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = SafetensorsFile::open(tmp.file("out.safetensors"));
  auto g = SafetensorsFile::open(fixture() + "/golden.safetensors");
  for (int i = 0; i < 2; ++i) {
    Tensor ours = out->tensor("logits." + std::to_string(i));
    Tensor ref = g->tensor("prompt" + std::to_string(i) + ".logits");
    ASSERT_EQ(ours.shape(), ref.shape());
    double err = 0, scale = 0;
    for (int64_t j = 0; j < ref.numel(); ++j) {
      err = std::max(err, std::fabs(double(ours.data_as<float>()[j]) - ref.data_as<float>()[j]));
      scale = std::max(scale, std::fabs(double(ref.data_as<float>()[j])));
    }
    EXPECT_LE(err, 1e-4 * scale) << "line " << i;
  }
}

// --logprobs writes log softmax(logits[t])[ids[t+1]] of the logits `score` writes without it (V3 family).
TEST(ScoreCli, LogprobsOfAV3ModelAreTheLogSoftmaxOfItsLogits) {
  testing::TempDir tmp;
  const std::string model = DEEPINFER_SOURCE_DIR "/models/deepinfer-tiny-v3";
  testing::write_file(tmp.file("ids.jsonl"), "[587,2535,305,2607,307,412,201]\n[19,3000,45,1,7]\n");
  const std::string base = "score --model " + model + " --ids-file " + tmp.file("ids.jsonl") + " --threads 2 --out ";
  auto r = testing::run_cli(base + tmp.file("logits.safetensors") + " --chunk 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::run_cli(base + tmp.file("lp.safetensors") + " --logprobs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto logits = SafetensorsFile::open(tmp.file("logits.safetensors"));
  auto lp = SafetensorsFile::open(tmp.file("lp.safetensors"));
  const std::vector<std::vector<int64_t>> lines = {{587, 2535, 305, 2607, 307, 412, 201}, {19, 3000, 45, 1, 7}};
  for (size_t i = 0; i < lines.size(); ++i) {
    Tensor l = logits->tensor("logits." + std::to_string(i));
    Tensor p = lp->tensor("logprobs." + std::to_string(i));
    const int64_t n = static_cast<int64_t>(lines[i].size()), V = l.shape()[1];
    ASSERT_EQ(p.shape(), (Shape{n - 1}));
    for (int64_t t = 0; t + 1 < n; ++t) {
      const float* row = l.data_as<float>() + t * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      const double want = row[lines[i][t + 1]] - mx - std::log(sum);
      EXPECT_NEAR(p.data_as<float>()[t], want, 1e-4) << "line " << i << " position " << t;
      EXPECT_LT(p.data_as<float>()[t], 0.0f);
    }
  }
  // A single-token line has no next token to score.
  testing::write_file(tmp.file("one.jsonl"), "[5]\n");
  r = testing::run_cli("score --model " + model + " --ids-file " + tmp.file("one.jsonl") + " --logprobs --out " +
                       tmp.file("x.safetensors"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("at least two tokens"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace deepinfer
