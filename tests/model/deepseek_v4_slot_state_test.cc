// A V4 / V4.1 sequence's sliding-window rings are allocated by their first use, so a paged sequence holds rings only
// for the layers whose windows are not paged (bounded replay's decoder layers), and slot_bytes_bound counts exactly
// those. (The engine's sizing tests check every slot against the bound: tests/engine/engine_factory_test.cc.)
#include <gtest/gtest.h>

#include "deepinfer/model/deepseek_v4.h"
#include "test_util.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

TEST(DeepseekV4SlotState, RingsOnlyWhereAForwardUsesThem) {
  auto backend = make_cpu_backend(0);
  std::vector<int64_t> token_map(512);
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>(i % 256);
  for (const char* family : {"deepseek_v4", "deepseek_v41"}) {
    SCOPED_TRACE(family);
    auto m = DeepseekV4Model::load(golden_dir(family), *backend, token_map);
    const ModelConfig& c = m->config();
    const int64_t ring = int64_t{c.attn.sliding_window} * c.attn.head_dim * 4;
    V4SequenceState s = m->new_sequence();
    EXPECT_EQ(m->slot_bytes(s), 0) << "a fresh sequence holds nothing yet";
    // Without pages every layer's window is a ring: the first forward allocates all of them.
    std::vector<int64_t> ids{5, 9, 17, 33, 65, 129, 257};
    m->forward(s, ids);
    for (const V4LayerState& l : s.layers)
      EXPECT_EQ(l.window.rows.shape(), Shape({c.attn.sliding_window, c.attn.head_dim}));
    EXPECT_GE(m->slot_bytes(s), c.num_layers * ring);
    // The bound: rings only for the layers from the decoder start on, and only under bounded replay.
    const int decoder_layers = m->decoder_start() >= 0 ? c.num_layers - m->decoder_start() : 0;
    EXPECT_EQ(m->slot_bytes_bound(true) - m->slot_bytes_bound(false), decoder_layers * ring);
    if (std::string(family) == "deepseek_v41") EXPECT_GT(decoder_layers, 0);
  }
}

}  // namespace
}  // namespace deepinfer
