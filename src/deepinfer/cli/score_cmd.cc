// deepinfer score --model DIR --ids-file F --out OUT.safetensors [--chunk N] [--decode-from K]: runs every
// line of F (one JSON array of token ids) through the CPU reference forward and writes `logits.<line>`
// (fp32 [len, vocab], 0-based line numbers) for every position. --chunk N prefills in chunks of N tokens;
// --decode-from K feeds tokens K.. one at a time through the cache; --logprobs writes only the log-probability
// of each next token (`logprobs.<line>`, fp32 [len-1]) for held-out perplexity. V3 and V4 families. Used to
// compare against other backends and against transformers.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer::cli {
namespace {

struct ScoreArgs {
  std::string model, ids_file, out, token_map_file;
  int64_t chunk = 0;
  int64_t decode_from = -1;
  int threads = 0;
  bool logprobs = false;
};

std::vector<std::vector<int64_t>> read_id_lines(const std::string& path) {
  std::ifstream in(path);
  DI_CHECK_CODE(in.good(), ErrorCode::kNotFound) << "cannot open --ids-file " << path;
  std::vector<std::vector<int64_t>> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      DI_FAIL(ErrorCode::kInvalidArgument) << path << ":" << n << ": not JSON (" << e.what() << ")";
    }
    DI_CHECK(j.is_array() && !j.empty()) << path << ":" << n << ": expected a non-empty JSON array of token ids";
    std::vector<int64_t> ids;
    for (const auto& v : j) {
      DI_CHECK(v.is_number_integer()) << path << ":" << n << ": token ids must be integers";
      ids.push_back(v.get<int64_t>());
    }
    out.push_back(std::move(ids));
  }
  DI_CHECK(!out.empty()) << path << ": no sequences";
  return out;
}

// Logits of every position of every line, or with --logprobs only log p(ids[t+1] | ids[..t]) for t < len-1
// (held-out perplexity without writing len × vocab floats).
template <typename Model>
std::vector<HostTensor> score_lines(const Model& model, const std::vector<std::vector<int64_t>>& lines,
                                    const ScoreArgs& a) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<HostTensor> results;
  for (const auto& ids : lines) {
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t id : ids) DI_CHECK(id >= 0 && id < vocab) << "token id " << id << " outside the vocabulary";
    DI_CHECK(!a.logprobs || n >= 2) << "--logprobs: every line needs at least two tokens";
    const int64_t prefill = a.decode_from >= 0 ? std::clamp<int64_t>(a.decode_from, 0, n) : n;
    HostTensor logits(DType::kF32, {n, vocab});
    auto seq = model.new_sequence();
    int64_t at = 0;
    while (at < n) {
      const int64_t len = at >= prefill ? 1 : std::min(prefill - at, a.chunk > 0 ? a.chunk : prefill);
      HostTensor part = model.forward(seq, std::span<const int64_t>(ids.data() + at, len));
      std::copy(part.data<float>(), part.data<float>() + len * vocab, logits.data<float>() + at * vocab);
      at += len;
    }
    if (!a.logprobs) {
      results.push_back(std::move(logits));
      continue;
    }
    HostTensor lp(DType::kF32, {n - 1});
    for (int64_t t = 0; t + 1 < n; ++t) {
      const float* row = logits.data<float>() + t * vocab;
      const float mx = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      lp.data<float>()[t] = static_cast<float>(row[ids[t + 1]] - mx - std::log(sum));
    }
    results.push_back(std::move(lp));
  }
  return results;
}

int run_score(const ScoreArgs& a) {
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(a.model.empty() ? std::nullopt : std::optional<std::string>(a.model),
                                      env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
  DI_LOG_INFO("model: {} (from {})", m.dir, m.source);
  DI_CHECK(a.chunk >= 0) << "--chunk must be >= 0";
  auto lines = read_id_lines(a.ids_file);
  std::optional<std::vector<int64_t>> token_map;
  if (!a.token_map_file.empty()) {
    auto f = SafetensorsFile::open(a.token_map_file);
    Tensor t = f->tensor("engram.token_map");
    DI_CHECK(t.dtype() == DType::kI64) << a.token_map_file << ": engram.token_map must be I64";
    token_map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  }
  auto backend = make_cpu_backend(a.threads);
  std::vector<HostTensor> results;
  // The family in config.json picks the forward; both append chunks to a per-sequence state.
  if (load_model_config(m.dir + "/config.json").family == ModelFamily::kDeepseekV3) {
    DI_CHECK(!token_map) << "--engram-token-map: DeepSeek-V3-family models have no Engram";
    auto model = DeepseekV3Model::load(m.dir, *backend);
    results = score_lines(*model, lines, a);
  } else {
    auto model = DeepseekV4Model::load(m.dir, *backend, token_map);
    results = score_lines(*model, lines, a);
  }
  std::vector<SafetensorsWriteItem> items;
  std::vector<std::string> names;
  for (size_t i = 0; i < results.size(); ++i)
    names.push_back((a.logprobs ? "logprobs." : "logits.") + std::to_string(i));
  for (size_t i = 0; i < results.size(); ++i)
    items.push_back({names[i], DType::kF32, results[i].shape(), results[i].data<void>()});
  write_safetensors(a.out, items);
  DI_LOG_INFO("wrote {} sequence(s) to {}", results.size(), a.out);
  return 0;
}

}  // namespace

void register_score(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("score", "write the logits of every position of every input line (CPU reference)");
  auto a = std::make_shared<ScoreArgs>();
  sub->add_option("--model", a->model, "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, embedded)");
  sub->add_option("--ids-file", a->ids_file, "one JSON array of token ids per line")->required();
  sub->add_option("--out", a->out,
                  "output .safetensors (logits.<line>, fp32 [len, vocab]; with --logprobs logprobs.<line>)")
      ->required();
  sub->add_option("--chunk", a->chunk, "prefill in chunks of N tokens (0: one shot)")->capture_default_str();
  sub->add_option("--decode-from", a->decode_from, "feed tokens K.. one at a time through the cache");
  sub->add_option("--threads", a->threads, "CPU threads (0: all cores)")->capture_default_str();
  sub->add_flag("--logprobs", a->logprobs,
                "write logprobs.<line> (fp32 [len-1]: log-probability of each next token) instead of the logits");
  sub->add_option("--engram-token-map", a->token_map_file,
                  "safetensors file holding engram.token_map (V4.1 Engram; default: built from tokenizer.json)");
  reg.add(sub, [a] { return run_score(*a); });
}

}  // namespace deepinfer::cli
