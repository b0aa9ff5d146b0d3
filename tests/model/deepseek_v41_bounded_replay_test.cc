// V4.1 causal encoder-decoder "decoder SWA bounded replay" (MODELS.md Part A §2.3) on the V4.1 golden model
// (6 layers, decoder = layers 3-5 from the ratio-1 candidate source, window 16, Engram at layer 4 inside the
// decoder). The approximation has no transformers reference, so its semantics are checked against a test-side
// reconstruction that runs every layer (exact mode) on the part of the prompt before the decoder segment and then
// makes the decoder layers forget it: their window rows are overwritten with NaN and only the window floor keeps
// them out. If bounded replay skipped the wrong layers or tokens, fed the decoder-start compressor fewer tokens,
// mis-sliced the mHC/Engram rows, or let a decoder window reach below the segment, the two would differ (or NaN
// would leak).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v4.h"
#include "test_util.h"

namespace deepinfer {
namespace {

struct V41 {
  std::unique_ptr<SafetensorsFile> golden;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV4Model> model;
  std::vector<int64_t> ids(const std::string& name) const {
    Tensor t = golden->tensor(name);
    return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  }
};

V41& v41() {
  static std::unique_ptr<V41> f;
  if (!f) {
    f = std::make_unique<V41>();
    const std::string dir = testing::test_data_dir() + "/golden/deepseek_v41";
    f->golden = SafetensorsFile::open(dir + "/golden.safetensors");
    f->backend = make_cpu_backend(0);
    f->model = DeepseekV4Model::load(dir, *f->backend, f->ids("engram.token_map"));
  }
  return *f;
}

// Runs `ids` through `seq` in chunks of the given lengths (the rest in one chunk); returns the logits rows.
std::vector<float> run_chunks(const DeepseekV4Model& m, V4SequenceState& seq, std::span<const int64_t> ids,
                              const std::vector<int64_t>& splits = {}) {
  std::vector<float> rows;
  size_t at = 0;
  for (size_t i = 0; at < ids.size(); ++i) {
    const size_t len = i < splits.size() ? std::min<size_t>(splits[i], ids.size() - at) : ids.size() - at;
    HostTensor out = m.forward(seq, ids.subspan(at, len));
    rows.insert(rows.end(), out.data<float>(), out.data<float>() + out.numel());
    at += len;
  }
  return rows;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

TEST(V41BoundedReplay, DecoderSplitIsDerivedFromTheSchedule) {
  const auto& m = *v41().model;
  EXPECT_EQ(m.decoder_start(), 3);  // candidate_source_layer_id, ratio 1, last kv source
  EXPECT_EQ(m.decoder_window(), 16);
  EXPECT_EQ(m.bounded_decoder_from(5), 0);
  EXPECT_EQ(m.bounded_decoder_from(16), 0);
  EXPECT_EQ(m.bounded_decoder_from(70), 54);
}

TEST(V41BoundedReplay, PromptsWithinTheWindowGiveBitIdenticalLogits) {
  const auto& m = *v41().model;
  auto long_prompt = v41().ids("prompt1.input_ids");
  for (const std::vector<int64_t>& prompt :
       {v41().ids("prompt0.input_ids"), std::vector<int64_t>(long_prompt.begin(), long_prompt.begin() + 16)}) {
    // Through the engine's runner: bounded (default) vs --exact-prefill.
    const std::vector<TokenId> tokens(prompt.begin(), prompt.end());
    const std::vector<BlockId> table = {3};  // one block of 16 tokens in the runner's pages
    std::vector<std::vector<float>> got;
    for (bool exact : {false, true}) {
      V4ModelRunner runner(m, 1, ModelRunnerOptions{exact});
      ModelBatch b;
      BatchEntry e;
      e.token_ids = tokens;
      e.state_slot = 0;
      e.block_table = table;
      e.reset_state = true;
      e.prompt_len = static_cast<int64_t>(prompt.size());
      e.needs_logits = true;
      b.entries.push_back(e);
      b.num_logits_rows = 1;
      b.block_size = 16;
      got.emplace_back(m.config().vocab_size);
      runner.execute(b, got.back());
      EXPECT_EQ(runner.work_stats().layer_tokens_skipped, 0);
      EXPECT_EQ(runner.work_stats().layer_tokens, static_cast<int64_t>(prompt.size()) * m.config().num_layers);
    }
    EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)))
        << "prompt of " << prompt.size() << " tokens";
  }
}

