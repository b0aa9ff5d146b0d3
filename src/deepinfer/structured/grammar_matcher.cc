#include "deepinfer/structured/grammar_matcher.h"

#include <algorithm>
#include <cstdio>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {
namespace {

std::string printable(std::string_view bytes) {
  std::string out;
  for (char ch : bytes) {
    uint8_t c = static_cast<uint8_t>(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += ch;
    } else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), graph_(grammar_.get()) {
  reset();
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<TokenMaskCache> masks)
    : grammar_(masks->grammar_ptr()), masks_(std::move(masks)), graph_(grammar_.get()) {
  reset();
}

void GrammarMatcher::reset() {
  history_.clear();
  history_.push_back(Step{graph_.start_config(), false});
  error_.clear();
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (history_.back().terminated) {
    error_ = "input after the end of the sentence";
    return false;
  }
  uint32_t c = history_.back().config;
  for (size_t i = 0; i < bytes.size(); ++i) {
    uint32_t n = graph_.step(c, static_cast<uint8_t>(bytes[i]));
    if (n == StackGraph::kDead) {
      error_ = "byte " + std::to_string(i) + " ('" + printable(bytes.substr(i, 1)) + "') of '" +
               printable(bytes.substr(0, 64)) + (bytes.size() > 64 ? "..." : "") + "' is not allowed; expected " +
               graph_.describe(c);
      return false;
    }
    c = n;
  }
  history_.push_back(Step{c, false});
  return true;
}

bool GrammarMatcher::accept_token(int32_t token) {
  DI_CHECK(masks_ != nullptr) << "accept_token needs a matcher built with a vocabulary";
  const Vocabulary& vocab = masks_->vocab();
  DI_CHECK(token >= 0 && static_cast<size_t>(token) < vocab.size()) << "token id " << token << " out of range";
  if (history_.back().terminated) {
    error_ = "token " + std::to_string(token) + " after the end of the sentence";
    return false;
  }
  if (std::find(vocab.eos_ids().begin(), vocab.eos_ids().end(), token) != vocab.eos_ids().end()) {
    if (!can_terminate()) {
      error_ = "EOS token " + std::to_string(token) + " before the sentence is complete; expected " +
               graph_.describe(history_.back().config);
      return false;
    }
    history_.push_back(Step{history_.back().config, true});
    return true;
  }
  if (vocab.is_special(token)) {
    error_ = "special token " + std::to_string(token) + " is never allowed by a grammar";
    return false;
  }
  if (!accept_bytes(vocab.token_bytes(token))) {
    error_ = "token " + std::to_string(token) + ": " + error_;
    return false;
  }
  return true;
}

void GrammarMatcher::rollback(int n) {
  DI_CHECK(n >= 0 && n <= num_accepted())
      << "cannot roll back " << n << " steps; only " << num_accepted() << " were accepted";
  history_.resize(history_.size() - n);
}

void GrammarMatcher::fill_mask(std::span<uint64_t> mask) {
  DI_CHECK(masks_ != nullptr) << "fill_mask needs a matcher built with a vocabulary";
  const Vocabulary& vocab = masks_->vocab();
  DI_CHECK(mask.size() == mask_words(vocab.size()))
      << "mask has " << mask.size() << " words; the vocabulary needs " << mask_words(vocab.size());
  std::fill(mask.begin(), mask.end(), 0);
  const Step& cur = history_.back();
  if (cur.terminated) return;
  const TokenTrie& trie = masks_->trie();
  // Copy: walking may intern new configs (the leaf vector itself never changes, but its storage may move).
  std::vector<uint32_t> leaves = graph_.leaves(cur.config);
  for (uint32_t leaf : leaves) {
    const TokenMaskCache::Entry& e = masks_->entry(graph_.node_state(leaf));
    if (!e.dense.empty()) {
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= e.dense[w];
    } else {
      for (int32_t t : e.sparse) set_token_bit(mask, t);
    }
    if (e.returns.empty()) continue;
    // Tokens that run past the end of this frame's rule: continue them from the real parent.
    uint32_t parent = graph_.closure(graph_.node_parent(leaf));
    if (graph_.leaves(parent).empty()) continue;  // only <end> below: nothing may follow the return
    for (uint32_t node : e.returns)
      walk_trie(trie, graph_, parent, node + 1, trie.subtree_end(node), trie.depth(node), mask, nullptr, scratch_);
  }
  if (can_terminate())
    for (int32_t t : vocab.eos_ids()) set_token_bit(mask, t);
}

void GrammarMatcher::fill_mask_uncached(std::span<uint64_t> mask) {
  DI_CHECK(masks_ != nullptr) << "fill_mask_uncached needs a matcher built with a vocabulary";
  const Vocabulary& vocab = masks_->vocab();
  DI_CHECK(mask.size() == mask_words(vocab.size()))
      << "mask has " << mask.size() << " words; the vocabulary needs " << mask_words(vocab.size());
  std::fill(mask.begin(), mask.end(), 0);
  const Step& cur = history_.back();
  if (cur.terminated) return;
  const TokenTrie& trie = masks_->trie();
  walk_trie(trie, graph_, cur.config, 1, trie.num_nodes(), 0, mask, nullptr, scratch_);  // (no control tokens)
  if (can_terminate())
    for (int32_t t : vocab.eos_ids()) set_token_bit(mask, t);
}

std::string GrammarMatcher::forced_bytes(size_t max_bytes) {
  std::string out;
  uint32_t c = history_.back().config;
  if (history_.back().terminated) return out;
  while (out.size() < max_bytes && !graph_.can_end(c)) {
    int only = -1;
    uint32_t next = StackGraph::kDead;
    for (int b = 0; b < 256; ++b) {
      uint32_t n = graph_.step(c, static_cast<uint8_t>(b));
      if (n == StackGraph::kDead) continue;
      if (only >= 0) return out;
      only = b;
      next = n;
    }
    if (only < 0) break;
    out += static_cast<char>(only);
    c = next;
  }
  return out;
}

}  // namespace deepinfer::structured
