#include "deepinfer/tokenizer/stream_decoder.h"

#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {

std::string StreamDecoder::step(int32_t id) {
  const std::string& bytes = tok_.token_bytes(id);  // throws for unknown ids before any state changes
  if (skip_special_ && tok_.is_special(id)) return {};
  if (!first_) pending_ += tok_.token_separator();
  first_ = false;
  pending_ += bytes;
  // Everything up to a possibly-unfinished trailing sequence is final: ill-formed subparts before it are
  // replaced now, exactly as decode() replaces them in the whole text.
  const size_t stable = utf8_stable_prefix(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, stable));
  pending_.erase(0, stable);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  first_ = true;
  return out;
}

}  // namespace deepinfer::tokenizer
