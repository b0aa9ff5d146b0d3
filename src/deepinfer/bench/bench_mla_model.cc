#include "deepinfer/bench/bench_mla_model.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {

MlaBenchModel v3_slice(int moe_layers) {
  DI_CHECK(moe_layers >= 1) << "bench: the V3 slice needs >= 1 MoE layer, got " << moe_layers;
  MlaBenchModel m;
  m.name = "V3";
  m.hidden = 7168;
  m.heads = 128;
  m.q_lora = 1536;
  m.kv_lora = 512;
  m.rope_dim = 64;
  m.nope_dim = 128;
  m.v_dim = 128;
  m.experts = 256;
  m.topk = 8;
  m.moe_inter = 2048;
  m.shared_experts = 1;
  m.dense_inter = 18432;
  m.n_group = 8;
  m.topk_group = 4;
  m.sigmoid_router = true;
  m.route_scale = 2.5f;
  m.dense_layers = 1;
  m.moe_layers = moe_layers;
  m.proj_format = BenchFormat::kFP8Block;
  m.ffn_format = BenchFormat::kFP8Block;
  m.block = 128;
  return m;
}

MlaBenchModel v2_lite_model(BenchFormat ffn) {
  DI_CHECK(ffn == BenchFormat::kBF16 || ffn == BenchFormat::kF32)
      << "bench: V2-Lite's FFN is bf16 (as released) or f32, not " << bench_format_name(ffn);
  MlaBenchModel m;
  m.name = "V2-Lite";
  m.hidden = 2048;
  m.heads = 16;
  m.q_lora = 0;
  m.kv_lora = 512;
  m.rope_dim = 64;
  m.nope_dim = 128;
  m.v_dim = 128;
  m.experts = 64;
  m.topk = 6;
  m.moe_inter = 1408;
  m.shared_experts = 2;
  m.dense_inter = 10944;
  m.sigmoid_router = false;
  m.route_scale = 1.0f;
  m.dense_layers = 1;
  m.moe_layers = 26;
  m.proj_format = BenchFormat::kBF16;
  m.ffn_format = ffn;
  return m;
}

MlaBenchModel tiny_mla() {
  MlaBenchModel m;
  m.name = "tiny-mla";
  m.hidden = 64;
  m.heads = 4;
  m.q_lora = 32;
  m.kv_lora = 32;
  m.rope_dim = 8;
  m.nope_dim = 16;
  m.v_dim = 16;
  m.experts = 8;
  m.topk = 2;
  m.moe_inter = 32;
  m.shared_experts = 1;
  m.dense_inter = 64;
  m.n_group = 4;
  m.topk_group = 2;
  m.sigmoid_router = true;
  m.route_scale = 2.5f;
  m.dense_layers = 1;
  m.moe_layers = 2;
  m.block = 32;
  return m;
}

double mla_naive_macs(const MlaBenchModel& m, int64_t seqs, int64_t rows, int64_t queries, double key_visits) {
  (void)queries;
  const double h = static_cast<double>(m.heads);
  return static_cast<double>(seqs) * rows * h * (m.nope_dim + m.v_dim) * m.kv_lora +
         key_visits * h * (m.nope_dim + m.rope_dim + m.v_dim);
}

double mla_absorbed_macs(const MlaBenchModel& m, int64_t queries, double key_visits) {
  const double h = static_cast<double>(m.heads);
  return static_cast<double>(queries) * h * (m.nope_dim + m.v_dim) * m.kv_lora +
         key_visits * h * (2 * m.kv_lora + m.rope_dim);
}

StepCost count_mla_step(const MlaBenchModel& m, const StepShape& s) {
  DI_CHECK(s.seqs >= 1 && s.tokens >= 1 && s.context >= s.tokens)
      << "bench: a step needs seqs >= 1, tokens >= 1 and context >= tokens (got " << s.seqs << ", " << s.tokens << ", "
      << s.context << ")";
  const int64_t d = m.hidden, h = m.heads, qk = m.nope_dim + m.rope_dim, tt = s.seqs * s.tokens;
  const double t = static_cast<double>(tt);
  const int b = m.block;
  // Keys seen by the step's queries: positions context − tokens .. context − 1 see p + 1 rows each.
  double visits = 0;
  for (int64_t p = s.context - s.tokens; p < s.context; ++p) visits += static_cast<double>(p + 1);
  visits *= static_cast<double>(s.seqs);
  StepCost c;
  for (int64_t l = 0; l < m.layers(); ++l) {
    // Projections.
    if (m.q_lora > 0) {
      c.flops += 2 * t * static_cast<double>(m.q_lora * d + h * qk * m.q_lora);
      c.weight_bytes += format_bytes(m.proj_format, m.q_lora, d, b) + format_bytes(m.proj_format, h * qk, m.q_lora, b);
    } else {
      c.flops += 2 * t * static_cast<double>(h * qk * d);
      c.weight_bytes += format_bytes(m.proj_format, h * qk, d, b);
    }
    c.flops += 2 * t * static_cast<double>(m.row() * d + d * h * m.v_dim);
    c.weight_bytes += format_bytes(m.proj_format, m.row(), d, b) + format_bytes(m.proj_format, d, h * m.v_dim, b);
    // Attention (the cheaper form) with kv_b read as f32, and every sequence's rows read once.
    c.flops += 2 * std::min(mla_naive_macs(m, s.seqs, s.context, tt, visits), mla_absorbed_macs(m, tt, visits));
    c.weight_bytes += 4.0 * static_cast<double>(h * (m.nope_dim + m.v_dim) * m.kv_lora);
    const double value_bytes = s.prefill ? 4.0 : static_cast<double>(m.kv_value_bytes);
    const double rows = value_bytes * static_cast<double>(s.seqs) * static_cast<double>(s.context) * m.row();
    c.cache_bytes += rows;
    c.attention_bytes += rows;
    // FFN.
    if (l < m.dense_layers) {
      c.flops += 2 * t * 3.0 * static_cast<double>(d * m.dense_inter);
      c.weight_bytes +=
          2 * format_bytes(m.ffn_format, m.dense_inter, d, b) + format_bytes(m.ffn_format, d, m.dense_inter, b);
      continue;
    }
    c.flops += 2 * t * static_cast<double>(m.experts * d);
    c.weight_bytes += 4.0 * static_cast<double>(m.experts * d);
    c.flops += 2 * t * static_cast<double>(m.topk + m.shared_experts) * 3 * d * m.moe_inter;
    c.weight_bytes +=
        expected_distinct_experts(m.experts, m.topk, tt) *
        (2 * format_bytes(m.ffn_format, m.moe_inter, d, b) + format_bytes(m.ffn_format, d, m.moe_inter, b));
    if (m.shared_experts > 0) {
      const int64_t si = m.shared_experts * m.moe_inter;
      c.weight_bytes += 2 * format_bytes(m.ffn_format, si, d, b) + format_bytes(m.ffn_format, d, si, b);
    }
  }
  return c;
}

}  // namespace deepinfer::bench
