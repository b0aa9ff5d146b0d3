#include "deepinfer/bench/decode_rate.h"

#include <fmt/format.h>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {

DecodeRate decode_rate(const DecodeCounts& c) {
  DI_CHECK(c.steps >= 0 && c.seconds >= 0 && c.sequence_steps >= 0 && c.drafted >= 0 && c.accepted >= 0 &&
           c.discarded >= 0 && c.draft_length >= 0)
      << "decode rate: counts must be non-negative (steps " << c.steps << ", seconds " << c.seconds
      << ", sequence steps " << c.sequence_steps << ", drafted " << c.drafted << ", accepted " << c.accepted
      << ", discarded " << c.discarded << ", draft length " << c.draft_length << ")";
  DI_CHECK(c.accepted <= c.drafted) << "decode rate: " << c.accepted << " accepted of only " << c.drafted
                                    << " drafted tokens";
  DI_CHECK(c.discarded <= c.sequence_steps + c.accepted)
      << "decode rate: " << c.discarded << " discarded tokens of only " << c.sequence_steps + c.accepted << " sampled";
  DI_CHECK(c.steps > 0 || c.sequence_steps == 0) << "decode rate: " << c.sequence_steps << " sequence steps in 0 steps";
  DecodeRate r;
  if (c.steps == 0) return r;
  DI_CHECK(c.seconds > 0) << "decode rate: " << c.steps << " steps took no time";
  r.avg_sps = static_cast<double>(c.steps) / c.seconds;
  r.mean_batch = static_cast<double>(c.sequence_steps) / static_cast<double>(c.steps);
  r.acceptance = c.drafted > 0 ? static_cast<double>(c.accepted) / static_cast<double>(c.drafted) : 0.0;
  r.delivered_tokens = static_cast<double>(c.sequence_steps + c.accepted - c.discarded);
  r.delivered_tokens_per_s = r.delivered_tokens / c.seconds;
  r.full_acceptance_tokens_per_s = r.avg_sps * r.mean_batch * (1.0 + c.draft_length);
  return r;
}

std::string format_decode_rate(const DecodeCounts& c, const DecodeRate& r) {
  if (c.steps == 0) return "avg_SPS n/a (no decode steps)";
  const std::string accept = c.draft_length == 0 ? std::string("no speculation")
                             : c.drafted == 0
                                 ? std::string("no drafts verified")
                                 : fmt::format("measured acceptance {:.3f} of {} drafts", r.acceptance, c.drafted);
  return fmt::format(
      "avg_SPS {:.2f} steps/s ({} steps in {:.6f} s, mean batch {:.2f}); delivered {:.1f} tokens/s ({}); "
      "full-acceptance assumption {:.1f} tokens/s (avg_SPS x batch x (1 + {}))",
      r.avg_sps, c.steps, c.seconds, r.mean_batch, r.delivered_tokens_per_s, accept, r.full_acceptance_tokens_per_s,
      c.draft_length);
}

}  // namespace deepinfer::bench
