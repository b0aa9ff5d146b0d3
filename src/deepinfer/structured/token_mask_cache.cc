#include "deepinfer/structured/token_mask_cache.h"

#include <algorithm>
#include <bit>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {

// Every byte below the node lies in one of the config's subtree sets (StackGraph::subtree_sets).
static inline bool takes_whole_subtree(const uint64_t* below, const uint64_t* sets) {
  return ((below[0] & ~sets[0]) | (below[1] & ~sets[1])) == 0 || ((below[0] & ~sets[2]) | (below[1] & ~sets[3])) == 0;
}

void walk_trie(const TokenTrie& trie, StackGraph& graph, uint32_t config, uint32_t begin, uint32_t end,
               uint32_t base_depth, std::span<uint64_t> mask, std::vector<uint32_t>* returns,
               std::vector<uint32_t>& scratch, const SliceBounds* slices) {
  if (scratch.size() < trie.max_depth() + 1) scratch.resize(trie.max_depth() + 1);
  scratch[base_depth] = config;
  // Slice tokens of at most S characters are already in the mask; those of D or more are dead: a subtree of slice
  // tokens none of whose lengths lies in (S, D) needs no visit.
  const uint32_t alive = slices ? slices->all_alive : 0;
  const uint32_t dead = slices ? slices->all_dead : SliceBounds::kUnlimited;
  const bool use_slices = slices != nullptr && (alive > 0 || dead != SliceBounds::kUnlimited);
  uint32_t i = begin;
  while (i < end) {
    if (use_slices) {
      const uint32_t most = trie.slice_max_chars(i);
      if (most != 0 && (most <= alive || trie.slice_min_chars(i) >= dead || dead <= alive + 1)) {
        i = trie.subtree_end(i);
        continue;
      }
    }
    const uint32_t d = trie.depth(i);
    uint32_t c = graph.step(scratch[d - 1], trie.byte(i));
    if (c == StackGraph::kDead) {
      i = trie.subtree_end(i);
      continue;
    }
    for (const int32_t* t = trie.tokens_begin(i); t != trie.tokens_end(i); ++t) set_token_bit(mask, *t);
    if (returns != nullptr && graph.hit_bottom(c)) {
      if (trie.subtree_end(i) > i + 1) returns->push_back(i);
      c = graph.without_bottom(c);
      if (c == StackGraph::kDead) {
        i = trie.subtree_end(i);
        continue;
      }
    }
    const uint32_t end_of_subtree = trie.subtree_end(i);
    if (end_of_subtree > i + 1 && !graph.hit_bottom(c)) {
      // Every byte below loops on c, or stays in c's closed class: all tokens of the subtree are allowed and none
      // returns. Take them at once.
      if (takes_whole_subtree(trie.below_bytes(i), graph.subtree_sets(c))) {
        for (const int32_t* t = trie.tokens_begin(i + 1); t != trie.tokens_begin(end_of_subtree); ++t)
          set_token_bit(mask, *t);
        i = end_of_subtree;
        continue;
      }
    }
    scratch[d] = c;
    ++i;
  }
}

// walk_trie from the root over TokenTrie::residual(), for a detached config whose slice bound S is at least
// residual_slice_chars() (the mask already holds those slice tokens). The dropped subtrees are exactly the ones
// walk_trie would skip for such S; no node where the frame returns is among them (every byte prefix of a slice run
// of <= S characters stays below the bottom), so `returns` and the self-loop shortcut see the full trie's subtrees.
static void walk_residual(const TokenTrie& trie, StackGraph& graph, uint32_t config, std::span<uint64_t> mask,
                          std::vector<uint32_t>* returns, std::vector<uint32_t>& scratch) {
  const std::vector<TokenTrie::ResidualNode>& res = trie.residual();
  if (scratch.size() < trie.max_depth() + 1) scratch.resize(trie.max_depth() + 1);
  scratch[0] = config;
  const uint32_t end = static_cast<uint32_t>(res.size());
  uint32_t r = 1;
  while (r < end) {
    const TokenTrie::ResidualNode& rn = res[r];
    uint32_t c = graph.step(scratch[rn.depth - 1], rn.byte);
    if (c == StackGraph::kDead) {
      r = rn.subtree_end;
      continue;
    }
    const uint32_t i = rn.node;
    for (const int32_t* t = trie.tokens_begin(i); t != trie.tokens_end(i); ++t) set_token_bit(mask, *t);
    if (returns != nullptr && graph.hit_bottom(c)) {
      if (trie.subtree_end(i) > i + 1) returns->push_back(i);
      c = graph.without_bottom(c);
      if (c == StackGraph::kDead) {
        r = rn.subtree_end;
        continue;
      }
    }
    if (rn.subtree_end > r + 1 && !graph.hit_bottom(c)) {
      if (takes_whole_subtree(trie.below_bytes(i), graph.subtree_sets(c))) {
        for (const int32_t* t = trie.tokens_begin(i + 1); t != trie.tokens_begin(trie.subtree_end(i)); ++t)
          set_token_bit(mask, *t);
        r = rn.subtree_end;
        continue;
      }
    }
    scratch[rn.depth] = c;
    ++r;
  }
}

