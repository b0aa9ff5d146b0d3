// Stop conditions, checked after each sampled token. Order: EOS, stop token, stop string (the model chose to
// stop) before max_tokens and max_model_len (a limit cut it off), so a sequence that ends with EOS on its last
// allowed token reports kEos. Nothing but the length limits stops a sequence before min_tokens outputs.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "deepinfer/engine/sequence.h"

namespace deepinfer {

// Token ids → text, for stop strings. Any decoder works (tokenizer/incremental detokenizer).
using DetokenizeFn = std::function<std::string(std::span<const TokenId>)>;

struct StopCheck {
  StopReason reason = StopReason::kNone;
  std::string stop_string;
};

// `s` already contains the new token as its last one.
StopCheck check_stop(const Sequence& s, std::span<const TokenId> eos_token_ids, int64_t max_model_len,
                     const DetokenizeFn& detokenize);

// True if some stop string ends inside the text contributed by the newest token. Decodes only a tail of the
// output (enough tokens to cover the longest stop string, since a token is at least one byte), so the cost per
// token does not grow with the output length.
bool match_stop_string(std::span<const TokenId> output, std::span<const std::string> stops,
                       const DetokenizeFn& detokenize, std::string* matched);

}  // namespace deepinfer
