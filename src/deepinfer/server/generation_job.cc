#include "deepinfer/server/generation_job.h"

namespace deepinfer::server {

std::string dump_json(const OJson& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
std::string sse_data(const OJson& j) { return "data: " + dump_json(j) + "\n\n"; }
std::string sse_event(const std::string& event, const OJson& j) {
  return "event: " + event + "\ndata: " + dump_json(j) + "\n\n";
}

GenerationJob::GenerationJob(JobContext ctx) : ctx_(std::move(ctx)) {
  samples_.reserve(static_cast<size_t>(ctx_.n));
  for (int i = 0; i < ctx_.n; ++i) samples_.emplace_back(ctx_.output);
}

std::string GenerationJob::on_delta(const SequenceDelta& d) {
  if (d.sample_index < 0 || d.sample_index >= ctx_.n) return {};
  SampleOutput& s = samples_[static_cast<size_t>(d.sample_index)];
  if (s.finished()) return {};
  tokenizer::ChatDelta delta = s.feed(d);
  completion_tokens_ += static_cast<int64_t>(d.new_token_ids.size());
  if (d.finished) ++num_finished_;
  return emit(d.sample_index, delta, d);
}

std::string GenerationJob::token_text(TokenId id) const {
  const tokenizer::Tokenizer* tok = ctx_.output.tok;
  if (tok && tok->is_valid_id(id)) {
    TokenId one[1] = {id};
    return tok->decode(one);
  }
  return "token_id:" + std::to_string(id);
}

OJson GenerationJob::usage_json() const {
  return {{"prompt_tokens", ctx_.prompt_len},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", ctx_.prompt_len + completion_tokens_}};
}

}  // namespace deepinfer::server
