// Byte-pair encoding, a port of HF tokenizers' `Word::merge_all`: a heap of candidate merges ordered by
// (rank, position); an entry is stale when the pair at its position no longer produces its new id. We keep
// that exact rule (not the textbook "rescan for the lowest rank") because the two differ when two different
// pairs merge into the same token.
#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/byte_level.h"
#include "deepinfer/tokenizer/model.h"
#include "deepinfer/tokenizer/utf8.h"
#include "deepinfer/tokenizer/word_cache.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::json;

// Open-addressing map (left id, right id) → merge value, one 8-byte word per entry so that a lookup costs one
// cache miss (encode time on first-seen words is dominated by these lookups): left id, right id and value
// packed as 21 + 21 + 22 bits. The value is the merge's priority (lower merges first) from which Bpe derives
// the new id (see Bpe::merge_value_is_id_).
class MergeMap {
 public:
  static constexpr int kIdBits = 21;
  static constexpr int kValueBits = 22;
  static constexpr uint32_t kMaxId = (uint32_t{1} << kIdBits) - 2;  // all-ones ids mark an empty entry
  static constexpr uint32_t kMaxValue = (uint32_t{1} << kValueBits) - 1;
  static constexpr uint32_t kNone = UINT32_MAX;

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    entries_.assign(cap, kEmpty);
    mask_ = cap - 1;
  }
  // Later merges of the same pair overwrite earlier ones, like HF's HashMap collect.
  void insert(int32_t a, int32_t b, uint32_t value) {
    const uint64_t key = pack(a, b);
    size_t i = hash(key) & mask_;
    while (entries_[i] != kEmpty && (entries_[i] >> kValueBits) != key) i = (i + 1) & mask_;
    entries_[i] = (key << kValueBits) | value;
  }
  // The value of the merge (a, b), or kNone.
  uint32_t find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const uint64_t e = entries_[i];
      if ((e >> kValueBits) == key) return static_cast<uint32_t>(e & kMaxValue);
      if (e == kEmpty) return kNone;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << kIdBits) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ULL;
    return static_cast<size_t>(k ^ (k >> 29));
  }
  std::vector<uint64_t> entries_;
  size_t mask_ = 0;
};

class Bpe : public Model {
 public:
  static constexpr size_t kShortWord = 64;
  explicit Bpe(const json& j);

