#include "deepinfer/api/llm.h"

#include <cmath>
#include <deque>
#include <exception>
#include <filesystem>
#include <span>
#include <unordered_map>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/engine_factory.h"
#include "deepinfer/parallel/communicator.h"
#include "deepinfer/tokenizer/chat_encoding.h"
#include "deepinfer/tokenizer/stream_decoder.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::api {

// Decoding state of one sample; its output lives in Session::requests[i].outputs[k].
struct SampleState {
  double nll = 0;  // sum of -logprob of the chosen tokens, for decode_ppl
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  bool finished = false;
};

// The requests of one generate call or stream, their outputs so far and (for a stream) the deltas not yet
// handed out.
struct Session {
  int64_t id = 0;
  bool streaming = false;
  std::vector<RequestOutput> requests;            // input order
  std::vector<std::vector<SampleState>> samples;  // [request][sample]
  std::vector<int> samples_left;
  std::vector<bool> added;  // queued in the engine (an add_request error leaves the rest out)
  std::unordered_map<std::string, int> index_of;
  std::deque<StreamDelta> pending;
  std::vector<size_t> pending_done;  // pending entries whose request just finished (request_output to attach)
  int64_t finished_requests = 0;
  std::exception_ptr error;  // thrown while handling a delta; rethrown after the step (never into the engine)
  bool done() const { return finished_requests == static_cast<int64_t>(requests.size()); }
};

namespace {

tokenizer::ChatFormat default_chat_format(const ModelConfig& c) {
  switch (c.family) {
    case ModelFamily::kDeepseekV41:
      return tokenizer::ChatFormat::kV41;
    case ModelFamily::kDeepseekV4:
      return tokenizer::ChatFormat::kV4;
    case ModelFamily::kDeepseekV3:
      return tokenizer::ChatFormat::kV3;
  }
  return tokenizer::ChatFormat::kV41;
}

std::string chat_format_string(tokenizer::ChatFormat f) {
  switch (f) {
    case tokenizer::ChatFormat::kV3:
      return "v3";
    case tokenizer::ChatFormat::kV31:
      return "v31";
    case tokenizer::ChatFormat::kV4:
      return "v4";
    case tokenizer::ChatFormat::kV41:
      return "v41";
  }
  return "";
}

// The model's vocabulary may be padded past the tokenizer's (DeepSeek's is): such ids contribute no text.
std::vector<TokenId> known_ids(const tokenizer::Tokenizer& tok, std::span<const TokenId> ids) {
  std::vector<TokenId> out;
  out.reserve(ids.size());
  for (TokenId t : ids)
    if (tok.is_valid_id(t)) out.push_back(t);
  return out;
}

[[noreturn]] void rethrow_with_prefix(const Error& e, const std::string& prefix) {
  throw Error(e.code(), prefix + e.message(), e.file(), e.line());
}

}  // namespace

void validate(const LlmConfig& c) {
  DI_CHECK(c.device == "cpu" || c.device == "cuda") << "device must be 'cpu' or 'cuda', got '" << c.device << "'";
  DI_CHECK(c.max_model_len > 0) << "max_model_len must be positive, got " << c.max_model_len;
  DI_CHECK(c.max_num_seqs > 0) << "max_num_seqs must be positive, got " << c.max_num_seqs;
  DI_CHECK(c.max_num_batched_tokens > 0) << "max_num_batched_tokens must be positive, got " << c.max_num_batched_tokens;
  DI_CHECK(c.gpu_memory_utilization > 0 && c.gpu_memory_utilization <= 1)
      << "gpu_memory_utilization must be in (0, 1], got " << c.gpu_memory_utilization;
  DI_CHECK(c.kv_cache_bytes > 0) << "kv_cache_bytes must be positive, got " << c.kv_cache_bytes;
  DI_CHECK(c.threads >= 0) << "threads must be >= 0 (0 = all cores), got " << c.threads;
  DI_CHECK(c.ep >= 1 && c.dp >= 1 && c.cp >= 1)
      << "ep, dp and cp must be >= 1, got ep=" << c.ep << " dp=" << c.dp << " cp=" << c.cp;
  // ep/dp > 1 run their ranks as threads of this process, which only the CPU backend computes in; on GPUs each
  // rank is its own process (docs/PARALLEL.md).
  DI_CHECK_CODE(c.device == "cpu" || (c.ep == 1 && c.dp == 1), ErrorCode::kUnsupported)
      << "ep=" << c.ep << " dp=" << c.dp << " on device='" << c.device
      << "': in-process expert/data parallelism runs on the CPU backend only; on GPUs launch one process per GPU";
  ParallelLayout::make(c.ep, c.dp);  // InvalidArgument for a bad layout
  DI_CHECK(c.eplb_interval >= 0 && c.eplb_slots >= 0)
      << "eplb_interval and eplb_slots must be >= 0, got " << c.eplb_interval << " and " << c.eplb_slots;
  if (!c.chat_format.empty()) tokenizer::parse_chat_format(c.chat_format);
  DI_CHECK(c.speculative == "off" || c.speculative == "mtp" || c.speculative == "dspark")
      << "speculative must be 'off', 'mtp' or 'dspark', got '" << c.speculative << "'";
  DI_CHECK(c.num_draft_tokens >= 1 && c.num_draft_tokens <= 16)
      << "num_draft_tokens must be in [1, 16], got " << c.num_draft_tokens;
}

