#include "deepinfer/ops/kernel_choice_args.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

using cuda::KernelPick;
using cuda::WgmmaDecode;
using cuda::WgmmaTile;

constexpr std::pair<KernelPick, std::string_view> kPicks[] = {
    {KernelPick::kAuto, "auto"}, {KernelPick::kNever, "never"}, {KernelPick::kAlways, "always"}};
constexpr std::pair<WgmmaDecode, std::string_view> kDecodes[] = {{WgmmaDecode::kByFormat, "by_format"},
                                                                 {WgmmaDecode::kProducer, "producer"},
                                                                 {WgmmaDecode::kSplit, "split"},
                                                                 {WgmmaDecode::kConsumers, "consumers"},
                                                                 {WgmmaDecode::kProducerStaged, "producer_staged"}};
constexpr std::pair<WgmmaTile, std::string_view> kTiles[] = {{WgmmaTile::kByRows, "by_rows"},
                                                             {WgmmaTile::k128x256, "128x256"},
                                                             {WgmmaTile::k256x128, "256x128"},
                                                             {WgmmaTile::kMixed, "mixed"}};
constexpr std::string_view kKeys =
    "attn_mma, indexer_mma, topk_small_blocks, wgmma, wgmma_exact, wgmma_decode, wgmma_tile, wgmma_split_k, wgmma_fp8, "
    "wgmma_fp8_wide, lt_fp8_block, mla_tf32, mla_bf16x3, mla_flash, mla_flash_rows, paged_mla_mma, mla_lazy_rescale, "
    "mla_flash_split_s, mla_flash_wgmma, "
    "rows_mma, "
    "rows_mma_bf16_a, bf16_split_a, "
    "rows_mma_pdl, rows_mma_warps, rows_mma_kw, rows_mma_splits, rows_mma_share, stream_mma_max_rows, f32_scale_mma, "
    "decode_direct_max_rows, grouped_one_launch_rows";

template <class T, size_t N>
std::string names(const std::pair<T, std::string_view> (&table)[N]) {
  std::string out;
  for (const auto& [v, name] : table) out += (out.empty() ? "" : " | ") + std::string(name);
  return out;
}

template <class T, size_t N>
T lookup(const std::pair<T, std::string_view> (&table)[N], std::string_view value, const std::string& spec) {
  for (const auto& [v, name] : table)
    if (name == value) return v;
  DI_FAIL(ErrorCode::kInvalidArgument) << "--kernel-choice " << spec << ": the value must be one of " << names(table);
}

template <class T, size_t N>
std::string_view name_of(const std::pair<T, std::string_view> (&table)[N], T v) {
  for (const auto& [value, name] : table)
    if (value == v) return name;
  return "?";
}

// One of `allowed`, or "default" (0: the kernel's rule).
int shape_value(std::string_view value, const std::string& spec, std::initializer_list<int> allowed) {
  if (value == "default") return 0;
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  const bool ok = ec == std::errc() && end == value.data() + value.size() &&
                  std::find(allowed.begin(), allowed.end(), v) != allowed.end();
  if (!ok) {
    std::string list;
    for (int a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
    DI_FAIL(ErrorCode::kInvalidArgument) << "--kernel-choice " << spec << ": the value must be one of " << list
                                         << " or 'default'";
  }
  return v;
}

// A row count >= 0, or "default" (-1).
int64_t rows_value(std::string_view value, const std::string& spec) {
  if (value == "default") return -1;
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  DI_CHECK_CODE(ec == std::errc() && end == value.data() + value.size() && v >= 0, ErrorCode::kInvalidArgument)
      << "--kernel-choice " << spec << ": the value must be a row count >= 0 or 'default'";
  return v;
}

// A switch: "0" or "1".
bool flag_value(std::string_view value, const std::string& spec) {
  DI_CHECK_CODE(value == "0" || value == "1", ErrorCode::kInvalidArgument)
      << "--kernel-choice " << spec << ": the value must be 0 or 1";
  return value == "1";
}

}  // namespace

