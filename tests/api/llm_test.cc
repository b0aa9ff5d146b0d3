// api::Llm (the facade under the Python binding) on the V4.1 golden model: transformers' greedy continuations in
// input order, streaming equal to generate, errors that name the prompt and leave the engine usable.
#include "deepinfer/api/llm.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "deepinfer/core/error.h"
#include "deepinfer/io/safetensors.h"
#include "test_util.h"

namespace deepinfer::api {
namespace {

std::string golden_dir() { return testing::test_data_dir() + "/golden/deepseek_v41"; }

std::vector<TokenId> ids_of(const Tensor& t) {
  std::vector<TokenId> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<TokenId>(t.data_as<int64_t>()[i]));
  return v;
}

LlmConfig small_config() {
  LlmConfig c;
  c.model_dir = golden_dir();
  c.max_model_len = 512;
  c.max_num_seqs = 2;
  c.max_num_batched_tokens = 64;
  c.kv_cache_bytes = 64 << 20;
  return c;
}

template <typename F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no deepinfer::Error thrown";
  return ErrorCode::kInternal;
}

TEST(LlmApi, GreedyOutputsInInputOrderEqualTransformers) {
  auto golden = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  LlmConfig c = small_config();
  c.exact_prefill = true;  // transformers runs every layer on every token
  Llm llm(c);
  // Reversed so that input order differs from both length order and finishing order.
  std::vector<PromptInput> prompts;
  for (int p = 2; p >= 0; --p)
    prompts.push_back(PromptInput::from_ids(ids_of(golden->tensor("prompt" + std::to_string(p) + ".input_ids"))));
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 16;
  sp.ignore_eos = true;
  int64_t calls = 0, last_finished = 0;
  auto outs = llm.generate(prompts, {sp}, [&](int64_t finished, int64_t total) {
    ++calls;
    EXPECT_EQ(total, 3);
    EXPECT_GE(finished, last_finished);
    last_finished = finished;
  });
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(last_finished, 3);
  EXPECT_GT(calls, 16);  // at least one call per decode step
  for (int i = 0; i < 3; ++i) {
    const int p = 2 - i;
    EXPECT_EQ(outs[i].index, i);
    EXPECT_EQ(outs[i].prompt_token_ids, prompts[i].token_ids);
    ASSERT_EQ(outs[i].outputs.size(), 1u);
    const CompletionOutput& o = outs[i].outputs[0];
    EXPECT_EQ(o.token_ids, ids_of(golden->tensor("prompt" + std::to_string(p) + ".generated_ids"))) << "prompt " << p;
    EXPECT_EQ(o.finish_reason, "length");
    EXPECT_EQ(o.engine_stop_reason, "max_tokens");
    ASSERT_TRUE(o.decode_ppl.has_value());
    EXPECT_TRUE(std::isfinite(*o.decode_ppl) && *o.decode_ppl >= 1.0);
    EXPECT_FALSE(o.has_logprobs);  // computed for decode_ppl, not handed out unasked
    EXPECT_TRUE(o.logprobs.empty());
    EXPECT_FALSE(outs[i].acceptance_rate.has_value());
  }
}

// DP2 x EP2 (two in-process ranks, each with its own requests and half the experts) and EP2 with EPLB every 3
// steps: still transformers' greedy continuations.
TEST(LlmApi, ExpertAndDataParallelGreedyEqualsTransformers) {
  auto golden = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  for (auto [ep, dp, eplb] : {std::tuple{2, 2, 0}, std::tuple{2, 1, 3}}) {
    LlmConfig c = small_config();
    c.exact_prefill = true;
    c.ep = ep;
    c.dp = dp;
    c.eplb_interval = eplb;
    c.threads = 2;
    Llm llm(c);
    std::vector<PromptInput> prompts;
    for (int p = 0; p < 3; ++p)
      prompts.push_back(PromptInput::from_ids(ids_of(golden->tensor("prompt" + std::to_string(p) + ".input_ids"))));
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 8;
    sp.ignore_eos = true;
    auto outs = llm.generate(prompts, {sp});
    ASSERT_EQ(outs.size(), 3u);
    for (int p = 0; p < 3; ++p) {
      std::vector<TokenId> want = ids_of(golden->tensor("prompt" + std::to_string(p) + ".generated_ids"));
      want.resize(8);
      EXPECT_EQ(outs[p].outputs[0].token_ids, want) << "ep " << ep << " dp " << dp << " prompt " << p;
    }
  }
}