std::string finish_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kNone:
      return "";
    case StopReason::kEos:
    case StopReason::kStopToken:
    case StopReason::kStopString:
      return "stop";
    case StopReason::kMaxTokens:
    case StopReason::kMaxModelLen:
      return "length";
    case StopReason::kAborted:
      return "abort";
    case StopReason::kError:
      return "error";
    case StopReason::kGrammarComplete:
      return "stop";
    case StopReason::kGrammarDeadEnd:
      return "error";
  }
  return "";
}

Llm::Llm(LlmConfig config) : config_(std::move(config)) {
  validate(config_);
  DI_CHECK_CODE(std::filesystem::is_directory(config_.model_dir), ErrorCode::kNotFound)
      << "model directory '" << config_.model_dir << "' does not exist";
  const std::string cfg_path = config_.model_dir + "/config.json";
  DI_CHECK_CODE(std::filesystem::exists(cfg_path), ErrorCode::kNotFound)
      << "model directory '" << config_.model_dir << "' has no config.json";
  EngineStackOptions o;
  o.model_dir = config_.model_dir;
  o.device = config_.device;
  o.threads = config_.threads;
  o.max_num_seqs = config_.max_num_seqs;
  o.max_model_len = config_.max_model_len;
  o.max_num_batched_tokens = config_.max_num_batched_tokens;
  o.gpu_memory_utilization = config_.gpu_memory_utilization;
  o.host_kv_budget_bytes = config_.kv_cache_bytes;
  o.seed = config_.seed;
  o.exact_prefill = config_.exact_prefill;
  o.batch_invariant = config_.batch_invariant;
  o.activation_quant = config_.activation_quant;
  o.kernel_choices = config_.kernel_choices;
  o.kv_cache_dtype = config_.kv_cache_dtype;
  o.spelling = OptionSpelling::kKeyword;
  o.ep = config_.ep;
  o.dp = config_.dp;
  o.eplb_interval = config_.eplb_interval;
  o.eplb_slots = config_.eplb_slots;
  o.cp = config_.cp;
  o.speculative = config_.speculative;
  o.num_draft_tokens = config_.num_draft_tokens;
  stack_ = load_engine_stack(o);
  model_config_ = stack_->config;
  tok_ = stack_->tokenizer.get();
  structured_unavailable_ = stack_->structured_unavailable;
  max_model_len_ = stack_->max_model_len;
  const ModelConfig& cfg = *model_config_;
  auto on_delta = [this](const SequenceDelta& d) {
    if (active_ == nullptr) return;
    Session& s = *active_;
    auto it = s.index_of.find(d.request_id);
    if (it == s.index_of.end()) return;
    try {
      handle_delta(s, it->second, d);
    } catch (...) {
      if (!s.error) s.error = std::current_exception();
    }
  };
  engine_ = stack_->make_engine(on_delta);
  DI_LOG_INFO("Llm ready: {} ({}) on {}, max_model_len={}, max_num_seqs={}", config_.model_dir, family_name(cfg.family),
              config_.device, max_model_len_, config_.max_num_seqs);
}