cuda::KernelChoices parse_kernel_choices(const std::vector<std::string>& specs) {
  cuda::KernelChoices c;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    DI_CHECK_CODE(eq != std::string::npos && eq > 0, ErrorCode::kInvalidArgument)
        << "--kernel-choice '" << spec << "': expected KEY=VALUE with KEY one of " << kKeys;
    const std::string_view key = std::string_view(spec).substr(0, eq), value = std::string_view(spec).substr(eq + 1);
    if (key == "attn_mma") {
      c.attn_mma = lookup(kPicks, value, spec);
    } else if (key == "indexer_mma") {
      c.indexer_mma = lookup(kPicks, value, spec);
    } else if (key == "topk_small_blocks") {
      c.topk_small_blocks = lookup(kPicks, value, spec);
    } else if (key == "wgmma") {
      c.gemm.wgmma = lookup(kPicks, value, spec);
    } else if (key == "wgmma_exact") {
      c.gemm.wgmma_exact = flag_value(value, spec);
    } else if (key == "wgmma_decode") {
      c.gemm.wgmma_decode = lookup(kDecodes, value, spec);
    } else if (key == "wgmma_tile") {
      c.gemm.wgmma_tile = lookup(kTiles, value, spec);
    } else if (key == "wgmma_split_k") {
      c.gemm.wgmma_split_k = lookup(kPicks, value, spec);
    } else if (key == "wgmma_fp8") {
      c.gemm.wgmma_fp8 = lookup(kPicks, value, spec);
    } else if (key == "wgmma_fp8_wide") {
      c.gemm.wgmma_fp8_wide = shape_value(value, spec, {0, 1, 2});
    } else if (key == "lt_fp8_block") {
      c.gemm.lt_fp8_block = lookup(kPicks, value, spec);
    } else if (key == "mla_tf32") {
      c.mla_tf32 = flag_value(value, spec);
    } else if (key == "mla_bf16x3") {
      c.mla_bf16x3 = flag_value(value, spec);
    } else if (key == "mla_flash") {
      c.mla_flash = flag_value(value, spec);
    } else if (key == "mla_flash_rows") {
      c.mla_flash_rows = shape_value(value, spec, {64, 128});
    } else if (key == "paged_mla_mma") {
      c.paged_mla_mma = lookup(kPicks, value, spec);
    } else if (key == "mla_lazy_rescale") {
      c.mla_lazy_rescale = flag_value(value, spec);
    } else if (key == "mla_flash_split_s") {
      c.mla_flash_split_s = flag_value(value, spec);
    } else if (key == "mla_flash_wgmma") {
      c.mla_flash_wgmma = flag_value(value, spec);
    } else if (key == "rows_mma") {
      c.gemm.rows_mma = lookup(kPicks, value, spec);
    } else if (key == "rows_mma_bf16_a") {
      c.gemm.rows_mma_bf16_a = flag_value(value, spec);
    } else if (key == "bf16_split_a") {
      c.gemm.bf16_split_a = flag_value(value, spec);
    } else if (key == "rows_mma_pdl") {
      c.gemm.rows_mma_pdl = flag_value(value, spec);
    } else if (key == "rows_mma_warps") {
      c.gemm.rows_mma_warps = shape_value(value, spec, {4, 8, 16});
    } else if (key == "rows_mma_kw") {
      c.gemm.rows_mma_kw = shape_value(value, spec, {1, 2, 4, 8});
    } else if (key == "rows_mma_splits") {
      c.gemm.rows_mma_splits = shape_value(value, spec, {1, 2, 4, 8});
    } else if (key == "rows_mma_share") {
      c.gemm.rows_mma_share = shape_value(value, spec, {1, 2, 4, 8});
    } else if (key == "stream_mma_max_rows") {
      c.gemm.stream_mma_max_rows = rows_value(value, spec);
    } else if (key == "f32_scale_mma") {
      c.gemm.f32_scale_mma = flag_value(value, spec);
    } else if (key == "decode_direct_max_rows") {
      c.gemm.decode_direct_max_rows = rows_value(value, spec);
    } else if (key == "grouped_one_launch_rows") {
      c.grouped_one_launch_rows = rows_value(value, spec);
    } else {
      DI_FAIL(ErrorCode::kInvalidArgument)
          << "--kernel-choice " << spec << ": unknown key '" << key << "' (one of " << kKeys << ")";
    }
  }
  return c;
}

