// ModelConfig: config.json parsed once into plain, validated structs, plus the derived per-layer plan.
// Field meanings follow ../shared/docs/MODELS.md. Runtime parameters (batch sizes, memory budgets) live in
// the engine's own config, not here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer {

// kDeepseekV3 covers model_type deepseek_v3 (V3, R1, V3.1) and deepseek_v2 (V2-Lite): the same MLA math.
enum class ModelFamily { kDeepseekV3, kDeepseekV4, kDeepseekV41 };
std::string_view family_name(ModelFamily f);

enum class AttentionKind {
  kMLA,            // V3 family: multi-head latent attention
  kSlidingWindow,  // V4/V4.1 ratio-0 layers: SWA branch only
  kCSA,            // V4 ratio-4 compressed sparse attention with its own indexer
  kHCA,            // V4 heavily compressed attention (large ratio, every entry attended)
  kCSA2,           // V4.1 shared compressed attention (entries owned by a kv-source layer)
};
std::string_view attention_kind_name(AttentionKind k);

// How a V4.1 CSA2 layer gets its selection (MODELS.md §2.3).
enum class Csa2Role {
  kNone,
  kFull,     // owns the compressor (kv source) and scores with its own indexer query
  kIndex,    // scores with its own indexer query over another layer's entries
  kReindex,  // like kIndex, restricted to the candidate pool of the candidate-source layer
  kReuse,    // reuses the latest index source's top-k
};
std::string_view csa2_role_name(Csa2Role r);

enum class RoutingKind { kDense, kTopK, kHash };
// V3-family expert selection (config `topk_method`): top-k over all experts (V2-Lite), top-k within the best
// groups by max score (V2), or by the sum of the top-2 biased scores (V3 noaux_tc).
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class ScoringFunc { kSigmoid, kSoftmax, kSqrtSoftplus };
std::string_view scoring_name(ScoringFunc s);

struct RopeConfig {
  double theta = 10000.0;
  int dim = 64;  // rotated channels (the last `dim` of a head for V4, the rope slice for MLA)
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;          // V3 YaRN
  double mscale_all_dim = 0.0;  // V3 YaRN; softmax scale gets m^2 when != 0
  double attention_factor = 1.0;
};

struct QuantConfig {
  bool fp8 = false;       // dense linears stored as F8_E4M3 with block scales
  int block_n = 128;      // scale block over output rows
  int block_k = 128;      // scale block over input columns
  bool scale_ue8m0 = false;  // scales stored as F8_E8M0 (V4/V4.1) rather than F32 weight_scale_inv (V3)
  bool experts_fp4 = false;  // routed experts as MXFP4 (I8 packed + E8M0 per 32 inputs)
};

struct MlaConfig {
  int q_lora_rank = 0;  // 0: single q_proj (V2-Lite)
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
};

struct V4AttentionConfig {
  int head_dim = 512;
  int rope_dim = 64;
  int q_lora_rank = 1024;
  int o_groups = 8;
  int o_lora_rank = 1024;
  int sliding_window = 128;
  int index_n_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  int candidate_topk_blocks = 0;  // V4.1
  int candidate_block_size = 0;   // V4.1
  bool q_head_norm = false;       // V4: per-head unweighted RMSNorm of q
};

struct MoeConfig {
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int intermediate_size = 0;  // dense layers (V3 family)
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring = ScoringFunc::kSigmoid;
  bool has_bias = false;       // e_score_correction_bias / gate.bias
  TopkMethod topk_method = TopkMethod::kNoauxTc;  // V3 family
  double gate_temp = 1.0;      // V4.1
  double swiglu_limit = 0.0;   // 0: no clamp
};

struct HyperConnectionConfig {
  int hc_mult = 1;  // 1: plain residual (V3)
  int sinkhorn_iters = 0;
  double eps = 0.0;
};

struct EngramConfig {
  std::vector<int> layer_ids;
  std::vector<int64_t> num_embeddings;  // table rows per Engram layer
  int64_t vocab_size = 0;               // prime search start
  int max_ngram_size = 0;
  int n_heads = 0;
  int head_dim = 0;
  int pad_id = 0;
  int64_t compressed_vocab_size = 0;
  bool enabled() const { return !layer_ids.empty(); }
};

enum class DraftKind { kNone, kMTP, kDSpark };

struct DraftConfig {
  DraftKind kind = DraftKind::kNone;
  int num_layers = 0;
  // DSpark
  int block_size = 0;
  int64_t noise_token_id = 0;
  std::vector<int> target_layer_ids;
  int markov_rank = 0;
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
};

struct LayerPlan {
  int index = 0;
  AttentionKind attention = AttentionKind::kMLA;
  int compress_ratio = 0;
  bool compress_rope = false;  // V4/V4.1: ratio > 0 layers use the YaRN "compress" rope
  // V4.1 CSA2
  Csa2Role csa2_role = Csa2Role::kNone;
  int kv_source = -1;     // layer that owns the compressed entries this layer attends
  int index_source = -1;  // layer whose indexer selection this layer uses
  bool candidate_source = false;
  RoutingKind routing = RoutingKind::kDense;
  bool engram = false;  // Engram update applied at the start of this layer
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kDeepseekV3;
  std::string model_type;  // as written in config.json
  int64_t vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  bool tie_word_embeddings = false;
  std::string torch_dtype = "bfloat16";

  MlaConfig mla;              // kDeepseekV3
  V4AttentionConfig attn;     // kDeepseekV4 / kDeepseekV41
  RopeConfig rope;            // main rope (MLA rope for V3)
  RopeConfig compress_rope;   // V4/V4.1 ratio > 0 layers
  MoeConfig moe;
  HyperConnectionConfig hc;
  EngramConfig engram;
  DraftConfig draft;
  QuantConfig quant;
  std::optional<int64_t> image_token_id;  // V4.1

  std::vector<LayerPlan> layers;
  // V4.1 CSA2 lists as given (also reflected in `layers`).
  std::vector<int> kv_source_layer_ids;
  std::vector<int> index_source_layer_ids;
  int candidate_source_layer_id = -1;

  bool is_v4_family() const { return family != ModelFamily::kDeepseekV3; }
};

// Parses config.json text; `what` names the file in errors. Unknown model_type or inconsistent fields throw
// InvalidArgument / Unsupported with the field name.
ModelConfig parse_model_config(const std::string& json_text, const std::string& what = "config.json");
ModelConfig load_model_config(const std::string& path);

// The softmax scale of attention logits (V3: with the YaRN m^2 correction; V4: head_dim^-0.5).
double attention_softmax_scale(const ModelConfig& c);
// Whether every row the paged caches hold is FP8 / FP4 fake-quantized (V4.1 whose head and indexer widths are whole
// 32-value blocks: the reference leaves unblockable rows unquantized), so that a bf16 cache holds each exactly.
bool cached_rows_quantized(const ModelConfig& c);
// V3 family: the plan of MTP layer k (checkpoint index num_layers + k; MoE by the same rule as main layers).
LayerPlan mtp_layer_plan(const ModelConfig& c, int k);

}  // namespace deepinfer
