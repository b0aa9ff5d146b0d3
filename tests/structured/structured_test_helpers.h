// Helpers shared by the structured-output tests (header-only: the test CMake globs *_test.cc only).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/grammar_matcher.h"
#include "deepinfer/structured/vocabulary.h"

namespace deepinfer::structured::testing {

inline std::shared_ptr<const CompiledGrammar> compile(const Grammar& g) { return CompiledGrammar::compile(g); }

// Feeds `text` byte by byte from the start state; accepted iff every byte is allowed and the matcher may stop.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_terminate();
}

inline std::string shared_path(const std::string& rel) { return std::string(DEEPINFER_SHARED_DIR) + "/" + rel; }

inline bool file_exists(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr;
}

// gzip -dc through a pipe (the library does not link zlib).
inline std::vector<std::string> read_gzip_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::string cmd = "gzip -dc '" + path + "'";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return lines;
  std::string cur;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') {
        lines.push_back(std::move(cur));
        cur.clear();
      } else {
        cur += buf[i];
      }
    }
  }
  if (!cur.empty()) lines.push_back(std::move(cur));
  pclose(p);
  return lines;
}

// Removes whitespace outside string literals (the "compact" rendering of the maskbench harness).
inline std::string compact_json(const std::string& s) {
  std::string out;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      out += c;
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
      out += c;
    } else if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
      out += c;
    }
  }
  return out;
}

// DeepSeek-V3's vocabulary from ../shared (nullptr when absent).
inline std::shared_ptr<const TokenizerInfo> deepseek_v3_tokenizer() {
  static std::shared_ptr<const TokenizerInfo> info = [] {
    std::string path = shared_path("data/tokenizers/deepseek_v3/tokenizer.json");
    if (!file_exists(path)) return std::shared_ptr<const TokenizerInfo>();
    return std::make_shared<const TokenizerInfo>(load_hf_byte_level_vocabulary(path, "<｜end▁of▁sentence｜>"));
  }();
  return info;
}

// Brute force: is `token` allowed after the matcher's input? (copying the matcher's history by replay)
inline bool token_allowed_bruteforce(const std::shared_ptr<const CompiledGrammar>& g, const std::string& prefix,
                                     const std::string& token_bytes) {
  GrammarMatcher m(g);
  if (!m.accept_bytes(prefix)) return false;
  return m.accept_bytes(token_bytes);
}

}  // namespace deepinfer::structured::testing
