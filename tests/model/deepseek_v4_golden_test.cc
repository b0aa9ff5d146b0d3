// Golden tests of the DeepSeek-V4 / V4.1 CPU forward against transformers' outputs (tests/data/golden, copied
// from ../shared/golden): full-prompt logits, cached token-by-token decode, greedy continuations, chunked
// prefill = one-shot, hidden states, Engram hash ids. Tolerance (fixture README): per row,
// max |Δlogit| <= 1e-4 · max |logit|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v4.h"
#include "test_util.h"

namespace deepinfer {
namespace {

constexpr double kRelTol = 1e-4;

struct Fixture {
  std::string dir;
  std::unique_ptr<SafetensorsFile> golden;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV4Model> model;

  std::vector<int64_t> ids(const std::string& name) const {
    Tensor t = golden->tensor(name);
    return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  }
  Tensor tensor(const std::string& name) const { return golden->tensor(name); }
  bool has(const std::string& name) const { return golden->find(name) != nullptr; }
};

Fixture& fixture(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  auto& f = cache[family];
  if (!f) {
    f = std::make_unique<Fixture>();
    f->dir = testing::test_data_dir() + "/golden/" + family;
    f->golden = SafetensorsFile::open(f->dir + "/golden.safetensors");
    f->backend = make_cpu_backend(0);
    std::optional<std::vector<int64_t>> token_map;
    if (f->has("engram.token_map")) token_map = f->ids("engram.token_map");
    f->model = DeepseekV4Model::load(f->dir, *f->backend, token_map);
  }
  return *f;
}

// Worst row of max|a − b| / max|b| over `rows` rows of width `v` (a from row a_row0, b from row b_row0).
double worst_rel_error(const float* a, const float* b, int64_t rows, int64_t v, double* worst_abs = nullptr) {
  double worst = 0, worst_a = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double diff = 0, scale = 0;
    for (int64_t j = 0; j < v; ++j) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[r * v + j]) - b[r * v + j]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[r * v + j])));
    }
    worst = std::max(worst, diff / scale);
    worst_a = std::max(worst_a, diff);
  }
  if (worst_abs) *worst_abs = worst_a;
  return worst;
}

int64_t argmax(const float* row, int64_t v) { return std::max_element(row, row + v) - row; }

class GoldenV4 : public ::testing::TestWithParam<std::string> {
 protected:
  Fixture& f() { return fixture(GetParam()); }
  int64_t vocab() { return f().model->config().vocab_size; }
  std::vector<std::string> prompts() {
    std::vector<std::string> out;
    for (int i = 0; f().has("prompt" + std::to_string(i) + ".input_ids"); ++i)
      out.push_back("prompt" + std::to_string(i));
    return out;
  }
};

TEST_P(GoldenV4, FullPromptLogits) {
  for (const auto& p : prompts()) {
    auto ids = f().ids(p + ".input_ids");
    auto seq = f().model->new_sequence();
    HostTensor logits = f().model->forward(seq, ids);
    double abs_err = 0;
    const double rel = worst_rel_error(logits.data<float>(), f().tensor(p + ".logits").data_as<float>(),
                                       static_cast<int64_t>(ids.size()), vocab(), &abs_err);
    RecordProperty(p + "_max_abs_dlogit", std::to_string(abs_err));
    std::printf("[%s %s] full-prompt logits: max |dlogit| %.3g (worst row rel %.3g)\n", GetParam().c_str(), p.c_str(),
                abs_err, rel);
    EXPECT_LE(rel, kRelTol) << p;
  }
}

// Cached prefill of the prompt, then generated_ids[j-1] one at a time: rows equal decode_logits; greedy picks
// equal generated_ids.
TEST_P(GoldenV4, DecodeLogitsAndGreedy) {
  for (const auto& p : prompts()) {
    auto ids = f().ids(p + ".input_ids");
    auto gen = f().ids(p + ".generated_ids");
    const Tensor ref = f().tensor(p + ".decode_logits");
    const int64_t v = vocab();
    auto seq = f().model->new_sequence();
    HostTensor prefill = f().model->forward(seq, ids);
    std::vector<float> rows(prefill.data<float>() + (ids.size() - 1) * v, prefill.data<float>() + ids.size() * v);
    std::vector<int64_t> greedy{argmax(rows.data(), v)};
    for (size_t j = 1; j < gen.size(); ++j) {
      const int64_t tok = gen[j - 1];
      HostTensor step = f().model->forward(seq, std::span<const int64_t>(&tok, 1));
      rows.insert(rows.end(), step.data<float>(), step.data<float>() + v);
      greedy.push_back(argmax(step.data<float>(), v));
    }
    double abs_err = 0;
    const double rel =
        worst_rel_error(rows.data(), ref.data_as<float>(), static_cast<int64_t>(gen.size()), v, &abs_err);
    std::printf("[%s %s] decode logits: max |dlogit| %.3g (worst row rel %.3g)\n", GetParam().c_str(), p.c_str(),
                abs_err, rel);
    EXPECT_LE(rel, kRelTol) << p;
    EXPECT_EQ(greedy, gen) << p;
  }
}

