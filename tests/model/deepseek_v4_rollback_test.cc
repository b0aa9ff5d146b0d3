// DeepseekV4Model::truncate (speculative decoding's rollback) on the V4 and V4.1 golden models: after a chunk
// [t, d_1 .. d_K] rolled back to its first a + 1 tokens, every per-slot cache kind (sliding-window rings, compressor
// pending rows / counters / V4 CSA overlap slices, compressed entries, indexer keys, Engram look-back) is
// bit-identical to a sequence that was only ever fed those a + 1 tokens, and so are the logits of what follows.
// Every rejection position a = 0 .. K-1, at chunk starts that cross the ring wrap (window 16), CSA (r = 4), HCA
// (r = 16) and V4.1 r = 4 / r = 1 group boundaries; V4.1 also under bounded replay (decoder windows with a floor).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v4.h"
#include "test_util.h"

namespace deepinfer {
namespace {

struct Golden {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV4Model> model;
};

const Golden& golden(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Golden>> cache;
  auto& g = cache[family];
  if (!g) {
    g = std::make_unique<Golden>();
    const std::string dir = testing::test_data_dir() + "/golden/" + family;
    g->backend = make_cpu_backend(1);
    auto file = SafetensorsFile::open(dir + "/golden.safetensors");
    std::optional<std::vector<int64_t>> map;
    if (file->find("engram.token_map") != nullptr) {
      Tensor t = file->tensor("engram.token_map");
      map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
    }
    g->model = DeepseekV4Model::load(dir, *g->backend, map);
  }
  return *g;
}

std::vector<int64_t> tokens(int n, int salt, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 131 + salt * 17 + 5) % (vocab - 4) + 2);
  return ids;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  if (a.numel() == 0) return true;
  if (a.data() == nullptr || b.data() == nullptr) return false;
  return std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void expect_same_compressor(const CompressorState& a, const CompressorState& b, const std::string& what) {
  EXPECT_EQ(a.emitted, b.emitted) << what;
  EXPECT_EQ(a.pending, b.pending) << what;
  if (a.pending > 0 && b.pending > 0) {
    EXPECT_TRUE(same_bytes(a.pending_kv.view(), b.pending_kv.view())) << what << " pending kv";
    EXPECT_TRUE(same_bytes(a.pending_gate.view(), b.pending_gate.view())) << what << " pending gate";
  }
  EXPECT_EQ(a.prev_kv.view().data() == nullptr, b.prev_kv.view().data() == nullptr) << what << " overlap slice";
  if (a.prev_kv.view().data() && b.prev_kv.view().data()) {
    EXPECT_TRUE(same_bytes(a.prev_kv.view(), b.prev_kv.view())) << what << " overlap kv";
    EXPECT_TRUE(same_bytes(a.prev_gate.view(), b.prev_gate.view())) << what << " overlap gate";
  }
}

void expect_same_state(const V4SequenceState& a, const V4SequenceState& b, const std::string& what) {
  ASSERT_EQ(a.num_tokens, b.num_tokens) << what;
  EXPECT_EQ(a.engram_recent, b.engram_recent) << what;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const V4LayerState& x = a.layers[l];
    const V4LayerState& y = b.layers[l];
    const std::string at = what + ", layer " + std::to_string(l);
    EXPECT_TRUE(same_bytes(x.window.rows.view(), y.window.rows.view())) << at << " ring";
    expect_same_compressor(x.compressor, y.compressor, at + " compressor");
    expect_same_compressor(x.index_compressor, y.index_compressor, at + " index compressor");
    EXPECT_EQ(x.n_entries, y.n_entries) << at;
    ASSERT_EQ(x.entries.rows, y.entries.rows) << at;
    ASSERT_EQ(x.index_keys.rows, y.index_keys.rows) << at;
    EXPECT_TRUE(same_bytes(x.entries.view(), y.entries.view())) << at << " entries";
    EXPECT_TRUE(same_bytes(x.index_keys.view(), y.index_keys.view())) << at << " index keys";
  }
}

