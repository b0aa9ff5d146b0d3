#include "deepinfer/tokenizer/pre_tokenizer.h"

#include <unicode/uchar.h>

#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/regex.h"
#include "deepinfer/tokenizer/split_matchers.h"
#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::json;

// The GPT-2 pattern ByteLevel applies when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF's NormalizedString::split over the alternating (span, is_match) list of one piece.
class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<SpanMatcher> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(Pieces* p) const override {
    std::vector<std::string_view> out;
    out.reserve(p->views.size() * 2);
    std::vector<Span> matches;
    struct Part {
      uint32_t begin, end;
      bool is_match;
    };
    std::vector<Part> parts;
    for (std::string_view piece : p->views) {
      matches.clear();
      regex_->find_all(piece, &matches);
      if (matches.empty() && !invert_ && behavior_ != Behavior::kRemoved) {
        out.push_back(piece);  // common case: nothing to cut
        continue;
      }
      parts.clear();
      uint32_t prev = 0;
      for (const auto& [b, e] : matches) {
        if (prev != b) parts.push_back({prev, b, invert_});
        parts.push_back({b, e, !invert_});
        prev = e;
      }
      if (prev != piece.size()) parts.push_back({prev, static_cast<uint32_t>(piece.size()), invert_});
      emit(piece, parts, &out);
    }
    p->views = std::move(out);
  }

  void for_each_piece(std::string_view text, FunctionRef<void(std::string_view)> sink) const override {
    if (behavior_ != Behavior::kIsolated || invert_) {
      PreTokenizer::for_each_piece(text, sink);
      return;
    }
    uint32_t prev = 0;
    regex_->for_each_match(text, [&](uint32_t b, uint32_t e) {
      if (b > prev) sink(text.substr(prev, b - prev));
      if (e > b) sink(text.substr(b, e - b));
      prev = e;
    });
    if (prev < text.size()) sink(text.substr(prev));
  }

 private:
  template <typename Part>
  void emit(std::string_view piece, const std::vector<Part>& parts, std::vector<std::string_view>* out) const {
    auto push = [&](uint32_t b, uint32_t e) {
      if (e > b) out->push_back(piece.substr(b, e - b));
    };
    switch (behavior_) {
      case Behavior::kIsolated:
        for (const auto& s : parts) push(s.begin, s.end);
        return;
      case Behavior::kRemoved:
        for (const auto& s : parts)
          if (!s.is_match) push(s.begin, s.end);
        return;
      case Behavior::kContiguous:
      case Behavior::kMergedWithPrevious: {
        std::vector<Span> acc;
        bool previous_match = false;
        for (const auto& s : parts) {
          const bool merge =
              behavior_ == Behavior::kContiguous ? s.is_match == previous_match : (s.is_match && !previous_match);
          if (merge && !acc.empty()) {
            acc.back().second = s.end;
          } else {
            acc.emplace_back(s.begin, s.end);
          }
          previous_match = s.is_match;
        }
        for (const auto& [b, e] : acc) push(b, e);
        return;
      }
      case Behavior::kMergedWithNext: {
        std::vector<Span> acc;
        bool previous_match = false;
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          if (it->is_match && !previous_match && !acc.empty()) {
            acc.back().first = it->begin;
          } else {
            acc.emplace_back(it->begin, it->end);
          }
          previous_match = it->is_match;
        }
        for (auto it = acc.rbegin(); it != acc.rend(); ++it) push(it->first, it->second);
        return;
      }
    }
  }

  std::unique_ptr<SpanMatcher> regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      regex_ = std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(kGpt2Pattern), Behavior::kIsolated, false);
  }
  void pre_tokenize(Pieces* p) const override {
    if (add_prefix_space_) {
      for (auto& v : p->views) {
        if (!v.empty() && v.front() != ' ') v = p->owned.emplace_back(" " + std::string(v));
      }
    }
    if (regex_) regex_->pre_tokenize(p);
  }
  void for_each_piece(std::string_view text, FunctionRef<void(std::string_view)> sink) const override {
    if (add_prefix_space_) {
      PreTokenizer::for_each_piece(text, sink);
    } else if (regex_) {
      regex_->for_each_piece(text, sink);
    } else {
      sink(text);  // DeepSeek's: the byte→alphabet mapping is left to the model (see the file comment)
    }
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> regex_;
};

// DeepSeek's Sequence[Split(1), Split(2), Split(3), ByteLevel(no prefix space, no regex)] (split_matchers.h):
// pre_tokenize goes through the general stages, for_each_piece (the encode path) through the fused scan.
class DeepSeekPreTokenizer : public PreTokenizer {
 public:
  explicit DeepSeekPreTokenizer(std::unique_ptr<PreTokenizer> general) : general_(std::move(general)) {}
  void pre_tokenize(Pieces* p) const override { general_->pre_tokenize(p); }
  void for_each_piece(std::string_view text, FunctionRef<void(std::string_view)> sink) const override {
    deepseek_pieces(text, sink);
  }
  bool byte_level() const override { return true; }

 private:
  std::unique_ptr<PreTokenizer> general_;
};

