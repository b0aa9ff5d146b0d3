// Speculative decoding: verification of a draft against the target's logits rows (docs/SPECULATIVE.md).
//
// Greedy (temperature 0): accept d_i while it equals the argmax of the target's processed row i-1; the first
// mismatch is replaced by that argmax; when all n are accepted the bonus is the argmax of row n. The output is
// the non-speculative greedy output token for token, because each row is processed exactly as Sampler does.
//
// Sampling (temperature > 0), standard speculative sampling (Leviathan et al. 2023, Chen et al. 2023): with p
// the target's distribution at that position (the processed row the non-speculative sampler would sample:
// mask, min-tokens, penalties, temperature, top-k, top-p, min-p) and q the draft's, accept d with probability
// min(1, p(d)/q(d)); on rejection sample from norm(max(0, p - q)); after n acceptances sample the bonus from p.
// Each emitted token then has exactly the distribution of non-speculative sampling. Randomness is counter-based
// (rng.h) keyed by the token's position: draw 1 = the acceptance test, draw 2 = the residual sample, and the
// bonus uses draw 0 exactly like Sampler, so a seeded request is deterministic with speculation on (its tokens
// differ from a non-speculative run with the same seed, their distribution does not).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "deepinfer/sampling/rng.h"
#include "deepinfer/sampling/sampling_params.h"
#include "deepinfer/spec/proposer.h"

namespace deepinfer::spec {

struct VerifyResult {
  int num_accepted = 0;         // drafts accepted
  std::vector<TokenId> tokens;  // the accepted drafts, then the correction or bonus token (unless stopped early)
};

// The processed logits row the non-speculative sampler would sample at the i-th verified position (i = 0 .. n),
// given that the tokens before it, d_1 .. d_i included, were emitted: the caller applies the grammar mask and
// the processor chain with that history (Sampler::process). Called in order, at most once per i. An empty row
// means nothing can be sampled there (non-finite logits, a grammar that is complete or at a dead end):
// verification ends before it.
using ProcessedRowFn = std::function<std::vector<float>(int i)>;
// Called for every emitted token in order (row i's token), before row i + 1 is processed: the caller extends its
// history (and advances the grammar matcher). True when the token ends the sequence (EOS, a stop token id,
// max_tokens): verification stops there and later rows are never processed.
using StopFn = std::function<bool(int i, TokenId token)>;

// Verifies the first n drafts of `draft` (n <= draft.tokens.size()). `position` is the position of the token
// that row 0 predicts. `greedy` must be params.greedy().
VerifyResult verify_draft(const Draft& draft, int n, bool greedy, const ProcessedRowFn& row, const StopFn& stop,
                          const RngKey& key, int64_t position);

}  // namespace deepinfer::spec
