// Context-parallel prefill (zig-zag split, all-gathered cache rows) on the V3, V4 and V4.1 golden models and a
// generated V4.1 checkpoint: CP2 and CP4 prefill logits are bit-identical to one rank, every rank ends with the
// one-rank cache state (greedy decode continued on rank 0 and on the last rank gives bit-identical logits and the
// same ids), for prompt lengths that are not multiples of 2n and whose compressor groups straddle pieces.
// Bitwise is the claim: the CPU ops are row-independent and the ranks feed them the same rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <type_traits>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "parallel/cp_test_group.h"
#include "random_checkpoint_util.h"
#include "test_util.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(3, vocab - 1);
  std::vector<int64_t> ids(n);
  for (auto& id : ids) id = pick(rng);
  return ids;
}

std::vector<float> to_vec(const HostTensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

int64_t argmax_last(const HostTensor& logits) {
  const int64_t V = logits.shape()[1], rows = logits.shape()[0];
  const float* last = logits.data<float>() + (rows - 1) * V;
  return std::max_element(last, last + V) - last;
}

// One-rank reference and CP run of the same prompt; `prepare` sets up a fresh state (e.g. bounded replay).
template <typename Model, typename State>
void expect_cp_equals_one_rank(const Model& m, const std::vector<int64_t>& ids, int n,
                               const std::function<void(State&)>& prepare, int decode_steps = 3) {
  SCOPED_TRACE("cp " + std::to_string(n) + ", prompt " + std::to_string(ids.size()));
  const int64_t V = m.config().vocab_size, T = static_cast<int64_t>(ids.size());
  State one = m.new_sequence();
  prepare(one);
  const HostTensor ref = m.forward(one, ids);
  const int64_t ref_rows = ref.shape()[0];  // T, or the decoder rows under bounded replay

  std::vector<State> states(n);
  std::vector<HostTensor> outs(n);
  std::vector<std::vector<int64_t>> local(n);
  testing::CpTestGroup group(n);
  group.run([&](int rank) {
    states[rank] = m.new_sequence();
    prepare(states[rank]);
    CpShard shard(rank, n, T, group.all_gather(rank));
    local[rank] = shard.local();
    if constexpr (std::is_same_v<State, V4SequenceState>)
      outs[rank] = m.forward(states[rank], ids, nullptr, /*capture=*/nullptr, &shard);
    else
      outs[rank] = m.forward(states[rank], ids, nullptr, &shard);
  });
  if (ref_rows == T) {
    std::vector<float> full(static_cast<size_t>(T * V), -1.0f);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(outs[r].shape()[0], static_cast<int64_t>(local[r].size()));
      for (size_t i = 0; i < local[r].size(); ++i)
        std::memcpy(full.data() + local[r][i] * V, outs[r].data<float>() + i * V, sizeof(float) * V);
    }
    ASSERT_EQ(std::memcmp(full.data(), ref.data<float>(), sizeof(float) * T * V), 0) << "prefill logits differ";
  } else {
    // Bounded replay: CP ends at the decoder split; every rank returns the one-rank decoder rows.
    for (int r = 0; r < n; ++r) ASSERT_EQ(to_vec(outs[r]), to_vec(ref)) << "rank " << r;
  }
  // Decode continues on the owner (rank 0) and, to show every rank holds the full state, on the last rank.
  int64_t next = argmax_last(ref);
  std::vector<int64_t> ref_ids;
  for (int s = 0; s < decode_steps; ++s) {
    const int64_t tok[1] = {next};
    const HostTensor a = m.forward(one, tok);
    const HostTensor b = m.forward(states[0], tok);
    const HostTensor c = m.forward(states[n - 1], tok);
    ASSERT_EQ(to_vec(a), to_vec(b)) << "decode step " << s << " on rank 0";
    ASSERT_EQ(to_vec(a), to_vec(c)) << "decode step " << s << " on rank " << n - 1;
    next = argmax_last(a);
    ref_ids.push_back(next);
  }
}

