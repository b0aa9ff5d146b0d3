// deepinfer inspect [DIR]: family, per-layer plan, parameter counts, weight dtypes and bytes, KV bytes per
// token per cache kind, and a completeness check of the checkpoint (all problems at once, non-zero exit).
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/model/model_summary.h"
#include "deepinfer/model/weight_schema.h"

namespace deepinfer::cli {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) b /= 1000, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

void print_plan(const ModelConfig& c) {
  std::cout << "layer plan:\n";
  if (c.family == ModelFamily::kDeepseekV3) {
    std::cout << "  layer  attention  mlp\n";
    for (const auto& p : c.layers)
      std::cout << fmt::format("  {:>5}  {:<9}  {}\n", p.index, attention_kind_name(p.attention),
                               p.routing == RoutingKind::kDense ? "dense" : "moe");
    return;
  }
  std::cout << "  layer  attention  ratio  rope      role     kv_src  idx_src  cand  engram  routing\n";
  for (const auto& p : c.layers) {
    std::cout << fmt::format("  {:>5}  {:<9}  {:>5}  {:<8}  {:<7}  {:>6}  {:>7}  {:<4}  {:<6}  {}\n", p.index,
                             attention_kind_name(p.attention), p.compress_ratio, p.compress_rope ? "compress" : "main",
                             csa2_role_name(p.csa2_role), p.kv_source >= 0 ? std::to_string(p.kv_source) : "-",
                             p.index_source >= 0 ? std::to_string(p.index_source) : "-",
                             p.candidate_source ? "yes" : "", p.engram ? "yes" : "",
                             p.routing == RoutingKind::kHash ? "hash" : "topk");
  }
}

int run_inspect(const std::optional<std::string>& dir_arg) {
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(dir_arg, env ? std::optional<std::string>(env) : std::nullopt,
                                      embedded_model_dir());
  DI_LOG_INFO("model: {} (from {})", m.dir, m.source);
  ModelConfig c = load_model_config(m.dir + "/config.json");
  auto ck = Checkpoint::open(m.dir);
  WeightCheck check = check_weights(c, *ck);

  std::cout << "model: " << m.dir << "\n";
  std::cout << "family: " << family_name(c.family) << " (model_type " << c.model_type << ")\n";
  std::cout << fmt::format("dims: hidden {}, layers {}, heads {}, vocab {}, max_position {}\n", c.hidden_size,
                           c.num_layers, c.num_heads, c.vocab_size, c.max_position_embeddings);
  if (c.family == ModelFamily::kDeepseekV3) {
    std::cout << fmt::format("mla: q_lora {}, kv_lora {}, nope {}, rope {}, v {}; softmax scale {:.7f}\n",
                             c.mla.q_lora_rank, c.mla.kv_lora_rank, c.mla.qk_nope_head_dim, c.mla.qk_rope_head_dim,
                             c.mla.v_head_dim, attention_softmax_scale(c));
  } else {
    std::cout << fmt::format(
        "attention: head_dim {}, rope {}, q_lora {}, o_groups {} x o_lora {}, window {}, indexer {}x{} top-{}\n",
        c.attn.head_dim, c.attn.rope_dim, c.attn.q_lora_rank, c.attn.o_groups, c.attn.o_lora_rank,
        c.attn.sliding_window, c.attn.index_n_heads, c.attn.index_head_dim, c.attn.index_topk);
    std::cout << fmt::format("mHC: {} streams, {} Sinkhorn iterations\n", c.hc.hc_mult, c.hc.sinkhorn_iters);
  }
  std::cout << fmt::format("moe: {} routed (top-{}, {}), {} shared, intermediate {}\n", c.moe.n_routed_experts,
                           c.moe.num_experts_per_tok, scoring_name(c.moe.scoring), c.moe.n_shared_experts,
                           c.moe.moe_intermediate_size);
  if (c.engram.enabled()) {
    std::cout << "engram: layers";
    for (int l : c.engram.layer_ids) std::cout << " " << l;
    std::cout << fmt::format(", n-gram 2..{}, {} heads x {}\n", c.engram.max_ngram_size, c.engram.n_heads,
                             c.engram.head_dim);
  }
  if (c.draft.kind != DraftKind::kNone)
    std::cout << fmt::format("draft: {} with {} layer(s)\n", c.draft.kind == DraftKind::kMTP ? "MTP" : "DSpark",
                             c.draft.num_layers);
  std::cout << fmt::format("quantization: {}\n",
                           c.quant.fp8 ? fmt::format("fp8 e4m3, {}x{} blocks, {} scales, experts {}", c.quant.block_n,
                                                     c.quant.block_k, c.quant.scale_ue8m0 ? "ue8m0" : "f32",
                                                     c.quant.experts_fp4 ? "mxfp4" : "fp8")
                                       : std::string("none"));
  print_plan(c);

  ParamCounts pc = count_params(c, check.specs);
  std::cout << fmt::format("parameters: total {} ({} in routed experts, {} in embedding tables), active per token {}\n",
                           human_count(pc.total), human_count(pc.routed_experts), human_count(pc.embedding_tables),
                           human_count(pc.active));
  std::map<std::string, std::pair<int64_t, uint64_t>> by_format;  // format -> (tensors, bytes)
  for (const auto& r : check.found) {
    std::string key = std::string(weight_format_name(r.format)) + " " +
                      std::string(dtype_safetensors_name(r.weight->dtype));
    by_format[key].first++;
    by_format[key].second += r.bytes;
  }
  std::cout << "weights by storage:\n";
  for (const auto& [k, v] : by_format)
    std::cout << fmt::format("  {:<20} {:>6} tensors  {}\n", k, v.first, human_bytes(static_cast<double>(v.second)));
  std::cout << fmt::format("checkpoint: {} shard(s), {} tensors, {}\n", ck->shards().size(), ck->names().size(),
                           human_bytes(static_cast<double>(ck->total_bytes())));
  std::cout << "kv cache:\n";
  for (const auto& k : cache_kinds(c)) {
    std::cout << fmt::format("  {:<18} {:>3} layers  {:>10.1f} B/token  {:>10} B/sequence fixed  [{}]\n", k.name,
                             k.num_layers, k.bytes_per_token, k.bytes_per_sequence, k.format);
  }
  std::cout << fmt::format("  total persistent: {:.1f} B/token\n", kv_bytes_per_token(c));
  if (!check.unused.empty()) {
    std::cout << check.unused.size() << " checkpoint tensor(s) not used by this build (first: " << check.unused.front()
              << ")\n";
  }
  if (!check.problems.empty()) {
    std::cout << check.problems.size() << " problem(s):\n";
    for (const auto& p : check.problems) std::cout << "  " << p << "\n";
    std::cerr << "deepinfer: error: checkpoint " << m.dir << " is not usable (" << check.problems.size()
              << " problems)\n";
    return 1;
  }
  std::cout << "check: all " << check.found.size() << " required tensors present with valid shapes and dtypes\n";
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("inspect", "describe a checkpoint and check that it is complete");
  auto dir = std::make_shared<std::string>();
  sub->add_option("model_dir", *dir, "checkpoint directory (default: --model, DEEPINFER_HF_MODEL_DIR, embedded)");
  auto flag = std::make_shared<std::string>();
  sub->add_option("--model", *flag, "checkpoint directory");
  reg.add(sub, [dir, flag] {
    std::optional<std::string> d;
    if (!flag->empty()) d = *flag;
    else if (!dir->empty()) d = *dir;
    return run_inspect(d);
  });
}

}  // namespace deepinfer::cli