  void encode(std::string_view piece, bool byte_level, std::vector<int32_t>* out) const override {
    encode_cached(piece, byte_level, cache(byte_level), out);
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    auto it = token_to_id_.find(std::string(token));
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    if (id < 0 || id >= vocab_size() || !present_[id]) return nullptr;
    return &id_to_token_[id];
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t num_tokens() const override { return static_cast<int32_t>(token_to_id_.size()); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool removed;
  };
  void initial_symbols(std::string_view piece, bool byte_level, std::vector<Symbol>* symbols) const;
  void merge_all(std::vector<Symbol>* symbols) const;
  void encode_cached(std::string_view piece, bool byte_level, WordCache& cache, std::vector<int32_t>* out) const;
  // Merges ids[0, n) in place (unique_merge_results_ only); returns the new count.
  size_t merge_short(int32_t* ids, size_t n) const;
  // The id a merge with this MergeMap value produces.
  int32_t merged_id(uint32_t value) const {
    return merge_value_is_id_ ? static_cast<int32_t>(value) : merge_result_[value];
  }
  void encode_uncached(std::string_view piece, bool byte_level, std::vector<int32_t>* out) const;
  WordCache& cache(bool byte_level) const;

  // Identifies this model's word caches among the thread's (never reused, unlike the object's address).
  const uint64_t cache_owner_ = next_cache_owner_.fetch_add(1) * 2;
  static inline std::atomic<uint64_t> next_cache_owner_{1};

  std::vector<std::string> id_to_token_;
  std::vector<bool> present_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  MergeMap merges_;
  // Values in merges_: the new id itself when the new ids grow with the rank (then comparing ids orders merges
  // like comparing ranks, and a lookup needs no second load; true for DeepSeek's files), else the rank, with
  // merge_result_[rank] the new id.
  bool merge_value_is_id_ = true;
  std::vector<int32_t> merge_result_;
  bool all_bytes_present_ = false;       // byte level: every byte has an alphabet token (no unk handling needed)
  std::array<int32_t, 256> byte_ids_{};  // id of each byte's alphabet token, -1 if absent
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // True when no two merges produce the same token. Then HF's heap order equals "merge the lowest-rank
  // adjacent pair, leftmost first", which is cheaper for short words (merge_short).
  bool unique_merge_results_ = true;
};

std::string optional_string(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  DI_CHECK(it->is_string()) << "tokenizer.json: model." << name << " must be a string or null";
  return it->get<std::string>();
}

bool optional_bool(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return false;
  DI_CHECK(it->is_boolean()) << "tokenizer.json: model." << name << " must be a boolean";
  return it->get<bool>();
}

Bpe::Bpe(const json& j) {
  DI_CHECK(j.contains("vocab")) << "tokenizer.json: model.vocab is missing";
  DI_CHECK(j.contains("merges")) << "tokenizer.json: model.merges is missing";
  id_to_token_ = parse_vocab(j["vocab"], "model.vocab");
  present_.assign(id_to_token_.size(), false);
  token_to_id_.reserve(id_to_token_.size());
  for (auto it = j["vocab"].begin(); it != j["vocab"].end(); ++it) {
    const auto id = it.value().get<int32_t>();
    present_[id] = true;
    token_to_id_.emplace(it.key(), id);
  }
  DI_CHECK_CODE(optional_string(j, "continuing_subword_prefix").empty(), ErrorCode::kUnsupported)
      << "tokenizer.json: model.continuing_subword_prefix is not supported";
  DI_CHECK_CODE(optional_string(j, "end_of_word_suffix").empty(), ErrorCode::kUnsupported)
      << "tokenizer.json: model.end_of_word_suffix is not supported";
  if (j.contains("dropout") && !j["dropout"].is_null()) {
    DI_CHECK(j["dropout"].is_number()) << "tokenizer.json: model.dropout must be a number or null";
    DI_CHECK_CODE(j["dropout"].get<double>() == 0.0, ErrorCode::kUnsupported)
        << "tokenizer.json: model.dropout (random merges) is not supported for inference";
  }
  fuse_unk_ = optional_bool(j, "fuse_unk");
  byte_fallback_ = optional_bool(j, "byte_fallback");
  ignore_merges_ = optional_bool(j, "ignore_merges");
  const std::string unk = optional_string(j, "unk_token");
  if (!unk.empty()) {
    auto it = token_to_id_.find(unk);
    DI_CHECK(it != token_to_id_.end()) << "tokenizer.json: model.unk_token \"" << unk << "\" is not in model.vocab";
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(byte_to_char(static_cast<uint8_t>(b)), &s);
    auto it = token_to_id_.find(s);
    byte_ids_[b] = it == token_to_id_.end() ? -1 : it->second;
  }

  const json& merges = j["merges"];
  DI_CHECK(merges.is_array()) << "tokenizer.json: model.merges must be an array";
  DI_CHECK_CODE(merges.size() <= MergeMap::kMaxValue, ErrorCode::kUnsupported)
      << "tokenizer.json: model.merges has " << merges.size() << " entries; at most " << MergeMap::kMaxValue
      << " are supported";
  DI_CHECK_CODE(id_to_token_.size() <= MergeMap::kMaxId, ErrorCode::kUnsupported)
      << "tokenizer.json: model.vocab ids must be below " << MergeMap::kMaxId;
  struct Merge {
    int32_t a, b, merged;
  };
  std::vector<Merge> parsed;
  parsed.reserve(merges.size());
  std::unordered_set<int32_t> produced;
  auto lookup = [&](const std::string& token, size_t i) {
    auto it = token_to_id_.find(token);
    DI_CHECK(it != token_to_id_.end()) << "tokenizer.json: model.merges[" << i << "]: token \"" << token
                                       << "\" is not in model.vocab";
    return it->second;
  };
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      // "a b": the separator is the first space (tokens never contain a raw space in byte-level vocabs).
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      DI_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos)
          << "tokenizer.json: model.merges[" << i << "] = \"" << s << "\" must be two tokens separated by a space";
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      DI_FAIL(ErrorCode::kInvalidArgument)
          << "tokenizer.json: model.merges[" << i << "] must be \"a b\" or [\"a\", \"b\"], got " << m.dump();
    }
    const int32_t ida = lookup(a, i);
    const int32_t idb = lookup(b, i);
    const int32_t merged = lookup(a + b, i);
    if (!produced.insert(merged).second) unique_merge_results_ = false;
    if (!parsed.empty() && merged <= parsed.back().merged) merge_value_is_id_ = false;
    parsed.push_back({ida, idb, merged});
  }
  merges_.reserve(parsed.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    const Merge& m = parsed[i];
    merges_.insert(m.a, m.b, merge_value_is_id_ ? static_cast<uint32_t>(m.merged) : static_cast<uint32_t>(i));
    if (!merge_value_is_id_) merge_result_.push_back(m.merged);
  }
  all_bytes_present_ = std::all_of(byte_ids_.begin(), byte_ids_.end(), [](int32_t id) { return id >= 0; });
}

