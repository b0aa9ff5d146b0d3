#include "deepinfer/tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/regex.h"
#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::json;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class FormNormalizer : public Normalizer {
 public:
  explicit FormNormalizer(UnicodeForm form) : form_(form) {}
  std::string normalize(std::string_view text) const override { return unicode_normalize(text, form_); }

 private:
  UnicodeForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return lowercase(text); }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return strip_accents(text); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override { return strip(text, left_, right_); }

 private:
  bool left_, right_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override {
    std::vector<Span> matches;
    regex_->find_all(text, &matches);
    if (matches.empty()) return std::string(text);
    std::string out;
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
      out.append(text.substr(prev, b - prev));
      out += content_;
      prev = e;
    }
    out.append(text.substr(prev));
    return out;
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return std::string();
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

const json& field(const json& j, const char* name, const std::string& path) {
  DI_CHECK(j.is_object()) << "tokenizer.json: " << path << " must be an object";
  auto it = j.find(name);
  DI_CHECK(it != j.end()) << "tokenizer.json: " << path << "." << name << " is missing";
  return *it;
}

std::string string_field(const json& j, const char* name, const std::string& path) {
  const json& v = field(j, name, path);
  DI_CHECK(v.is_string()) << "tokenizer.json: " << path << "." << name << " must be a string";
  return v.get<std::string>();
}

bool bool_field(const json& j, const char* name, const std::string& path, bool fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  DI_CHECK(it->is_boolean()) << "tokenizer.json: " << path << "." << name << " must be a boolean";
  return it->get<bool>();
}

const icu::Normalizer2* icu_normalizer(UnicodeForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case UnicodeForm::kNFC: n = icu::Normalizer2::getNFCInstance(status); break;
    case UnicodeForm::kNFD: n = icu::Normalizer2::getNFDInstance(status); break;
    case UnicodeForm::kNFKC: n = icu::Normalizer2::getNFKCInstance(status); break;
    case UnicodeForm::kNFKD: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  DI_CHECK_INTERNAL(U_SUCCESS(status) && n) << "ICU normalizer unavailable: " << u_errorName(status);
  return n;
}

}  // namespace

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString out = icu_normalizer(form)->normalize(in, status);
  DI_CHECK_INTERNAL(U_SUCCESS(status)) << "ICU normalize failed: " << u_errorName(status);
  std::string result;
  out.toUTF8String(result);
  return result;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t c = next_code_point(text, &pos);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      continue;
    }
    // One code point at a time, so ICU applies no context (Rust's char::to_lowercase has none either).
    UChar in[2];
    int32_t in_len = 0;
    U16_APPEND_UNSAFE(in, in_len, c);
    UChar lower[8];
    UErrorCode status = U_ZERO_ERROR;
    const int32_t n = u_strToLower(lower, 8, in, in_len, "", &status);
    DI_CHECK_INTERNAL(U_SUCCESS(status)) << "ICU lowercase failed: " << u_errorName(status);
    for (int32_t i = 0; i < n;) {
      UChar32 d;
      U16_NEXT_UNSAFE(lower, i, d);
      append_utf8(static_cast<char32_t>(d), &out);
    }
  }
  return out;
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = next_code_point(text, &pos);
    if (c >= 0x300 && (U_GET_GC_MASK(c) & U_GC_M_MASK)) continue;
    out.append(text.substr(start, pos - start));
  }
  return out;
}

std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end) {
      size_t pos = begin;
      const char32_t c = next_code_point(text, &pos);
      if (!u_isUWhiteSpace(c)) break;
      begin = pos;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t pos = start;
      const char32_t c = next_code_point(text, &pos);
      if (!u_isUWhiteSpace(c)) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = string_field(j, "type", path);
  if (type == "Sequence") {
    const json& list = field(j, "normalizers", path);
    DI_CHECK(list.is_array()) << "tokenizer.json: " << path << ".normalizers must be an array";
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = parse_normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]");
      if (n) parts.push_back(std::move(n));
    }
    if (parts.empty()) return nullptr;
    if (parts.size() == 1) return std::move(parts[0]);
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<FormNormalizer>(UnicodeForm::kNFC);
  if (type == "NFD") return std::make_unique<FormNormalizer>(UnicodeForm::kNFD);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(UnicodeForm::kNFKC);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(UnicodeForm::kNFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(bool_field(j, "strip_left", path, true),
                                             bool_field(j, "strip_right", path, true));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(string_field(j, "prepend", path));
  if (type == "Replace") {
    const json& pattern = field(j, "pattern", path);
    std::unique_ptr<Regex> regex;
    if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      regex = Regex::literal(pattern["String"].get<std::string>());
    } else if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = std::make_unique<Regex>(pattern["Regex"].get<std::string>());
    } else {
      DI_FAIL(ErrorCode::kInvalidArgument) << "tokenizer.json: " << path
                                           << ".pattern must be {\"String\": ...} or {\"Regex\": ...}";
    }
    return std::make_unique<ReplaceNormalizer>(std::move(regex), string_field(j, "content", path));
  }
  DI_FAIL(ErrorCode::kUnsupported) << "tokenizer.json: " << path << ".type \"" << type
                                   << "\" is not a supported normalizer";
}

}  // namespace deepinfer::tokenizer
