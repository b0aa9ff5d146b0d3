// DeepseekV4Model paged decode as the engine's runner drives it, shared by the CPU and CUDA tests: sequences are
// prefilled with forward() into one V4KvPages (block ids shuffled, optional prefix hits in an earlier sequence's
// blocks), then decoded in lockstep, either all active sequences per step with decode_batch() (optionally through
// DecodeGraphs: padded, recorded or not) or one forward() per sequence.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <vector>

#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer::testing {

// Block size of the pages: a multiple of every compress ratio (paged entries need it); 128 for ratio 128.
constexpr int kV4Block = 16;

inline std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(3, vocab - 1);
  std::vector<int64_t> ids(n);
  for (auto& id : ids) id = pick(rng);
  return ids;
}

// One paged sequence: its prompt, the ids it decodes, and optionally a prefix hit of `hit` positions (a block
// multiple) in the blocks of an earlier sequence `share` whose prompt starts the same.
struct Spec {
  std::vector<int64_t> prompt, gen;
  int share = -1;
  int64_t hit = 0;
};

// Specs of the given prompt lengths, `steps` decode ids each, random ids; share: (index, of, hit) triples.
inline std::vector<Spec> make_specs(const DeepseekV4Model& m, const std::vector<int64_t>& lengths, int steps,
                                    const std::vector<std::array<int64_t, 3>>& shares = {}) {
  const int64_t V = m.config().vocab_size;
  std::vector<Spec> specs;
  for (size_t i = 0; i < lengths.size(); ++i)
    specs.push_back({random_ids(lengths[i], V, 100 + static_cast<uint32_t>(i)),
                     random_ids(steps + static_cast<int64_t>(i % 3), V, 900 + static_cast<uint32_t>(i))});
  for (const auto& [i, of, hit] : shares) {
    EXPECT_TRUE(of < i && hit <= lengths[of] && hit <= lengths[i]) << "bad share spec " << i;
    std::copy_n(specs[of].prompt.begin(), hit, specs[i].prompt.begin());
    specs[i].share = static_cast<int>(of);
    specs[i].hit = hit;
  }
  return specs;
}

// Prefills every spec (forward, paged, block ids shuffled), then decodes all active sequences per step, batched
// (one decode_batch) or one forward() each. Returns per spec its decode logits rows, flattened. forward_every > 0
// (batched): at step j, sequence i takes a forward() of its own instead when (i + j) % forward_every == 0, so that
// sequences go from the batched decode's pooled compressor state to forward() and back.
inline std::vector<std::vector<float>> paged_decode(const DeepseekV4Model& m, const std::vector<Spec>& specs,
                                                    bool bounded, bool batched, int block = kV4Block,
                                                    DecodeGraphs* graphs = nullptr, int forward_every = 0) {
  const int64_t v = m.config().vocab_size, n = static_cast<int64_t>(specs.size());
  V4KvPages pages = m.new_kv_pages(bounded);
  std::vector<int64_t> need(n);
  int64_t blocks = 0;
  for (int64_t i = 0; i < n; ++i) {
    need[i] = static_cast<int64_t>(specs[i].prompt.size() + specs[i].gen.size()) / block + 1;
    blocks += need[i];
  }
  std::vector<BlockId> pool(blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(5));
  std::vector<std::vector<BlockId>> tables(n);
  std::vector<V4SequenceState> seqs;
  seqs.reserve(n);
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Spec& s = specs[i];
    const int64_t shared = s.share >= 0 ? s.hit / block : 0;
    if (shared > 0) tables[i].assign(tables[s.share].begin(), tables[s.share].begin() + shared);
    tables[i].insert(tables[i].end(), pool.begin() + next, pool.begin() + next + need[i] - shared);
    next += need[i] - shared;
    V4SequenceState st = m.new_sequence();
    st.pages = &pages;
    st.decoder_from = bounded ? m.bounded_decoder_from(static_cast<int64_t>(s.prompt.size())) : 0;
    const int64_t start = s.share >= 0 ? std::max<int64_t>(0, s.hit - m.prefix_replay_tokens(bounded)) : 0;
    if (start > 0) m.start_at(st, start, std::span<const int64_t>(s.prompt).first(start));
    st.ref = PageRef{tables[i], block, s.share >= 0 ? s.hit : 0};
    m.forward(st, std::span<const int64_t>(s.prompt).subspan(start));
    seqs.push_back(std::move(st));
  }
  std::vector<std::vector<float>> rows(n);
  size_t longest = 0;
  for (const Spec& s : specs) longest = std::max(longest, s.gen.size());
  for (size_t j = 0; j < longest; ++j) {
    std::vector<V4SequenceState*> active;
    std::vector<int64_t> tokens, which;
    for (int64_t i = 0; i < n; ++i)
      if (j < specs[i].gen.size()) {
        active.push_back(&seqs[i]);
        tokens.push_back(specs[i].gen[j]);
        which.push_back(i);
      }
    // Rotate the batch order each step: a row's result must not depend on its place in the batch.
    std::rotate(active.begin(), active.begin() + static_cast<int64_t>(j % active.size()), active.end());
    std::rotate(tokens.begin(), tokens.begin() + static_cast<int64_t>(j % tokens.size()), tokens.end());
    std::rotate(which.begin(), which.begin() + static_cast<int64_t>(j % which.size()), which.end());
    if (batched && forward_every > 0) {
      for (size_t k = 0; k < active.size();) {
        if ((which[k] + static_cast<int64_t>(j)) % forward_every != 0) {
          ++k;
          continue;
        }
        HostTensor logits = m.forward(*active[k], std::span<const int64_t>(&tokens[k], 1));
        rows[which[k]].insert(rows[which[k]].end(), logits.data<float>(), logits.data<float>() + v);
        active.erase(active.begin() + static_cast<int64_t>(k));
        tokens.erase(tokens.begin() + static_cast<int64_t>(k));
        which.erase(which.begin() + static_cast<int64_t>(k));
      }
      if (active.empty()) continue;
    }
    if (batched) {
      for (V4SequenceState* s : active) EXPECT_TRUE(m.decode_batchable(*s));
      HostTensor logits = m.decode_batch(std::span<V4SequenceState* const>(active), tokens, graphs);
      EXPECT_EQ(logits.shape()[0], static_cast<int64_t>(active.size()));
      for (size_t k = 0; k < active.size(); ++k)
        rows[which[k]].insert(rows[which[k]].end(), logits.data<float>() + k * v, logits.data<float>() + (k + 1) * v);
    } else {
      for (size_t k = 0; k < active.size(); ++k) {
        HostTensor logits = m.forward(*active[k], std::span<const int64_t>(&tokens[k], 1));
        rows[which[k]].insert(rows[which[k]].end(), logits.data<float>(), logits.data<float>() + v);
      }
    }
  }
  return rows;
}

}  // namespace deepinfer::testing