void Bpe::initial_symbols(std::string_view piece, bool byte_level, std::vector<Symbol>* symbols) const {
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols->size());
    symbols->push_back({id, n - 1, n + 1, false});
  };
  if (byte_level) {
    for (unsigned char b : piece) {
      if (byte_ids_[b] >= 0) {
        push(byte_ids_[b]);
      } else if (unk_id_ >= 0 && !(fuse_unk_ && !symbols->empty() && symbols->back().id == unk_id_)) {
        push(unk_id_);
      }
      // No unk token: HF silently drops the byte.
    }
  } else {
    size_t pos = 0;
    while (pos < piece.size()) {
      const size_t start = pos;
      next_code_point(piece, &pos);
      const std::string ch(piece.substr(start, pos - start));
      auto it = token_to_id_.find(ch);
      if (it != token_to_id_.end()) {
        push(it->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        std::vector<int32_t> ids;
        for (unsigned char b : ch) {
          char name[8];
          std::snprintf(name, sizeof(name), "<0x%02X>", b);
          auto bt = token_to_id_.find(name);
          if (bt == token_to_id_.end()) {
            all = false;
            break;
          }
          ids.push_back(bt->second);
        }
        if (all) {
          for (int32_t id : ids) push(id);
          continue;
        }
      }
      if (unk_id_ >= 0 && !(fuse_unk_ && !symbols->empty() && symbols->back().id == unk_id_)) push(unk_id_);
    }
  }
  if (!symbols->empty()) symbols->back().next = -1;
}

void Bpe::merge_all(std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& sym = *symbols_ptr;
  const auto n = static_cast<int32_t>(sym.size());
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    // priority_queue pops the "largest": make that the lowest rank, then the lowest position.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> storage;
  storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(storage));
  // `rank` holds the MergeMap value: it orders merges like the rank does.
  auto push = [&](int32_t pos, int32_t left, int32_t right) {
    const uint32_t v = merges_.find(left, right);
    if (v != MergeMap::kNone) queue.push({v, pos, merged_id(v)});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, sym[i].id, sym[i + 1].id);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (cur.removed || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[next_pos];
    const uint32_t v = merges_.find(cur.id, right.id);
    if (v == MergeMap::kNone || merged_id(v) != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = right.next;
    sym[next_pos].removed = true;
    if (right.next >= 0 && right.next < n) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, sym[cur.prev].id, cur.id);
    if (cur.next >= 0 && cur.next < n) push(top.pos, cur.id, sym[cur.next].id);
  }
}