std::shared_ptr<const MaskEntry> SharedMaskStore::find(const std::string& signature) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(signature);
  return it == entries_.end() ? nullptr : it->second;
}

std::shared_ptr<const MaskEntry> SharedMaskStore::insert(std::string signature,
                                                         std::shared_ptr<const MaskEntry> entry) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(signature);
  if (it != entries_.end()) return it->second;
  const size_t bytes = entry->memory_bytes() + signature.size();
  if (bytes_ + bytes > max_bytes_) return entry;
  bytes_ += bytes;
  entries_.emplace(std::move(signature), entry);
  return entry;
}

size_t SharedMaskStore::num_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t SharedMaskStore::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

TokenMaskCache::TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar,
                               std::shared_ptr<const TokenizerInfo> tokenizer, std::shared_ptr<SharedMaskStore> store)
    : grammar_(std::move(grammar)),
      tokenizer_(std::move(tokenizer)),
      store_(store ? std::move(store) : std::make_shared<SharedMaskStore>(tokenizer_.get())),
      graph_(grammar_.get()),
      slices_(&graph_, std::min(kMaxSliceChars, tokenizer_->trie.max_slice_chars())) {
  DI_CHECK_INTERNAL(store_->tokenizer() == tokenizer_.get()) << "a SharedMaskStore serves one tokenizer";
  entries_.resize(grammar_->num_states());
}

std::shared_ptr<const TokenMaskCache::Entry> TokenMaskCache::compute(int32_t state) {
  const size_t words = mask_words(vocab().size());
  const uint32_t root = graph_.detached_config(state);
  const SliceBounds sb = slices_.bounds(root);
  if (sb.all_alive > 0) {
    const uint64_t* m = trie().slice_mask_upto(sb.all_alive);
    scratch_mask_.assign(m, m + words);
  } else {
    scratch_mask_.assign(words, 0);
  }
  auto e = std::make_shared<Entry>();
  const uint32_t residual_chars = trie().residual_slice_chars();
  if (residual_chars > 0 && sb.all_alive >= residual_chars)
    walk_residual(trie(), graph_, root, scratch_mask_, &e->returns, scratch_);
  else
    walk_trie(trie(), graph_, root, 1, trie().num_nodes(), 0, scratch_mask_, &e->returns, scratch_, &sb);
  ++walks_;
  // Most words of a small entry are zero: skip them (std::popcount is a library call without -mpopcnt).
  size_t count = 0;
  for (uint64_t w : scratch_mask_)
    if (w != 0) count += std::popcount(w);
  // Small sets are applied bit by bit; a dense OR costs words/4 cycles-ish regardless of the count.
  if (count * 8 < words) {
    for (size_t w = 0; w < words; ++w)
      for (uint64_t bits = scratch_mask_[w]; bits; bits &= bits - 1)
        e->sparse.push_back(static_cast<int32_t>(w * 64 + std::countr_zero(bits)));
  } else {
    e->dense = scratch_mask_;
  }
  return e;
}

const TokenMaskCache::Entry& TokenMaskCache::entry(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_[state]) return *entries_[state];
  std::string signature = grammar_->detached_signature(state, kMaxSignatureStates, &sig_scratch_);
  std::shared_ptr<const Entry> e;
  if (!signature.empty()) e = store_->find(signature);
  if (!e) {
    e = compute(state);
    if (!signature.empty()) e = store_->insert(std::move(signature), std::move(e));
  }
  entries_[state] = std::move(e);
  return *entries_[state];
}

void TokenMaskCache::precompute_all() {
  for (size_t s = 0; s < grammar_->num_states(); ++s)
    if (grammar_->state(static_cast<int32_t>(s)).has_bytes) entry(static_cast<int32_t>(s));
}

size_t TokenMaskCache::num_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(entries_.begin(), entries_.end(), [](const auto& e) { return e != nullptr; });
}

size_t TokenMaskCache::num_walks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return walks_;
}

size_t TokenMaskCache::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& e : entries_)
    if (e) n += e->memory_bytes();
  return n;
}

}  // namespace deepinfer::structured
