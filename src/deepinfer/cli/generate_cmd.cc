// deepinfer generate --model DIR --prompt-ids 1,2,3 --max-tokens N: greedy generation of one sequence with
// the CPU reference forward (DeepSeek-V3 family or V4 / V4.1, from config.json). Prints the generated ids, the decode
// perplexity (exp of the mean negative log-likelihood of the generated tokens) and the speed.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer::cli {
namespace {

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      DI_CHECK(item.find_first_not_of(" \t", used) == std::string::npos) << "bad token id '" << item << "'";
    } catch (const std::logic_error&) {
      DI_FAIL(ErrorCode::kInvalidArgument) << "--prompt-ids: '" << item << "' is not an integer";
    }
  }
  DI_CHECK(!ids.empty()) << "--prompt-ids: at least one token id is required";
  return ids;
}

// log softmax(row)[id].
double log_prob(const float* row, int64_t vocab, int64_t id) {
  double mx = row[0];
  for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, static_cast<double>(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - mx);
  return row[id] - mx - std::log(sum);
}

struct GenerateArgs {
  std::string model;
  std::string prompt_ids;
  int max_tokens = 16;
  int threads = 0;
  std::string token_map_file;
  bool stop_at_eos = false;
};

template <typename Model>
int greedy(const Model& model, const std::vector<int64_t>& prompt, const GenerateArgs& a) {
  const int64_t vocab = model.config().vocab_size;
  for (int64_t id : prompt)
    DI_CHECK(id >= 0 && id < vocab) << "token id " << id << " outside the vocabulary (" << vocab << ")";

  auto seq = model.new_sequence();
  const auto t0 = std::chrono::steady_clock::now();
  HostTensor logits = model.forward(seq, prompt);
  const auto t1 = std::chrono::steady_clock::now();
  const float* row = logits.data<float>() + (prompt.size() - 1) * vocab;
  std::vector<int64_t> out;
  double nll = 0;
  for (int step = 0; step < a.max_tokens; ++step) {
    const int64_t next = std::max_element(row, row + vocab) - row;
    nll -= log_prob(row, vocab, next);
    out.push_back(next);
    const auto& eos = model.config().eos_token_ids;
    if (a.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (step + 1 == a.max_tokens) break;
    logits = model.forward(seq, std::span<const int64_t>(&out.back(), 1));
    row = logits.data<float>();
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::string ids;
  for (size_t i = 0; i < out.size(); ++i) ids += (i ? "," : "") + std::to_string(out[i]);
  std::cout << ids << "\n";
  std::cout << fmt::format("decode_ppl {:.4f}\n", std::exp(nll / static_cast<double>(out.size())));
  std::cerr << fmt::format(
      "prefill {} tokens in {:.3f} s ({:.1f} tok/s); decode {} tokens in {:.3f} s ({:.1f} tok/s)\n", prompt.size(),
      prefill_s, prompt.size() / prefill_s, out.size() - 1, decode_s,
      out.size() > 1 ? (out.size() - 1) / decode_s : 0.0);
  return 0;
}

int run_generate(const GenerateArgs& a) {
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(a.model.empty() ? std::nullopt : std::optional<std::string>(a.model),
                                      env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
  DI_LOG_INFO("model: {} (from {})", m.dir, m.source);
  DI_CHECK(a.max_tokens >= 1) << "--max-tokens must be >= 1";
  std::vector<int64_t> prompt = parse_ids(a.prompt_ids);
  std::optional<std::vector<int64_t>> token_map;
  if (!a.token_map_file.empty()) {
    auto f = SafetensorsFile::open(a.token_map_file);
    Tensor t = f->tensor("engram.token_map");
    DI_CHECK(t.dtype() == DType::kI64) << a.token_map_file << ": engram.token_map must be I64";
    token_map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  }
  auto backend = make_cpu_backend(a.threads);
  // The family in config.json picks the forward; both models share new_sequence() / forward().
  if (load_model_config(m.dir + "/config.json").family == ModelFamily::kDeepseekV3)
    return greedy(*DeepseekV3Model::load(m.dir, *backend), prompt, a);
  return greedy(*DeepseekV4Model::load(m.dir, *backend, token_map), prompt, a);
}

}  // namespace

void register_generate(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("generate", "greedy generation with the CPU reference forward (V3 family, V4 / V4.1)");
  auto a = std::make_shared<GenerateArgs>();
  sub->add_option("--model", a->model, "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, embedded)");
  sub->add_option("--prompt-ids", a->prompt_ids, "comma-separated prompt token ids")->required();
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  sub->add_option("--threads", a->threads, "CPU threads (0: all cores)")->capture_default_str();
  sub->add_option("--engram-token-map", a->token_map_file,
                  "safetensors file holding engram.token_map (V4.1 Engram; default: built from tokenizer.json)");
  sub->add_flag("--stop-at-eos", a->stop_at_eos, "stop at an EOS token");
  reg.add(sub, [a] { return run_generate(*a); });
}

}  // namespace deepinfer::cli
