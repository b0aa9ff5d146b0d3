#include "deepinfer/structured/vocabulary.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_map>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/grammar.h"

namespace deepinfer::structured {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids, std::vector<bool> special,
                       size_t size)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)), special_(std::move(special)) {
  size_ = std::max(size, bytes_.size());
  DI_CHECK(special_.empty() || special_.size() == bytes_.size())
      << "special flags: " << special_.size() << " entries for " << bytes_.size() << " tokens";
  for (int32_t id : eos_ids_)
    DI_CHECK(id >= 0 && static_cast<size_t>(id) < size_) << "eos id " << id << " out of range";
}

int slice_utf8_next(int state, uint8_t b) {
  switch (state) {
    case 0:
      if (b < 0x80) return b >= 0x20 && b != '"' && b != '\\' && b != 0x7F ? 0 : -1;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 2;
      if (b == 0xE2) return 8;
      if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return 3;
      if (b == 0xED) return 4;
      if (b == 0xF0) return 5;
      if (b >= 0xF1 && b <= 0xF3) return 6;
      if (b == 0xF4) return 7;
      return -1;
    case 1:  // one continuation byte left
      return b >= 0x80 && b <= 0xBF ? 0 : -1;
    case 2:  // after E0: no overlongs
      return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 3:
      return b >= 0x80 && b <= 0xBF ? 1 : -1;
    case 4:  // after ED: no surrogates
      return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 5:  // after F0: no overlongs
      return b >= 0x90 && b <= 0xBF ? 3 : -1;
    case 6:
      return b >= 0x80 && b <= 0xBF ? 3 : -1;
    case 7:  // after F4: nothing above U+10FFFF
      return b >= 0x80 && b <= 0x8F ? 3 : -1;
    case 8:  // after E2: E2 80 may lead to U+2028 / U+2029
      return b == 0x80 ? 9 : b >= 0x81 && b <= 0xBF ? 1 : -1;
    case 9:  // after E2 80: not U+2028 (A8) / U+2029 (A9), see vocabulary.h
      return b >= 0x80 && b <= 0xBF && b != 0xA8 && b != 0xA9 ? 0 : -1;
  }
  return -1;
}

TokenTrie::TokenTrie(const Vocabulary& vocab) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < vocab.num_bytes_tokens(); ++i) {
    int32_t id = static_cast<int32_t>(i);
    if (!vocab.is_special(id) && !vocab.token_bytes(id).empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const std::string& x = vocab.token_bytes(a);
    const std::string& y = vocab.token_bytes(b);
    return x != y ? x < y : a < b;
  });
  // Sorted order is the trie's pre-order: walk the tokens keeping the current root-to-node path.
  byte_.push_back(0);
  depth_.push_back(0);
  subtree_end_.push_back(0);
  std::vector<uint32_t> node_tokens_count(1, 0);
  std::vector<uint32_t> path{0};  // path[d] = node at depth d
  std::string_view prev;
  for (int32_t id : ids) {
    std::string_view cur = vocab.token_bytes(id);
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < cur.size() && prev[lcp] == cur[lcp]) ++lcp;
    while (path.size() > lcp + 1) {
      subtree_end_[path.back()] = static_cast<uint32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < cur.size(); ++d) {
      uint32_t node = static_cast<uint32_t>(byte_.size());
      byte_.push_back(static_cast<uint8_t>(cur[d]));
      depth_.push_back(static_cast<uint32_t>(d + 1));
      subtree_end_.push_back(0);
      node_tokens_count.push_back(0);
      path.push_back(node);
    }
    max_depth_ = std::max<uint32_t>(max_depth_, static_cast<uint32_t>(cur.size()));
    ++node_tokens_count[path.back()];
    tokens_.push_back(id);
    prev = cur;
  }
  while (!path.empty()) {
    subtree_end_[path.back()] = static_cast<uint32_t>(byte_.size());
    path.pop_back();
  }
  // Tokens were appended in node order, so offsets are a prefix sum.
  token_offset_.assign(byte_.size() + 1, 0);
  for (size_t i = 0; i < byte_.size(); ++i) token_offset_[i + 1] = token_offset_[i] + node_tokens_count[i];
  // Descendant byte sets, children before parents (reverse pre-order); a node's parent is the nearest earlier
  // node one level up.
  below_.assign(byte_.size() * 2, 0);
  std::vector<uint32_t> last_at_depth(max_depth_ + 1, 0);
  std::vector<uint32_t> parent(byte_.size(), 0);
  for (uint32_t i = 1; i < byte_.size(); ++i) {
    parent[i] = last_at_depth[depth_[i] - 1];
    last_at_depth[depth_[i]] = i;
  }
  for (uint32_t i = static_cast<uint32_t>(byte_.size()); i-- > 1;) {
    const uint32_t p = parent[i];
    const int bucket = byte_bucket(byte_[i]);
    below_[p * 2 + (bucket >> 6)] |= uint64_t{1} << (bucket & 63);
    below_[p * 2] |= below_[i * 2];
    below_[p * 2 + 1] |= below_[i * 2 + 1];
  }
  // Content slices: classify each token, then fold (min, max) characters up the tree; a subtree with any other
  // token gets max 0. Node 0 (the root) is never skipped by a walk, its value does not matter.
  const size_t n = byte_.size();
  slice_min_.assign(n, 255);
  slice_max_.assign(n, 0);
  std::vector<uint8_t> clean(n, 1);  // no non-slice token in the subtree
  mask_words_ = (vocab.size() + 63) / 64;
  std::vector<std::pair<int32_t, uint32_t>> slice_tokens;  // (id, chars)
  for (uint32_t i = 1; i < n; ++i) {
    for (const int32_t* t = tokens_begin(i); t != tokens_end(i); ++t) {
      const std::string& b = vocab.token_bytes(*t);
      int state = 0;
      uint32_t chars = 0;
      for (size_t k = 0; k < b.size() && state >= 0; ++k) {
        state = slice_utf8_next(state, static_cast<uint8_t>(b[k]));
        chars += state == 0;
      }
      if (state != 0 || chars > 255) {
        clean[i] = 0;
        continue;
      }
      slice_tokens.emplace_back(*t, chars);
      max_slice_chars_ = std::max(max_slice_chars_, chars);
      slice_min_[i] = std::min<uint8_t>(slice_min_[i], static_cast<uint8_t>(chars));
      slice_max_[i] = std::max<uint8_t>(slice_max_[i], static_cast<uint8_t>(chars));
    }
  }
  for (uint32_t i = static_cast<uint32_t>(n); i-- > 1;) {
    const uint32_t p = parent[i];
    if (p == 0) continue;
    clean[p] &= clean[i];
    slice_min_[p] = std::min(slice_min_[p], slice_min_[i]);
    slice_max_[p] = std::max(slice_max_[p], slice_max_[i]);
  }
  for (uint32_t i = 0; i < n; ++i)
    if (!clean[i]) slice_max_[i] = 0;
  slice_masks_.assign(static_cast<size_t>(max_slice_chars_ + 1) * mask_words_, 0);
  for (const auto& [id, chars] : slice_tokens)
    slice_masks_[chars * mask_words_ + (static_cast<size_t>(id) >> 6)] |= uint64_t{1} << (id & 63);
  for (uint32_t L = 1; L <= max_slice_chars_; ++L)
    for (size_t w = 0; w < mask_words_; ++w)
      slice_masks_[L * mask_words_ + w] |= slice_masks_[(L - 1) * mask_words_ + w];
  // Residual trie: drop every subtree of slice tokens of at most T characters (the same test as walk_trie's skip
  // for S = T, D unlimited); subtree ends are filled when the pre-order path unwinds.
  const uint32_t T = residual_slice_chars();
  DI_CHECK_INTERNAL(max_depth_ < 65536) << "token of " << max_depth_ << " bytes";
  std::vector<uint32_t> rpath;  // residual indices of the current root-to-node path
  for (uint32_t i = 0; i < n;) {
    if (i > 0 && slice_max_[i] != 0 && slice_max_[i] <= T) {
      i = subtree_end_[i];
      continue;
    }
    while (!rpath.empty() && depth_[residual_[rpath.back()].node] >= depth_[i]) {
      residual_[rpath.back()].subtree_end = static_cast<uint32_t>(residual_.size());
      rpath.pop_back();
    }
    rpath.push_back(static_cast<uint32_t>(residual_.size()));
    residual_.push_back(ResidualNode{i, 0, static_cast<uint16_t>(depth_[i]), byte_[i]});
    ++i;
  }
  for (uint32_t r : rpath) residual_[r].subtree_end = static_cast<uint32_t>(residual_.size());
}

