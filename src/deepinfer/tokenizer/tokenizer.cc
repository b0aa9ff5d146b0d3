#include "deepinfer/tokenizer/tokenizer.h"

#include <atomic>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/core/thread_pool.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/tokenizer/byte_level.h"
#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::json;

bool flag(const json& t, const char* name, size_t i, bool fallback) {
  auto it = t.find(name);
  if (it == t.end() || it->is_null()) return fallback;
  DI_CHECK(it->is_boolean()) << "tokenizer.json: added_tokens[" << i << "]." << name << " must be a boolean";
  return it->get<bool>();
}

// Only the decoders DeepSeek's and the golden tokenizers use: ByteLevel, or none (tokens joined by spaces).
bool parse_decoder_is_byte_level(const json& j) {
  if (j.is_null()) return false;
  DI_CHECK(j.is_object() && j.contains("type") && j["type"].is_string())
      << "tokenizer.json: decoder must be null or an object with a string \"type\"";
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return true;
  DI_FAIL(ErrorCode::kUnsupported) << "tokenizer.json: decoder.type \"" << type << "\" is not supported (ByteLevel is)";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return from_json(text);
  } catch (const Error& e) {
    DI_FAIL(e.code()) << path << ": " << e.message();
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number no double holds (1e999)
    DI_FAIL(ErrorCode::kInvalidArgument) << "tokenizer.json is not valid JSON: " << e.what();
  }
  DI_CHECK(j.is_object()) << "tokenizer.json: the top level must be an object";
  DI_CHECK(j.contains("model")) << "tokenizer.json: model is missing";

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->normalizer_ = parse_normalizer(j.value("normalizer", json()), "normalizer");
  tok->pre_tokenizer_ = parse_pre_tokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer");
  tok->byte_level_ = tok->pre_tokenizer_ && tok->pre_tokenizer_->byte_level();
  tok->model_ = parse_model(j["model"]);
  const bool byte_level_decoder = parse_decoder_is_byte_level(j.value("decoder", json()));
  tok->separator_ = byte_level_decoder ? "" : " ";

  // Added tokens.
  const json added = j.value("added_tokens", json::array());
  DI_CHECK(added.is_array()) << "tokenizer.json: added_tokens must be an array";
  int32_t max_id = tok->model_->vocab_size() - 1;
  int32_t max_added_id = -1;
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    DI_CHECK(t.is_object()) << "tokenizer.json: added_tokens[" << i << "] must be an object";
    DI_CHECK(t.contains("content") && t["content"].is_string())
        << "tokenizer.json: added_tokens[" << i << "].content must be a string";
    DI_CHECK(t.contains("id") && t["id"].is_number_integer() && t["id"].get<int64_t>() >= 0 &&
             t["id"].get<int64_t>() < (int64_t{1} << 31))
        << "tokenizer.json: added_tokens[" << i << "].id must be a non-negative integer";
    AddedToken a;
    a.content = t["content"].get<std::string>();
    a.id = t["id"].get<int32_t>();
    a.special = flag(t, "special", i, false);
    a.normalized = flag(t, "normalized", i, !a.special);
    a.lstrip = flag(t, "lstrip", i, false);
    a.rstrip = flag(t, "rstrip", i, false);
    a.single_word = flag(t, "single_word", i, false);
    // HF does not trust the ids in the file: a token in the model vocabulary gets the model's id, a token
    // already added keeps its first definition, any other gets the next id after the model and the tokens
    // added so far (AddedVocabulary::add_tokens). Files written by HF agree with this; we warn otherwise.
    if (tok->added_by_content_.count(a.content)) continue;
    int32_t id;
    if (auto model_id = tok->model_->token_to_id(a.content)) {
      id = *model_id;
    } else {
      id = std::max(max_added_id + 1, tok->model_->num_tokens());
    }
    max_added_id = std::max(max_added_id, id);
    if (id != a.id) {
      DI_LOG_WARN("tokenizer.json: added_tokens[{}] \"{}\" has id {} but HF tokenizers assigns {}; using {}", i,
                  a.content, a.id, id, id);
      a.id = id;
    }
    const auto index = static_cast<int32_t>(tok->added_.size());
    tok->added_by_content_.emplace(a.content, a.id);
    tok->added_by_id_.emplace(a.id, index);
    max_id = std::max(max_id, a.id);
    tok->added_.push_back(std::move(a));
  }
  for (size_t i = 0; i < tok->added_.size(); ++i) {
    const AddedToken& a = tok->added_[i];
    if (a.normalized) {
      // HF matches normalized tokens by their normalized form, and id_to_token / decode give that form too
      // (token_to_id still takes the original content).
      const std::string form = tok->normalizer_ ? tok->normalizer_->normalize(a.content) : a.content;
      tok->normalized_matcher_.add(form, static_cast<int32_t>(i));
      tok->added_strings_.push_back(form);
    } else {
      tok->added_strings_.push_back(a.content);
      tok->raw_matcher_.add(a.content, static_cast<int32_t>(i));
    }
    tok->skip_special_.push_back(a.special);
  }
  tok->skip_none_.assign(tok->added_.size(), false);

  // Per-id tables for decode.
  const auto n = static_cast<size_t>(max_id + 1);
  tok->token_bytes_.resize(n);
  tok->valid_.assign(n, false);
  tok->special_.assign(n, false);
  std::unordered_set<std::string> special_contents;
  for (const AddedToken& a : tok->added_)
    if (a.special) special_contents.insert(a.content);
  for (size_t id = 0; id < n; ++id) {
    const auto token = tok->id_to_token(static_cast<int32_t>(id));
    if (!token) continue;
    tok->valid_[id] = true;
    tok->special_[id] = special_contents.count(*token) > 0;
    tok->token_bytes_[id] = byte_level_decoder ? alphabet_to_bytes(*token) : *token;
  }
  return tok;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(std::string(token));
  if (it != added_by_content_.end()) return it->second;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return added_strings_[it->second];
  if (const std::string* t = model_->id_to_token(id)) return *t;
  return std::nullopt;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  DI_CHECK(is_valid_id(id)) << "token id " << id << " is not in the vocabulary (size " << vocab_size() << ")";
  return token_bytes_[id];
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>* out) const {
  if (!pre_tokenizer_) {
    model_->encode(text, byte_level_, out);
    return;
  }
  pre_tokenizer_->for_each_piece(text, [&](std::string_view piece) { model_->encode(piece, byte_level_, out); });
}

