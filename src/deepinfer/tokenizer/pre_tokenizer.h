// Pre-tokenizers of tokenizer.json ("pre_tokenizer" field): Sequence, Split(pattern, behavior, invert),
// ByteLevel, Whitespace, WhitespaceSplit, Digits. DeepSeek uses Sequence[Split×3 (Isolated), ByteLevel(no
// prefix space, no regex)].
//
// A pre-tokenizer refines a list of pieces. Pieces are views into the (normalized) input or into `owned`
// when a stage rewrites text (ByteLevel's prefix space). The ByteLevel byte→alphabet mapping itself is not
// materialized: the BPE model is told to look bytes up through the alphabet instead.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "deepinfer/tokenizer/function_ref.h"

namespace deepinfer::tokenizer {

struct Pieces {
  std::vector<std::string_view> views;
  std::deque<std::string> owned;  // storage for rewritten pieces (deque: growth keeps views valid)
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces p->views by their refinement. Empty pieces are dropped, as HF does.
  virtual void pre_tokenize(Pieces* p) const = 0;
  // Calls `sink` with each piece pre_tokenize would make of {text}, in order (empty pieces may be passed or
  // not). HF applies every stage to each piece on its own, so a Sequence can stream each piece of one stage
  // straight into the next and into the model; Split(Isolated) and the plain ByteLevel stream without storage.
  virtual void for_each_piece(std::string_view text, FunctionRef<void(std::string_view)> sink) const;
  // True when this stage (or a stage inside it) is ByteLevel: pieces are then bytes that the model must
  // read through the byte-level alphabet.
  virtual bool byte_level() const { return false; }
};

// Parses one pre-tokenizer object; `path` names it in errors. Returns nullptr for JSON null.
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, const std::string& path);

}  // namespace deepinfer::tokenizer