namespace {

// GPT-2's reversible byte <-> printable code point table used by byte-level BPE vocabularies.
std::unordered_map<uint32_t, uint8_t> byte_level_decoder() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<uint32_t> cs(bs.begin(), bs.end());
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  std::unordered_map<uint32_t, uint8_t> out;
  for (size_t i = 0; i < bs.size(); ++i) out[cs[i]] = static_cast<uint8_t>(bs[i]);
  return out;
}

bool decode_utf8(std::string_view s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return true;
}

}  // namespace

Vocabulary load_hf_byte_level_vocabulary(const std::string& path, std::string_view eos_token) {
  std::ifstream in(path);
  DI_CHECK_CODE(in.good(), ErrorCode::kNotFound) << "cannot open tokenizer file " << path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DI_FAIL(ErrorCode::kInvalidArgument) << path << ": not valid JSON (" << e.what() << ")";
  }
  const auto& vocab = j.at("model").at("vocab");
  static const auto decoder = byte_level_decoder();
  size_t n = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) n = std::max<size_t>(n, it.value().get<size_t>() + 1);
  for (const auto& t : j.value("added_tokens", nlohmann::json::array()))
    n = std::max<size_t>(n, t.at("id").get<size_t>() + 1);
  std::vector<std::string> bytes(n);
  std::vector<bool> special(n, true);  // ids that no entry defines are never produced by a grammar
  std::vector<uint32_t> cps;
  std::vector<bool> added(n, false);  // added tokens may also sit in model.vocab, spelled as plain text
  for (const auto& t : j.value("added_tokens", nlohmann::json::array())) added[t.at("id").get<size_t>()] = true;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    size_t id = it.value().get<size_t>();
    if (added[id]) continue;
    DI_CHECK(decode_utf8(it.key(), cps)) << "token " << id << " is not valid UTF-8 in " << path;
    std::string b;
    for (uint32_t cp : cps) {
      auto d = decoder.find(cp);
      DI_CHECK(d != decoder.end()) << "token " << id << " is not a byte-level token string";
      b += static_cast<char>(d->second);
    }
    bytes[id] = std::move(b);
    special[id] = false;
  }
  int32_t eos = -1;
  for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
    size_t id = t.at("id").get<size_t>();
    const std::string content = t.at("content").get<std::string>();
    bool is_special = t.value("special", false);
    bytes[id] = is_special ? std::string() : content;
    special[id] = is_special;
    if (content == eos_token) eos = static_cast<int32_t>(id);
  }
  DI_CHECK_CODE(eos >= 0, ErrorCode::kNotFound) << "EOS token '" << eos_token << "' not found in " << path;
  return Vocabulary(std::move(bytes), {eos}, std::move(special));
}

}  // namespace deepinfer::structured
