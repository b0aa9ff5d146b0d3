#include "deepinfer/engine/model_runner.h"

#include "deepinfer/core/error.h"
#include "deepinfer/engine/greedy_argmax.h"

namespace deepinfer {

std::vector<int64_t> resolve_token_ids(const ModelBatch& batch, const BatchEntry& e) {
  std::vector<int64_t> ids(e.token_ids.begin(), e.token_ids.end());
  if (e.pending_row >= 0) {
    DI_CHECK_INTERNAL(!ids.empty() && e.pending_row < static_cast<int64_t>(batch.prev_sampled_tokens.size()))
        << "sequence " << e.seq_id << ": pending row " << e.pending_row << " but the previous step sampled "
        << batch.prev_sampled_tokens.size() << " tokens";
    ids.back() = batch.prev_sampled_tokens[e.pending_row];
  }
  return ids;
}

void ModelRunner::execute_argmax(const ModelBatch& batch, const ArgmaxRows& out) {
  const int64_t rows = batch.num_logits_rows, vocab = vocab_size();
  out.check_room(rows);
  std::vector<float>& logits = argmax_logits_;
  logits.assign(static_cast<size_t>(rows * vocab), 0.0f);  // as the general path hands execute() its rows
  execute(batch, logits);
  for (int64_t r = 0; r < rows; ++r) out.put(r, std::span<const float>(logits).subspan(r * vocab, vocab));
}

spec::Draft ModelRunner::propose(const spec::DraftRequest&) {
  DI_FAIL(ErrorCode::kUnsupported) << "this model runner has no draft proposer";
}

}  // namespace deepinfer
