#include "deepinfer/model/weight_schema.h"

#include <set>
#include <sstream>

#include "deepinfer/core/error.h"

namespace deepinfer {

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFloat:
      return "float";
    case WeightFormat::kFP8Block:
      return "fp8-block";
    case WeightFormat::kMXFP4:
      return "mxfp4";
    case WeightFormat::kInt:
      return "int";
  }
  return "?";
}

std::vector<std::string> scale_names(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    std::string stem = weight_name.substr(0, weight_name.size() - suffix.size());
    return {stem + ".scale", weight_name + "_scale_inv"};
  }
  return {weight_name + ".scale", weight_name + "_scale_inv"};
}

Shape fp8_scale_shape(const Shape& shape, const QuantConfig& q) {
  DI_CHECK_INTERNAL(shape.size() == 2) << "fp8 weights are matrices";
  return {(shape[0] + q.block_n - 1) / q.block_n, (shape[1] + q.block_k - 1) / q.block_k};
}

namespace {

// Collects specs with the family's naming rules.
class SpecBuilder {
 public:
  explicit SpecBuilder(const ModelConfig& c) : c_(c) {}

  void vec(const std::string& name, Shape shape, int layer = -1) {
    add(name, std::move(shape), WeightKind::kVector, false, layer);
  }
  void lin(const std::string& name, Shape shape, bool quantizable, int layer = -1) {
    add(name, std::move(shape), WeightKind::kLinear, quantizable && c_.quant.fp8, layer);
  }
  void expert(const std::string& name, Shape shape, int layer) {
    add(name, std::move(shape), WeightKind::kExpert, c_.quant.fp8, layer, true);
  }
  void embedding(const std::string& name, Shape shape) {
    add(name, std::move(shape), WeightKind::kEmbedding, false, -1);
  }
  void engram_table(const std::string& name, Shape shape, int layer) {
    add(name, std::move(shape), WeightKind::kEngramTable, c_.quant.fp8, layer);
  }
  void int_table(const std::string& name, Shape shape, int layer) {
    add(name, std::move(shape), WeightKind::kIntTable, false, layer);
  }
  std::vector<WeightSpec> take() { return std::move(specs_); }
  // Specs added while set are draft tensors (WeightSpec::draft).
  void set_draft(bool on) { draft_ = on; }

 private:
  void add(const std::string& name, Shape shape, WeightKind kind, bool quantized, int layer, bool is_expert = false) {
    WeightSpec s;
    s.name = name;
    s.aliases = aliases(name);
    s.shape = std::move(shape);
    s.kind = kind;
    s.quantized = quantized;
    s.layer = layer;
    s.expert = is_expert && !draft_;  // draft experts do not count toward the target's active parameters
    s.draft = draft_;
    specs_.push_back(std::move(s));
  }

  // V4/V4.1 canonical names are the released checkpoint's ("layers.N.attn.wq_a.weight", "embed.weight",
  // "head.weight"); transformers writes them under "model." with a few renames.
  std::vector<std::string> aliases(const std::string& name) const {
    if (c_.family == ModelFamily::kDeepseekV3) return {};
    std::vector<std::string> out;
    auto with_model = [](const std::string& n) { return "model." + n; };
    if (name == "embed.weight") return {"model.embed.weight", "model.embed_tokens.weight"};
    if (name == "head.weight") return {"lm_head.weight"};
    if (name == "norm.weight") return {"model.norm.weight"};
    if (name.rfind("hc_head_", 0) == 0) {
      std::string part = name.substr(8);  // fn / base / scale
      return {"model.hc_head.hc_" + part, "hc_head.hc_" + part, with_model(name)};
    }
    out.push_back(with_model(name));
    // DSpark Markov head: the reference names its factors markov_w1 (embedding) / markov_w2 (projection).
    for (const auto& [ours, theirs] :
         {std::pair<std::string, std::string>{"markov_head.embed.weight", "markov_head.markov_w1.weight"},
          {"markov_head.head.weight", "markov_head.markov_w2.weight"}}) {
      auto at = name.find(ours);
      if (at != std::string::npos) out.push_back(name.substr(0, at) + theirs);
    }
    const std::string kv_norm = ".attn.kv_norm.weight";
    auto pos = name.find(kv_norm);
    if (pos != std::string::npos) {
      std::string alt = name.substr(0, pos) + ".attn.norm.weight";
      out.push_back(alt);
      out.push_back(with_model(alt));
    }
    return out;
  }

