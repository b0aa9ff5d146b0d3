#include "deepinfer/server/generation_job.h"

#include <chrono>

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
  // A stream already carried the pieces of a tool-call block the output then cut off: its raw text is not content.
  if (ctx_.stream && delta.streamed_block_at != std::string::npos) delta.content.resize(delta.streamed_block_at);
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

OJson GenerationJob::anthropic_usage_json() const {
  return {{"input_tokens", ctx_.prompt_len}, {"output_tokens", completion_tokens_}};
}

OJson GenerationJob::responses_usage_json() const {
  return {{"input_tokens", ctx_.prompt_len},
          {"input_tokens_details", {{"cached_tokens", 0}}},
          {"output_tokens", completion_tokens_},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", ctx_.prompt_len + completion_tokens_}};
}

JobContext finish_context(GenerationSpec* spec, Request* request) {
  JobContext ctx = std::move(spec->ctx);
  if (ctx.created == 0)
    ctx.created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  ctx.prompt_len = static_cast<int64_t>(spec->prompt.size());
  ctx.n = spec->params.n;
  ctx.logprobs = spec->params.logprobs;
  ctx.output.stop = spec->params.stop;
  ctx.output.eos_token_ids = std::move(spec->eos_token_ids);
  request->request_id = ctx.id;
  request->prompt_token_ids = std::move(spec->prompt);
  request->params = std::move(spec->params);
  request->priority = spec->priority;
  return ctx;
}

}  // namespace deepinfer::server
