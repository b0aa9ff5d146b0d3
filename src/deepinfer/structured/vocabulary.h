// What structured output needs to know about a tokenizer: token id -> the exact bytes it emits, which ids are
// control tokens (never produced by a grammar) and which ids end the sequence. Kept apart from
// deepinfer/tokenizer so that either side can change without the other; the engine adapts one to the other.
//
// TokenTrie is the vocabulary as a byte trie in pre-order, the layout the mask computation walks: node i's
// subtree is [i, subtree_end(i)), so a dead prefix skips all its extensions in one jump.
//
// Content slices: most tokens (124,894 of DeepSeek-V3's 127,997 byte tokens) are runs of complete UTF-8
// characters none of which is '"', '\\', 0x7F, a control character, U+2028 or U+2029 - text that may stand
// unescaped inside a JSON string. The two line separators are left out because ECMAScript's '.' refuses them:
// with them in, every `.`-pattern string (`^.*$` keys, `.{1,64}`) refused a slice character and lost the
// shortcut (S = 0, a full-trie walk); without them such strings are closed over slices like plain strings, and
// the tokens that hold one (none in DeepSeek-V3's vocabulary) are walked. The trie knows, per node, whether every token
// below it is such a run and how many characters those tokens have, and keeps bitmasks of all such tokens up to each
// length. Where a grammar state provably accepts every run of up to S such characters (string content, maxLength
// positions), the mask computation ORs one precomputed mask and skips those subtrees instead of walking them (the
// "slicer" idea of llguidance).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::structured {

class Vocabulary {
 public:
  // `special[i]` marks control tokens (chat markers, BOS/EOS...): they are never allowed by a grammar; the ids
  // in `eos_ids` are allowed exactly when the grammar may end. `size` may exceed token_bytes.size() (a model's
  // padded embedding table): the extra ids behave as special tokens.
  Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids, std::vector<bool> special = {},
             size_t size = 0);

  size_t size() const { return size_; }
  const std::string& token_bytes(int32_t id) const { return bytes_[id]; }
  bool is_special(int32_t id) const {
    return static_cast<size_t>(id) >= bytes_.size() || (!special_.empty() && special_[id]);
  }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  size_t num_bytes_tokens() const { return bytes_.size(); }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_ids_;
  std::vector<bool> special_;
  size_t size_;
};

// Reads a Hugging Face tokenizer.json whose model is byte-level BPE (GPT-2 style byte-to-unicode token
// strings, as DeepSeek's): vocab entries are decoded to bytes, added tokens marked special=true are control
// tokens, the others are literal text. `eos_token` names the EOS token (must exist).
Vocabulary load_hf_byte_level_vocabulary(const std::string& tokenizer_json_path, std::string_view eos_token);

// The byte automaton of one content-slice character (see above): state 0 is a character boundary; returns the
// next state (0 when the byte completes a character) or -1 when the byte cannot continue a slice character.
// Well-formed UTF-8 only (no overlongs, no surrogates, nothing above U+10FFFF), and not U+2028 / U+2029.
int slice_utf8_next(int state, uint8_t byte);
inline constexpr int kSliceUtf8States = 10;

class TokenTrie {
 public:
  explicit TokenTrie(const Vocabulary& vocab);

  uint32_t num_nodes() const { return static_cast<uint32_t>(byte_.size()); }
  uint8_t byte(uint32_t node) const { return byte_[node]; }
  uint32_t depth(uint32_t node) const { return depth_[node]; }
  uint32_t subtree_end(uint32_t node) const { return subtree_end_[node]; }
  uint32_t max_depth() const { return max_depth_; }
  // Token ids whose bytes end exactly at this node.
  const int32_t* tokens_begin(uint32_t node) const { return tokens_.data() + token_offset_[node]; }
  const int32_t* tokens_end(uint32_t node) const { return tokens_.data() + token_offset_[node + 1]; }
  // Bytes on the edges below this node (its strict descendants) as a 128-bit set, bit byte_bucket(b): lets a walk
  // take a whole subtree at once when every byte in it loops on the current parser state (JSON string content).
  const uint64_t* below_bytes(uint32_t node) const { return &below_[static_cast<size_t>(node) * 2]; }
  // Bytes 0..126 are their own bucket; 127 and all non-ASCII bytes share bucket 127.
  static int byte_bucket(uint8_t b) { return b < 127 ? b : 127; }

  // Content slices. Nonzero when every token in this node's subtree is a slice token; then the fewest / most
  // characters of those tokens (counted from the root).
  uint8_t slice_max_chars(uint32_t node) const { return slice_max_[node]; }
  uint8_t slice_min_chars(uint32_t node) const { return slice_min_[node]; }
  // The most characters of any slice token (<= 255: longer tokens are not slice tokens).
  uint32_t max_slice_chars() const { return max_slice_chars_; }
  // Bitmask (mask_words(vocab.size()) words) of the slice tokens with at most `chars` characters.
  const uint64_t* slice_mask_upto(uint32_t chars) const {
    return slice_masks_.data() + static_cast<size_t>(std::min(chars, max_slice_chars_)) * mask_words_;
  }

  // The residual trie: this trie without the subtrees whose tokens are all slice tokens of at most
  // residual_slice_chars() characters, in the same pre-order, one compact record per node. A walk from the root
  // for a state that accepts every such token (slice bound S >= residual_slice_chars(), the usual string and key
  // content state) visits only these nodes, with no per-node slice test: DeepSeek-V3's 272k-node trie shrinks to
  // the few thousand nodes of tokens holding '"', '\\', controls or long runs, and their prefixes. The set is
  // closed under prefixes (a node kept keeps its parent), so subtree ranges stay contiguous.
  struct ResidualNode {
    uint32_t node;         // id in the full trie (tokens, below_bytes, subtree_end there)
    uint32_t subtree_end;  // index in residual() one past this node's residual subtree
    uint16_t depth;
    uint8_t byte;
  };
  static constexpr uint32_t kResidualSliceChars = 32;
  uint32_t residual_slice_chars() const { return std::min(kResidualSliceChars, max_slice_chars_); }
  const std::vector<ResidualNode>& residual() const { return residual_; }

 private:
  std::vector<uint8_t> byte_;  // node 0 is the root (empty prefix)
  std::vector<uint32_t> depth_;
  std::vector<uint32_t> subtree_end_;
  std::vector<uint32_t> token_offset_;  // num_nodes + 1
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> below_;  // 2 words per node
  uint32_t max_depth_ = 0;
  std::vector<uint8_t> slice_min_, slice_max_;  // per node
  uint32_t max_slice_chars_ = 0;
  size_t mask_words_ = 0;
  std::vector<uint64_t> slice_masks_;  // (max_slice_chars_ + 1) masks, cumulative by length
  std::vector<ResidualNode> residual_;
};

// A vocabulary with its trie, built once per tokenizer and shared by every grammar.
struct TokenizerInfo {
  explicit TokenizerInfo(Vocabulary v) : vocab(std::move(v)), trie(vocab) {}
  Vocabulary vocab;
  TokenTrie trie;
};

}  // namespace deepinfer::structured
