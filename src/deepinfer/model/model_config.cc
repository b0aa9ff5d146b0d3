#include "deepinfer/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/io/checkpoint.h"

namespace deepinfer {

using nlohmann::json;

std::string_view family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kDeepseekV3: return "deepseek_v3";
    case ModelFamily::kDeepseekV4: return "deepseek_v4";
    case ModelFamily::kDeepseekV41: return "deepseek_v41";
  }
  return "?";
}

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kMLA: return "mla";
    case AttentionKind::kSlidingWindow: return "swa";
    case AttentionKind::kCSA: return "csa";
    case AttentionKind::kHCA: return "hca";
    case AttentionKind::kCSA2: return "csa2";
  }
  return "?";
}

std::string_view csa2_role_name(Csa2Role r) {
  switch (r) {
    case Csa2Role::kNone: return "-";
    case Csa2Role::kFull: return "full";
    case Csa2Role::kIndex: return "index";
    case Csa2Role::kReindex: return "reindex";
    case Csa2Role::kReuse: return "reuse";
  }
  return "?";
}

std::string_view scoring_name(ScoringFunc s) {
  switch (s) {
    case ScoringFunc::kSigmoid: return "sigmoid";
    case ScoringFunc::kSoftmax: return "softmax";
    case ScoringFunc::kSqrtSoftplus: return "sqrtsoftplus";
  }
  return "?";
}

