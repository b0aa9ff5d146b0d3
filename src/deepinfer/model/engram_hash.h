// Engram n-gram hash layout of DeepSeek-V4.1 (MODELS.md §2.5): the tokenizer-derived compressed token map,
// per-layer hash multipliers (NumPy's default_rng, reproduced exactly), prime bucket sizes and per-layer
// row offsets. Built once per model; the per-sequence look-back lives in the sequence state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/model/model_config.h"

namespace deepinfer {

struct EngramTables {
  std::vector<int64_t> token_map;  // token id -> compressed id
  int64_t compressed_vocab = 0;    // number of compressed ids
  int64_t pad_id = 0;              // compressed id of engram_pad_id (fills blocked look-back)
  int max_ngram = 0;               // n: look-back of n-1 tokens, n-grams 2..n
  int heads = 0;
  // Per Engram layer (in engram.layer_ids order):
  std::vector<std::vector<int64_t>> multipliers;  // [n]
  std::vector<std::vector<int64_t>> primes;       // [(n-1)·heads], (n-gram, head) order
  std::vector<std::vector<int64_t>> offsets;      // [(n-1)·heads], cumulative prime sums within the layer
  int hash_cols() const { return (max_ngram - 1) * heads; }
};

// Prime bucket sizes: for each layer, n-gram size and head, the next prime above engram.vocab_size - 1 that
// no earlier (layer, n-gram, head) took.
std::vector<std::vector<int64_t>> engram_primes(const EngramConfig& e);

// The reference's multipliers: 2·rng.integers(0, (INT64_MAX // compressed_vocab) // 2, size=n) + 1 with
// rng = numpy.random.default_rng(10007·layer_id).
std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab);

// Tables for `config.engram` from a token map (validated against engram.compressed_vocab_size).
EngramTables build_engram_tables(const EngramConfig& e, std::vector<int64_t> token_map);

// The compressed token map from a tokenizer.json (see engram_token_map.cc for the normalisation).
std::vector<int64_t> engram_token_map_from_tokenizer(const std::string& tokenizer_json_path);

}  // namespace deepinfer