// Each thread keeps the caches of the last few models it used; a thread that alternates between more models
// than that only loses cache hits.
WordCache& Bpe::cache(bool byte_level) const {
  struct Entry {
    uint64_t owner = 0;
    std::unique_ptr<WordCache> cache;
  };
  constexpr size_t kPerThread = 4;
  thread_local std::array<Entry, kPerThread> entries;
  thread_local size_t next_victim = 0;
  thread_local Entry* last = nullptr;
  const uint64_t owner = cache_owner_ + (byte_level ? 1 : 0);
  if (last && last->owner == owner) return *last->cache;
  for (Entry& e : entries) {
    if (e.owner == owner) {
      last = &e;
      return *e.cache;
    }
  }
  Entry& e = entries[next_victim++ % kPerThread];
  e.owner = owner;
  e.cache = std::make_unique<WordCache>();
  last = &e;
  return *e.cache;
}

void Bpe::encode_cached(std::string_view piece, bool byte_level, WordCache& cache, std::vector<int32_t>* out) const {
  // Single byte pieces are frequent (spaces, punctuation) and need no merge.
  if (byte_level && piece.size() == 1 && byte_ids_[static_cast<unsigned char>(piece[0])] >= 0) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.empty() || piece.size() > WordCache::kMaxKeyBytes) {
    encode_uncached(piece, byte_level, out);
    return;
  }
  const WordCache::Key key(piece);
  if (cache.find(key, out)) return;
  const size_t before = out->size();
  encode_uncached(piece, byte_level, out);
  cache.insert(key, std::span<const int32_t>(out->data() + before, out->size() - before));
}

void Bpe::encode_uncached(std::string_view piece, bool byte_level, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = token_to_id_.find(byte_level ? bytes_to_alphabet(piece) : std::string(piece));
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (unique_merge_results_ && byte_level && all_bytes_present_ && piece.size() <= kShortWord) {
    int32_t ids[kShortWord];
    for (size_t i = 0; i < piece.size(); ++i) ids[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    const size_t n = merge_short(ids, piece.size());
    out->insert(out->end(), ids, ids + n);
    return;
  }
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  initial_symbols(piece, byte_level, &symbols);
  if (unique_merge_results_ && symbols.size() <= kShortWord) {
    int32_t ids[kShortWord];
    for (size_t i = 0; i < symbols.size(); ++i) ids[i] = symbols[i].id;
    const size_t n = merge_short(ids, symbols.size());
    out->insert(out->end(), ids, ids + n);
    return;
  }
  merge_all(&symbols);
  for (const Symbol& s : symbols) {
    if (!s.removed) out->push_back(s.id);
  }
}

size_t Bpe::merge_short(int32_t* ids, size_t n) const {
  // value[i]: the MergeMap value of (ids[i], ids[i+1]), kept in step with ids; the lowest merges first.
  uint32_t value[kShortWord];
  for (size_t i = 0; i + 1 < n; ++i) value[i] = merges_.find(ids[i], ids[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (value[i] < value[best]) best = i;
    if (value[best] == MergeMap::kNone) break;
    ids[best] = merged_id(value[best]);
    --n;
    for (size_t i = best + 1; i < n; ++i) {
      ids[i] = ids[i + 1];
      value[i] = value[i + 1];
    }
    if (best > 0) value[best - 1] = merges_.find(ids[best - 1], ids[best]);
    if (best + 1 < n) value[best] = merges_.find(ids[best], ids[best + 1]);
  }
  return n;
}

}  // namespace

std::unique_ptr<Model> make_bpe(const json& j) { return std::make_unique<Bpe>(j); }

}  // namespace deepinfer::tokenizer
