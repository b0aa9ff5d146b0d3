#include "deepinfer/tokenizer/engram_map.h"

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "deepinfer/tokenizer/normalizer.h"

namespace deepinfer::tokenizer {
namespace {

// Built from the same JSON a tokenizers.normalizers.Sequence serializes to, so each step has HF's semantics.
const Normalizer& engram_normalizer() {
  static const std::unique_ptr<Normalizer> n = [] {
    const char* kSentinel = "\xEE\x80\x80";  // U+E000 (private use) shields a lone space from Strip
    nlohmann::json j = {
        {"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFKC"}},
          {{"type", "NFD"}},
          {{"type", "StripAccents"}},
          {{"type", "Lowercase"}},
          {{"type", "Replace"}, {"pattern", {{"Regex", "[ \\t\\r\\n]+"}}}, {"content", " "}},
          {{"type", "Replace"}, {"pattern", {{"Regex", "^ $"}}}, {"content", kSentinel}},
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
          {{"type", "Replace"}, {"pattern", {{"String", kSentinel}}}, {"content", " "}}}}};
    return parse_normalizer(j, "engram");
  }();
  return *n;
}

}  // namespace

std::string engram_normalize(std::string_view text) { return engram_normalizer().normalize(text); }

EngramTokenMap build_engram_token_map(const Tokenizer& tok) {
  EngramTokenMap map;
  map.class_of.resize(static_cast<size_t>(tok.vocab_size()));
  std::unordered_map<std::string, int64_t> classes;
  // A missing id decodes to "" in HF (it drops unknown ids), so its key is "".
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    std::string key;
    if (!tok.is_valid_id(id)) {
      key = "";
    } else {
      const std::string text = tok.decode(std::vector<int32_t>{id});
      if (text.find("\xEF\xBF\xBD") != std::string::npos) {
        key = *tok.id_to_token(id);
      } else {
        key = engram_normalize(text);
        if (key.empty()) key = text;
      }
    }
    auto [it, inserted] = classes.emplace(key, static_cast<int64_t>(classes.size()));
    map.class_of[id] = it->second;
  }
  map.num_classes = static_cast<int64_t>(classes.size());
  return map;
}

}  // namespace deepinfer::tokenizer
