// Golden prompts as paged sequences of one V3KvPages (block size 4, block ids shuffled so no sequence's pages are
// contiguous), as the engine's runner keeps them: each prompt is prefilled with forward(), then the generated ids
// are decoded in lockstep, either all active sequences per step with decode_batch() (the batch shrinks as shorter
// continuations end) or one forward() per sequence. Shared by the CPU and the CUDA golden tests.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "deepinfer/model/deepseek_v3.h"

namespace deepinfer::testing {

// Per prompt: the logits rows of its continuation [gen.size(), vocab] (row 0 from the prefill's last position).
inline std::vector<std::vector<float>> v3_paged_decode(const DeepseekV3Model& model,
                                                       const std::vector<std::vector<int64_t>>& prompts,
                                                       const std::vector<std::vector<int64_t>>& gens, bool batched,
                                                       DecodeGraphs* graphs = nullptr) {
  constexpr int kBlock = 4;
  const int64_t v = model.config().vocab_size, n = static_cast<int64_t>(prompts.size());
  V3KvPages pages = model.new_kv_pages();
  std::vector<std::vector<BlockId>> tables(n);
  int64_t blocks = 0;
  for (int64_t i = 0; i < n; ++i) blocks += (prompts[i].size() + gens[i].size() + kBlock - 1) / kBlock;
  std::vector<BlockId> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::vector<V3SequenceState> seqs;
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t need = (prompts[i].size() + gens[i].size() + kBlock - 1) / kBlock;
    tables[i].assign(ids.begin() + next, ids.begin() + next + need);
    next += need;
    V3SequenceState s = model.new_sequence();
    s.pages = &pages;
    s.ref = PageRef{tables[i], kBlock, 0};
    s.mla_naive_until = model.mla_naive_until(static_cast<int64_t>(prompts[i].size()));
    seqs.push_back(std::move(s));
  }
  std::vector<std::vector<float>> rows(n);
  size_t longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    HostTensor logits = model.forward(seqs[i], prompts[i]);
    const float* last = logits.data<float>() + (prompts[i].size() - 1) * v;
    rows[i].assign(last, last + v);
    longest = std::max(longest, gens[i].size());
  }
  for (size_t j = 1; j < longest; ++j) {
    std::vector<V3SequenceState*> active;
    std::vector<int64_t> tokens, which;
    for (int64_t i = 0; i < n; ++i)
      if (j < gens[i].size()) {
        active.push_back(&seqs[i]);
        tokens.push_back(gens[i][j - 1]);
        which.push_back(i);
      }
    if (batched) {
      HostTensor logits = model.decode_batch(std::span<V3SequenceState* const>(active), tokens, graphs);
      for (size_t k = 0; k < active.size(); ++k)
        rows[which[k]].insert(rows[which[k]].end(), logits.data<float>() + k * v, logits.data<float>() + (k + 1) * v);
    } else {
      for (size_t k = 0; k < active.size(); ++k) {
        HostTensor logits = model.forward(*active[k], std::span<const int64_t>(&tokens[k], 1));
        rows[which[k]].insert(rows[which[k]].end(), logits.data<float>(), logits.data<float>() + v);
      }
    }
  }
  return rows;
}

}  // namespace deepinfer::testing