// Prefill in chunks (several split patterns, including single tokens and splits inside compress groups)
// gives the same logits as one shot.
TEST_P(GoldenV4, ChunkedPrefillEqualsOneShot) {
  auto ids = f().ids("prompt2.input_ids");
  const int64_t v = vocab(), n = static_cast<int64_t>(ids.size());
  auto seq = f().model->new_sequence();
  HostTensor one_shot = f().model->forward(seq, ids);
  for (const std::vector<int64_t>& splits :
       {std::vector<int64_t>{1, 2, 3, 7, 64}, std::vector<int64_t>{17, 100}, std::vector<int64_t>{5, 9, 31, 130}}) {
    const std::vector<float> rows = testing::chunked_logits(*f().model, ids, splits, v);
    EXPECT_LE(worst_rel_error(rows.data(), one_shot.data<float>(), n, v), 1e-5) << "splits starting " << splits[0];
  }
}

// The head on the last rows only (what the engine reads of a prompt chunk): those rows of the full logits, bit for
// bit; 0 rows for none; more than the chunk gives the chunk; the state afterwards is the same (next logits agree).
TEST_P(GoldenV4, LastRowsAreTheTailOfTheFullLogits) {
  auto ids = f().ids("prompt2.input_ids");
  const int64_t v = vocab(), n = static_cast<int64_t>(ids.size());
  const std::vector<int64_t> next = {ids[1]};
  auto ref = f().model->new_sequence();
  HostTensor full = f().model->forward(ref, ids);
  HostTensor ref_next = f().model->forward(ref, next);
  for (int64_t last : {int64_t{0}, int64_t{1}, int64_t{3}, n + 5}) {
    auto seq = f().model->new_sequence();
    HostTensor part = f().model->forward(seq, ids, nullptr, nullptr, nullptr, last);
    const int64_t rows = std::min(last, n);
    ASSERT_EQ(part.shape(), (Shape{rows, v})) << last;
    EXPECT_EQ(std::memcmp(part.data<float>(), full.data<float>() + (n - rows) * v, rows * v * sizeof(float)), 0)
        << last;
    HostTensor after = f().model->forward(seq, next);
    ASSERT_EQ(after.shape(), ref_next.shape());
    EXPECT_EQ(std::memcmp(after.data<float>(), ref_next.data<float>(), v * sizeof(float)), 0) << last;
  }
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV4, ::testing::Values("deepseek_v4", "deepseek_v41"));

}  // namespace deepinfer

