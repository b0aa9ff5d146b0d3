#include "deepinfer/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// Unicode White_Space, Oniguruma's \s (PCRE2's UCP \s adds U+180E MONGOLIAN VOWEL SEPARATOR).
constexpr std::string_view kWhiteSpaceRanges =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Per-thread match scratch: PCRE2 match data and a JIT stack big enough for long pieces (a 1 MB word).
struct Scratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  Scratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~Scratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

std::string Regex::translate_onig(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceRanges;
        } else {
          out += "[";
          out += kWhiteSpaceRanges;
          out += "]";
        }
      } else if (e == 'p' && i + 3 < p.size() && p[i + 1] == '{' && p[i + 3] == '}' &&
                 !unicode16_additions(p[i + 2]).empty()) {
        const std::string_view extra = unicode16_additions(p[i + 2]);
        if (!in_class) out += "[";
        out += "\\p{";
        out += p[i + 2];
        out += "}";
        out += extra;
        if (!in_class) out += "]";
        i += 3;
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceRanges;
        out += "]";
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  const std::string translated = translate_onig(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error, buffer, sizeof(buffer));
    DI_FAIL(ErrorCode::kInvalidArgument) << "invalid regex /" << pattern << "/ at offset " << offset << ": "
                                         << reinterpret_cast<const char*>(buffer);
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

std::unique_ptr<Regex> Regex::literal(std::string_view literal) {
  std::string quoted;
  for (size_t i = 0; i < literal.size();) {
    // Escape ASCII punctuation; other code points are copied whole.
    const auto c = static_cast<unsigned char>(literal[i]);
    if (c < 0x80 && !std::isalnum(c)) {
      if (c == '\n') {
        quoted += "\\n";
      } else if (c == '\r') {
        quoted += "\\r";
      } else if (c == '\t') {
        quoted += "\\t";
      } else if (c == ' ') {
        quoted += ' ';
      } else {
        quoted += "\\x{";
        constexpr char kHex[] = "0123456789abcdef";
        quoted += kHex[c >> 4];
        quoted += kHex[c & 15];
        quoted += "}";
      }
      ++i;
    } else {
      quoted += static_cast<char>(c);
      ++i;
    }
  }
  return std::make_unique<Regex>(quoted);
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

void Regex::find_all(std::string_view subject, std::vector<Span>* out) const {
  Scratch& s = scratch();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t start = 0;
  size_t last_match_end = SIZE_MAX;
  while (start <= n) {
    int rc = jit_ ? pcre2_jit_match(code_, data, n, start, PCRE2_NO_UTF_CHECK, s.data, s.context)
                  : pcre2_match(code_, data, n, start, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Very long pieces: the interpreter keeps its backtracking frames on the heap.
      rc = pcre2_match(code_, data, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR buffer[256];
      pcre2_get_error_message(rc, buffer, sizeof(buffer));
      DI_FAIL(ErrorCode::kInternal) << "regex /" << pattern_ << "/ failed: " << reinterpret_cast<const char*>(buffer);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t b = ov[0], e = ov[1];
    if (b == e && last_match_end == e) {
      // Oniguruma (via the Rust onig crate) skips an empty match that touches the previous match.
      if (start >= n) return;
      size_t next = start;
      next_code_point(subject, &next);
      start = next;
      continue;
    }
    out->emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
    last_match_end = e;
    start = e;
    if (b == e) {
      if (start >= n) return;
    }
  }
}

}  // namespace deepinfer::tokenizer