// For every chunk start in `starts` and every rejection position: rollback == never drafted.
void check_rollback(const DeepseekV4Model& m, const std::vector<int>& starts, int K, bool bounded) {
  const int64_t V = m.config().vocab_size;
  int compared = 0;
  for (int p : starts) {
    const std::vector<int64_t> prompt = tokens(p, p, V);
    const std::vector<int64_t> chunk = tokens(K + 1, 1000 + p, V), after = tokens(3, 2000 + p, V);
    auto fresh = [&] {
      V4SequenceState s = m.new_sequence();
      if (bounded) s.decoder_from = m.bounded_decoder_from(p);
      m.forward(s, prompt);
      return s;
    };
    for (int a = 0; a <= K; ++a) {
      const std::string what = "start " + std::to_string(p) + ", kept " + std::to_string(a + 1) + " of " +
                               std::to_string(K + 1) + (bounded ? " (bounded replay)" : "");
      V4SequenceState spec = fresh();
      spec.record_undo = true;
      m.forward(spec, chunk);
      spec.record_undo = false;
      m.truncate(spec, p + a + 1);
      EXPECT_FALSE(spec.undo.has_value());
      V4SequenceState plain = fresh();
      m.forward(plain, std::span<const int64_t>(chunk).first(static_cast<size_t>(a + 1)));
      expect_same_state(spec, plain, what);
      // What follows sees the same caches: bit-identical logits, and states that stay identical.
      const HostTensor ls = m.forward(spec, after), lp = m.forward(plain, after);
      ASSERT_EQ(ls.numel(), lp.numel()) << what;
      EXPECT_EQ(std::memcmp(ls.data<float>(), lp.data<float>(), ls.view().nbytes()), 0) << what << ": next logits";
      expect_same_state(spec, plain, what + ", then 3 more tokens");
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(starts.size()) * (K + 1));
}

// V4 golden: layers [SWA?, CSA r=4 with indexer and overlap, HCA r=16, ...], window 16.
TEST(V4Rollback, BitIdenticalToNeverDraftingV4) {
  const DeepseekV4Model& m = *golden("deepseek_v4").model;
  // Starts before and across the first ring wrap and HCA group (16), CSA groups (4), the second HCA group (32).
  check_rollback(m, {1, 3, 11, 14, 15, 16, 17, 29, 31, 33}, 5, false);
}

// V4.1 golden: ratios [0, 4, 4, 1, 1, 1] (r=4 source with reuse, r=1 candidate source), Engram at layers 1 and 4.
TEST(V4Rollback, BitIdenticalToNeverDraftingV41) {
  const DeepseekV4Model& m = *golden("deepseek_v41").model;
  ASSERT_TRUE(m.engram().has_value());
  check_rollback(m, {1, 2, 10, 13, 14, 15, 16, 30}, 5, false);
}

TEST(V4Rollback, BitIdenticalToNeverDraftingV41BoundedReplay) {
  const DeepseekV4Model& m = *golden("deepseek_v41").model;
  ASSERT_GE(m.decoder_start(), 0);
  check_rollback(m, {20, 27, 33}, 4, true);
}

// A chunk longer than the ring (window 16): every slot was overwritten, and the dropped ones come back.
TEST(V4Rollback, ChunkLongerThanTheWindow) {
  for (const char* family : {"deepseek_v4", "deepseek_v41"}) {
    const DeepseekV4Model& m = *golden(family).model;
    check_rollback(m, {7}, 20, false);
  }
}

TEST(V4Rollback, NeedsAnUndoRecordAndAPrefixOfTheLastChunk) {
  const DeepseekV4Model& m = *golden("deepseek_v41").model;
  V4SequenceState s = m.new_sequence();
  m.forward(s, tokens(6, 1, m.config().vocab_size));
  EXPECT_THROW(m.truncate(s, 4), Error);  // recorded nothing
  s.record_undo = true;
  m.forward(s, tokens(3, 2, m.config().vocab_size));
  EXPECT_THROW(m.truncate(s, 5), Error);  // before the last chunk
  m.truncate(s, 7);
  EXPECT_EQ(s.num_tokens, 7);
}

}  // namespace
}  // namespace deepinfer