namespace {

// Typed field access with errors that name the file and field.
class Fields {
 public:
  Fields(const json& j, std::string what) : j_(j), what_(std::move(what)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t i64(const char* key) const {
    DI_CHECK(has(key)) << what_ << ": missing required field '" << key << "'";
    return i64_or(key, 0);
  }
  int64_t i64_or(const char* key, int64_t def) const {
    if (!has(key)) return def;
    const json& v = j_[key];
    // Integers beyond int64 arrive as unsigned or as doubles; converting those would be undefined or wrap.
    const bool in_range = v.is_number_unsigned()  ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                          : v.is_number_integer() ? true
                          : v.is_number_float()   ? std::fabs(v.get<double>()) < 9.2e18 &&
                                                      std::floor(v.get<double>()) == v.get<double>()
                                                  : false;
    DI_CHECK(in_range) << what_ << ": field '" << key << "' must be an integer in the int64 range, got " << v.dump();
    return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  }
  int pos_int(const char* key) const {
    int64_t v = i64(key);
    DI_CHECK(v > 0 && v < (int64_t{1} << 31)) << what_ << ": field '" << key << "' must be positive, got " << v;
    return static_cast<int>(v);
  }
  int int_or(const char* key, int def) const {
    int64_t v = i64_or(key, def);
    DI_CHECK(v >= 0 && v < (int64_t{1} << 31)) << what_ << ": field '" << key << "' out of range: " << v;
    return static_cast<int>(v);
  }
  double f64_or(const char* key, double def) const {
    if (!has(key)) return def;
    DI_CHECK(j_[key].is_number()) << what_ << ": field '" << key << "' must be a number, got " << j_[key].dump();
    return j_[key].get<double>();
  }
  bool bool_or(const char* key, bool def) const {
    if (!has(key)) return def;
    DI_CHECK(j_[key].is_boolean()) << what_ << ": field '" << key << "' must be true/false";
    return j_[key].get<bool>();
  }
  std::string str_or(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    DI_CHECK(j_[key].is_string()) << what_ << ": field '" << key << "' must be a string";
    return j_[key].get<std::string>();
  }
  std::vector<int> ints(const char* key) const {
    std::vector<int> out;
    if (!has(key)) return out;
    DI_CHECK(j_[key].is_array()) << what_ << ": field '" << key << "' must be a list of integers";
    for (const auto& v : j_[key]) {
      DI_CHECK(v.is_number_integer()) << what_ << ": field '" << key << "' must be a list of integers";
      out.push_back(v.get<int>());
    }
    return out;
  }
  std::vector<int64_t> eos_ids() const {
    std::vector<int64_t> out;
    if (!has("eos_token_id")) return out;
    const json& v = j_["eos_token_id"];
    if (v.is_array()) {
      for (const auto& e : v) out.push_back(e.get<int64_t>());
    } else {
      out.push_back(i64("eos_token_id"));
    }
    return out;
  }
  const json& raw() const { return j_; }
  const std::string& what() const { return what_; }

 private:
  const json& j_;
  std::string what_;
};

RopeConfig parse_rope(const json& j, const std::string& what, double default_theta, int dim) {
  RopeConfig r;
  r.dim = dim;
  Fields f(j, what);
  r.theta = f.f64_or("rope_theta", default_theta);
  std::string type = f.str_or("rope_type", f.str_or("type", "default"));
  if (type == "yarn") {
    r.yarn = true;
    r.factor = f.f64_or("factor", 1.0);
    r.original_max_position = f.i64_or("original_max_position_embeddings", 4096);
    r.beta_fast = f.f64_or("beta_fast", 32.0);
    r.beta_slow = f.f64_or("beta_slow", 1.0);
    r.mscale = f.f64_or("mscale", 1.0);
    r.mscale_all_dim = f.f64_or("mscale_all_dim", 0.0);
    r.attention_factor = f.f64_or("attention_factor", 1.0);
    DI_CHECK(r.factor >= 1.0) << what << ": yarn factor must be >= 1";
  } else {
    DI_CHECK_CODE(type == "default", ErrorCode::kUnsupported) << what << ": rope_type '" << type << "' is not supported";
  }
  DI_CHECK(r.theta > 0) << what << ": rope_theta must be positive";
  return r;
}

ScoringFunc parse_scoring(const std::string& s, const std::string& what) {
  if (s == "sigmoid") return ScoringFunc::kSigmoid;
  if (s == "softmax") return ScoringFunc::kSoftmax;
  if (s == "sqrtsoftplus") return ScoringFunc::kSqrtSoftplus;
  DI_FAIL(ErrorCode::kUnsupported) << what << ": scoring_func '" << s << "' is not supported";
}

void parse_quant(const json& root, ModelConfig& c, const std::string& what) {
  if (!root.contains("quantization_config") || root["quantization_config"].is_null()) return;
  const json& q = root["quantization_config"];
  DI_CHECK(q.is_object()) << what << ": quantization_config must be an object";
  Fields f(q, what + " quantization_config");
  std::string method = f.str_or("quant_method", "");
  DI_CHECK_CODE(method == "fp8", ErrorCode::kUnsupported)
      << what << ": quantization method '" << method << "' is not supported (fp8 is)";
  std::string fmt = f.str_or("fmt", "e4m3");
  DI_CHECK_CODE(fmt == "e4m3", ErrorCode::kUnsupported) << what << ": fp8 format '" << fmt << "' is not supported";
  c.quant.fp8 = true;
  std::vector<int> block = f.ints("weight_block_size");
  if (block.empty()) block = {128, 128};
  DI_CHECK(block.size() == 2 && block[0] > 0 && block[1] > 0) << what << ": weight_block_size must be [n, k]";
  c.quant.block_n = block[0];
  c.quant.block_k = block[1];
  c.quant.scale_ue8m0 = f.str_or("scale_fmt", c.is_v4_family() ? "ue8m0" : "") == "ue8m0";
  std::string expert = f.str_or("expert_dtype", c.is_v4_family() ? "fp4" : "fp8");
  DI_CHECK_CODE(expert == "fp4" || expert == "fp8" || expert == "bf16", ErrorCode::kUnsupported)
      << what << ": expert_dtype '" << expert << "' is not supported";
  c.quant.experts_fp4 = expert == "fp4";
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void parse_common(const Fields& f, ModelConfig& c) {
  c.vocab_size = f.i64("vocab_size");
  DI_CHECK(c.vocab_size > 0) << f.what() << ": vocab_size must be positive";
  c.hidden_size = f.pos_int("hidden_size");
  c.num_layers = f.pos_int("num_hidden_layers");
  c.num_heads = f.pos_int("num_attention_heads");
  c.rms_norm_eps = f.f64_or("rms_norm_eps", 1e-6);
  DI_CHECK(c.rms_norm_eps > 0) << f.what() << ": rms_norm_eps must be positive";
  c.max_position_embeddings = f.i64_or("max_position_embeddings", 4096);
  if (f.has("bos_token_id")) c.bos_token_id = f.i64("bos_token_id");
  c.eos_token_ids = f.eos_ids();
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.torch_dtype = f.str_or("torch_dtype", f.str_or("dtype", "bfloat16"));
  c.moe.n_routed_experts = f.int_or("n_routed_experts", 0);
  c.moe.n_shared_experts = f.int_or("n_shared_experts", 0);
  c.moe.num_experts_per_tok = f.int_or("num_experts_per_tok", 0);
  c.moe.moe_intermediate_size = f.int_or("moe_intermediate_size", 0);
  c.moe.intermediate_size = f.int_or("intermediate_size", 0);
  c.moe.norm_topk_prob = f.bool_or("norm_topk_prob", true);
  c.moe.routed_scaling_factor = f.f64_or("routed_scaling_factor", 1.0);
  c.draft.num_layers = f.int_or("num_nextn_predict_layers", 0);
  if (c.moe.n_routed_experts > 0) {
    DI_CHECK(c.moe.num_experts_per_tok > 0 && c.moe.num_experts_per_tok <= c.moe.n_routed_experts)
        << f.what() << ": num_experts_per_tok must be in [1, n_routed_experts]";
    DI_CHECK(c.moe.moe_intermediate_size > 0) << f.what() << ": moe_intermediate_size must be positive";
  }
}

LayerPlan v3_layer_plan(const ModelConfig& c, int l) {
  LayerPlan p;
  p.index = l;
  p.attention = AttentionKind::kMLA;
  const bool moe = c.moe.n_routed_experts > 0 && l >= c.moe.first_k_dense_replace && l % c.moe.moe_layer_freq == 0;
  p.routing = moe ? RoutingKind::kTopK : RoutingKind::kDense;
  return p;
}

void parse_v3(const Fields& f, ModelConfig& c) {
  const json& j = f.raw();
  c.family = ModelFamily::kDeepseekV3;
  parse_common(f, c);
  const bool v2 = c.model_type == "deepseek_v2";
  c.mla.q_lora_rank = f.int_or("q_lora_rank", 0);
  c.mla.kv_lora_rank = f.pos_int("kv_lora_rank");
  c.mla.qk_nope_head_dim = f.pos_int("qk_nope_head_dim");
  c.mla.qk_rope_head_dim = f.pos_int("qk_rope_head_dim");
  c.mla.v_head_dim = f.pos_int("v_head_dim");
  DI_CHECK(c.mla.qk_rope_head_dim % 2 == 0) << f.what() << ": qk_rope_head_dim must be even";
  c.moe.first_k_dense_replace = f.int_or("first_k_dense_replace", 0);
  c.moe.moe_layer_freq = std::max(1, f.int_or("moe_layer_freq", 1));
  c.moe.n_group = std::max(1, f.int_or("n_group", 1));
  c.moe.topk_group = std::max(1, f.int_or("topk_group", 1));
  c.moe.scoring = parse_scoring(f.str_or("scoring_func", v2 ? "softmax" : "sigmoid"), f.what());
  const std::string topk_method = f.str_or("topk_method", v2 ? "greedy" : "noaux_tc");
  DI_CHECK_CODE(topk_method == "noaux_tc" || topk_method == "greedy" || topk_method == "group_limited_greedy",
                ErrorCode::kUnsupported)
      << f.what() << ": topk_method '" << topk_method << "' is not supported";
  c.moe.has_bias = topk_method == "noaux_tc";
  c.moe.topk_method = topk_method == "noaux_tc"   ? TopkMethod::kNoauxTc
                      : topk_method == "greedy" ? TopkMethod::kGreedy
                                                : TopkMethod::kGroupLimitedGreedy;
  if (c.moe.n_routed_experts > 0) {
    DI_CHECK(c.moe.n_routed_experts % c.moe.n_group == 0) << f.what() << ": n_routed_experts % n_group != 0";
    DI_CHECK(c.moe.topk_group <= c.moe.n_group) << f.what() << ": topk_group > n_group";
  }
  if (c.moe.first_k_dense_replace > 0 || c.moe.n_routed_experts == 0)
    DI_CHECK(c.moe.intermediate_size > 0) << f.what() << ": dense layers need intermediate_size";
  // HF 5.x nests YaRN parameters in rope_parameters; older configs use rope_theta + rope_scaling.
  json rope = json::object();
  rope["rope_theta"] = f.f64_or("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (j.contains(key) && j[key].is_object())
      for (auto it = j[key].begin(); it != j[key].end(); ++it) rope[it.key()] = it.value();
  }
  c.rope = parse_rope(rope, f.what() + " rope", 10000.0, c.mla.qk_rope_head_dim);
  c.draft.kind = c.draft.num_layers > 0 ? DraftKind::kMTP : DraftKind::kNone;
  for (int l = 0; l < c.num_layers; ++l) c.layers.push_back(v3_layer_plan(c, l));
}

// V4 / V4.1 attention fields shared by both.
void parse_v4_attention(const Fields& f, ModelConfig& c) {
  c.attn.head_dim = f.pos_int("head_dim");
  c.attn.rope_dim = f.pos_int("qk_rope_head_dim");
  c.attn.q_lora_rank = f.pos_int("q_lora_rank");
  c.attn.o_groups = f.pos_int("o_groups");
  c.attn.o_lora_rank = f.pos_int("o_lora_rank");
  c.attn.sliding_window = f.pos_int("sliding_window");
  c.attn.index_n_heads = f.int_or("index_n_heads", 0);
  c.attn.index_head_dim = f.int_or("index_head_dim", 0);
  c.attn.index_topk = f.int_or("index_topk", 0);
  DI_CHECK(c.attn.rope_dim % 2 == 0 && c.attn.rope_dim <= c.attn.head_dim)
      << f.what() << ": qk_rope_head_dim must be even and <= head_dim";
  DI_CHECK(c.num_heads % c.attn.o_groups == 0) << f.what() << ": num_attention_heads % o_groups != 0";
  int kv_heads = f.int_or("num_key_value_heads", 1);
  DI_CHECK_CODE(kv_heads == 1, ErrorCode::kUnsupported) << f.what() << ": V4 attention has one KV head, got " << kv_heads;
  c.hc.hc_mult = f.pos_int("hc_mult");
  c.hc.sinkhorn_iters = f.int_or("hc_sinkhorn_iters", 20);
  c.hc.eps = f.f64_or("hc_eps", 1e-6);
  c.moe.scoring = parse_scoring(f.str_or("scoring_func", "sqrtsoftplus"), f.what());
  c.moe.has_bias = true;
  c.moe.swiglu_limit = f.f64_or("swiglu_limit", 0.0);
  c.moe.gate_temp = f.f64_or("gate_temp", 1.0);
  DI_CHECK(c.moe.gate_temp > 0) << f.what() << ": gate_temp must be positive";
  DI_CHECK(c.moe.n_routed_experts > 0) << f.what() << ": V4 models are MoE in every layer (n_routed_experts)";
  const json& j = f.raw();
  const double theta = f.f64_or("rope_theta", 10000.0);
  const double ctheta = f.f64_or("compress_rope_theta", 160000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("main")) {
    c.rope = parse_rope(j["rope_parameters"]["main"], f.what() + " rope_parameters.main", theta, c.attn.rope_dim);
    DI_CHECK(j["rope_parameters"].contains("compress")) << f.what() << ": rope_parameters has no 'compress' entry";
    c.compress_rope =
        parse_rope(j["rope_parameters"]["compress"], f.what() + " rope_parameters.compress", ctheta, c.attn.rope_dim);
  } else {
    // Released-checkpoint form: rope_theta for the main rope, compress_rope_theta + rope_scaling (YaRN).
    c.rope = parse_rope(json{{"rope_theta", theta}}, f.what(), theta, c.attn.rope_dim);
    json cr = json::object();
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) cr = j["rope_scaling"];
    cr["rope_theta"] = ctheta;
    c.compress_rope = parse_rope(cr, f.what() + " rope_scaling", ctheta, c.attn.rope_dim);
  }
}

// Per-layer compress ratios: an explicit list, or layer_types + compress_rates (HF V4).
std::vector<int> v4_compress_ratios(const Fields& f, int num_layers) {
  const json& j = f.raw();
  std::vector<int> ratios = f.ints("compress_ratios");
  if (!ratios.empty()) {
    DI_CHECK(static_cast<int>(ratios.size()) >= num_layers)
        << f.what() << ": compress_ratios has " << ratios.size() << " entries for " << num_layers << " layers";
    ratios.resize(num_layers);  // trailing entries belong to draft layers
    return ratios;
  }
  DI_CHECK(j.contains("layer_types") && j["layer_types"].is_array())
      << f.what() << ": needs compress_ratios or layer_types";
  DI_CHECK(static_cast<int>(j["layer_types"].size()) >= num_layers) << f.what() << ": layer_types is too short";
  json rates = j.contains("compress_rates") ? j["compress_rates"] : json::object();
  for (int l = 0; l < num_layers; ++l) {
    std::string t = j["layer_types"][l].get<std::string>();
    if (t == "sliding_attention") {
      ratios.push_back(0);
    } else if (t == "compressed_sparse_attention" || t == "heavily_compressed_attention") {
      int def = t == "compressed_sparse_attention" ? 4 : 128;
      ratios.push_back(rates.contains(t) ? rates[t].get<int>() : def);
    } else {
      DI_FAIL(ErrorCode::kUnsupported) << f.what() << ": layer_types[" << l << "] '" << t << "' is not supported";
    }
  }
  return ratios;
}

// Entries of compress_ratios (the list also covers the draft layers: V4-Flash-0731 and V4.1 end with one 0 per
// DSpark layer), or 0 when the config lists layer_types instead.
int ratio_entries(const Fields& f) { return static_cast<int>(f.ints("compress_ratios").size()); }

// DSpark draft (V4.1, V4-Flash-0731): recognised by its block size. The draft layer count is
// num_nextn_predict_layers, or, where a config leaves that 0, the compress_ratios entries past the main layers.
void parse_dspark(const Fields& f, ModelConfig& c, int ratio_entries) {
  c.draft.block_size = f.int_or("dspark_block_size", 0);
  if (c.draft.block_size <= 0) {
    if (c.family == ModelFamily::kDeepseekV41) c.draft.kind = DraftKind::kNone;
    return;
  }
  c.draft.noise_token_id = f.i64_or("dspark_noise_token_id", 0);
  c.draft.target_layer_ids = f.ints("dspark_target_layer_ids");
  c.draft.markov_rank = f.int_or("dspark_markov_rank", 0);
  c.draft.n_routed_experts = f.int_or("dspark_n_routed_experts", 0);
  c.draft.num_experts_per_tok = f.int_or("dspark_num_experts_per_tok", 0);
  if (c.draft.num_layers == 0 && ratio_entries > c.num_layers) c.draft.num_layers = ratio_entries - c.num_layers;
  c.draft.kind = c.draft.num_layers > 0 ? DraftKind::kDSpark : DraftKind::kNone;
  for (int l : c.draft.target_layer_ids)
    DI_CHECK(l >= 0 && l < c.num_layers) << f.what() << ": dspark target layer " << l << " out of range";
  if (c.draft.kind != DraftKind::kDSpark) return;
  const auto& t = c.draft.target_layer_ids;
  DI_CHECK(!t.empty()) << f.what() << ": dspark_target_layer_ids must list the target layers the draft reads";
  for (size_t i = 1; i < t.size(); ++i)
    DI_CHECK(t[i] > t[i - 1]) << f.what() << ": dspark_target_layer_ids must be strictly increasing";
  DI_CHECK(c.draft.markov_rank > 0) << f.what() << ": dspark_markov_rank must be positive";
  if (c.draft.n_routed_experts == 0) c.draft.n_routed_experts = c.moe.n_routed_experts;
  if (c.draft.num_experts_per_tok == 0) c.draft.num_experts_per_tok = c.moe.num_experts_per_tok;
  DI_CHECK(c.draft.num_experts_per_tok >= 1 && c.draft.num_experts_per_tok <= c.draft.n_routed_experts)
      << f.what() << ": dspark_num_experts_per_tok must be in [1, dspark_n_routed_experts]";
}

void parse_v4(const Fields& f, ModelConfig& c) {
  const json& j = f.raw();
  c.family = ModelFamily::kDeepseekV4;
  parse_common(f, c);
  parse_v4_attention(f, c);
  c.attn.q_head_norm = true;
  std::vector<int> ratios = v4_compress_ratios(f, c.num_layers);
  // Hash-routed layers: mlp_layer_types (HF) or num_hash_layers (released).
  std::vector<bool> hash(c.num_layers, false);
  if (j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array()) {
    DI_CHECK(static_cast<int>(j["mlp_layer_types"].size()) >= c.num_layers) << f.what() << ": mlp_layer_types too short";
    for (int l = 0; l < c.num_layers; ++l) {
      std::string t = j["mlp_layer_types"][l].get<std::string>();
      DI_CHECK_CODE(t == "moe" || t == "hash_moe", ErrorCode::kUnsupported)
          << f.what() << ": mlp_layer_types[" << l << "] '" << t << "' is not supported";
      hash[l] = t == "hash_moe";
    }
  } else {
    int n = f.int_or("num_hash_layers", 0);
    for (int l = 0; l < std::min(n, c.num_layers); ++l) hash[l] = true;
  }
  c.draft.kind = c.draft.num_layers > 0 ? DraftKind::kMTP : DraftKind::kNone;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerPlan p;
    p.index = l;
    p.compress_ratio = ratios[l];
    DI_CHECK(ratios[l] >= 0) << f.what() << ": negative compress ratio at layer " << l;
    if (ratios[l] == 0) {
      p.attention = AttentionKind::kSlidingWindow;
    } else {
      p.attention = ratios[l] == 4 ? AttentionKind::kCSA : AttentionKind::kHCA;
      p.compress_rope = true;
      p.kv_source = l;
      if (p.attention == AttentionKind::kCSA) {
        p.index_source = l;
        DI_CHECK(c.attn.index_n_heads > 0 && c.attn.index_head_dim > 0 && c.attn.index_topk > 0)
            << f.what() << ": CSA layer " << l << " needs index_n_heads, index_head_dim and index_topk";
      }
    }
    p.routing = hash[l] ? RoutingKind::kHash : RoutingKind::kTopK;
    c.layers.push_back(p);
  }
  parse_dspark(f, c, ratio_entries(f));  // V4-Flash-0731
}

void parse_v41(const Fields& f, ModelConfig& c) {
  c.family = ModelFamily::kDeepseekV41;
  parse_common(f, c);
  parse_v4_attention(f, c);
  c.attn.q_head_norm = false;
  c.attn.candidate_topk_blocks = f.int_or("candidate_topk_blocks", 0);
  c.attn.candidate_block_size = f.int_or("candidate_block_size", 0);
  std::vector<int> ratios = v4_compress_ratios(f, c.num_layers);
  c.kv_source_layer_ids = f.ints("kv_source_layer_ids");
  c.index_source_layer_ids = f.ints("index_source_layer_ids");
  c.candidate_source_layer_id = static_cast<int>(f.i64_or("candidate_source_layer_id", -1));
  for (int l : c.kv_source_layer_ids)
    DI_CHECK(l >= 0 && l < c.num_layers && ratios[l] > 0)
        << f.what() << ": kv_source_layer_ids entry " << l << " is not a compressed layer";
  for (int l : c.index_source_layer_ids)
    DI_CHECK(l >= 0 && l < c.num_layers && ratios[l] > 0)
        << f.what() << ": index_source_layer_ids entry " << l << " is not a compressed layer";
  if (c.candidate_source_layer_id >= 0) {
    DI_CHECK(contains(c.index_source_layer_ids, c.candidate_source_layer_id))
        << f.what() << ": candidate_source_layer_id " << c.candidate_source_layer_id << " is not an index source";
    DI_CHECK(c.attn.candidate_topk_blocks > 0 && c.attn.candidate_block_size > 0)
        << f.what() << ": candidate source needs candidate_topk_blocks and candidate_block_size";
  }
  int last_kv = -1, last_index = -1;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerPlan p;
    p.index = l;
    p.compress_ratio = ratios[l];
    p.routing = RoutingKind::kTopK;
    if (ratios[l] == 0) {
      p.attention = AttentionKind::kSlidingWindow;
    } else {
      p.attention = AttentionKind::kCSA2;
      p.compress_rope = true;
      if (contains(c.kv_source_layer_ids, l)) last_kv = l;
      DI_CHECK(last_kv >= 0 && ratios[last_kv] == ratios[l])
          << f.what() << ": compressed layer " << l << " (ratio " << ratios[l]
          << ") has no preceding kv source of the same ratio";
      p.kv_source = last_kv;
      const bool own_index = contains(c.index_source_layer_ids, l);
      if (own_index) last_index = l;
      DI_CHECK(last_index >= 0) << f.what() << ": compressed layer " << l << " has no preceding index source";
      DI_CHECK(last_index == l || c.layers[last_index].kv_source == last_kv)
          << f.what() << ": layer " << l << " would reuse the selection of layer " << last_index
          << " over different compressed entries";
      p.index_source = last_index;
      p.candidate_source = l == c.candidate_source_layer_id;
      const bool kv_owner = last_kv == l;
      if (!own_index) {
        p.csa2_role = Csa2Role::kReuse;
      } else if (kv_owner) {
        p.csa2_role = Csa2Role::kFull;
      } else if (c.candidate_source_layer_id >= 0 && l > c.candidate_source_layer_id &&
                 c.layers[c.candidate_source_layer_id].kv_source == last_kv) {
        p.csa2_role = Csa2Role::kReindex;
      } else {
        p.csa2_role = Csa2Role::kIndex;
      }
      if (own_index)
        DI_CHECK(c.attn.index_n_heads > 0 && c.attn.index_head_dim > 0 && c.attn.index_topk > 0)
            << f.what() << ": index source layer " << l << " needs index_n_heads, index_head_dim and index_topk";
    }
    c.layers.push_back(p);
  }
  // Engram
  c.engram.layer_ids = f.ints("engram_layer_ids");
  if (c.engram.enabled()) {
    const json& j = f.raw();
    DI_CHECK(j.contains("engram_num_embeddings") && j["engram_num_embeddings"].is_array() &&
             j["engram_num_embeddings"].size() == c.engram.layer_ids.size())
        << f.what() << ": engram_num_embeddings must list one row count per Engram layer";
    for (const auto& v : j["engram_num_embeddings"]) c.engram.num_embeddings.push_back(v.get<int64_t>());
    c.engram.vocab_size = f.i64("engram_vocab_size");
    c.engram.max_ngram_size = f.pos_int("engram_max_ngram_size");
    c.engram.n_heads = f.pos_int("engram_n_heads");
    c.engram.head_dim = f.pos_int("engram_head_dim");
    c.engram.pad_id = f.int_or("engram_pad_id", 2);
    c.engram.compressed_vocab_size = f.i64_or("engram_compressed_vocab_size", 0);
    DI_CHECK(c.engram.max_ngram_size >= 2) << f.what() << ": engram_max_ngram_size must be >= 2";
    for (int l : c.engram.layer_ids) {
      DI_CHECK(l >= 0 && l < c.num_layers) << f.what() << ": engram layer " << l << " out of range";
      c.layers[l].engram = true;
    }
  }
  parse_dspark(f, c, ratio_entries(f));
}

}  // namespace

