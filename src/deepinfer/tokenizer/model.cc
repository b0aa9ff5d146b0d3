#include "deepinfer/tokenizer/model.h"

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "deepinfer/core/error.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::json;

// WordLevel: the whole piece is one token, or the unknown token.
class WordLevel : public Model {
 public:
  WordLevel(std::vector<std::string> id_to_token, std::string unk)
      : id_to_token_(std::move(id_to_token)), unk_(std::move(unk)) {
    for (size_t i = 0; i < id_to_token_.size(); ++i) {
      if (!id_to_token_[i].empty()) token_to_id_.emplace(id_to_token_[i], static_cast<int32_t>(i));
    }
    auto it = token_to_id_.find(unk_);
    unk_id_ = it == token_to_id_.end() ? -1 : it->second;
  }
  void encode(std::string_view piece, bool byte_level, std::vector<int32_t>* out) const override {
    DI_CHECK_CODE(!byte_level, ErrorCode::kUnsupported) << "WordLevel model with a ByteLevel pre-tokenizer";
    auto it = token_to_id_.find(std::string(piece));
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
    DI_CHECK(unk_id_ >= 0) << "WordLevel: \"" << piece << "\" is not in the vocabulary and unk_token \"" << unk_
                           << "\" is not either";
    out->push_back(unk_id_);
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    auto it = token_to_id_.find(std::string(token));
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    if (id < 0 || id >= vocab_size() || !present(id)) return nullptr;
    return &id_to_token_[id];
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t num_tokens() const override { return static_cast<int32_t>(token_to_id_.size()); }

 private:
  bool present(int32_t id) const {
    auto it = token_to_id_.find(id_to_token_[id]);
    return it != token_to_id_.end() && it->second == id;
  }
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::string unk_;
  int32_t unk_id_ = -1;
};

}  // namespace

// The most ids a vocabulary may leave unused below its largest (real ones leave none; this bounds the id table).
constexpr int64_t kMaxVocabIdGap = int64_t{1} << 20;

std::vector<std::string> parse_vocab(const json& vocab, const std::string& path) {
  DI_CHECK(vocab.is_object()) << "tokenizer.json: " << path << " must be an object {token: id}";
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    DI_CHECK(it.value().is_number_integer())
        << "tokenizer.json: " << path << "[\"" << it.key() << "\"] must be an integer id";
    const int64_t id = it.value().get<int64_t>();
    DI_CHECK(id >= 0 && id < (int64_t{1} << 31))
        << "tokenizer.json: " << path << "[\"" << it.key() << "\"] = " << id << " is out of range";
    max_id = std::max(max_id, id);
  }
  // The table is indexed by id: a few ids far past the entries' count would size it by the id, not the vocabulary
  // (one id of 2^31 - 1 asked for ~64 GiB).
  const int64_t entries = static_cast<int64_t>(vocab.size());
  DI_CHECK(max_id < entries + kMaxVocabIdGap) << "tokenizer.json: " << path << ": id " << max_id << " leaves more than "
                                              << kMaxVocabIdGap << " ids unused among " << entries << " entries";
  std::vector<std::string> table(static_cast<size_t>(max_id + 1));
  std::vector<bool> seen(table.size(), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = it.value().get<size_t>();
    DI_CHECK(!seen[id]) << "tokenizer.json: " << path << ": id " << id << " is used by both \"" << table[id]
                        << "\" and \"" << it.key() << "\"";
    seen[id] = true;
    table[id] = it.key();
  }
  return table;
}

std::unique_ptr<Model> make_word_level(const json& j) {
  DI_CHECK(j.contains("vocab")) << "tokenizer.json: model.vocab is missing";
  std::string unk;
  if (j.contains("unk_token") && j["unk_token"].is_string()) unk = j["unk_token"].get<std::string>();
  return std::make_unique<WordLevel>(parse_vocab(j["vocab"], "model.vocab"), unk);
}

std::unique_ptr<Model> parse_model(const json& j) {
  DI_CHECK(j.is_object()) << "tokenizer.json: model must be an object";
  std::string type;
  if (j.contains("type")) {
    DI_CHECK(j["type"].is_string()) << "tokenizer.json: model.type must be a string";
    type = j["type"].get<std::string>();
  } else {
    type = j.contains("merges") ? "BPE" : "";  // HF accepts an untyped BPE model
  }
  if (type == "BPE") return make_bpe(j);
  if (type == "WordLevel") return make_word_level(j);
  DI_FAIL(ErrorCode::kUnsupported) << "tokenizer.json: model.type \"" << type
                                   << "\" is not supported (BPE and WordLevel are)";
}

}  // namespace deepinfer::tokenizer
