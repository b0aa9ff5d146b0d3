// Per-DFA-state token masks, computed once per (compiled grammar, vocabulary) and shared by every matcher.
//
// For a leaf frame in DFA state s the set of allowed tokens splits in two:
//   - tokens decided by s alone: walking their bytes from the detached frame (s, kBottom) either stays inside
//     s's rule and the rules it calls, or ends exactly when s's rule returns. Those are valid whatever lies
//     beneath (a return always lands in a live state) -> `accepted`, a context-independent set;
//   - tokens whose bytes go on after s's rule returns: they depend on the stack below. Their trie nodes at the
//     return point are kept as `returns`; at mask time the matcher walks just those subtrees from the real
//     parent frame. For JSON this is "a string ends inside the token" - a few hundred subtrees that die after a
//     byte or two.
// Entries are built lazily (the first mask that needs a state pays a trie walk), then reused. The walk takes the
// vocabulary's content-slice tokens (vocabulary.h) from precomputed masks where the state provably accepts them
// (content_slices.h): inside JSON strings, bounded or not, it visits only the few thousand other tokens. An entry
// depends only on the automaton reachable from its state (CompiledGrammar::detached_signature), so entries are
// keyed by that signature in a SharedMaskStore: states with the same sub-automaton - the JSON string, number and
// whitespace rules of every schema, the N copies of an inline string rule - pay for one walk, within a grammar
// and, when a store is shared by the grammars of one tokenizer (GrammarCompiler does), across grammars.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/content_slices.h"
#include "deepinfer/structured/stack_graph.h"
#include "deepinfer/structured/vocabulary.h"

namespace deepinfer::structured {

// Bit t of word t / 64 is token t.
inline void set_token_bit(std::span<uint64_t> mask, int32_t token) {
  mask[static_cast<size_t>(token) >> 6] |= uint64_t{1} << (token & 63);
}
inline bool test_token_bit(std::span<const uint64_t> mask, int32_t token) {
  return (mask[static_cast<size_t>(token) >> 6] >> (token & 63)) & 1;
}
inline size_t mask_words(size_t vocab_size) { return (vocab_size + 63) / 64; }

// Walks the trie nodes [begin, end) (a run of sibling subtrees whose parent is at depth `base_depth`) from
// `config`, setting the bit of every token whose bytes keep some stack alive. With `returns` non-null (detached
// walks), a node where the detached frame returns has its tokens accepted and is recorded in `returns`; the walk
// continues below it only for the paths that did not return. With `slices` (the bounds of `config`, for a walk
// from the trie root whose mask already holds TokenTrie::slice_mask_upto(slices->all_alive)), subtrees of slice
// tokens whose lengths are all decided by the bounds are skipped.
void walk_trie(const TokenTrie& trie, StackGraph& graph, uint32_t config, uint32_t begin, uint32_t end,
               uint32_t base_depth, std::span<uint64_t> mask, std::vector<uint32_t>* returns,
               std::vector<uint32_t>& scratch, const SliceBounds* slices = nullptr);

struct MaskEntry {
  std::vector<uint64_t> dense;    // accepted tokens as a bitmask, or empty when `sparse` is used
  std::vector<int32_t> sparse;    // accepted tokens as ids (small sets)
  std::vector<uint32_t> returns;  // trie nodes (with children) where the state's rule returns
  size_t memory_bytes() const { return sizeof(MaskEntry) + dense.size() * 8 + sparse.size() * 4 + returns.size() * 4; }
};

// Mask entries by detached signature, for one tokenizer (entries hold its trie node ids). Thread-safe. Stops
// adding once `max_bytes` is reached (entries already handed out stay valid: shared ownership).
class SharedMaskStore {
 public:
  explicit SharedMaskStore(const TokenizerInfo* tokenizer, size_t max_bytes = size_t{256} << 20)
      : tokenizer_(tokenizer), max_bytes_(max_bytes) {}
  const TokenizerInfo* tokenizer() const { return tokenizer_; }
  std::shared_ptr<const MaskEntry> find(const std::string& signature) const;
  // Returns the stored entry for `signature` (an earlier one if another thread got there first).
  std::shared_ptr<const MaskEntry> insert(std::string signature, std::shared_ptr<const MaskEntry> entry);
  size_t num_entries() const;
  size_t memory_bytes() const;

 private:
  const TokenizerInfo* tokenizer_;
  size_t max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const MaskEntry>> entries_;
  size_t bytes_ = 0;
};

class TokenMaskCache {
 public:
  using Entry = MaskEntry;
  // Signatures larger than this many states are not computed (the state gets a private entry).
  static constexpr size_t kMaxSignatureStates = 128;
  // Content-slice lengths examined per state (longer slice tokens are walked): bounds the analysis of long
  // counted repetitions; 124,838 of DeepSeek-V3's 124,894 slice tokens have at most 32 characters.
  static constexpr uint32_t kMaxSliceChars = 32;

  // `store` (optional) shares entries with other grammars of the same tokenizer; without one the cache keeps a
  // private store, which still shares entries between the states of this grammar.
  TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenizerInfo> tokenizer,
                 std::shared_ptr<SharedMaskStore> store = nullptr);

  const CompiledGrammar& grammar() const { return *grammar_; }
  std::shared_ptr<const CompiledGrammar> grammar_ptr() const { return grammar_; }
  const Vocabulary& vocab() const { return tokenizer_->vocab; }
  const TokenTrie& trie() const { return tokenizer_->trie; }
  // Thread-safe; the reference stays valid for the cache's lifetime.
  const Entry& entry(int32_t state);
  // Builds the entries of every state reachable in the grammar (eager compile; optional).
  void precompute_all();
  size_t num_entries() const;
  size_t memory_bytes() const;  // of the entries this grammar uses (shared ones counted in full)
  // Trie walks this cache did (entries not found in the store).
  size_t num_walks() const;
  const SharedMaskStore& store() const { return *store_; }

 private:
  std::shared_ptr<const Entry> compute(int32_t state);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenizerInfo> tokenizer_;
  std::shared_ptr<SharedMaskStore> store_;
  mutable std::mutex mu_;
  StackGraph graph_;
  ContentSliceAnalyzer slices_;
  std::vector<std::shared_ptr<const Entry>> entries_;
  size_t walks_ = 0;
  std::vector<uint64_t> scratch_mask_;
  std::vector<uint32_t> scratch_;
  std::vector<uint32_t> sig_scratch_;  // detached_signature's renumbering arrays
};

}  // namespace deepinfer::structured
