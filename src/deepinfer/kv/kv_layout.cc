#include "deepinfer/kv/kv_layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"

namespace deepinfer {

namespace {

int max_compress_ratio_lcm(const ModelConfig& c) {
  int l = 1;
  for (const auto& p : c.layers)
    if (p.compress_ratio > 0) l = std::lcm(l, p.compress_ratio);
  return l;
}

CacheKindSpec classify(const CacheKind& k, const ModelConfig& c) {
  CacheKindSpec s{k, k.bytes_per_token > 0, true, 0};
  if (k.name == "mla_latent" || k.name == "compressed_kv" || k.name == "index_keys" || k.name == "engram_lookback")
    return s;
  if (k.name == "swa_ring") {
    s.prefix_reusable = false;
    s.replay_tokens = c.attn.sliding_window;
    return s;
  }
  if (k.name == "compressor_state") {
    // V4.1 groups never overlap: at a block boundary nothing is pending. V4's overlapping CSA compressor also
    // carries the previous window's slice, which only re-running that window rebuilds.
    if (c.family != ModelFamily::kDeepseekV41) {
      s.prefix_reusable = false;
      for (const auto& p : c.layers)
        if (p.attention == AttentionKind::kCSA) s.replay_tokens = std::max(s.replay_tokens, p.compress_ratio);
      if (s.replay_tokens == 0) s.prefix_reusable = true;  // HCA only: empty at a multiple-of-ratio boundary
    }
    return s;
  }
  DI_FAIL(ErrorCode::kInternal) << "cache kind '" << k.name << "' has no prefix-reuse classification (kv_layout.cc)";
}

}  // namespace

double KvLayout::bytes_per_token() const {
  double t = 0;
  for (const auto& k : kinds) t += k.kind.bytes_per_token;
  return t;
}

int64_t KvLayout::bytes_per_block() const {
  if (storage) return storage->bytes_per_block;
  return static_cast<int64_t>(std::ceil(bytes_per_token() * block_size));
}

int64_t KvLayout::bytes_per_sequence() const {
  if (storage) return storage->bytes_per_slot;
  int64_t t = 0;
  for (const auto& k : kinds) t += k.kind.bytes_per_sequence;
  return t;
}

int KvLayout::replay_tokens() const {
  int r = 0;
  for (const auto& k : kinds)
    if (!k.prefix_reusable) r = std::max(r, k.replay_tokens);
  return r;
}

int default_block_size(const ModelConfig& c) { return std::lcm(64, max_compress_ratio_lcm(c)); }

KvLayout make_kv_layout(const ModelConfig& c, int block_size) {
  KvLayout layout;
  layout.block_size = block_size > 0 ? block_size : default_block_size(c);
  const int ratios = max_compress_ratio_lcm(c);
  DI_CHECK(layout.block_size % ratios == 0)
      << "block_size " << layout.block_size << " must be a multiple of every compression ratio (lcm " << ratios
      << ") so that each block holds whole compressed entries";
  for (const auto& k : cache_kinds(c)) layout.kinds.push_back(classify(k, c));
  return layout;
}

int64_t kv_budget_bytes(int64_t total_bytes, double utilization, int64_t weight_bytes, int64_t activation_bytes) {
  DI_CHECK(utilization > 0 && utilization <= 1) << "memory utilization must be in (0, 1], got " << utilization;
  const int64_t usable = static_cast<int64_t>(static_cast<double>(total_bytes) * utilization);
  const int64_t left = usable - weight_bytes - activation_bytes;
  DI_CHECK_CODE(left > 0, ErrorCode::kResourceExhausted)
      << "no memory left for the KV cache: " << usable << " usable bytes (" << utilization << " of " << total_bytes
      << ") - " << weight_bytes << " weights - " << activation_bytes << " activations";
  return left;
}

KvSizing size_kv_cache(const KvLayout& layout, int64_t budget_bytes, int max_num_seqs, int64_t max_model_len) {
  DI_CHECK(max_num_seqs >= 1) << "max_num_seqs must be >= 1, got " << max_num_seqs;
  DI_CHECK(max_model_len >= 1) << "max_model_len must be >= 1, got " << max_model_len;
  KvSizing s;
  const int64_t per_block = layout.bytes_per_block();
  const int64_t per_seq = layout.bytes_per_sequence();
  const int64_t blocks_per_seq = (max_model_len + layout.block_size - 1) / layout.block_size;
  const int64_t slot_bytes = per_seq * max_num_seqs;
  const int64_t one_seq = per_seq + blocks_per_seq * per_block;
  DI_CHECK_CODE(budget_bytes >= slot_bytes + blocks_per_seq * per_block, ErrorCode::kResourceExhausted)
      << "KV cache budget of " << budget_bytes << " bytes cannot hold " << max_num_seqs
      << " sequences' fixed state (" << per_seq << " B each) plus one sequence of max_model_len " << max_model_len
      << " tokens (" << blocks_per_seq * per_block << " B); one sequence needs " << one_seq
      << " B: raise the memory budget or lower max_model_len / max_num_seqs";
  s.num_state_slots = max_num_seqs;
  if (per_block > 0) {
    const int64_t blocks = (budget_bytes - slot_bytes) / per_block;
    // Block ids are int32; a larger pool would need > 2^31 blocks of memory anyway.
    s.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  } else {
    s.num_blocks = static_cast<int32_t>(blocks_per_seq * max_num_seqs);  // no paged kinds: blocks cost nothing
  }
  s.token_capacity = static_cast<int64_t>(s.num_blocks) * layout.block_size;
  s.max_concurrency = static_cast<int32_t>(std::min<int64_t>(max_num_seqs, s.num_blocks / blocks_per_seq));
  s.bytes_used = slot_bytes + static_cast<int64_t>(s.num_blocks) * per_block;
  return s;
}

KvCacheConfig make_kv_cache_config(const KvLayout& layout, const KvSizing& sizing, bool enable_prefix_cache,
                                   bool allow_bounded_replay) {
  KvCacheConfig k;
  k.num_blocks = sizing.num_blocks;
  k.block_size = layout.block_size;
  k.num_state_slots = sizing.num_state_slots;
  k.prefix_replay_tokens = layout.replay_tokens();
  k.enable_prefix_cache = enable_prefix_cache && (k.prefix_replay_tokens == 0 || allow_bounded_replay);
  return k;
}

std::string describe_kv_cache(const KvLayout& layout, const KvSizing& s, int64_t max_model_len) {
  std::string out;
  for (const auto& k : layout.kinds) {
    out += fmt::format("  {:<18} {:>3} layers  {}  {}{}\n", k.kind.name, k.kind.num_layers,
                       k.paged ? fmt::format("{:.2f} B/token", k.kind.bytes_per_token)
                               : fmt::format("{} B/sequence", k.kind.bytes_per_sequence),
                       k.kind.format,
                       k.prefix_reusable ? "" : fmt::format("  (prefix reuse re-runs the last {} tokens)", k.replay_tokens));
  }
  if (layout.storage)
    out += fmt::format(
        "  as the model runner stores them: {} B/block ({:.1f} B/token; design formats above {:.1f} B/token), "
        "{} B per state slot\n",
        layout.storage->bytes_per_block, static_cast<double>(layout.storage->bytes_per_block) / layout.block_size,
        layout.bytes_per_token(), layout.storage->bytes_per_slot);
  out += fmt::format(
      "KV cache: {} blocks x {} tokens ({} B/block) + {} state slots ({} B each) = {:.1f} MiB; {} tokens fit, "
      "max concurrency {} at max_model_len {}",
      s.num_blocks, layout.block_size, layout.bytes_per_block(), s.num_state_slots, layout.bytes_per_sequence(),
      static_cast<double>(s.bytes_used) / (1 << 20), s.token_capacity, s.max_concurrency, max_model_len);
  return out;
}

void log_kv_sizing(const KvLayout& layout, const KvSizing& sizing, int64_t max_model_len) {
  DI_LOG_INFO("{}", describe_kv_cache(layout, sizing, max_model_len));
}

}  // namespace deepinfer