  const ModelConfig& c_;
  std::vector<WeightSpec> specs_;
  bool draft_ = false;
};

void v3_specs(const ModelConfig& c, SpecBuilder& b) {
  const int64_t D = c.hidden_size, H = c.num_heads;
  const auto& m = c.mla;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  b.embedding("model.embed_tokens.weight", {c.vocab_size, D});
  auto layer_specs = [&](const LayerPlan& p) {
    const std::string L = "model.layers." + std::to_string(p.index) + ".";
    const int l = p.index;
    b.vec(L + "input_layernorm.weight", {D}, l);
    b.vec(L + "post_attention_layernorm.weight", {D}, l);
    if (m.q_lora_rank > 0) {
      b.lin(L + "self_attn.q_a_proj.weight", {m.q_lora_rank, D}, true, l);
      b.vec(L + "self_attn.q_a_layernorm.weight", {m.q_lora_rank}, l);
      b.lin(L + "self_attn.q_b_proj.weight", {H * qk, m.q_lora_rank}, true, l);
    } else {
      b.lin(L + "self_attn.q_proj.weight", {H * qk, D}, true, l);
    }
    b.lin(L + "self_attn.kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, D}, true, l);
    b.vec(L + "self_attn.kv_a_layernorm.weight", {m.kv_lora_rank}, l);
    b.lin(L + "self_attn.kv_b_proj.weight", {H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}, true, l);
    b.lin(L + "self_attn.o_proj.weight", {D, H * m.v_head_dim}, true, l);
    if (p.routing == RoutingKind::kDense) {
      const int64_t I = c.moe.intermediate_size;
      b.lin(L + "mlp.gate_proj.weight", {I, D}, true, l);
      b.lin(L + "mlp.up_proj.weight", {I, D}, true, l);
      b.lin(L + "mlp.down_proj.weight", {D, I}, true, l);
      return;
    }
    const int64_t E = c.moe.n_routed_experts, I = c.moe.moe_intermediate_size;
    b.lin(L + "mlp.gate.weight", {E, D}, false, l);
    if (c.moe.has_bias) b.vec(L + "mlp.gate.e_score_correction_bias", {E}, l);
    for (int64_t e = 0; e < E; ++e) {
      const std::string X = L + "mlp.experts." + std::to_string(e) + ".";
      b.expert(X + "gate_proj.weight", {I, D}, l);
      b.expert(X + "up_proj.weight", {I, D}, l);
      b.expert(X + "down_proj.weight", {D, I}, l);
    }
    if (c.moe.n_shared_experts > 0) {
      const int64_t S = I * c.moe.n_shared_experts;
      b.lin(L + "mlp.shared_experts.gate_proj.weight", {S, D}, true, l);
      b.lin(L + "mlp.shared_experts.up_proj.weight", {S, D}, true, l);
      b.lin(L + "mlp.shared_experts.down_proj.weight", {D, S}, true, l);
    }
  };
  for (const auto& p : c.layers) layer_specs(p);
  b.vec("model.norm.weight", {D});
  if (!c.tie_word_embeddings) b.embedding("lm_head.weight", {c.vocab_size, D});
  // MTP layers (MODELS.md Part B §5): a full decoder block plus enorm, hnorm, eh_proj and the shared head's
  // norm. Their embed_tokens / shared_head.head copies are the main embedding and head and are not read.
  if (c.draft.kind == DraftKind::kMTP) {
    b.set_draft(true);
    for (int k = 0; k < c.draft.num_layers; ++k) {
      const LayerPlan p = mtp_layer_plan(c, k);
      const std::string L = "model.layers." + std::to_string(p.index) + ".";
      layer_specs(p);
      b.vec(L + "enorm.weight", {D}, p.index);
      b.vec(L + "hnorm.weight", {D}, p.index);
      b.lin(L + "eh_proj.weight", {D, 2 * D}, true, p.index);
      b.vec(L + "shared_head.norm.weight", {D}, p.index);
    }
    b.set_draft(false);
  }
}

// The tensors of one V4 block (attention with its own SWA branch only, MoE with `E` routed experts) under prefix L.
void v4_block_specs(const ModelConfig& c, SpecBuilder& b, const std::string& L, int l, int64_t E) {
  const int64_t D = c.hidden_size, H = c.num_heads, hc = c.hc.hc_mult;
  const auto& a = c.attn;
  const int64_t hd = a.head_dim, ql = a.q_lora_rank, G = a.o_groups, ol = a.o_lora_rank;
  const int64_t n_mix = (2 + hc) * hc;
  b.vec(L + "attn_norm.weight", {D}, l);
  b.vec(L + "ffn_norm.weight", {D}, l);
  for (const char* site : {"attn", "ffn"}) {
    b.vec(L + "hc_" + site + "_fn", {n_mix, hc * D}, l);
    b.vec(L + "hc_" + site + "_base", {n_mix}, l);
    b.vec(L + "hc_" + site + "_scale", {3}, l);
  }
  const std::string A = L + "attn.";
  b.lin(A + "wq_a.weight", {ql, D}, true, l);
  b.vec(A + "q_norm.weight", {ql}, l);
  b.lin(A + "wq_b.weight", {H * hd, ql}, true, l);
  b.lin(A + "wkv.weight", {hd, D}, true, l);
  b.vec(A + "kv_norm.weight", {hd}, l);
  b.lin(A + "wo_a.weight", {G * ol, H * hd / G}, true, l);
  b.lin(A + "wo_b.weight", {D, G * ol}, true, l);
  b.vec(A + "attn_sink", {H}, l);
  const std::string F = L + "ffn.";
  const int64_t I = c.moe.moe_intermediate_size;
  b.lin(F + "gate.weight", {E, D}, false, l);
  b.vec(F + "gate.bias", {E}, l);
  for (int64_t x = 0; x < E; ++x) {
    const std::string X = F + "experts." + std::to_string(x) + ".";
    b.expert(X + "w1.weight", {I, D}, l);
    b.expert(X + "w3.weight", {I, D}, l);
    b.expert(X + "w2.weight", {D, I}, l);
  }
  if (c.moe.n_shared_experts > 0) {
    const int64_t S = I * c.moe.n_shared_experts;
    b.lin(F + "shared_experts.w1.weight", {S, D}, true, l);
    b.lin(F + "shared_experts.w3.weight", {S, D}, true, l);
    b.lin(F + "shared_experts.w2.weight", {D, S}, true, l);
  }
}

// DSpark draft (MODELS.md Part A §4-5): `mtp.i.*` blocks (SWA only, their own expert count), the context
// projection on the first, the final norm, Markov and confidence heads (V4-0731: and an hc_head) on the last.
void dspark_specs(const ModelConfig& c, SpecBuilder& b) {
  const auto& d = c.draft;
  const int64_t D = c.hidden_size, hc = c.hc.hc_mult, V = c.vocab_size, r = d.markov_rank;
  const int64_t n_targets = static_cast<int64_t>(d.target_layer_ids.size());
  b.set_draft(true);
  for (int i = 0; i < d.num_layers; ++i) {
    const std::string M = "mtp." + std::to_string(i) + ".";
    const int l = c.num_layers + i;
    v4_block_specs(c, b, M, l, d.n_routed_experts);
    if (i == 0) {
      b.lin(M + "main_proj.weight", {D, n_targets * D}, true, l);
      b.vec(M + "main_norm.weight", {D}, l);
    }
    if (i + 1 == d.num_layers) {
      b.vec(M + "norm.weight", {D}, l);
      b.embedding(M + "markov_head.embed.weight", {V, r});
      b.embedding(M + "markov_head.head.weight", {V, r});
      b.lin(M + "confidence_head.proj.weight", {1, D + r}, false, l);
      if (c.family != ModelFamily::kDeepseekV41) {
        b.vec(M + "hc_head_fn", {hc, hc * D}, l);
        b.vec(M + "hc_head_base", {hc}, l);
        b.vec(M + "hc_head_scale", {1}, l);
      }
    }
  }
  b.set_draft(false);
}

// V4-Flash base MTP modules (MODELS.md Part A §4; vLLM deepseek_v4_mtp): `mtp.i.*` = one V4 block (SWA only,
// the target's expert count) plus enorm, hnorm, e_proj, h_proj, the shared head's norm and an hc_head. Embedding
// and head are the target's.
void v4_mtp_specs(const ModelConfig& c, SpecBuilder& b) {
  const int64_t D = c.hidden_size, hc = c.hc.hc_mult;
  b.set_draft(true);
  for (int i = 0; i < c.draft.num_layers; ++i) {
    const std::string M = "mtp." + std::to_string(i) + ".";
    const int l = c.num_layers + i;
    v4_block_specs(c, b, M, l, c.moe.n_routed_experts);
    b.vec(M + "enorm.weight", {D}, l);
    b.vec(M + "hnorm.weight", {D}, l);
    b.lin(M + "e_proj.weight", {D, D}, true, l);
    b.lin(M + "h_proj.weight", {D, D}, true, l);
    b.vec(M + "norm.weight", {D}, l);
    b.vec(M + "hc_head_fn", {hc, hc * D}, l);
    b.vec(M + "hc_head_base", {hc}, l);
    b.vec(M + "hc_head_scale", {1}, l);
  }
  b.set_draft(false);
}

void v4_specs(const ModelConfig& c, SpecBuilder& b) {
  const int64_t D = c.hidden_size, H = c.num_heads, hc = c.hc.hc_mult;
  const auto& a = c.attn;
  const int64_t hd = a.head_dim, ql = a.q_lora_rank, G = a.o_groups, ol = a.o_lora_rank;
  const int64_t IH = a.index_n_heads, Id = a.index_head_dim;
  const int64_t n_mix = (2 + hc) * hc;
  const bool v41 = c.family == ModelFamily::kDeepseekV41;
  b.embedding("embed.weight", {c.vocab_size, D});
  for (const auto& p : c.layers) {
    const int l = p.index;
    const std::string L = "layers." + std::to_string(l) + ".";
    b.vec(L + "attn_norm.weight", {D}, l);
    b.vec(L + "ffn_norm.weight", {D}, l);
    for (const char* site : {"attn", "ffn"}) {
      b.vec(L + "hc_" + site + "_fn", {n_mix, hc * D}, l);
      b.vec(L + "hc_" + site + "_base", {n_mix}, l);
      b.vec(L + "hc_" + site + "_scale", {3}, l);
    }
    const std::string A = L + "attn.";
    b.lin(A + "wq_a.weight", {ql, D}, true, l);
    b.vec(A + "q_norm.weight", {ql}, l);
    b.lin(A + "wq_b.weight", {H * hd, ql}, true, l);
    b.lin(A + "wkv.weight", {hd, D}, true, l);
    b.vec(A + "kv_norm.weight", {hd}, l);
    b.lin(A + "wo_a.weight", {G * ol, H * hd / G}, true, l);
    b.lin(A + "wo_b.weight", {D, G * ol}, true, l);
    b.vec(A + "attn_sink", {H}, l);
    const int r = p.compress_ratio;
    if (p.attention == AttentionKind::kCSA || p.attention == AttentionKind::kHCA) {
      // V4: CSA compressors overlap two windows (2x width); both carry learned position biases.
      const int64_t w = p.attention == AttentionKind::kCSA ? 2 * hd : hd;
      b.lin(A + "compressor.wkv.weight", {w, D}, false, l);
      b.lin(A + "compressor.wgate.weight", {w, D}, false, l);
      b.vec(A + "compressor.ape", {r, w}, l);
      b.vec(A + "compressor.norm.weight", {hd}, l);
      if (p.attention == AttentionKind::kCSA) {
        b.lin(A + "indexer.wq_b.weight", {IH * Id, ql}, true, l);
        b.lin(A + "indexer.weights_proj.weight", {IH, D}, false, l);
        b.lin(A + "indexer.compressor.wkv.weight", {2 * Id, D}, false, l);
        b.lin(A + "indexer.compressor.wgate.weight", {2 * Id, D}, false, l);
        b.vec(A + "indexer.compressor.ape", {r, 2 * Id}, l);
        b.vec(A + "indexer.compressor.norm.weight", {Id}, l);
      }
    } else if (p.attention == AttentionKind::kCSA2) {
      if (p.kv_source == l) {
        b.lin(A + "compressor.wkv.weight", {hd, D}, false, l);
        if (r > 1) b.lin(A + "compressor.wgate.weight", {hd, D}, false, l);
        b.vec(A + "compressor.norm.weight", {hd}, l);
        b.lin(A + "indexer.wk.weight", {Id, hd}, false, l);
        b.vec(A + "indexer.k_norm.weight", {Id}, l);
      }
      if (p.index_source == l) {
        b.lin(A + "indexer.wq_b.weight", {IH * Id, ql}, true, l);
        b.lin(A + "indexer.weights_proj.weight", {IH, D}, false, l);
      }
    }
    if (p.engram) {
      size_t k = 0;
      while (c.engram.layer_ids[k] != l) ++k;
      const auto& e = c.engram;
      const int64_t cols = static_cast<int64_t>(e.max_ngram_size - 1) * e.n_heads;
      b.engram_table(L + "engram.embed.weight", {e.num_embeddings[k], e.head_dim}, l);
      b.lin(L + "engram.wkv.weight", {(hc + 1) * D, cols * e.head_dim}, true, l);
      b.vec(L + "engram.q_weight", {hc, D}, l);
      b.vec(L + "engram.k_weight", {hc, D}, l);
    }
    const std::string F = L + "ffn.";
    const int64_t E = c.moe.n_routed_experts, I = c.moe.moe_intermediate_size;
    b.lin(F + "gate.weight", {E, D}, false, l);
    if (p.routing == RoutingKind::kHash) {
      b.int_table(F + "gate.tid2eid", {c.vocab_size, c.moe.num_experts_per_tok}, l);
    } else {
      b.vec(F + "gate.bias", {E}, l);
      if (v41) b.vec(F + "gate.bias_vl", {E}, l);
    }
    for (int64_t x = 0; x < E; ++x) {
      const std::string X = F + "experts." + std::to_string(x) + ".";
      b.expert(X + "w1.weight", {I, D}, l);
      b.expert(X + "w3.weight", {I, D}, l);
      b.expert(X + "w2.weight", {D, I}, l);
    }
    if (c.moe.n_shared_experts > 0) {
      const int64_t S = I * c.moe.n_shared_experts;
      b.lin(F + "shared_experts.w1.weight", {S, D}, true, l);
      b.lin(F + "shared_experts.w3.weight", {S, D}, true, l);
      b.lin(F + "shared_experts.w2.weight", {D, S}, true, l);
    }
  }
  b.vec("norm.weight", {D});
  b.embedding("head.weight", {c.vocab_size, D});
  if (!v41) {
    b.vec("hc_head_fn", {hc, hc * D});
    b.vec("hc_head_base", {hc});
    b.vec("hc_head_scale", {1});
  }
  if (c.draft.kind == DraftKind::kDSpark) dspark_specs(c, b);
  if (c.draft.kind == DraftKind::kMTP && c.family == ModelFamily::kDeepseekV4) v4_mtp_specs(c, b);
}

bool is_float_storage(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

std::string dtype_and_shape(const SafetensorsEntry& e) {
  return std::string(dtype_safetensors_name(e.dtype)) + shape_str(e.shape);
}

}  // namespace

std::vector<WeightSpec> expected_weights(const ModelConfig& c) {
  SpecBuilder b(c);
  if (c.family == ModelFamily::kDeepseekV3) {
    v3_specs(c, b);
  } else {
    v4_specs(c, b);
  }
  return b.take();
}

WeightCheck check_weights(const ModelConfig& c, const Checkpoint& ck) {
  WeightCheck out;
  std::set<std::string> used;
  out.specs = expected_weights(c);  // ResolvedWeight::spec points into this vector (stable after this line)
  auto lookup = [&](const WeightSpec& s, std::string& found_name) -> const SafetensorsEntry* {
    std::vector<std::string> names{s.name};
    names.insert(names.end(), s.aliases.begin(), s.aliases.end());
    for (const std::string& n : names) {
      if (const SafetensorsEntry* e = ck.find(n)) {
        found_name = n;
        return e;
      }
    }
    return nullptr;
  };
  for (const auto& s : out.specs) {
    std::string ignored;
    if (s.draft && lookup(s, ignored) != nullptr) out.has_draft = true;
  }
  for (const auto& s : out.specs) {
    if (s.draft && !out.has_draft) continue;  // no draft in this checkpoint: complete without one
    std::string found_name;
    const SafetensorsEntry* w = lookup(s, found_name);
    if (w == nullptr) {
      out.problems.push_back("missing tensor '" + s.name + "' " + shape_str(s.shape));
      continue;
    }
    used.insert(found_name);
    ResolvedWeight r;
    r.spec = &s;
    r.name = found_name;
    r.weight = w;
    r.bytes = w->end - w->begin;
    auto bad = [&](const std::string& why) {
      out.problems.push_back("tensor '" + found_name + "' is " + dtype_and_shape(*w) + ": " + why);
    };
    auto find_scale = [&]() -> const SafetensorsEntry* {
      for (const auto& n : scale_names(found_name)) {
        if (const auto* e = ck.find(n)) {
          used.insert(n);
          return e;
        }
      }
      return nullptr;
    };
    switch (s.kind) {
      case WeightKind::kVector:
      case WeightKind::kEmbedding:
        if (!is_float_storage(w->dtype)) {
          bad("expected a float dtype (F32/BF16/F16)");
          continue;
        }
        if (w->shape != s.shape) {
          bad("expected shape " + shape_str(s.shape));
          continue;
        }
        break;
      case WeightKind::kIntTable:
        r.format = WeightFormat::kInt;
        if (w->dtype != DType::kI32 && w->dtype != DType::kI64) {
          bad("expected I32 or I64");
          continue;
        }
        if (w->shape != s.shape) {
          bad("expected shape " + shape_str(s.shape));
          continue;
        }
        break;
      case WeightKind::kLinear:
      case WeightKind::kExpert:
      case WeightKind::kEngramTable: {
        const SafetensorsEntry* sc = nullptr;
        if (is_float_storage(w->dtype)) {
          if (w->shape != s.shape) {
            bad("expected shape " + shape_str(s.shape));
            continue;
          }
          if (s.kind == WeightKind::kEngramTable) sc = find_scale();  // HF keeps a (unit) scale beside bf16 tables
        } else if (w->dtype == DType::kF8E4M3) {
          r.format = WeightFormat::kFP8Block;
          if (w->shape != s.shape) {
            bad("expected shape " + shape_str(s.shape));
            continue;
          }
          sc = find_scale();
          Shape want = s.kind == WeightKind::kEngramTable ? Shape{s.shape[0], (s.shape[1] + 31) / 32}
                                                          : fp8_scale_shape(s.shape, c.quant);
          if (sc == nullptr) {
            bad("FP8 weight without a scale tensor (" + scale_names(found_name)[0] + ")");
            continue;
          }
          if (sc->shape != want || !(sc->dtype == DType::kE8M0 || sc->dtype == DType::kF32)) {
            out.problems.push_back("scale of '" + found_name + "' is " + dtype_and_shape(*sc) +
                                   ", expected F8_E8M0 or F32 " + shape_str(want));
            continue;
          }
        } else if ((w->dtype == DType::kI8 || w->dtype == DType::kU8) && s.kind == WeightKind::kExpert) {
          r.format = WeightFormat::kMXFP4;
          Shape packed{s.shape[0], s.shape[1] / 2};
          if (s.shape[1] % 32 != 0 || w->shape != packed) {
            bad("expected packed MXFP4 shape " + shape_str(packed) + " (two e2m1 values per byte)");
            continue;
          }
          sc = find_scale();
          Shape want{s.shape[0], s.shape[1] / 32};
          if (sc == nullptr || sc->dtype != DType::kE8M0 || sc->shape != want) {
            bad("MXFP4 weight needs an F8_E8M0 scale " + shape_str(want));
            continue;
          }
        } else {
          bad(s.kind == WeightKind::kExpert ? "expected float, F8_E4M3 (+scale) or MXFP4 (I8 + F8_E8M0 scale)"
                                            : "expected float or F8_E4M3 (+scale)");
          continue;
        }
        r.scale = sc;
        if (sc) r.bytes += sc->end - sc->begin;
        break;
      }
    }
    out.found.push_back(r);
  }
  for (const auto& n : ck.names())
    if (!used.count(n)) out.unused.push_back(n);
  return out;
}

}  // namespace deepinfer
