// Golden tests of the DeepSeek-V3 CPU forward against transformers' deepseek_v3 (tests/data/golden/deepseek_v3,
// copied from ../shared/golden): full-prompt logits in both MLA forms, cached token-by-token decode, greedy
// continuations, chunked prefill = one-shot, hidden states. Tolerance (fixture README): per row,
// max |Δlogit| <= 1e-4 · max |logit|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "test_util.h"
#include "v3_paged_decode.h"

namespace deepinfer {
namespace {

constexpr double kRelTol = 1e-4;

struct Fixture {
  std::unique_ptr<SafetensorsFile> golden;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV3Model> model;

  std::vector<int64_t> ids(const std::string& name) const {
    Tensor t = golden->tensor(name);
    return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  }
  Tensor tensor(const std::string& name) const { return golden->tensor(name); }
  bool has(const std::string& name) const { return golden->find(name) != nullptr; }
  int64_t vocab() const { return model->config().vocab_size; }
};

Fixture& fixture() {
  static std::unique_ptr<Fixture> f;
  if (!f) {
    f = std::make_unique<Fixture>();
    const std::string dir = testing::test_data_dir() + "/golden/deepseek_v3";
    f->golden = SafetensorsFile::open(dir + "/golden.safetensors");
    f->backend = make_cpu_backend(0);
    f->model = DeepseekV3Model::load(dir, *f->backend);
  }
  f->model->set_mla_form(MlaForm::kAuto);
  return *f;
}

// Worst row of max|a − b| / max|b| over `rows` rows of width `v`; the largest |a − b| goes to *worst_abs.
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

std::vector<std::string> prompts() {
  std::vector<std::string> out;
  for (int i = 0; fixture().has("prompt" + std::to_string(i) + ".input_ids"); ++i)
    out.push_back("prompt" + std::to_string(i));
  return out;
}

// Every golden prompt's input ids and the ids transformers generated after it.
std::pair<std::vector<std::vector<int64_t>>, std::vector<std::vector<int64_t>>> golden_ids(Fixture& f) {
  std::vector<std::vector<int64_t>> ids, gens;
  for (const auto& p : prompts()) {
    ids.push_back(f.ids(p + ".input_ids"));
    gens.push_back(f.ids(p + ".generated_ids"));
  }
  return {ids, gens};
}

// Both MLA forms reproduce the one-shot logits (the auto choice is naive for these prefills).
TEST(GoldenV3, FullPromptLogitsNaiveAndAbsorbed) {
  Fixture& f = fixture();
  for (MlaForm form : {MlaForm::kNaive, MlaForm::kAbsorbed}) {
    f.model->set_mla_form(form);
    for (const auto& p : prompts()) {
      auto ids = f.ids(p + ".input_ids");
      auto seq = f.model->new_sequence();
      HostTensor logits = f.model->forward(seq, ids);
      double abs_err = 0;
      const double rel = worst_rel_error(logits.data<float>(), f.tensor(p + ".logits").data_as<float>(),
                                         static_cast<int64_t>(ids.size()), f.vocab(), &abs_err);
      const char* name = form == MlaForm::kNaive ? "naive" : "absorbed";
      std::printf("[deepseek_v3 %s %s] full-prompt logits: max |dlogit| %.3g (worst row rel %.3g)\n", p.c_str(), name,
                  abs_err, rel);
      EXPECT_LE(rel, kRelTol) << p << " " << name;
    }
  }
}

// Cached prefill, then generated_ids[j-1] one at a time (absorbed decode): rows equal decode_logits and
// full_tail_logits; greedy picks equal generated_ids.
TEST(GoldenV3, DecodeLogitsAndGreedy) {
  Fixture& f = fixture();
  for (const auto& p : prompts()) {
    auto ids = f.ids(p + ".input_ids");
    auto gen = f.ids(p + ".generated_ids");
    const int64_t v = f.vocab();
    auto seq = f.model->new_sequence();
    HostTensor prefill = f.model->forward(seq, ids);
    std::vector<float> rows(prefill.data<float>() + (ids.size() - 1) * v, prefill.data<float>() + ids.size() * v);
    std::vector<int64_t> greedy{argmax(rows.data(), v)};
    for (size_t j = 1; j < gen.size(); ++j) {
      const int64_t tok = gen[j - 1];
      HostTensor step = f.model->forward(seq, std::span<const int64_t>(&tok, 1));
      rows.insert(rows.end(), step.data<float>(), step.data<float>() + v);
      greedy.push_back(argmax(step.data<float>(), v));
    }
    const auto n = static_cast<int64_t>(gen.size());
    double abs_err = 0, tail_abs = 0;
    const double rel = worst_rel_error(rows.data(), f.tensor(p + ".decode_logits").data_as<float>(), n, v, &abs_err);
    const double tail =
        worst_rel_error(rows.data(), f.tensor(p + ".full_tail_logits").data_as<float>(), n, v, &tail_abs);
    std::printf("[deepseek_v3 %s] decode logits: max |dlogit| %.3g (worst row rel %.3g), vs full tail %.3g\n",
                p.c_str(), abs_err, rel, tail_abs);
    EXPECT_LE(rel, kRelTol) << p;
    EXPECT_LE(tail, kRelTol) << p;
    EXPECT_EQ(greedy, gen) << p;
  }
}

// The engine's decode path: every prompt a paged sequence, generated ids decoded with decode_batch (one
// paged_mla_attention call per layer for all sequences) — bit-identical to one forward() per sequence, and within the
// golden tolerance of decode_logits.
TEST(GoldenV3, BatchedPagedDecodeEqualsPerSequence) {
  Fixture& f = fixture();
  const auto [ids, gens] = golden_ids(f);
  ASSERT_GE(ids.size(), 2u);
  const auto batched = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/true);
  const auto single = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/false);
  const int64_t v = f.vocab();
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(batched[i].size(), single[i].size());
    for (size_t j = 0; j < batched[i].size(); ++j)
      ASSERT_EQ(batched[i][j], single[i][j]) << "prompt " << i << " row " << j / v << " logit " << j % v;
    const auto n = static_cast<int64_t>(gens[i].size());
    const double rel = worst_rel_error(
        batched[i].data(), f.tensor("prompt" + std::to_string(i) + ".decode_logits").data_as<float>(), n, v);
    std::printf("[deepseek_v3 prompt%zu] batched paged decode: worst row rel %.3g\n", i, rel);
    EXPECT_LE(rel, kRelTol) << "prompt " << i;
  }
}