void Tokenizer::encode_normalized(std::string_view text, SpecialTokenMode mode, std::vector<int32_t>* out) const {
  std::string normalized_storage;
  if (normalizer_) {
    normalized_storage = normalizer_->normalize(text);
    text = normalized_storage;
  }
  if (mode == SpecialTokenMode::kAllAsText || normalized_matcher_.empty()) {
    encode_text(text, out);
    return;
  }
  std::vector<Segment> segments;
  normalized_matcher_.split(text, added_, mode == SpecialTokenMode::kSpecialAsText ? skip_special_ : skip_none_,
                            &segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      out->push_back(s.id);
    } else {
      encode_text(text.substr(s.begin, s.end - s.begin), out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, SpecialTokenMode mode) const {
  std::string repaired;
  if (!is_valid_utf8(input)) {
    repaired = sanitize_utf8(input);
    input = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(input.size() / 3 + 4);
  if (input.empty()) return out;
  if (mode == SpecialTokenMode::kAllAsText || raw_matcher_.empty()) {
    encode_normalized(input, mode, &out);
    return out;
  }
  std::vector<Segment> segments;
  raw_matcher_.split(input, added_, mode == SpecialTokenMode::kSpecialAsText ? skip_special_ : skip_none_, &segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      encode_normalized(input.substr(s.begin, s.end - s.begin), mode, &out);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts, ThreadPool& pool,
                                                          SpecialTokenMode mode) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  // Texts differ wildly in length, so threads pull one text at a time instead of taking fixed ranges.
  std::atomic<size_t> next{0};
  pool.parallel_for(pool.size(), [&](int64_t, int64_t) {
    for (size_t i = next.fetch_add(1); i < texts.size(); i = next.fetch_add(1)) out[i] = encode(texts[i], mode);
  });
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special_tokens && special_[id]) continue;
    if (!first) bytes += separator_;
    bytes += b;
    first = false;
  }
  return sanitize_utf8(bytes);
}

}  // namespace deepinfer::tokenizer