namespace deepinfer {
namespace {

// prompt1.hidden_states.<k>: transformers records entry 0 = the embeddings and replaces the last entry by the
// final normed hidden state. V4: [embeddings ×hc, layer 0..L-2 outputs, final]; V4.1: [embeddings,
// attn_norm outputs of layers 0..L-2, final].
TEST_P(GoldenV4, HiddenStates) {
  auto ids = f().ids("prompt1.input_ids");
  const int64_t T = static_cast<int64_t>(ids.size());
  auto seq = f().model->new_sequence();
  V4ForwardTrace trace;
  f().model->forward(seq, ids, &trace);
  const bool v41 = GetParam() == "deepseek_v41";
  for (int k = 1; f().has("prompt1.hidden_states." + std::to_string(k)); ++k) {
    const Tensor ref = f().tensor("prompt1.hidden_states." + std::to_string(k));
    const HostTensor* ours = nullptr;
    const bool last = !f().has("prompt1.hidden_states." + std::to_string(k + 1));
    if (last) {
      ours = &trace.final_hidden;
    } else if (v41) {
      ours = &trace.attn_inputs[k - 1];
    } else {
      ours = &trace.layer_outputs[k - 1];
    }
    ASSERT_NE(ours, nullptr) << k;
    ASSERT_EQ(ours->numel(), ref.numel()) << k;
    const int64_t width = ref.numel() / T;
    double abs_err = 0;
    const double rel = worst_rel_error(ours->data<float>(), ref.data_as<float>(), T, width, &abs_err);
    std::printf("[%s] hidden state %d: max |d| %.3g (worst row rel %.3g)\n", GetParam().c_str(), k, abs_err, rel);
    EXPECT_LE(rel, kRelTol) << "hidden state " << k;
  }
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// V4.1 Engram: the hash layout derived in C++ (primes, offsets, NumPy-compatible multipliers) equals the
// reference's, and the per-token hash ids of prompt + generated[:-1] (fed in several chunks, so the
// look-back crosses chunk boundaries) equal engram_hash_ids.
TEST(GoldenV41Engram, HashLayoutAndIds) {
  Fixture& f = fixture("deepseek_v41");
  const EngramTables& e = *f.model->engram();
  const Tensor mult = f.tensor("engram.multipliers"), primes = f.tensor("engram.primes");
  const Tensor offsets = f.tensor("engram.offsets");
  const size_t layers = e.multipliers.size();
  ASSERT_EQ(static_cast<int64_t>(layers), mult.dim(0));
  for (size_t l = 0; l < layers; ++l) {
    for (int64_t i = 0; i < mult.dim(1); ++i)
      EXPECT_EQ(e.multipliers[l][i], mult.data_as<int64_t>()[l * mult.dim(1) + i]);
    const int64_t cols = primes.dim(1) * primes.dim(2);
    for (int64_t i = 0; i < cols; ++i) {
      EXPECT_EQ(e.primes[l][i], primes.data_as<int64_t>()[l * cols + i]);
      EXPECT_EQ(e.offsets[l][i], offsets.data_as<int64_t>()[l * cols + i]);
    }
  }
  for (int p = 0; f.has("prompt" + std::to_string(p) + ".engram_hash_ids"); ++p) {
    const std::string name = "prompt" + std::to_string(p);
    std::vector<int64_t> ids = f.ids(name + ".input_ids");
    std::vector<int64_t> gen = f.ids(name + ".generated_ids");
    ids.insert(ids.end(), gen.begin(), gen.end() - 1);
    const Tensor ref = f.tensor(name + ".engram_hash_ids");  // [T, layers, cols]
    const int64_t T = static_cast<int64_t>(ids.size()), cols = ref.dim(2);
    ASSERT_EQ(ref.dim(0), T);
    auto seq = f.model->new_sequence();
    int64_t at = 0;
    for (int64_t len : {int64_t{3}, int64_t{1}, T}) {
      len = std::min(len, T - at);
      if (len == 0) break;
      V4ForwardTrace trace;
      f.model->forward(seq, std::span<const int64_t>(ids.data() + at, len), &trace);
      for (size_t l = 0; l < layers; ++l)
        for (int64_t t = 0; t < len; ++t)
          for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(trace.engram_hash_ids[l].data<int64_t>()[t * cols + c],
                      ref.data_as<int64_t>()[((at + t) * layers + l) * cols + c])
                << name << " token " << at + t << " layer " << l << " col " << c;
      at += len;
    }
  }
}

// A 700-token V4 prompt (tools/make_v4_long_fixture.py; the fixture model with index_topk 256 so no top-k cut can
// fall inside a tie): HCA layers hold 43 entries and CSA layers 175; prefilled in uneven chunks, the last 96 rows
// match transformers' one-shot logits and the cached greedy continuation matches.
TEST(GoldenV4Long, ChunkedPrefillAndGreedyMatchTransformers) {
  Fixture& f = fixture("deepseek_v4_long");
  const auto& g = f.golden;
  const Tensor ids_t = g->tensor("input_ids"), tail = g->tensor("logits_tail"), gen_t = g->tensor("generated_ids");
  std::vector<int64_t> ids(ids_t.data_as<int64_t>(), ids_t.data_as<int64_t>() + ids_t.numel());
  const std::vector<int64_t> gen(gen_t.data_as<int64_t>(), gen_t.data_as<int64_t>() + gen_t.numel());
  const int64_t v = f.model->config().vocab_size, n = static_cast<int64_t>(ids.size()), rows = tail.dim(0);
  auto seq = f.model->new_sequence();
  std::vector<float> logits;
  int64_t at = 0;
  for (int64_t len : {int64_t{333}, int64_t{1}, int64_t{2}, int64_t{255}, n}) {
    len = std::min(len, n - at);
    HostTensor part = f.model->forward(seq, std::span<const int64_t>(ids.data() + at, len));
    logits.insert(logits.end(), part.data<float>(), part.data<float>() + len * v);
    at += len;
  }
  double abs_err = 0;
  const double rel = worst_rel_error(logits.data() + (n - rows) * v, tail.data_as<float>(), rows, v, &abs_err);
  std::printf("[deepseek_v4 700 tokens] tail logits: max |dlogit| %.3g (worst row rel %.3g)\n", abs_err, rel);
  EXPECT_LE(rel, kRelTol);
  std::vector<int64_t> greedy{argmax(logits.data() + (n - 1) * v, v)};
  while (greedy.size() < gen.size()) {
    HostTensor step = f.model->forward(seq, std::span<const int64_t>(&greedy.back(), 1));
    greedy.push_back(argmax(step.data<float>(), v));
  }
  EXPECT_EQ(greedy, gen);
}

// The token map built from the fixture's tokenizer.json equals the reference's, and a model loaded without
// an explicit map (so from tokenizer.json) gives the fixture's logits.
TEST(GoldenV41Engram, TokenMapFromTokenizerJson) {
  Fixture& f = fixture("deepseek_v41");
  EXPECT_EQ(engram_token_map_from_tokenizer(f.dir + "/tokenizer.json"), f.ids("engram.token_map"));
  auto model = DeepseekV4Model::load(f.dir, *f.backend);
  auto ids = f.ids("prompt0.input_ids");
  auto seq = model->new_sequence();
  HostTensor logits = model->forward(seq, ids);
  EXPECT_LE(worst_rel_error(logits.data<float>(), f.tensor("prompt0.logits").data_as<float>(),
                            static_cast<int64_t>(ids.size()), model->config().vocab_size),
            kRelTol);
}

}  // namespace
}  // namespace deepinfer
