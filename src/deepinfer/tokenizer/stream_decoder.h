// Incremental detokenizer for streaming generation.
//
//   StreamDecoder stream(tok);
//   for (int32_t id : generated) send(stream.step(id));
//   send(stream.finish());
//
// The concatenation of everything step() and finish() return equals tok.decode(all ids) byte for byte, and
// every returned chunk is valid UTF-8: bytes of a character split across tokens are held back until the
// character completes (a held sequence that can no longer complete becomes U+FFFD, as decode() does).
#pragma once

#include <cstdint>
#include <string>

#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false)
      : tok_(tok), skip_special_(skip_special_tokens) {}

  // The text that token `id` makes final. Throws InvalidArgument for an unknown id (the state is unchanged).
  std::string step(int32_t id);
  // Flushes held bytes (an unfinished character becomes U+FFFD) and resets for a new sequence.
  std::string finish();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace deepinfer::tokenizer
