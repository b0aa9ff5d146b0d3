// The tokenizer of a Hugging Face tokenizer.json, exact against the `tokenizers` library.
//
//   auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
//   std::vector<int32_t> ids = tok->encode("Hello<｜User｜>");   // = tokenizer(text, add_special_tokens=False)
//   std::string text = tok->decode(ids);
//
// encode: repair invalid UTF-8 (each maximal ill-formed subpart → U+FFFD) → cut out added tokens (raw pass)
// → normalize → cut out normalized added tokens → pre-tokenize → model. No BOS/EOS is added (the chat
// encoders write them) and the post-processor is not applied: for DeepSeek it only adjusts offsets.
// decode: ids → token strings → decoder (ByteLevel: alphabet → bytes) → UTF-8 with U+FFFD for broken bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "deepinfer/tokenizer/added_vocabulary.h"
#include "deepinfer/tokenizer/model.h"
#include "deepinfer/tokenizer/normalizer.h"
#include "deepinfer/tokenizer/pre_tokenizer.h"

namespace deepinfer {
class ThreadPool;
}

namespace deepinfer::tokenizer {

class Tokenizer {
 public:
  // Throws NotFound if the file cannot be read, InvalidArgument naming the field if it is malformed,
  // Unsupported for components this implementation does not have.
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);
  static std::unique_ptr<Tokenizer> from_json(std::string_view json_text);

  std::vector<int32_t> encode(std::string_view text, SpecialTokenMode mode = SpecialTokenMode::kRecognize) const;
  // Encodes every text, spread over the pool's threads (work is handed out one text at a time).
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts, ThreadPool& pool,
                                                 SpecialTokenMode mode = SpecialTokenMode::kRecognize) const;

  // Throws InvalidArgument for an id that names no token (HF silently drops those).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes token `id` contributes to decoded text (before UTF-8 repair). Valid ids only.
  const std::string& token_bytes(int32_t id) const;
  // The separator a decoder without ByteLevel puts between tokens ("" for ByteLevel, " " for none).
  const std::string& token_separator() const { return separator_; }
  bool is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[id]; }
  bool is_valid_id(int32_t id) const { return id >= 0 && id < vocab_size() && valid_[id]; }

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of `id` (byte-level alphabet for BPE tokens), nullopt if no token has it.
  std::optional<std::string> id_to_token(int32_t id) const;
  // One past the largest id of the model and the added tokens (HF's get_vocab_size(with_added_tokens=True)
  // when ids have no gaps).
  int32_t vocab_size() const { return static_cast<int32_t>(valid_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  void encode_text(std::string_view text, std::vector<int32_t>* out) const;
  void encode_normalized(std::string_view text, SpecialTokenMode mode, std::vector<int32_t>* out) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Model> model_;
  bool byte_level_ = false;  // the pre-tokenizer ends with ByteLevel

  std::vector<AddedToken> added_;
  std::vector<std::string> added_strings_;  // per added token: its string for id_to_token and decode
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_map<int32_t, int32_t> added_by_id_;  // id → index in added_
  TokenMatcher raw_matcher_;         // normalized=false tokens, matched on the input
  TokenMatcher normalized_matcher_;  // normalized=true tokens, matched on normalized text
  std::vector<bool> skip_none_, skip_special_;

  std::string separator_;
  std::vector<std::string> token_bytes_;  // per id
  std::vector<bool> special_, valid_;
};

}  // namespace deepinfer::tokenizer