// A bf16 cache (--kv-cache-dtype bf16): the batched paged decode still equals one forward() per sequence bit for bit
// (every read widens the same stored rows), the logits stay near transformers' (the rows rounded to bf16: looser
// than the f32 cache's 1e-4, printed) and differ from the f32 cache's (the rounding reached the attention).
TEST(GoldenV3, Bf16CachePagedDecode) {
  Fixture& f = fixture();
  const auto [ids, gens] = golden_ids(f);
  const auto f32 = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/true);
  f.model->set_kv_cache_dtype(DType::kBF16);
  const auto batched = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/true);
  const auto single = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/false);
  f.model->set_kv_cache_dtype(DType::kF32);
  const int64_t v = f.vocab();
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(batched[i].size(), single[i].size());
    EXPECT_EQ(std::memcmp(batched[i].data(), single[i].data(), batched[i].size() * sizeof(float)), 0) << "prompt " << i;
    const auto n = static_cast<int64_t>(gens[i].size());
    const double rel = worst_rel_error(
        batched[i].data(), f.tensor("prompt" + std::to_string(i) + ".decode_logits").data_as<float>(), n, v);
    const double vs_f32 = worst_rel_error(batched[i].data(), f32[i].data(), n, v);
    std::printf(
        "[deepseek_v3 prompt%zu] bf16 cache, batched paged decode: worst row rel %.3g (vs the f32 cache %.3g)\n", i,
        rel, vs_f32);
    EXPECT_LE(rel, 1e-2) << "prompt " << i;
    EXPECT_GT(vs_f32, 0.0) << "prompt " << i << ": the bf16 cache gave the f32 cache's logits";
  }
}

// The decode-graph path's step inputs on the CPU: DecodeGraphs without recording pads each step to its bucket (rows
// repeating row 0 that write no cache row) and feeds the persistent input buffers, as a recorded step would. The CPU
// ops are row-independent, so the real rows must equal one forward() per sequence bit for bit; a recording
// DecodeGraphs is disabled on the CPU (no graphs) and leaves the batch unpadded.
TEST(GoldenV3, PaddedDecodeStepsEqualPerSequence) {
  Fixture& f = fixture();
  std::vector<std::vector<int64_t>> ids, gens;
  for (int copy = 0; copy < 2; ++copy)
    for (const auto& p : prompts()) {
      ids.push_back(f.ids(p + ".input_ids"));
      gens.push_back(f.ids(p + ".generated_ids"));
      if (copy == 1) gens.back().resize(std::max<size_t>(2, gens.back().size() / 2));
    }
  DecodeGraphs padded(*f.backend, 256, /*record=*/false);
  const auto stepped = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/true, &padded);
  const auto single = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/false);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(stepped[i].size(), single[i].size());
    EXPECT_EQ(std::memcmp(stepped[i].data(), single[i].data(), stepped[i].size() * sizeof(float)), 0)
        << "sequence " << i;
  }
  EXPECT_GT(padded.stats().padded_eager, 0);
  EXPECT_EQ(padded.stats().recorded, 0);
  EXPECT_FALSE(f.model->new_decode_graphs()->enabled());
}