std::string describe_kernel_choices(const cuda::KernelChoices& c) {
  const cuda::KernelChoices d;
  std::string out;
  const auto add = [&](std::string_view key, const std::string& value) {
    out += (out.empty() ? "" : ", ") + std::string(key) + "=" + value;
  };
  if (c.attn_mma != d.attn_mma) add("attn_mma", std::string(name_of(kPicks, c.attn_mma)));
  if (c.indexer_mma != d.indexer_mma) add("indexer_mma", std::string(name_of(kPicks, c.indexer_mma)));
  if (c.topk_small_blocks != d.topk_small_blocks)
    add("topk_small_blocks", std::string(name_of(kPicks, c.topk_small_blocks)));
  if (c.gemm.wgmma != d.gemm.wgmma) add("wgmma", std::string(name_of(kPicks, c.gemm.wgmma)));
  if (c.gemm.wgmma_exact != d.gemm.wgmma_exact) add("wgmma_exact", c.gemm.wgmma_exact ? "1" : "0");
  if (c.gemm.wgmma_decode != d.gemm.wgmma_decode)
    add("wgmma_decode", std::string(name_of(kDecodes, c.gemm.wgmma_decode)));
  if (c.gemm.wgmma_tile != d.gemm.wgmma_tile) add("wgmma_tile", std::string(name_of(kTiles, c.gemm.wgmma_tile)));
  if (c.gemm.wgmma_split_k != d.gemm.wgmma_split_k)
    add("wgmma_split_k", std::string(name_of(kPicks, c.gemm.wgmma_split_k)));
  if (c.gemm.wgmma_fp8 != d.gemm.wgmma_fp8) add("wgmma_fp8", std::string(name_of(kPicks, c.gemm.wgmma_fp8)));
  if (c.gemm.wgmma_fp8_wide != d.gemm.wgmma_fp8_wide) add("wgmma_fp8_wide", std::to_string(c.gemm.wgmma_fp8_wide));
  if (c.gemm.lt_fp8_block != d.gemm.lt_fp8_block)
    add("lt_fp8_block", std::string(name_of(kPicks, c.gemm.lt_fp8_block)));
  if (c.mla_tf32 != d.mla_tf32) add("mla_tf32", c.mla_tf32 ? "1" : "0");
  if (c.mla_bf16x3 != d.mla_bf16x3) add("mla_bf16x3", c.mla_bf16x3 ? "1" : "0");
  if (c.mla_flash != d.mla_flash) add("mla_flash", c.mla_flash ? "1" : "0");
  if (c.mla_flash_rows != d.mla_flash_rows)
    add("mla_flash_rows", c.mla_flash_rows == 0 ? "default" : std::to_string(c.mla_flash_rows));
  if (c.paged_mla_mma != d.paged_mla_mma) add("paged_mla_mma", std::string(name_of(kPicks, c.paged_mla_mma)));
  if (c.mla_lazy_rescale != d.mla_lazy_rescale) add("mla_lazy_rescale", c.mla_lazy_rescale ? "1" : "0");
  if (c.mla_flash_split_s != d.mla_flash_split_s) add("mla_flash_split_s", c.mla_flash_split_s ? "1" : "0");
  if (c.mla_flash_wgmma != d.mla_flash_wgmma) add("mla_flash_wgmma", c.mla_flash_wgmma ? "1" : "0");
  if (c.gemm.rows_mma != d.gemm.rows_mma) add("rows_mma", std::string(name_of(kPicks, c.gemm.rows_mma)));
  if (c.gemm.rows_mma_bf16_a != d.gemm.rows_mma_bf16_a) add("rows_mma_bf16_a", c.gemm.rows_mma_bf16_a ? "1" : "0");
  if (c.gemm.bf16_split_a != d.gemm.bf16_split_a) add("bf16_split_a", c.gemm.bf16_split_a ? "1" : "0");
  if (c.gemm.rows_mma_pdl != d.gemm.rows_mma_pdl) add("rows_mma_pdl", c.gemm.rows_mma_pdl ? "1" : "0");
  if (c.gemm.rows_mma_warps != d.gemm.rows_mma_warps) add("rows_mma_warps", std::to_string(c.gemm.rows_mma_warps));
  if (c.gemm.rows_mma_kw != d.gemm.rows_mma_kw) add("rows_mma_kw", std::to_string(c.gemm.rows_mma_kw));
  if (c.gemm.rows_mma_splits != d.gemm.rows_mma_splits) add("rows_mma_splits", std::to_string(c.gemm.rows_mma_splits));
  if (c.gemm.rows_mma_share != d.gemm.rows_mma_share) add("rows_mma_share", std::to_string(c.gemm.rows_mma_share));
  if (c.gemm.stream_mma_max_rows != d.gemm.stream_mma_max_rows)
    add("stream_mma_max_rows", c.gemm.stream_mma_max_rows < 0 ? "default" : std::to_string(c.gemm.stream_mma_max_rows));
  if (c.gemm.f32_scale_mma != d.gemm.f32_scale_mma) add("f32_scale_mma", c.gemm.f32_scale_mma ? "1" : "0");
  if (c.gemm.decode_direct_max_rows != d.gemm.decode_direct_max_rows)
    add("decode_direct_max_rows",
        c.gemm.decode_direct_max_rows < 0 ? "default" : std::to_string(c.gemm.decode_direct_max_rows));
  if (c.grouped_one_launch_rows != d.grouped_one_launch_rows)
    add("grouped_one_launch_rows",
        c.grouped_one_launch_rows < 0 ? "default" : std::to_string(c.grouped_one_launch_rows));
  return out;
}

}  // namespace deepinfer
