// Added tokens ("added_tokens" of tokenizer.json): strings that are cut out of the input before
// pre-tokenization and map to one id each, like HF's AddedVocabulary.
//
// HF matches in two passes with leftmost-longest semantics: first the tokens with normalized=false on the
// raw input, then the tokens with normalized=true on the normalized remaining text. single_word, lstrip and
// rstrip adjust each match as HF's find_matches does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = true;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// What encode does with added tokens written in the text.
enum class SpecialTokenMode {
  kRecognize,      // HF default (transformers' tokenizer(text)): every added token is matched
  kSpecialAsText,  // HF encode_special_tokens / transformers split_special_tokens: special=true ones are text
  kAllAsText,      // no added token is matched (e.g. untrusted user text inside a chat template)
};

// A piece of input: either an added token (id >= 0) or text [begin, end) to tokenize normally.
struct Segment {
  int32_t id;
  uint32_t begin, end;
};

// One leftmost-longest matcher over a set of patterns (a byte trie; patterns are few and short).
class TokenMatcher {
 public:
  void add(std::string_view pattern, int32_t token_index);
  bool empty() const { return count_ == 0; }
  // Appends the segments of `text` (offsets relative to `text`). Matches of tokens whose `skip[index]` is
  // true are ignored, as HF ignores special tokens under encode_special_tokens.
  void split(std::string_view text, const std::vector<AddedToken>& tokens, const std::vector<bool>& skip,
             std::vector<Segment>* out) const;

 private:
  // Longest pattern starting at text[pos]: returns the token index or -1, and its length.
  int32_t longest_at(std::string_view text, size_t pos, size_t* len) const;
  // The first position >= pos where a pattern could start (text.size() if none): memchr over the distinct
  // first bytes when they are few (DeepSeek's added tokens all start with '<' or U+FF5C), else a table scan.
  size_t next_candidate(std::string_view text, size_t pos) const;

  std::vector<int32_t> terminal_{-1};            // per trie node: token index ending there, or -1
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  bool first_byte_[256] = {};
  std::vector<unsigned char> first_bytes_;  // the distinct first bytes, in order of first use
  int count_ = 0;
};

// HF's single_word boundary rule: is the code point at the end (start) of `s` alphanumeric or '_'?
bool ends_with_word_char(std::string_view s);
bool starts_with_word_char(std::string_view s);

}  // namespace deepinfer::tokenizer
