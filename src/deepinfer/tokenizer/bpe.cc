// Byte-pair encoding, a port of HF tokenizers' `Word::merge_all`: a heap of candidate merges ordered by
// (rank, position); an entry is stale when the pair at its position no longer produces its new id. We keep
// that exact rule (not the textbook "rescan for the lowest rank") because the two differ when two different
// pairs merge into the same token.
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

// Open-addressing map (left id, right id) → (rank, new id). Lookups dominate encode time.
class MergeMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t new_id;
  };

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{0, -1});
    mask_ = cap - 1;
  }
  // Later merges of the same pair overwrite earlier ones, like HF's HashMap collect.
  void insert(int32_t a, int32_t b, Value v) {
    const uint64_t key = pack(a, b);
    size_t i = hash(key) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    keys_[i] = key;
    values_[i] = v;
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    size_t i = hash(key) & mask_;
    while (true) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
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
  void merge_short(std::vector<int32_t>* ids) const;
  void encode_cached(std::string_view piece, bool byte_level, WordCache& cache, std::vector<int32_t>* out) const;
  void encode_uncached(std::string_view piece, bool byte_level, std::vector<int32_t>* out) const;
  WordCache& cache(bool byte_level) const;

  // Identifies this model's word caches among the thread's (never reused, unlike the object's address).
  const uint64_t cache_owner_ = next_cache_owner_.fetch_add(1) * 2;
  static inline std::atomic<uint64_t> next_cache_owner_{1};

  std::vector<std::string> id_to_token_;
  std::vector<bool> present_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  MergeMap merges_;
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
  merges_.reserve(merges.size());
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
    merges_.insert(ida, idb, {static_cast<uint32_t>(i), merged});
    if (!produced.insert(merged).second) unique_merge_results_ = false;
  }
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
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = merges_.find(sym[i].id, sym[i + 1].id)) queue.push({m->rank, i, m->new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (cur.removed || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[next_pos];
    const auto* m = merges_.find(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = right.next;
    sym[next_pos].removed = true;
    if (right.next >= 0 && right.next < n) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = merges_.find(sym[cur.prev].id, cur.id)) queue.push({pm->rank, cur.prev, pm->new_id});
    }
    if (cur.next >= 0 && cur.next < n) {
      if (const auto* nm = merges_.find(cur.id, sym[cur.next].id)) queue.push({nm->rank, top.pos, nm->new_id});
    }
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
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  initial_symbols(piece, byte_level, &symbols);
  if (unique_merge_results_ && symbols.size() <= kShortWord) {
    thread_local std::vector<int32_t> ids;
    ids.clear();
    for (const Symbol& s : symbols) ids.push_back(s.id);
    merge_short(&ids);
    out->insert(out->end(), ids.begin(), ids.end());
    return;
  }
  merge_all(&symbols);
  for (const Symbol& s : symbols) {
    if (!s.removed) out->push_back(s.id);
  }
}

void Bpe::merge_short(std::vector<int32_t>* ids_ptr) const {
  std::vector<int32_t>& ids = *ids_ptr;
  constexpr uint32_t kNone = UINT32_MAX;
  // rank[i] / result[i]: the merge of (ids[i], ids[i+1]), kept in step with ids.
  uint32_t rank[kShortWord];
  int32_t result[kShortWord];
  auto lookup = [&](size_t i) {
    const auto* m = merges_.find(ids[i], ids[i + 1]);
    rank[i] = m ? m->rank : kNone;
    result[i] = m ? m->new_id : -1;
  };
  size_t n = ids.size();
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNone) break;
    ids[best] = result[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    --n;
    ids.resize(n);
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
}

}  // namespace

std::unique_ptr<Model> make_bpe(const json& j) { return std::make_unique<Bpe>(j); }

}  // namespace deepinfer::tokenizer
