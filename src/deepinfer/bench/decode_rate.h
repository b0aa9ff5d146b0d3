// Decode throughput the way the reference reports it (../shared/docs/REFERENCE.md, "How the reference reports
// performance"): avg_SPS, decode steps per second; and a token count per second that assumes every draft token
// is accepted (steps/s × batch × (1 + draft length)). That second figure is not what a user receives, so next to
// it we print the tokens actually delivered, with the speculative acceptance measured in the same run. Used by
// `deepinfer bench` (decode rows, no drafts) and the summary of `deepinfer offline`.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer::bench {

// What a run counted over its decode steps.
struct DecodeCounts {
  int64_t steps = 0;           // decode steps
  double seconds = 0;          // their wall time
  int64_t sequence_steps = 0;  // Σ over the steps of the sequences each one decoded (steps × batch at a fixed batch)
  int64_t drafted = 0;         // draft tokens verified in those steps
  int64_t accepted = 0;        // of which accepted
  int64_t discarded = 0;       // tokens sampled for sequences that had already stopped (never delivered)
  int draft_length = 0;        // drafts proposed per sequence and step (0: no speculation)
};

struct DecodeRate {
  double avg_sps = 0;                       // steps / seconds
  double mean_batch = 0;                    // sequence_steps / steps
  double acceptance = 0;                    // accepted / drafted (0 without drafts)
  double delivered_tokens = 0;              // sequence_steps + accepted − discarded
  double delivered_tokens_per_s = 0;        // delivered_tokens / seconds
  double full_acceptance_tokens_per_s = 0;  // avg_sps × mean_batch × (1 + draft_length): an assumption, not output
};

// Throws InvalidArgument on inconsistent counts (negative, accepted > drafted, discarded > sequence_steps,
// steps without time, sequence steps without steps). No steps: every rate is 0.
DecodeRate decode_rate(const DecodeCounts& c);

// One line: "avg_SPS 20.00 steps/s (10 steps in 0.500000 s, mean batch 4.00); delivered 140.0 tokens/s (measured
// acceptance 0.750 of 40 drafts); full-acceptance assumption 160.0 tokens/s (avg_SPS × batch × (1 + 1))".
std::string format_decode_rate(const DecodeCounts& c, const DecodeRate& r);

}  // namespace deepinfer::bench
