// The V4-Flash base MTP module (model/v4_mtp_draft.h) on a generated V4-shaped checkpoint that carries `mtp.0.*`
// weights: loading with and without them, the target's final-stream features, chunking invariance of the module's
// windowed cache (across ring wraps), and rollback after chained drafts leaving the cache bit-identical; and the
// draft logits against transformers' own DeepSeek-V4 block (tests/data/golden/deepseek_v4_mtp, made by
// tools/make_v4_mtp_golden.py on the V4 golden target weights).
#include "deepinfer/model/v4_mtp_draft.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/random_checkpoint.h"
#include "model/dspark_fixture.h"
#include "test_util.h"

namespace deepinfer {
namespace {

std::vector<float> rows_of(const HostTensor& t, int64_t first, int64_t n) {
  const int64_t w = t.shape()[1];
  return std::vector<float>(t.data<float>() + first * w, t.data<float>() + (first + n) * w);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(V4MtpDraft, LoadsTheModuleOrSaysWhyNot) {
  const DeepseekV4Model& m = *testing::v4_mtp_fixture().model;
  ASSERT_TRUE(m.weights().mtp.has_value());
  EXPECT_EQ(V4MtpDraft::unavailable_reason(m), "");
  const V4MtpDraft draft(m);
  EXPECT_EQ(draft.feature_dim(), m.config().hc.hc_mult * m.config().hidden_size);
  EXPECT_EQ(m.feature_dim(), draft.feature_dim());

  // The same config without MTP layers, and a config that has them over a checkpoint without their tensors.
  testing::TempDir tmp;
  nlohmann::json cfg =
      nlohmann::json::parse(testing::read_file_or_empty(testing::test_data_dir() + "/golden/deepseek_v4/config.json"));
  testing::write_file(tmp.file("in.json"), cfg.dump());
  RandomCheckpointOptions o;
  o.config_path = tmp.file("in.json");
  o.out_dir = tmp.path() + "/ckpt";
  o.seed = 4;
  write_random_checkpoint(o);
  auto backend = make_cpu_backend(0);
  {
    auto plain = DeepseekV4Model::load(o.out_dir, *backend);
    EXPECT_NE(V4MtpDraft::unavailable_reason(*plain).find("no V4 MTP layers"), std::string::npos);
    try {
      V4MtpDraft d(*plain);
      ADD_FAILURE() << "a model without MTP layers must not draft";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    }
  }
  cfg["num_nextn_predict_layers"] = 1;
  testing::write_file(o.out_dir + "/config.json", cfg.dump());
  auto no_weights = DeepseekV4Model::load(o.out_dir, *backend);
  EXPECT_FALSE(no_weights->weights().mtp.has_value());
  EXPECT_NE(V4MtpDraft::unavailable_reason(*no_weights).find("mtp.0.e_proj.weight"), std::string::npos);
}

TEST(V4MtpDraft, FeaturesAreTheFinalStreamsBeforeHcHead) {
  const DeepseekV4Model& m = *testing::v4_mtp_fixture().model;
  const int64_t V = m.config().vocab_size, T = 21;
  const std::vector<int64_t> ids = testing::dspark_prompt(static_cast<int>(T), V);
  auto a = m.new_sequence(), b = m.new_sequence();
  V4ForwardTrace trace;
  const HostTensor plain = m.forward(a, ids, &trace);
  std::vector<float> features;
  const HostTensor with = m.forward_features(b, ids, &features);
  ASSERT_EQ(static_cast<int64_t>(features.size()), T * m.feature_dim());
  const HostTensor& last = trace.layer_outputs.back();  // [T, hc, D]
  EXPECT_TRUE(bit_equal(features, std::vector<float>(last.data<float>(), last.data<float>() + last.numel())));
  EXPECT_TRUE(bit_equal(rows_of(plain, 0, T), rows_of(with, 0, T)));
}

// Target features of a prompt and the module's inputs for its positions 0..T-2 (next token = the prompt's next).
struct Inputs {
  std::vector<float> features;  // [T - 1, hc·D]
  std::vector<int64_t> next;    // [T - 1]
};
Inputs module_inputs(const DeepseekV4Model& m, int64_t T) {
  const std::vector<int64_t> ids = testing::dspark_prompt(static_cast<int>(T), m.config().vocab_size);
  auto seq = m.new_sequence();
  std::vector<float> f;
  m.forward_features(seq, ids, &f);
  Inputs in;
  in.features.assign(f.begin(), f.begin() + (T - 1) * m.feature_dim());
  in.next.assign(ids.begin() + 1, ids.end());
  return in;
}

TEST(V4MtpDraft, ChunkingDoesNotChangeTheLogits) {
  const DeepseekV4Model& m = *testing::v4_mtp_fixture().model;
  const V4MtpDraft draft(m, /*rollback_slack=*/4);
  const int64_t F = draft.feature_dim(), n = 2 * draft.window() + 9;  // the ring (window + 4) wraps
  const Inputs in = module_inputs(m, n + 1);
  V4MtpCache whole = draft.new_cache();
  HostTensor out_whole;
  const HostTensor all = draft.forward(whole, in.features, in.next, &out_whole);
  ASSERT_EQ(all.shape()[0], n);
  for (int64_t chunk : {1, 5, 16}) {
    V4MtpCache c = draft.new_cache();
    for (int64_t p = 0; p < n; p += chunk) {
      const int64_t len = std::min(chunk, n - p);
      HostTensor out;
      const HostTensor l = draft.forward(c, std::span<const float>(in.features).subspan(p * F, len * F),
                                         std::span<const int64_t>(in.next).subspan(p, len), &out);
      const std::vector<float> got = rows_of(l, 0, len), want = rows_of(all, p, len);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << "chunk " << chunk << " at " << p;
      const std::vector<float> got_s = rows_of(out, 0, len), want_s = rows_of(out_whole, p, len);
      for (size_t i = 0; i < got_s.size(); ++i)
        ASSERT_NEAR(got_s[i], want_s[i], 1e-4 * (1 + std::fabs(want_s[i]))) << "chunk " << chunk << " at " << p;
    }
    EXPECT_EQ(c.num_tokens, n);
  }
  // The windowed keys matter: the module's row at the last position differs when the earlier positions are
  // forgotten (a cache restarted there).
  V4MtpCache late = draft.new_cache(n - 1);
  const HostTensor alone = draft.forward(late, std::span<const float>(in.features).subspan((n - 1) * F, F),
                                         std::span<const int64_t>(in.next).subspan(n - 1, 1));
  EXPECT_FALSE(bit_equal(rows_of(alone, 0, 1), rows_of(all, n - 1, 1)));
}

// The module reads no buffer that an op did not write: on a target loaded on a backend whose TensorMemory::empty fills
// with 0xFF bytes (NaN, -1), the features and the module's logits and streams equal the zero-filling backend's bit
// for bit.
TEST(V4MtpDraft, ReadsNoBufferNoOpWrote) {
  const testing::DraftFixture& f = testing::v4_mtp_fixture();
  const std::unique_ptr<Backend> poison = make_cpu_backend(0, /*poison_empty=*/true);
  const std::unique_ptr<DeepseekV4Model> target = DeepseekV4Model::load(f.dir, *poison);
  const V4MtpDraft zeroed(*f.model, 4), poisoned(*target, 4);
  const int64_t n = zeroed.window() + 5;
  const Inputs want_in = module_inputs(*f.model, n + 1), got_in = module_inputs(*target, n + 1);
  ASSERT_TRUE(bit_equal(got_in.features, want_in.features));
  V4MtpCache cz = zeroed.new_cache(), cp = poisoned.new_cache();
  HostTensor sz, sp;
  const HostTensor lz = zeroed.forward(cz, want_in.features, want_in.next, &sz);
  const HostTensor lp = poisoned.forward(cp, got_in.features, got_in.next, &sp);
  EXPECT_TRUE(bit_equal(rows_of(lp, 0, n), rows_of(lz, 0, n)));
  EXPECT_TRUE(bit_equal(rows_of(sp, 0, n), rows_of(sz, 0, n)));
  // And one more position on the warm cache (the ring's keys before the chunk).
  const std::vector<float> feat(want_in.features.end() - zeroed.feature_dim(), want_in.features.end());
  const std::vector<int64_t> next{want_in.next.back()};
  EXPECT_TRUE(
      bit_equal(rows_of(poisoned.forward(cp, feat, next), 0, 1), rows_of(zeroed.forward(cz, feat, next), 0, 1)));
}

TEST(V4MtpDraft, RollbackAfterChainedDraftsIsBitIdentical) {
  const DeepseekV4Model& m = *testing::v4_mtp_fixture().model;
  const V4MtpDraft draft(m, /*rollback_slack=*/8);
  const int64_t F = draft.feature_dim(), V = m.config().vocab_size;
  const int64_t n = draft.window() + 11;  // a ring of window + 8: the chained rows overwrite old slots
  const Inputs in = module_inputs(m, n + 2);
  const std::span<const float> feats(in.features);
  const std::span<const int64_t> next(in.next);
  for (int64_t chained : {1, 3, 8}) {
    SCOPED_TRACE("chained " + std::to_string(chained));
    V4MtpCache a = draft.new_cache(), b = draft.new_cache();
    HostTensor out;
    draft.forward(a, feats.first(n * F), next.first(n), &out);
    draft.forward(b, feats.first(n * F), next.first(n));
    // Chain on the module's own output features and made-up tokens, then roll back.
    std::vector<float> f = rows_of(out, n - 1, 1);
    for (int64_t j = 0; j < chained; ++j) {
      const int64_t id = (7 * j + 3) % V;
      HostTensor o;
      draft.forward(a, f, std::span<const int64_t>(&id, 1), &o);
      f = rows_of(o, 0, 1);
    }
    EXPECT_EQ(a.num_tokens, n + chained);
    draft.truncate(a, n);
    EXPECT_EQ(a.num_tokens, n);
    EXPECT_EQ(a.kv_base, 0);
    // Every position the next row can see holds the same key in both caches.
    for (int64_t p = n - draft.window() + 1; p < n; ++p) {
      const int64_t slot = p % a.capacity;
      ASSERT_EQ(a.slot_position[slot], p);
      ASSERT_EQ(b.slot_position[slot], p);
      EXPECT_EQ(std::memcmp(a.ring.view().slice(slot, slot + 1).data(), b.ring.view().slice(slot, slot + 1).data(),
                            sizeof(float) * m.config().attn.head_dim),
                0)
          << "position " << p;
    }
    HostTensor oa, ob;
    const HostTensor la = draft.forward(a, feats.subspan(n * F, F), next.subspan(n, 1), &oa);
    const HostTensor lb = draft.forward(b, feats.subspan(n * F, F), next.subspan(n, 1), &ob);
    EXPECT_TRUE(bit_equal(rows_of(la, 0, 1), rows_of(lb, 0, 1)));
    EXPECT_TRUE(bit_equal(rows_of(oa, 0, 1), rows_of(ob, 0, 1)));
  }
  // A rollback past the slack restarts the cache at the kept length (valid, only without the older keys).
  V4MtpCache c = draft.new_cache();
  draft.forward(c, feats.first(n * F), next.first(n));
  draft.truncate(c, n - 9);
  EXPECT_EQ(c.kv_base, n - 9);
  for (int64_t p : c.slot_position) EXPECT_EQ(p, -1);
  EXPECT_THROW(draft.truncate(c, n - 10), Error);  // below the restarted cache
}

// The module assembled in transformers (its DeepseekV4DecoderLayer as the block, DeepseekV4HyperHead, RMSNorm;
// vLLM's wiring around them) on the golden V4 target: our target features feed our module for positions 0..38 of a
// 40-token prompt (the window of 16 is crossed twice); draft logits and output streams must match within the V4
// golden tolerance (max |d| / max |ref| per row <= 1e-4).
TEST(V4MtpDraft, MatchesTransformersBlockGolden) {
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v4_mtp";
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV4Model::load(dir, *backend);
  ASSERT_TRUE(m->weights().mtp.has_value());
  const Tensor id_t = golden->tensor("input_ids");
  const std::vector<int64_t> ids(id_t.data_as<int64_t>(), id_t.data_as<int64_t>() + id_t.numel());
  const int64_t S = static_cast<int64_t>(ids.size()) - 1, V = m->config().vocab_size;
  const V4MtpDraft draft(*m);
  const int64_t F = draft.feature_dim();
  auto seq = m->new_sequence();
  std::vector<float> features;
  m->forward_features(seq, ids, &features);
  features.resize(static_cast<size_t>(S * F));
  V4MtpCache cache = draft.new_cache();
  HostTensor streams;
  const HostTensor logits = draft.forward(cache, features, std::span<const int64_t>(ids).subspan(1), &streams);
  auto worst_row_rel = [](const float* a, const float* b, int64_t rows, int64_t w) {
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double diff = 0, scale = 0;
      for (int64_t j = 0; j < w; ++j) {
        diff = std::max(diff, std::fabs(double(a[r * w + j]) - b[r * w + j]));
        scale = std::max(scale, std::fabs(double(b[r * w + j])));
      }
      worst = std::max(worst, diff / scale);
    }
    return worst;
  };
  const Tensor ref_logits = golden->tensor("mtp_logits"), ref_streams = golden->tensor("mtp_streams");
  ASSERT_EQ(ref_logits.dim(0), S);
  ASSERT_EQ(ref_logits.dim(1), V);
  ASSERT_EQ(ref_streams.dim(1), F);
  const double rl = worst_row_rel(logits.data<float>(), ref_logits.data_as<float>(), S, V);
  const double rs = worst_row_rel(streams.data<float>(), ref_streams.data_as<float>(), S, F);
  std::printf("V4 MTP vs transformers block: logits worst row rel %.3g, streams %.3g\n", rl, rs);
  EXPECT_LE(rl, 1e-4);
  EXPECT_LE(rs, 1e-4);
  // The same rows one position at a time (the proposer's decode path) agree too.
  V4MtpCache step = draft.new_cache();
  for (int64_t p = 0; p < S; ++p) {
    const HostTensor l = draft.forward(step, std::span<const float>(features).subspan(p * F, F),
                                       std::span<const int64_t>(ids).subspan(p + 1, 1));
    ASSERT_LE(worst_row_rel(l.data<float>(), ref_logits.data_as<float>() + p * V, 1, V), 1e-4) << "position " << p;
  }
}

}  // namespace
}  // namespace deepinfer