LayerPlan mtp_layer_plan(const ModelConfig& c, int k) {
  DI_CHECK(c.family == ModelFamily::kDeepseekV3) << "MTP layers are V3-family layers";
  DI_CHECK(k >= 0 && k < c.draft.num_layers) << "MTP layer " << k << " of " << c.draft.num_layers;
  return v3_layer_plan(c, c.num_layers + k);
}

ModelConfig parse_model_config(const std::string& text, const std::string& what) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    DI_FAIL(ErrorCode::kInvalidArgument) << what << ": not valid JSON (" << e.what() << ")";
  }
  DI_CHECK(root.is_object()) << what << ": must be a JSON object";
  DI_CHECK(root.contains("model_type") && root["model_type"].is_string()) << what << ": missing 'model_type'";
  ModelConfig c;
  c.model_type = root["model_type"].get<std::string>();
  try {
    if (c.model_type == "deepseek_v3" || c.model_type == "deepseek_v2") {
      parse_v3(Fields(root, what), c);
    } else if (c.model_type == "deepseek_v4") {
      parse_v4(Fields(root, what), c);
    } else if (c.model_type == "deepseek_v41" || c.model_type == "deepseek_v41_text") {
      const bool nested = root.contains("text_config") && root["text_config"].is_object();
      DI_CHECK(nested || c.model_type == "deepseek_v41_text") << what << ": deepseek_v41 config needs 'text_config'";
      const json& text_cfg = nested ? root["text_config"] : root;
      if (nested && root.contains("image_token_id") && root["image_token_id"].is_number_integer())
        c.image_token_id = root["image_token_id"].get<int64_t>();
      c.family = ModelFamily::kDeepseekV41;
      parse_v41(Fields(text_cfg, what + " text_config"), c);
    } else {
      DI_FAIL(ErrorCode::kUnsupported) << what << ": model_type '" << c.model_type
                                       << "' is not supported (deepseek_v2, deepseek_v3, deepseek_v4, deepseek_v41)";
    }
  } catch (const json::exception& e) {
    DI_FAIL(ErrorCode::kInvalidArgument) << what << ": malformed field (" << e.what() << ")";
  }
  c.family = c.model_type == "deepseek_v4" ? ModelFamily::kDeepseekV4
             : (c.model_type.rfind("deepseek_v41", 0) == 0) ? ModelFamily::kDeepseekV41
                                                             : ModelFamily::kDeepseekV3;
  parse_quant(root, c, what);
  return c;
}

ModelConfig load_model_config(const std::string& path) { return parse_model_config(read_text_file(path), path); }

bool cached_rows_quantized(const ModelConfig& c) {
  // Window rows FP8 in blocks of 32, entries FP4 in blocks of 16, indexer keys FP4 in blocks of 32.
  return c.family == ModelFamily::kDeepseekV41 && c.attn.head_dim % 32 == 0 && c.attn.index_head_dim % 32 == 0;
}

double attention_softmax_scale(const ModelConfig& c) {
  if (c.family != ModelFamily::kDeepseekV3) return 1.0 / std::sqrt(static_cast<double>(c.attn.head_dim));
  double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim));
  if (c.rope.yarn && c.rope.mscale_all_dim != 0 && c.rope.factor > 1) {
    double m = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

}  // namespace deepinfer
