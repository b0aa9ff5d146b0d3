#include "deepinfer/model/model_summary.h"

#include <string>

namespace deepinfer {

ParamCounts count_params(const ModelConfig& c, const std::vector<WeightSpec>& specs) {
  ParamCounts p;
  int64_t other = 0;
  int64_t table_rows_read = 0;
  for (const auto& s : specs) {
    const int64_t n = shape_numel(s.shape);
    p.total += n;
    if (s.expert) {
      p.routed_experts += n;
    } else if (s.kind == WeightKind::kEmbedding && s.name.find("embed") != std::string::npos) {
      p.embedding_tables += n;
      table_rows_read += s.shape[1];
    } else if (s.kind == WeightKind::kEngramTable) {
      p.embedding_tables += n;
      const auto& e = c.engram;
      table_rows_read += static_cast<int64_t>(e.max_ngram_size - 1) * e.n_heads * s.shape[1];
    } else {
      other += n;
    }
  }
  int64_t routed_active = 0;
  if (c.moe.n_routed_experts > 0)
    routed_active = p.routed_experts / c.moe.n_routed_experts * c.moe.num_experts_per_tok;
  p.active = other + routed_active + table_rows_read;
  return p;
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::vector<CacheKind> cache_kinds(const ModelConfig& c) {
  std::vector<CacheKind> out;
  if (c.family == ModelFamily::kDeepseekV3) {
    const int64_t per_layer = 2 * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
    out.push_back({"mla_latent",
                   "bf16 " + std::to_string(c.mla.kv_lora_rank) + " latent + " + std::to_string(c.mla.qk_rope_head_dim) +
                       " rope key (" + std::to_string(per_layer) + " B/layer)",
                   c.num_layers, static_cast<double>(per_layer * c.num_layers), 0});
    return out;
  }
  const int64_t hd = c.attn.head_dim, rope = c.attn.rope_dim, Id = c.attn.index_head_dim;
  const int64_t window = c.attn.sliding_window;
  const bool v41 = c.family == ModelFamily::kDeepseekV41;
  // Window entries: V4.1 all 512 channels FP8 with a UE8M0 scale per 32; V4 FP8 nope part (scale per 64) +
  // bf16 rope part, padded to 8 bytes.
  const int64_t win_entry = v41 ? hd + ceil_div(hd, 32) : ((hd - rope) + 2 * rope + ceil_div(hd - rope, 64) + 7) / 8 * 8;
  const int swa_layers = c.num_layers + (c.draft.kind == DraftKind::kDSpark ? c.draft.num_layers : 0);
  out.push_back({"swa_ring", v41 ? "fp8 e4m3 + ue8m0/32" : "fp8 e4m3 nope + bf16 rope + ue8m0/64", swa_layers, 0,
                 window * win_entry * swa_layers});
  CacheKind comp{"compressed_kv", "", 0, 0, 0};
  CacheKind index{"index_keys", "", 0, 0, 0};
  CacheKind pending{"compressor_state", "fp32 kv+gate of the open group", 0, 0, 0};
  for (const auto& p : c.layers) {
    if (p.compress_ratio == 0 || p.kv_source != p.index) continue;
    const int r = p.compress_ratio;
    if (v41) {
      comp.format = "fp4 e2m1 + e4m3/16";
      comp.bytes_per_token += static_cast<double>(hd / 2 + ceil_div(hd, 16)) / r;
      comp.num_layers++;
      index.format = "fp4 e2m1 + ue8m0/32";
      index.bytes_per_token += static_cast<double>(Id / 2 + ceil_div(Id, 32)) / r;
      index.num_layers++;
      if (r > 1) {
        pending.bytes_per_sequence += static_cast<int64_t>(r - 1) * 2 * hd * 4 + 8;
        pending.num_layers++;
      }
    } else {
      comp.format = "same as swa_ring entries";
      comp.bytes_per_token += static_cast<double>(win_entry) / r;
      comp.num_layers++;
      const bool overlap = p.attention == AttentionKind::kCSA;
      const int64_t width = overlap ? 2 * hd : hd;
      // pending: the open window's kv+gate, and for overlapping compressors the previous window too.
      pending.bytes_per_sequence += (overlap ? 2 : 1) * static_cast<int64_t>(r) * 2 * width * 4;
      pending.num_layers++;
      if (p.attention == AttentionKind::kCSA) {
        index.format = "fp8 e4m3 + f32 scale";
        index.bytes_per_token += static_cast<double>(Id + 4) / r;
        index.num_layers++;
        pending.bytes_per_sequence += 2 * static_cast<int64_t>(r) * 2 * (2 * Id) * 4;
      }
    }
  }
  if (comp.num_layers) out.push_back(comp);
  if (index.num_layers) out.push_back(index);
  if (pending.num_layers) out.push_back(pending);
  if (c.engram.enabled())
    out.push_back({"engram_lookback", "int32 compressed ids", static_cast<int>(c.engram.layer_ids.size()), 0,
                   static_cast<int64_t>(c.engram.max_ngram_size - 1) * 4});
  return out;
}

double kv_bytes_per_token(const ModelConfig& c) {
  double t = 0;
  for (const auto& k : cache_kinds(c)) t += k.bytes_per_token;
  return t;
}

}  // namespace deepinfer
