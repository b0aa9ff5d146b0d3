#include "deepinfer/engine/stop_checker.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer {

bool match_stop_string(std::span<const TokenId> output, std::span<const std::string> stops,
                       const DetokenizeFn& detokenize, std::string* matched) {
  if (stops.empty() || output.empty()) return false;
  DI_CHECK(detokenize != nullptr) << "stop strings need a detokenizer";
  size_t longest = 0;
  for (const auto& s : stops) longest = std::max(longest, s.size());
  // +3 tokens of slack for multi-byte characters split across tokens and for tokens that decode to nothing.
  const size_t window = std::min(output.size(), longest + 3);
  const auto tail = output.subspan(output.size() - window);
  const std::string with = detokenize(tail);
  const std::string without = detokenize(tail.first(window - 1));
  // A match that ends inside the newest token's text: it starts after the position where an occurrence would
  // have ended within `without` (earlier occurrences would have stopped the sequence before).
  for (const auto& s : stops) {
    if (with.size() < s.size()) continue;
    size_t pos = with.find(s, without.size() >= s.size() ? without.size() - s.size() + 1 : 0);
    if (pos != std::string::npos) {
      if (matched) *matched = s;
      return true;
    }
  }
  return false;
}

StopCheck check_stop(const Sequence& s, std::span<const TokenId> eos_token_ids, int64_t max_model_len,
                     const DetokenizeFn& detokenize) {
  const SamplingParams& p = *s.params;
  StopCheck r;
  const TokenId last = s.tokens.back();
  if (s.num_output() >= p.min_tokens) {
    if (!p.ignore_eos && std::find(eos_token_ids.begin(), eos_token_ids.end(), last) != eos_token_ids.end()) {
      r.reason = StopReason::kEos;
      return r;
    }
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end()) {
      r.reason = StopReason::kStopToken;
      return r;
    }
    if (match_stop_string(s.output(), p.stop, detokenize, &r.stop_string)) {
      r.reason = StopReason::kStopString;
      return r;
    }
  }
  if (p.max_tokens && s.num_output() >= *p.max_tokens) {
    r.reason = StopReason::kMaxTokens;
  } else if (s.num_known() >= max_model_len) {
    r.reason = StopReason::kMaxModelLen;
  }
  return r;
}

}  // namespace deepinfer