// The model reads no buffer that an op did not write: on a backend whose TensorMemory::empty fills with 0xFF bytes
// (NaN, -1) instead of zeros, the batched paged decode (prefill included) gives the zero-filling backend's logits bit
// for bit.
TEST(GoldenV3, ReadsNoBufferNoOpWrote) {
  Fixture& f = fixture();
  const auto [ids, gens] = golden_ids(f);
  const std::unique_ptr<Backend> poison = make_cpu_backend(0, /*poison_empty=*/true);
  const std::unique_ptr<DeepseekV3Model> poisoned =
      DeepseekV3Model::load(testing::test_data_dir() + "/golden/deepseek_v3", *poison);
  const auto want = testing::v3_paged_decode(*f.model, ids, gens, /*batched=*/true);
  const auto got = testing::v3_paged_decode(*poisoned, ids, gens, /*batched=*/true);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0) << "prompt " << i;
  }
}

// Prefill in chunks (single tokens, uneven splits; auto picks absorbed for the small chunks and naive for the
// large ones) gives the same logits as one shot, in either forced form too.
TEST(GoldenV3, ChunkedPrefillEqualsOneShot) {
  Fixture& f = fixture();
  auto ids = f.ids("prompt2.input_ids");
  const int64_t v = f.vocab(), n = static_cast<int64_t>(ids.size());
  auto seq = f.model->new_sequence();
  HostTensor one_shot = f.model->forward(seq, ids);
  for (MlaForm form : {MlaForm::kAuto, MlaForm::kNaive, MlaForm::kAbsorbed}) {
    f.model->set_mla_form(form);
    for (const std::vector<int64_t>& splits :
         {std::vector<int64_t>{1, 2, 3, 7, 64}, std::vector<int64_t>{17, 100}, std::vector<int64_t>{5, 9, 31, 130}}) {
      auto chunked = f.model->new_sequence();
      std::vector<float> rows;
      int64_t at = 0;
      for (size_t i = 0; at < n; ++i) {
        const int64_t len = std::min(n - at, i < splits.size() ? splits[i] : n);
        HostTensor part = f.model->forward(chunked, std::span<const int64_t>(ids.data() + at, len));
        rows.insert(rows.end(), part.data<float>(), part.data<float>() + len * v);
        at += len;
      }
      EXPECT_EQ(chunked.num_tokens, n);
      EXPECT_LE(worst_rel_error(rows.data(), one_shot.data<float>(), n, v), 1e-5)
          << "form " << static_cast<int>(form) << ", splits starting " << splits[0];
    }
  }
}

// prompt1.hidden_states.<k>: entry 0 = embeddings, 1..L-1 = decoder-layer outputs, last = final normed state.
TEST(GoldenV3, HiddenStates) {
  Fixture& f = fixture();
  auto ids = f.ids("prompt1.input_ids");
  const auto T = static_cast<int64_t>(ids.size());
  auto seq = f.model->new_sequence();
  V3ForwardTrace trace;
  f.model->forward(seq, ids, &trace);
  int checked = 0;
  for (int k = 1; f.has("prompt1.hidden_states." + std::to_string(k)); ++k) {
    const Tensor ref = f.tensor("prompt1.hidden_states." + std::to_string(k));
    const bool last = !f.has("prompt1.hidden_states." + std::to_string(k + 1));
    const HostTensor& ours = last ? trace.final_hidden : trace.layer_outputs[k - 1];
    ASSERT_EQ(ours.numel(), ref.numel()) << k;
    double abs_err = 0;
    const double rel = worst_rel_error(ours.data<float>(), ref.data_as<float>(), T, ref.numel() / T, &abs_err);
    std::printf("[deepseek_v3] hidden state %d: max |d| %.3g (worst row rel %.3g)\n", k, abs_err, rel);
    EXPECT_LE(rel, kRelTol) << "hidden state " << k;
    ++checked;
  }
  EXPECT_EQ(checked, f.model->config().num_layers);
}

// The per-token cache is the MLA latent + rope key: kv_lora_rank + qk_rope_head_dim floats per layer.
TEST(GoldenV3, CacheHoldsOneLatentRowPerTokenAndLayer) {
  Fixture& f = fixture();
  auto ids = f.ids("prompt0.input_ids");
  auto seq = f.model->new_sequence();
  f.model->forward(seq, ids);
  const auto& m = f.model->config().mla;
  for (const auto& layer : seq.kv) {
    EXPECT_EQ(layer.rows, static_cast<int64_t>(ids.size()));
    EXPECT_EQ(layer.view().shape(),
              (Shape{static_cast<int64_t>(ids.size()), static_cast<int64_t>(m.kv_lora_rank + m.qk_rope_head_dim)}));
  }
}

}  // namespace
}  // namespace deepinfer