TEST(V41BoundedReplay, LongPromptsMatchTheSegmentReconstruction) {
  const auto& m = *v41().model;
  TensorMemory& mem = backend_memory(*v41().backend);
  const int64_t V = m.config().vocab_size;
  for (const std::string p : {"prompt1", "prompt2"}) {
    auto ids = v41().ids(p + ".input_ids");
    const int64_t P = static_cast<int64_t>(ids.size()), s = m.bounded_decoder_from(P);
    ASSERT_EQ(s, P - 16);
    const std::span<const int64_t> all(ids), head = all.subspan(0, s), segment = all.subspan(s);

    // Reference: every layer on [0, s), then the decoder layers lose that part (NaN rows behind the floor).
    auto ref = m.new_sequence();
    run_chunks(m, ref, head);
    for (int l = m.decoder_start(); l < m.config().num_layers; ++l) mem.fill(ref.layers[l].window.rows.view(), NAN);
    ref.decoder_from = s;
    std::vector<float> ref_rows = run_chunks(m, ref, segment);
    ASSERT_EQ(static_cast<int64_t>(ref_rows.size()), (P - s) * V);
    EXPECT_TRUE(all_finite(ref_rows)) << p << ": a decoder window reached below the segment";

    // Bounded replay with the same chunk boundary: the first chunk is encoder-only (no logits rows).
    auto bounded = m.new_sequence();
    bounded.decoder_from = s;
    EXPECT_TRUE(run_chunks(m, bounded, head).empty());
    std::vector<float> rows = run_chunks(m, bounded, segment);
    ASSERT_EQ(rows.size(), ref_rows.size());
    EXPECT_EQ(0, std::memcmp(rows.data(), ref_rows.data(), rows.size() * sizeof(float))) << p;
    EXPECT_EQ(bounded.num_tokens, P);
    for (int l = 0; l < m.config().num_layers; ++l)
      EXPECT_EQ(bounded.layers[l].n_entries, ref.layers[l].n_entries) << p << " layer " << l;

    // One shot: same result up to chunking round-off, and the logits rows are those of the segment only.
    auto one_shot = m.new_sequence();
    one_shot.decoder_from = s;
    std::vector<float> one = run_chunks(m, one_shot, all);
    ASSERT_EQ(one.size(), rows.size());
    EXPECT_LE(max_abs_diff(one, rows), 1e-5) << p;

    // It is an approximation: the last row differs from the exact (transformers) forward.
    auto exact = m.new_sequence();
    std::vector<float> exact_rows = run_chunks(m, exact, all);
    const std::vector<float> exact_last(exact_rows.end() - V, exact_rows.end()), last(one.end() - V, one.end());
    EXPECT_GT(max_abs_diff(exact_last, last), 1e-3) << p;
  }
}

// Chunk boundaries before, across and after the segment start give the one-shot result; greedy decode after
// the prefill is finite and the same every time.
TEST(V41BoundedReplay, ChunkedPrefillAndDecodeMatchOneShot) {
  const auto& m = *v41().model;
  const int64_t V = m.config().vocab_size;
  auto ids = v41().ids("prompt2.input_ids");  // 290 tokens, segment starts at 274
  const int64_t s = m.bounded_decoder_from(static_cast<int64_t>(ids.size()));
  auto greedy = [&](const std::vector<int64_t>& splits, std::vector<float>* decode_rows) {
    auto seq = m.new_sequence();
    seq.decoder_from = s;
    std::vector<float> rows = run_chunks(m, seq, ids, splits);
    EXPECT_EQ(static_cast<int64_t>(rows.size()), (static_cast<int64_t>(ids.size()) - s) * V);
    std::vector<int64_t> out;
    std::vector<float> last(rows.end() - V, rows.end());
    for (int step = 0; step < 8; ++step) {
      decode_rows->insert(decode_rows->end(), last.begin(), last.end());
      out.push_back(std::max_element(last.begin(), last.end()) - last.begin());
      HostTensor next = m.forward(seq, std::span<const int64_t>(&out.back(), 1));
      last.assign(next.data<float>(), next.data<float>() + V);
    }
    return out;
  };
  std::vector<float> base_rows;
  const auto base = greedy({}, &base_rows);
  EXPECT_TRUE(all_finite(base_rows));
  std::vector<float> again_rows;
  EXPECT_EQ(greedy({}, &again_rows), base);
  EXPECT_EQ(0, std::memcmp(again_rows.data(), base_rows.data(), base_rows.size() * sizeof(float)));
  for (const std::vector<int64_t>& splits : {std::vector<int64_t>{100, 174, 5}, std::vector<int64_t>{270, 9, 3},
                                             std::vector<int64_t>{274}, std::vector<int64_t>{7, 280}}) {
    std::vector<float> rows;
    EXPECT_EQ(greedy(splits, &rows), base) << "first split " << splits[0];
    EXPECT_LE(max_abs_diff(rows, base_rows), 1e-5) << "first split " << splits[0];
  }
}

}  // namespace
}  // namespace deepinfer