TEST(LlmApi, StreamEqualsGenerate) {
  Llm llm(small_config());
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.seed = 7;
  sp.n = 2;
  sp.max_tokens = 9;
  sp.logprobs = 2;
  const std::vector<PromptInput> prompts = {PromptInput::from_ids({5, 6, 7, 8}), PromptInput::from_text("w1 W2 v3"),
                                            PromptInput::from_ids({300, 2, 11})};
  auto want = llm.generate(prompts, {sp});
  auto stream = llm.generate_stream(prompts, {sp});
  std::map<std::pair<int, int>, std::vector<TokenId>> ids;
  std::map<std::pair<int, int>, std::string> text;
  std::map<int, RequestOutput> finals;
  int finished = 0;
  while (auto d = stream->next()) {
    auto& v = ids[{d->index, d->sample_index}];
    v.insert(v.end(), d->token_ids.begin(), d->token_ids.end());
    text[{d->index, d->sample_index}] += d->text;
    EXPECT_EQ(d->logprobs.size(), d->token_ids.size());
    if (d->finished) ++finished;
    if (d->request_output) finals[d->index] = *d->request_output;
  }
  EXPECT_EQ(finished, 6);
  ASSERT_EQ(finals.size(), 3u);
  EXPECT_TRUE(stream->closed());
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(want[i].outputs.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      const CompletionOutput& o = want[i].outputs[k];
      EXPECT_EQ((ids[{i, k}]), o.token_ids) << i << "/" << k;
      EXPECT_EQ((text[{i, k}]), o.text) << i << "/" << k;
      EXPECT_FALSE(o.text.empty());
      EXPECT_EQ(finals[i].outputs[k].token_ids, o.token_ids);
      ASSERT_EQ(o.logprobs.size(), o.token_ids.size());
      for (size_t t = 0; t < o.logprobs.size(); ++t) {
        EXPECT_EQ(o.logprobs[t].token, o.token_ids[t]);
        EXPECT_EQ(o.logprobs[t].top_logprobs.size(), 2u);
      }
    }
    // Seeded samples differ from each other (stream = sample index) but not between the two runs.
    EXPECT_NE(want[i].outputs[0].token_ids, want[i].outputs[1].token_ids);
  }
  EXPECT_EQ(want[1].prompt, "w1 W2 v3");
  EXPECT_EQ(want[1].prompt_token_ids, llm.encode("w1 W2 v3"));
}

TEST(LlmApi, ErrorsNameThePromptAndLeaveTheEngineUsable) {
  Llm llm(small_config());
  SamplingParams sp;
  sp.max_tokens = 3;
  try {
    llm.generate({PromptInput::from_ids({1, 2}), PromptInput::from_ids({1, 99999})}, {sp});
    FAIL() << "out-of-vocabulary id accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.message()).find("prompts[1]: "), std::string::npos) << e.message();
  }
  std::vector<TokenId> too_long(600, 3);
  EXPECT_EQ(code_of([&] { llm.generate({PromptInput::from_ids(too_long)}, {sp}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { llm.generate({PromptInput::from_ids({})}, {sp}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              llm.generate({PromptInput::from_ids({1}), PromptInput::from_ids({2})}, {sp, sp, sp});
            }),
            ErrorCode::kInvalidArgument);
  SamplingParams bad = sp;
  bad.top_p = 0;
  EXPECT_EQ(code_of([&] { llm.generate({PromptInput::from_ids({1})}, {bad}); }), ErrorCode::kInvalidArgument);
  // A progress callback that throws cancels the call; the requests are aborted, not left queued.
  EXPECT_THROW(llm.generate({PromptInput::from_ids({1, 2, 3})}, {sp}, [](int64_t, int64_t) { throw 42; }), int);
  // An open stream holds the LLM; closing it frees it.
  auto stream = llm.generate_stream({PromptInput::from_ids({4, 5})}, {sp});
  EXPECT_EQ(code_of([&] { llm.generate({PromptInput::from_ids({1})}, {sp}); }), ErrorCode::kUnsupported);
  stream->close();
  EXPECT_FALSE(stream->next().has_value());
  auto ok = llm.generate({PromptInput::from_ids({1, 2})}, {sp});
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].outputs[0].token_ids.size(), 3u);
  EXPECT_EQ(llm.stats().generated_tokens >= 3, true);
}

TEST(LlmApi, ConfigErrors) {
  LlmConfig c = small_config();
  c.cp = 2;
  c.ep = 4;  // world lcm(4, 2) = 4, but with CP the world must be dp·cp = 2
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kInvalidArgument);
  c = small_config();
  c.cp = 0;
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kInvalidArgument);
  c = small_config();
  c.ep = 0;
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kInvalidArgument);
  c = small_config();
  c.ep = 64;  // more EP ranks than routed experts
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kInvalidArgument);
  c = small_config();
  c.device = "tpu";
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kInvalidArgument);
  c = small_config();
  c.gpu_memory_utilization = 1.5;
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kInvalidArgument);
  c = small_config();
  c.model_dir = "/nonexistent/model";
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kNotFound);
#ifndef DEEPINFER_WITH_CUDA
  c = small_config();
  c.device = "cuda";
  EXPECT_EQ(code_of([&] { Llm x(c); }), ErrorCode::kUnsupported);
#endif
}

}  // namespace
}  // namespace deepinfer::api