// Appends one engine delta to its sample's output and, for a stream, queues it with its text.
void Llm::handle_delta(Session& s, int idx, const SequenceDelta& d) {
  SampleState& st = s.samples[idx].at(d.sample_index);
  CompletionOutput& out = s.requests[idx].outputs[d.sample_index];
  StreamDelta sd;
  sd.index = idx;
  sd.sample_index = d.sample_index;
  sd.token_ids = d.new_token_ids;
  sd.has_logprobs = out.has_logprobs;
  out.token_ids.insert(out.token_ids.end(), d.new_token_ids.begin(), d.new_token_ids.end());
  for (const SampleResult& r : d.logprobs) st.nll -= r.logprob;
  if (out.has_logprobs) {
    out.logprobs.insert(out.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    sd.logprobs = d.logprobs;
  }
  if (st.decoder) {
    for (TokenId t : d.new_token_ids)
      if (tok_->is_valid_id(t)) sd.text += st.decoder->step(t);
    if (d.finished) sd.text += st.decoder->finish();
  }
  if (d.finished && !st.finished) {
    st.finished = true;
    out.finish_reason = finish_reason_name(d.stop_reason);
    out.engine_stop_reason = std::string(stop_reason_name(d.stop_reason));
    if (d.stop_reason == StopReason::kStopString) out.stop_string = d.stop_string;
    if (d.stop_reason == StopReason::kStopToken && !out.token_ids.empty()) out.stop_token_id = out.token_ids.back();
    if (!out.token_ids.empty()) out.decode_ppl = std::exp(st.nll / static_cast<double>(out.token_ids.size()));
    if (tok_) out.text = tok_->decode(known_ids(*tok_, out.token_ids), /*skip_special_tokens=*/true);
    sd.finished = true;
    sd.finish_reason = out.finish_reason;
    if (--s.samples_left[idx] == 0) {
      s.requests[idx].finished = true;
      ++s.finished_requests;
      if (s.streaming) s.pending_done.push_back(s.pending.size());
    }
  }
  if (s.streaming) s.pending.push_back(std::move(sd));
}

Llm::~Llm() { engine_.reset(); }  // before the runner it drives

const tokenizer::Tokenizer& Llm::tokenizer() const {
  DI_CHECK_CODE(tok_ != nullptr, ErrorCode::kNotFound)
      << config_.model_dir << "/tokenizer.json is missing: text prompts, chat and decoding need it (pass token ids)";
  return *tok_;
}

std::vector<TokenId> Llm::encode(const std::string& text) const { return tokenizer().encode(text); }

std::string Llm::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  return tokenizer().decode(ids, skip_special_tokens);
}

std::string Llm::chat_format_name() const {
  return config_.chat_format.empty() ? chat_format_string(default_chat_format(*model_config_))
                                     : chat_format_string(tokenizer::parse_chat_format(config_.chat_format));
}

std::vector<TokenId> Llm::encode_chat(const nlohmann::ordered_json& request) const {
  const tokenizer::Tokenizer& tok = tokenizer();
  tokenizer::ChatRequest req = tokenizer::parse_chat_request(request);
  DI_CHECK(!req.messages.empty()) << "chat: messages is empty";
  auto rendered = tokenizer::render_chat(req, tokenizer::parse_chat_format(chat_format_name()));
  return tokenizer::encode_prompt(tok, rendered);
}

EngineStats Llm::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_->stats();
}

std::unique_ptr<Session> Llm::start_session(const std::vector<PromptInput>& prompts,
                                            const std::vector<SamplingParams>& params) {
  DI_CHECK_CODE(active_ == nullptr, ErrorCode::kUnsupported)
      << "another generation is in progress on this LLM (an unfinished generate_stream): exhaust or close it "
         "first; concurrent generations on one LLM are not supported";
  DI_CHECK(params.size() == 1 || params.size() == prompts.size())
      << "sampling params: pass one for all prompts or one per prompt (" << prompts.size() << " prompts, "
      << params.size() << " params)";
  auto s = std::make_unique<Session>();
  s->id = next_session_++;
  const size_t n = prompts.size();
  s->requests.resize(n);
  s->samples.resize(n);
  s->samples_left.resize(n);
  s->added.assign(n, false);
  std::vector<Request> reqs(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string where = "prompts[" + std::to_string(i) + "]: ";
    const SamplingParams& p = params.size() == 1 ? params[0] : params[i];
    RequestOutput& ro = s->requests[i];
    ro.index = static_cast<int>(i);
    ro.request_id = std::to_string(s->id) + "-" + std::to_string(i);
    try {
      validate(p, model_config_->vocab_size);
      DI_CHECK_CODE(!p.structured.active() || structured_unavailable_.empty(), ErrorCode::kUnsupported)
          << "structured output (" << structured_output_kind_name(p.structured.kind)
          << ") is not available for this model: " << structured_unavailable_;
      if (prompts[i].text) {
        ro.prompt = *prompts[i].text;
        ro.prompt_token_ids = tokenizer().encode(*prompts[i].text);
        DI_CHECK(!ro.prompt_token_ids.empty()) << "the text encodes to no tokens";
      } else {
        ro.prompt_token_ids = prompts[i].token_ids;
        DI_CHECK(!ro.prompt_token_ids.empty()) << "empty token id list";
      }
    } catch (const Error& e) {
      rethrow_with_prefix(e, where);
    }
    s->samples[i].resize(static_cast<size_t>(p.n));
    s->samples_left[i] = p.n;
    ro.outputs.resize(static_cast<size_t>(p.n));
    for (int k = 0; k < p.n; ++k) {
      ro.outputs[k].index = k;
      ro.outputs[k].has_logprobs = p.logprobs.has_value();
      if (tok_)
        s->samples[i][k].decoder = std::make_unique<tokenizer::StreamDecoder>(*tok_, /*skip_special_tokens=*/true);
    }
    s->index_of[ro.request_id] = static_cast<int>(i);
    Request& r = reqs[i];
    r.request_id = ro.request_id;
    r.prompt_token_ids = ro.prompt_token_ids;
    r.params = p;
    // The chosen token's logprob is always computed (decode perplexity); it does not change sampling.
    if (!r.params.logprobs) r.params.logprobs = 0;
  }
  active_ = s.get();
  for (size_t i = 0; i < n; ++i) {
    try {
      engine_->add_request(std::move(reqs[i]));
      s->added[i] = true;
    } catch (const Error& e) {
      end_session(*s);
      rethrow_with_prefix(e, "prompts[" + std::to_string(i) + "]: ");
    } catch (...) {
      end_session(*s);
      throw;
    }
  }
  return s;
}