TEST(ContextParallel, V3GoldenPrefillAndDecodeEqualOneRank) {
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV3Model::load(golden_dir("deepseek_v3"), *backend);
  for (MlaForm form : {MlaForm::kAuto, MlaForm::kAbsorbed}) {
    m->set_mla_form(form);
    for (int n : {2, 4})
      for (int64_t T : {int64_t{8}, int64_t{37}})
        expect_cp_equals_one_rank<DeepseekV3Model, V3SequenceState>(*m, random_ids(T, m->config().vocab_size, 11 + T),
                                                                    n, [](V3SequenceState&) {});
  }
}

TEST(ContextParallel, V3ContinuesAChunkedPrefillUnderCp) {
  // A second prompt chunk under CP reads the first chunk's rows from the (replicated) cache.
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV3Model::load(golden_dir("deepseek_v3"), *backend);
  const auto first = random_ids(13, m->config().vocab_size, 5);
  expect_cp_equals_one_rank<DeepseekV3Model, V3SequenceState>(*m, random_ids(22, m->config().vocab_size, 6), 2,
                                                              [&](V3SequenceState& s) { m->forward(s, first); });
}

TEST(ContextParallel, V4GoldenPrefillAndDecodeEqualOneRank) {
  // CSA (ratio 4, overlapping windows + indexer) and HCA (ratio 16) layers, window 16.
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV4Model::load(golden_dir("deepseek_v4"), *backend);
  for (int n : {2, 4})
    for (int64_t T : {int64_t{9}, int64_t{50}})
      expect_cp_equals_one_rank<DeepseekV4Model, V4SequenceState>(*m, random_ids(T, m->config().vocab_size, 3 + T), n,
                                                                  [](V4SequenceState&) {});
}

std::vector<int64_t> golden_token_map() {
  auto golden = SafetensorsFile::open(golden_dir("deepseek_v41") + "/golden.safetensors");
  Tensor t = golden->tensor("engram.token_map");
  return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
}

TEST(ContextParallel, V41GoldenPrefillAndDecodeEqualOneRank) {
  // CSA2 (ratio 4 source, shared selections, candidate blocks), ratio-1 decoder source, Engram.
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV4Model::load(golden_dir("deepseek_v41"), *backend, golden_token_map());
  for (int n : {2, 4})
    for (int64_t T : {int64_t{11}, int64_t{45}})
      expect_cp_equals_one_rank<DeepseekV4Model, V4SequenceState>(*m, random_ids(T, m->config().vocab_size, 7 + T), n,
                                                                  [](V4SequenceState&) {});
}

TEST(ContextParallel, V41BoundedReplayEndsCpAtTheDecoderSplit) {
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV4Model::load(golden_dir("deepseek_v41"), *backend, golden_token_map());
  const int64_t T = 43;  // decoder segment = last 16 tokens: the split falls inside rank pieces
  for (int n : {2, 4})
    expect_cp_equals_one_rank<DeepseekV4Model, V4SequenceState>(
        *m, random_ids(T, m->config().vocab_size, 19), n,
        [&](V4SequenceState& s) { s.decoder_from = m->bounded_decoder_from(T); });
}

TEST(ContextParallel, GeneratedV41CheckpointWithStraddlingGroups) {
  // Ratio-3 kv source (groups straddle every piece boundary of CP2/CP4 for these lengths), a small top-k and
  // candidate blocks so that selection matters, window 8.
  testing::TempDir tmp;
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir("deepseek_v41") + "/config.json"));
  auto& tc = cfg["text_config"];
  tc["compress_ratios"] = {0, 3, 3, 1, 1, 1};
  tc["index_topk"] = 4;
  tc["candidate_topk_blocks"] = 2;
  tc["candidate_block_size"] = 2;
  tc["sliding_window"] = 8;
  const std::string ckpt_dir = testing::write_random_checkpoint_of(tmp, cfg, 41);
  auto backend = make_cpu_backend(0);
  std::vector<int64_t> token_map(tc["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>((i * 7) % 256);
  auto m = DeepseekV4Model::load(ckpt_dir, *backend, token_map);
  for (int n : {2, 4})
    for (int64_t T : {int64_t{23}, int64_t{61}})
      expect_cp_equals_one_rank<DeepseekV4Model, V4SequenceState>(*m, random_ids(T, m->config().vocab_size, 29 + T), n,
                                                                  [](V4SequenceState&) {});
}

}  // namespace
}  // namespace deepinfer
