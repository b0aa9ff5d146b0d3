// A bounded cache of BPE results per piece (piece bytes → ids), one per thread and model, so lookups need no
// lock. Natural text repeats a small set of words, so most pieces skip the merge loop entirely.
//
// Open addressing over 32-byte slots: a key of up to 16 bytes and up to 3 ids sit in the slot itself, so a hit
// touches one cache line; longer keys and id lists go to arenas. The table starts small and doubles (so short
// inputs cost little memory); when it holds kMaxEntries words it is emptied and refilled (cheaper than LRU
// bookkeeping, and the hot words come back at once). kMaxEntries is sized for large corpora: a 21 MB mixed corpus
// has ~132k distinct pieces, and a table that must be emptied within one pass re-runs BPE on its hot words. In front of
// it, a small direct-mapped table (256 KB, about L2-sized) keeps the most recently used short words: word frequencies
// are Zipf-like, so most lookups end there instead of in the 4 MB table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tokenizer {

class WordCache {
 public:
  static constexpr size_t kMaxKeyBytes = 64;              // longer pieces are rare and not cached
  static constexpr size_t kMaxEntries = size_t{1} << 18;  // 16 MB of slots at most

  WordCache() : slots_(kInitialSlots), hot_(kHotSlots), mask_(kInitialSlots - 1) {}

  // The key as two words (for keys of <= 16 bytes: together with the length, they identify it) and a hash.
  struct Key {
    std::string_view bytes;
    uint64_t w0 = 0, w1 = 0, hash = 0;
    explicit Key(std::string_view s) : bytes(s) {
      const size_t n = s.size();
      const char* p = s.data();
      if (n >= 8) {
        // First and last 8 bytes (overlapping when n < 16): unique for a given length up to 16.
        std::memcpy(&w0, p, 8);
        std::memcpy(&w1, p + n - 8, 8);
      } else if (n >= 4) {
        uint32_t a, b;
        std::memcpy(&a, p, 4);
        std::memcpy(&b, p + n - 4, 4);
        w0 = (uint64_t{b} << 32) | a;
      } else {
        for (size_t i = 0; i < n; ++i) w0 |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
      }
      uint64_t h = head_hash(w0, w1, n);
      if (n > 16) {
        for (size_t i = 8; i + 8 <= n - 8; i += 8) {  // the middle, for long keys
          uint64_t w;
          std::memcpy(&w, p + i, 8);
          h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        }
      }
      hash = h ^ (h >> 31);
    }
  };

  static uint64_t head_hash(uint64_t w0, uint64_t w1, size_t n) {
    uint64_t h = (w0 ^ (uint64_t{n} << 56)) * 0x9E3779B97F4A7C15ULL;
    return h ^ (w1 + (h >> 29)) * 0xC2B2AE3D27D4EB4FULL;
  }
  static uint64_t short_hash(uint64_t w0, uint64_t w1, size_t n) {
    const uint64_t h = head_hash(w0, w1, n);
    return h ^ (h >> 31);
  }

  // Appends the cached ids of `key` to *out and returns true, or returns false.
  bool find(const Key& key, std::vector<int32_t>* out) {
    const size_t n = key.bytes.size();
    Slot& hot = hot_[(key.hash >> 40) & (kHotSlots - 1)];
    if (hot.key_len == n && hot.k0 == key.w0 && hot.k1 == key.w1) {
      out->insert(out->end(), hot.ids, hot.ids + hot.n_ids);
      return true;
    }
    for (size_t i = key.hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key_len == 0) return false;
      if (s.key_len != n) continue;
      const bool equal = n <= 16 ? s.k0 == key.w0 && s.k1 == key.w1
                                 : s.k1 == key.hash && std::memcmp(long_keys_.data() + s.k0, key.bytes.data(), n) == 0;
      if (!equal) continue;
      if (s.n_ids <= 3) {
        out->insert(out->end(), s.ids, s.ids + s.n_ids);
        if (n <= 16) hot = s;
      } else {
        const int32_t* ids = long_ids_.data() + s.ids[0];
        out->insert(out->end(), ids, ids + s.n_ids);
      }
      return true;
    }
  }

  void insert(const Key& key, std::span<const int32_t> ids) {
    const size_t n = key.bytes.size();
    if (n == 0 || n > kMaxKeyBytes || ids.size() > 255) return;
    if (entries_ == kMaxEntries) {
      clear();
    } else if (2 * (entries_ + 1) > slots_.size()) {
      grow();
    }
    Slot& s = slots_[free_slot(key.hash)];
    s.key_len = static_cast<uint8_t>(n);
    if (n <= 16) {
      s.k0 = key.w0;
      s.k1 = key.w1;
    } else {
      s.k0 = long_keys_.size();
      s.k1 = key.hash;
      long_keys_.append(key.bytes);
    }
    s.n_ids = static_cast<uint8_t>(ids.size());
    if (ids.size() <= 3) {
      std::copy(ids.begin(), ids.end(), s.ids);
      if (n <= 16) hot_[(key.hash >> 40) & (kHotSlots - 1)] = s;
    } else {
      s.ids[0] = static_cast<int32_t>(long_ids_.size());
      long_ids_.insert(long_ids_.end(), ids.begin(), ids.end());
    }
    ++entries_;
  }

 private:
  static constexpr size_t kMaxSlots = kMaxEntries * 2;  // load factor <= 1/2
  static constexpr size_t kInitialSlots = size_t{1} << 12;
  static constexpr size_t kHotSlots = 8192;  // only short keys with <= 3 ids, always inline
  struct alignas(32) Slot {
    uint64_t k0 = 0, k1 = 0;  // short key: its words; long key: arena offset and hash
    uint8_t key_len = 0;      // 0: empty slot
    uint8_t n_ids = 0;
    int32_t ids[3] = {};  // n_ids > 3: ids[0] is the offset in long_ids_
  };
  static_assert(sizeof(Slot) == 32);

  size_t free_slot(uint64_t hash) const {
    size_t i = hash & mask_;
    while (slots_[i].key_len != 0) i = (i + 1) & mask_;
    return i;
  }

  // Doubles the table; the slots keep their arena offsets, and long keys keep their hash in k1. Short keys are
  // rehashed from their words, which is why the hash of a short key depends only on (w0, w1, length).
  void grow() {
    std::vector<Slot> old(std::min(slots_.size() * 2, kMaxSlots));
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.key_len == 0) continue;
      slots_[free_slot(s.key_len <= 16 ? short_hash(s.k0, s.k1, s.key_len) : s.k1)] = s;
    }
  }

  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});  // keeps the grown size: the workload refills it
    std::fill(hot_.begin(), hot_.end(), Slot{});
    long_keys_.clear();
    long_ids_.clear();
    entries_ = 0;
  }

  std::vector<Slot> slots_;
  std::vector<Slot> hot_;
  size_t mask_;
  std::string long_keys_;
  std::vector<int32_t> long_ids_;
  size_t entries_ = 0;
};

}  // namespace deepinfer::tokenizer