void Llm::end_session(Session& s) {
  for (size_t i = 0; i < s.requests.size(); ++i) {
    if (s.added[i] && !s.requests[i].finished) engine_->abort(s.requests[i].request_id);
  }
  engine_->take_finished();
  active_ = nullptr;
}

void Llm::step_session(Session& s) {
  engine_->step();
  if (s.error) std::rethrow_exception(s.error);
  for (CompletedSequence& c : engine_->take_finished()) {
    auto it = s.index_of.find(c.request_id);
    if (it == s.index_of.end()) continue;
    CompletionOutput& out = s.requests[it->second].outputs.at(c.sample_index);
    out.num_cached_prompt_tokens = c.num_cached_prompt_tokens;
    out.num_preemptions = c.num_preemptions;
    if (config_.speculative != "off") {
      RequestOutput& ro = s.requests[it->second];
      ro.num_draft_tokens = ro.num_draft_tokens.value_or(0) + c.spec.drafted;
      ro.num_accepted_tokens = ro.num_accepted_tokens.value_or(0) + c.spec.accepted;
      if (*ro.num_draft_tokens > 0)
        ro.acceptance_rate = static_cast<double>(*ro.num_accepted_tokens) / static_cast<double>(*ro.num_draft_tokens);
    }
  }
  // Streams get the whole request with the delta that finished it (after the counters above are in).
  for (size_t at : s.pending_done) {
    StreamDelta& d = s.pending.at(at);
    d.request_output = std::make_shared<const RequestOutput>(s.requests[d.index]);
  }
  s.pending_done.clear();
  DI_CHECK_INTERNAL(s.done() || engine_->has_unfinished())
      << "the engine has no work left but " << s.requests.size() - s.finished_requests << " requests are unfinished";
}

std::vector<RequestOutput> Llm::generate(const std::vector<PromptInput>& prompts,
                                         const std::vector<SamplingParams>& params, const ProgressFn& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Session> s = start_session(prompts, params);
  try {
    const int64_t total = static_cast<int64_t>(s->requests.size());
    while (!s->done()) {
      step_session(*s);
      if (progress) progress(s->finished_requests, total);
    }
  } catch (...) {
    end_session(*s);
    throw;
  }
  end_session(*s);
  return std::move(s->requests);
}

std::unique_ptr<GenerationStream> Llm::generate_stream(const std::vector<PromptInput>& prompts,
                                                       const std::vector<SamplingParams>& params) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Session> s = start_session(prompts, params);
  s->streaming = true;
  return std::unique_ptr<GenerationStream>(new GenerationStream(*this, std::move(s)));
}

GenerationStream::GenerationStream(Llm& llm, std::unique_ptr<Session> session)
    : llm_(llm), session_(std::move(session)) {}

GenerationStream::~GenerationStream() {
  try {
    close();
  } catch (...) {
    // Aborting cannot fail short of a broken engine; a destructor must not throw.
  }
}

std::optional<StreamDelta> GenerationStream::next() {
  std::lock_guard<std::mutex> lock(llm_.mu_);
  if (!session_) return std::nullopt;
  try {
    while (session_->pending.empty() && !session_->done()) llm_.step_session(*session_);
  } catch (...) {
    llm_.end_session(*session_);
    session_.reset();
    throw;
  }
  if (!session_->pending.empty()) {
    StreamDelta d = std::move(session_->pending.front());
    session_->pending.pop_front();
    return d;
  }
  llm_.end_session(*session_);
  session_.reset();
  return std::nullopt;
}

void GenerationStream::close() {
  std::lock_guard<std::mutex> lock(llm_.mu_);
  if (!session_) return;
  llm_.end_session(*session_);
  session_.reset();
}

}  // namespace deepinfer::api