// True for exactly the pre_tokenizer object of DeepSeek's tokenizer.json files.
bool is_deepseek_sequence(const json& j) {
  if (!j.is_object() || j.value("type", json()) != "Sequence") return false;
  const json list = j.value("pretokenizers", json());
  if (!list.is_array() || list.size() != 4) return false;
  const std::string_view patterns[] = {kDeepSeekDigitsPattern, kDeepSeekCjkPattern, kDeepSeekWordPattern};
  for (size_t i = 0; i < 3; ++i) {
    const json& s = list[i];
    if (!s.is_object() || s.value("type", json()) != "Split" || s.value("behavior", json()) != "Isolated" ||
        s.value("invert", json(false)) != false || !s.contains("pattern") || !s["pattern"].is_object() ||
        s["pattern"].size() != 1 || s["pattern"].value("Regex", json()) != patterns[i])
      return false;
  }
  const json& b = list[3];
  return b.is_object() && b.value("type", json()) == "ByteLevel" && b.value("add_prefix_space", json(true)) == false &&
         b.value("use_regex", json(true)) == false;
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(Pieces* p) const override {
    for (const auto& s : parts_) s->pre_tokenize(p);
  }
  void for_each_piece(std::string_view text, FunctionRef<void(std::string_view)> sink) const override {
    stream(0, text, sink);
  }
  bool byte_level() const override {
    for (const auto& s : parts_)
      if (s->byte_level()) return true;
    return false;
  }

 private:
  void stream(size_t stage, std::string_view text, FunctionRef<void(std::string_view)> sink) const {
    if (stage == parts_.size()) {
      sink(text);
      return;
    }
    parts_[stage]->for_each_piece(text, [&](std::string_view piece) { stream(stage + 1, piece, sink); });
  }

  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

const json& field(const json& j, const char* name, const std::string& path) {
  DI_CHECK(j.is_object()) << "tokenizer.json: " << path << " must be an object";
  auto it = j.find(name);
  DI_CHECK(it != j.end()) << "tokenizer.json: " << path << "." << name << " is missing";
  return *it;
}

bool bool_field(const json& j, const char* name, const std::string& path, bool fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  DI_CHECK(it->is_boolean()) << "tokenizer.json: " << path << "." << name << " must be a boolean";
  return it->get<bool>();
}

Behavior parse_behavior(const json& j, const std::string& path) {
  DI_CHECK(j.is_string()) << "tokenizer.json: " << path << " must be a string";
  const std::string s = j.get<std::string>();
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  DI_FAIL(ErrorCode::kInvalidArgument) << "tokenizer.json: " << path << " \"" << s << "\" is not a split behavior";
}

}  // namespace

void PreTokenizer::for_each_piece(std::string_view text, FunctionRef<void(std::string_view)> sink) const {
  Pieces pieces;
  pieces.views.push_back(text);
  pre_tokenize(&pieces);
  for (std::string_view piece : pieces.views) sink(piece);
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const json& type_json = field(j, "type", path);
  DI_CHECK(type_json.is_string()) << "tokenizer.json: " << path << ".type must be a string";
  const std::string type = type_json.get<std::string>();
  if (type == "Sequence") {
    const json& list = field(j, "pretokenizers", path);
    DI_CHECK(list.is_array()) << "tokenizer.json: " << path << ".pretokenizers must be an array";
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string sub = path + ".pretokenizers[" + std::to_string(i) + "]";
      DI_CHECK_CODE(parts.empty() || !parts.back()->byte_level(), ErrorCode::kUnsupported)
          << "tokenizer.json: " << sub << " follows a ByteLevel pre-tokenizer (ByteLevel must come last)";
      auto p = parse_pre_tokenizer(list[i], sub);
      if (p) parts.push_back(std::move(p));
    }
    auto sequence = std::make_unique<SequencePreTokenizer>(std::move(parts));
    if (is_deepseek_sequence(j)) return std::make_unique<DeepSeekPreTokenizer>(std::move(sequence));
    return sequence;
  }
  if (type == "Split") {
    const json& pattern = field(j, "pattern", path);
    std::unique_ptr<SpanMatcher> regex;
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      const std::string source = pattern["Regex"].get<std::string>();
      regex = make_builtin_matcher(source);  // DeepSeek's patterns, without a regex engine
      if (!regex) regex = std::make_unique<Regex>(source);
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      regex = Regex::literal(pattern["String"].get<std::string>());
    } else {
      DI_FAIL(ErrorCode::kInvalidArgument)
          << "tokenizer.json: " << path << ".pattern must be {\"Regex\": ...} or {\"String\": ...}";
    }
    return std::make_unique<SplitPreTokenizer>(std::move(regex),
                                               parse_behavior(field(j, "behavior", path), path + ".behavior"),
                                               bool_field(j, "invert", path, false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(bool_field(j, "add_prefix_space", path, true),
                                                   bool_field(j, "use_regex", path, true));
  }
  if (type == "Whitespace") {
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(R"(\w+|[^\w\s]+)"), Behavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(R"(\s+)"), Behavior::kRemoved, false);
  }
  if (type == "Digits") {
    const bool individual = bool_field(j, "individual_digits", path, false);
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(R"(\p{N})"),
                                               individual ? Behavior::kIsolated : Behavior::kContiguous, false);
  }
  DI_FAIL(ErrorCode::kUnsupported) << "tokenizer.json: " << path << ".type \"" << type
                                   << "\" is not a supported pre-tokenizer";
}

}  // namespace deepinfer::tokenizer
