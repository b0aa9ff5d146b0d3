// The tokenization model of tokenizer.json ("model" field): turns one pre-tokenized piece into ids.
// BPE (DeepSeek) and WordLevel (the synthetic golden tokenizers) are supported.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tokenizer {

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of `piece`. With `byte_level`, the piece holds raw bytes that the vocabulary spells in
  // the byte-level alphabet (see byte_level.h). Thread-safe.
  virtual void encode(std::string_view piece, bool byte_level, std::vector<int32_t>* out) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  // nullptr when no token has this id.
  virtual const std::string* id_to_token(int32_t id) const = 0;
  // One past the largest id.
  virtual int32_t vocab_size() const = 0;
  // Number of tokens (HF's Model::get_vocab_size; differs from vocab_size() when ids have gaps).
  virtual int32_t num_tokens() const = 0;
};

// Parses the "model" object; errors name the offending field (e.g. "model.merges[17]").
std::unique_ptr<Model> parse_model(const nlohmann::json& j);

// Shared by the models: the vocab object {token: id} as an id-indexed table. Ids must be non-negative and
// unique; gaps are allowed.
std::vector<std::string> parse_vocab(const nlohmann::json& vocab, const std::string& path);

std::unique_ptr<Model> make_word_level(const nlohmann::json& j);
std::unique_ptr<Model> make_bpe(const nlohmann::json& j);

}  // namespace deepinfer::tokenizer
