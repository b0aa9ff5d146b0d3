#include "deepinfer/engine/model_runner.h"

#include "deepinfer/core/error.h"

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

spec::Draft ModelRunner::propose(const spec::DraftRequest&) {
  DI_FAIL(ErrorCode::kUnsupported) << "this model runner has no draft proposer";
}

}  // namespace deepinfer
