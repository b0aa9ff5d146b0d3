// The greedy fast path with the chosen token's logprob (engine/greedy_argmax.h, argmax_cuda.h) through the engine on
// the CUDA backend: greedy requests with logprobs = 0 (what `deepinfer offline` asks for by default) reduce the
// batched decode logits to ids and logprobs on the device; the same run with device_argmax off copies the rows back
// and computes both on the host (sampler.h token_logprob), and a run with top logprobs takes the general path
// (Sampler::add_logprobs). The ids must be equal, and the logprobs within one float ulp (argmax_cuda.h: the device
// sums exp in another fixed order, in double, so the float results agree except where a few double ulps straddle a
// float rounding boundary), plus 1e-11 absolute for logprobs so close to 0 that their float ulp is below the double
// resolution of the logsumexp (both sides then carry the same cancellation). On V4.1, V4 and V3, with decode graphs
// and eager.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "deepinfer/engine/engine_factory.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "test_util.h"

namespace deepinfer {
namespace {

struct Outputs {
  std::map<std::string, std::vector<TokenId>> ids;
  std::map<std::string, std::vector<float>> logprobs;  // the chosen tokens'
  ModelWorkStats work;
};

// Greedy requests over the golden prompts; `logprobs` 0: the chosen token's, k > 0: also the top k.
Outputs run(const std::string& family, bool device_argmax, bool graphs, int logprobs) {
  const std::string dir = testing::test_data_dir() + "/golden/" + family;
  EngineStackOptions o;
  o.model_dir = dir;
  o.device = "cuda";
  o.max_num_seqs = 3;
  o.max_model_len = 256;
  o.max_num_batched_tokens = 33;  // chunked prefill next to decodes
  o.gpu_memory_utilization = 0.3;
  o.device_argmax = device_argmax;
  o.decode_graphs = graphs;
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  if (golden->find("engram.token_map")) o.engram_token_map_file = dir + "/golden.safetensors";
  auto stack = load_engine_stack(o);
  Outputs res;
  {
    auto engine = stack->make_engine();
    for (int p = 0; golden->find("prompt" + std::to_string(p) + ".input_ids"); ++p) {
      const Tensor t = golden->tensor("prompt" + std::to_string(p) + ".input_ids");
      Request q;
      q.request_id = std::to_string(p);
      for (int64_t i = 0; i < std::min<int64_t>(t.numel(), 48); ++i)
        q.prompt_token_ids.push_back(static_cast<TokenId>(t.data_as<int64_t>()[i]));
      q.params.max_tokens = 16;
      q.params.temperature = 0.0f;
      q.params.ignore_eos = true;
      q.params.logprobs = logprobs;
      engine->add_request(std::move(q));
    }
    while (engine->has_unfinished()) engine->step();
    for (auto& d : engine->take_finished()) {
      res.ids[d.request_id] = d.output_token_ids;
      for (const SampleResult& r : d.logprobs) res.logprobs[d.request_id].push_back(r.logprob);
    }
    res.work = engine->stats().model;
  }
  return res;
}

float ulp_of(float x) {
  const float a = std::fabs(x);
  return std::nextafter(a, INFINITY) - a;
}

// Per token: |a - b| <= 1 float ulp of b + 1e-11; returns the largest distance in float ulps of b.
double compare(const Outputs& a, const Outputs& b, const std::string& what) {
  double worst = 0;
  EXPECT_EQ(a.ids, b.ids) << what;
  for (const auto& [id, want] : b.logprobs) {
    const auto it = a.logprobs.find(id);
    if (it == a.logprobs.end()) {
      ADD_FAILURE() << what << ": no logprobs for request " << id;
      continue;
    }
    const std::vector<float>& got = it->second;
    EXPECT_EQ(got.size(), want.size()) << what << " request " << id;
    EXPECT_EQ(want.size(), b.ids.at(id).size()) << what << ": one logprob per token";
    for (size_t k = 0; k < std::min(got.size(), want.size()); ++k) {
      EXPECT_TRUE(std::isfinite(want[k]) && want[k] <= 0.0f) << want[k];
      const double diff = std::fabs(static_cast<double>(got[k]) - want[k]);
      worst = std::max(worst, diff / ulp_of(want[k]));
      EXPECT_LE(diff, ulp_of(want[k]) + 1e-11)
          << what << " request " << id << " token " << k << ": " << got[k] << " vs " << want[k];
    }
  }
  return worst;
}

TEST(CudaGreedyLogprob, DeviceLogprobsEqualTheHostsWithinOneUlp) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string family : {"deepseek_v41", "deepseek_v4", "deepseek_v3"}) {
    for (bool graphs : {true, false}) {
      const std::string name = family + (graphs ? " graphs" : " eager");
      const Outputs fast = run(family, true, graphs, 0);
      const Outputs host = run(family, false, graphs, 0);
      const Outputs general = run(family, true, graphs, 1);
      ASSERT_GE(fast.ids.size(), 3u) << name;
      EXPECT_GT(fast.work.argmax_steps_device, 0) << name << ": the chosen tokens' logprobs keep the fast path";
      EXPECT_EQ(host.work.argmax_steps_device, 0) << name;
      EXPECT_GT(host.work.argmax_steps_host, 0) << name;
      EXPECT_EQ(general.work.argmax_steps_device + general.work.argmax_steps_host, 0) << name << ": top logprobs";
      const double dev_host = compare(fast, host, name + ": device vs host");
      const double host_general = compare(host, general, name + ": host fast path vs general path");
      int64_t tokens = 0, equal = 0;
      for (const auto& [id, v] : host.logprobs)
        for (size_t k = 0; k < v.size() && k < fast.logprobs.at(id).size(); ++k, ++tokens)
          equal += v[k] == fast.logprobs.at(id)[k] ? 1 : 0;
      std::printf(
          "[cuda-greedy-logprob %s] ids equal: %s; %lld of %lld logprobs bit-equal device vs host (worst %.2f float "
          "ulps), host vs general path worst %.2f ulps; device steps %lld\n",
          name.c_str(), fast.ids == host.ids && host.ids == general.ids ? "yes" : "NO", static_cast<long long>(equal),
          static_cast<long long>(tokens), dev_host, host_general,
          static_cast<long long>(fast.work.argmax_steps_device));
    }
  }
}

}  // namespace
}  // namespace deepinfer
