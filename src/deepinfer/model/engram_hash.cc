#include "deepinfer/model/engram_hash.h"

#include <limits>
#include <set>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

// ---- NumPy's default_rng: SeedSequence -> PCG64 (XSL-RR 128/64) -> Lemire bounded integers.
// Constants and algorithms are those of numpy/random/bit_generator.pyx and pcg64.h.
class SeedSequence {
 public:
  explicit SeedSequence(uint64_t seed) {
    std::vector<uint32_t> entropy;
    do {
      entropy.push_back(static_cast<uint32_t>(seed));
      seed >>= 32;
    } while (seed != 0);
    uint32_t hash_const = kInitA;
    auto hashmix = [&](uint32_t value) {
      value ^= hash_const;
      hash_const *= kMultA;
      value *= hash_const;
      value ^= value >> kXShift;
      return value;
    };
    auto mix = [](uint32_t x, uint32_t y) {
      uint32_t r = kMixMultL * x - kMixMultR * y;
      return r ^ (r >> kXShift);
    };
    for (size_t i = 0; i < kPoolSize; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0u);
    for (size_t src = 0; src < kPoolSize; ++src)
      for (size_t dst = 0; dst < kPoolSize; ++dst)
        if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src]));
    for (size_t src = kPoolSize; src < entropy.size(); ++src)
      for (size_t dst = 0; dst < kPoolSize; ++dst) pool_[dst] = mix(pool_[dst], hashmix(entropy[src]));
  }

  // generate_state(n, uint64): 2n uint32 words, little-endian pairs.
  std::vector<uint64_t> generate_u64(size_t n) const {
    std::vector<uint32_t> words(2 * n);
    uint32_t hash_const = kInitB;
    for (size_t i = 0; i < words.size(); ++i) {
      uint32_t v = pool_[i % kPoolSize];
      v ^= hash_const;
      hash_const *= kMultB;
      v *= hash_const;
      v ^= v >> kXShift;
      words[i] = v;
    }
    std::vector<uint64_t> out(n);
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<uint64_t>(words[2 * i]) | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
    return out;
  }

 private:
  static constexpr size_t kPoolSize = 4;
  static constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
  static constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
  static constexpr int kXShift = 16;
  uint32_t pool_[kPoolSize];
};

class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed) {
    std::vector<uint64_t> s = SeedSequence(seed).generate_u64(4);
    const unsigned __int128 initstate = (static_cast<unsigned __int128>(s[0]) << 64) | s[1];
    const unsigned __int128 initseq = (static_cast<unsigned __int128>(s[2]) << 64) | s[3];
    state_ = 0;
    inc_ = (initseq << 1) | 1u;
    step();
    state_ += initstate;
    step();
  }

  uint64_t next64() {
    step();
    const uint64_t hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
    const unsigned rot = static_cast<unsigned>(hi >> 58);
    const uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
  }

  // Uniform integer in [0, rng] (inclusive) by Lemire's multiply-shift rejection, as NumPy for 64-bit ranges.
  uint64_t bounded(uint64_t rng) {
    if (rng == 0) return 0;
    if (rng == std::numeric_limits<uint64_t>::max()) return next64();
    const uint64_t rng_excl = rng + 1;
    unsigned __int128 m = static_cast<unsigned __int128>(next64()) * rng_excl;
    uint64_t leftover = static_cast<uint64_t>(m);
    if (leftover < rng_excl) {
      const uint64_t threshold = (0 - rng_excl) % rng_excl;
      while (leftover < threshold) {
        m = static_cast<unsigned __int128>(next64()) * rng_excl;
        leftover = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  void step() {
    const unsigned __int128 mult =
        (static_cast<unsigned __int128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;
    state_ = state_ * mult + inc_;
  }
  unsigned __int128 state_ = 0, inc_ = 0;
};

}  // namespace

std::vector<std::vector<int64_t>> engram_primes(const EngramConfig& e) {
  std::set<int64_t> seen;
  std::vector<std::vector<int64_t>> out;
  for (size_t l = 0; l < e.layer_ids.size(); ++l) {
    std::vector<int64_t> layer;
    for (int n = 0; n < e.max_ngram_size - 1; ++n) {
      int64_t current = e.vocab_size - 1;  // every n-gram size restarts the search; `seen` keeps them unique
      for (int h = 0; h < e.n_heads; ++h) {
        int64_t candidate = current + 1;
        while (!is_prime(candidate) || seen.count(candidate)) ++candidate;
        seen.insert(candidate);
        layer.push_back(current = candidate);
      }
    }
    out.push_back(std::move(layer));
  }
  return out;
}

std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab) {
  DI_CHECK(compressed_vocab > 0) << "engram: compressed vocabulary must be non-empty";
  const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab) / 2);
  Pcg64 rng(static_cast<uint64_t>(10007) * static_cast<uint64_t>(layer_id));
  std::vector<int64_t> out;
  for (int i = 0; i < max_ngram; ++i)
    out.push_back(2 * static_cast<int64_t>(rng.bounded(static_cast<uint64_t>(bound - 1))) + 1);
  return out;
}

EngramTables build_engram_tables(const EngramConfig& e, std::vector<int64_t> token_map) {
  DI_CHECK(e.enabled()) << "engram: no Engram layers in this config";
  EngramTables t;
  int64_t max_id = -1;
  for (int64_t v : token_map) max_id = std::max(max_id, v);
  t.compressed_vocab = max_id + 1;
  DI_CHECK(e.compressed_vocab_size == 0 || t.compressed_vocab == e.compressed_vocab_size)
      << "engram: the tokenizer-derived compressed vocabulary has " << t.compressed_vocab
      << " ids but engram_compressed_vocab_size is " << e.compressed_vocab_size
      << " (the hash multipliers would rehash the whole table)";
  DI_CHECK(e.pad_id >= 0 && e.pad_id < static_cast<int64_t>(token_map.size())) << "engram: pad id out of range";
  t.pad_id = token_map[e.pad_id];
  t.token_map = std::move(token_map);
  t.max_ngram = e.max_ngram_size;
  t.heads = e.n_heads;
  t.primes = engram_primes(e);
  for (size_t l = 0; l < e.layer_ids.size(); ++l) {
    t.multipliers.push_back(engram_multipliers(e.layer_ids[l], e.max_ngram_size, t.compressed_vocab));
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int64_t p : t.primes[l]) {
      offsets.push_back(total);
      total += p;
    }
    DI_CHECK(total <= e.num_embeddings[l]) << "engram: layer " << e.layer_ids[l] << " needs " << total
                                           << " table rows, the config has " << e.num_embeddings[l];
    t.offsets.push_back(std::move(offsets));
  }
  return t;
}

}  // namespace deepinfer
