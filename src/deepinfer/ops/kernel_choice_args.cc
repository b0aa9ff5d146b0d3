#include "deepinfer/ops/kernel_choice_args.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// One of `allowed` (the caller takes "default" apart).
int shape_value(std::string_view value, const std::string& spec, const std::vector<int>& allowed) {
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

// One --kernel-choice key: how its value parses into the choices and how it prints when it differs from the default.
struct Key {
  std::string_view name;
  std::function<void(cuda::KernelChoices&, std::string_view value, const std::string& spec)> parse;
  std::function<std::string(const cuda::KernelChoices&)> print;
  std::function<bool(const cuda::KernelChoices&, const cuda::KernelChoices&)> same;
};

// The field a key sets, reached the same way in a const and a mutable KernelChoices (`[](auto& c) -> auto& {...}`).
template <class Field>
Key make_key(std::string_view name, Field field,
             std::function<void(cuda::KernelChoices&, std::string_view, const std::string&)> parse,
             std::function<std::string(const cuda::KernelChoices&)> print) {
  return {name, std::move(parse), std::move(print),
          [field](const cuda::KernelChoices& a, const cuda::KernelChoices& b) { return field(a) == field(b); }};
}
template <class T, size_t N, class Field>
Key named(std::string_view name, const std::pair<T, std::string_view> (&table)[N], Field field) {
  return make_key(
      name, field,
      [&table, field](cuda::KernelChoices& c, std::string_view v, const std::string& spec) {
        field(c) = lookup(table, v, spec);
      },
      [&table, field](const cuda::KernelChoices& c) { return std::string(name_of(table, field(c))); });
}
template <class Field>
Key pick(std::string_view name, Field field) {
  return named(name, kPicks, field);
}
template <class Field>
Key flag(std::string_view name, Field field) {
  return make_key(
      name, field,
      [field](cuda::KernelChoices& c, std::string_view v, const std::string& spec) { field(c) = flag_value(v, spec); },
      [field](const cuda::KernelChoices& c) { return std::string(field(c) ? "1" : "0"); });
}
// One of `allowed`, or "default": the default choice's value (0 = the kernel's rule for most keys, printed as
// "default" where 0 is not one of `allowed`; wgmma_fp8_wide's 1).
template <class Field>
Key shape(std::string_view name, Field field, std::initializer_list<int> allowed) {
  const std::vector<int> values(allowed);
  const bool zero_allowed = std::find(values.begin(), values.end(), 0) != values.end();
  return make_key(
      name, field,
      [field, values](cuda::KernelChoices& c, std::string_view v, const std::string& spec) {
        static const cuda::KernelChoices defaults;
        field(c) = v == "default" ? field(defaults) : shape_value(v, spec, values);
      },
      [field, zero_allowed](const cuda::KernelChoices& c) {
        return field(c) == 0 && !zero_allowed ? std::string("default") : std::to_string(field(c));
      });
}
template <class Field>
Key rows(std::string_view name, Field field) {
  return make_key(
      name, field,
      [field](cuda::KernelChoices& c, std::string_view v, const std::string& spec) { field(c) = rows_value(v, spec); },
      [field](const cuda::KernelChoices& c) {
        return field(c) < 0 ? std::string("default") : std::to_string(field(c));
      });
}

// Every key, in the order describe_kernel_choices prints them.
const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      pick(
          "attn_mma", [](auto& c) -> auto& { return c.attn_mma; }),
      pick(
          "indexer_mma", [](auto& c) -> auto& { return c.indexer_mma; }),
      flag(
          "indexer_mma_decode", [](auto& c) -> auto& { return c.indexer_mma_decode; }),
      flag(
          "indexer_mma_ring", [](auto& c) -> auto& { return c.indexer_mma_ring; }),
      pick(
          "topk_small_blocks", [](auto& c) -> auto& { return c.topk_small_blocks; }),
      pick(
          "wgmma", [](auto& c) -> auto& { return c.gemm.wgmma; }),
      flag(
          "wgmma_exact", [](auto& c) -> auto& { return c.gemm.wgmma_exact; }),
      named(
          "wgmma_decode", kDecodes, [](auto& c) -> auto& { return c.gemm.wgmma_decode; }),
      named(
          "wgmma_tile", kTiles, [](auto& c) -> auto& { return c.gemm.wgmma_tile; }),
      pick(
          "wgmma_split_k", [](auto& c) -> auto& { return c.gemm.wgmma_split_k; }),
      pick(
          "wgmma_fp8", [](auto& c) -> auto& { return c.gemm.wgmma_fp8; }),
      shape("wgmma_fp8_wide", [](auto& c) -> auto& { return c.gemm.wgmma_fp8_wide; }, {0, 1, 2}),
      pick(
          "lt_fp8_block", [](auto& c) -> auto& { return c.gemm.lt_fp8_block; }),
      flag(
          "mla_tf32", [](auto& c) -> auto& { return c.mla_tf32; }),
      flag(
          "mla_bf16x3", [](auto& c) -> auto& { return c.mla_bf16x3; }),
      flag(
          "mla_flash", [](auto& c) -> auto& { return c.mla_flash; }),
      shape("mla_flash_rows", [](auto& c) -> auto& { return c.mla_flash_rows; }, {64, 128}),
      pick(
          "paged_mla_mma", [](auto& c) -> auto& { return c.paged_mla_mma; }),
      flag(
          "mla_lazy_rescale", [](auto& c) -> auto& { return c.mla_lazy_rescale; }),
      flag(
          "paged_mla_16", [](auto& c) -> auto& { return c.paged_mla_16; }),
      flag(
          "paged_mla_ahead", [](auto& c) -> auto& { return c.paged_mla_ahead; }),
      flag(
          "paged_mla_two_blocks", [](auto& c) -> auto& { return c.paged_mla_two_blocks; }),
      flag(
          "mla_flash_split_s", [](auto& c) -> auto& { return c.mla_flash_split_s; }),
      flag(
          "mla_flash_wgmma", [](auto& c) -> auto& { return c.mla_flash_wgmma; }),
      pick(
          "rows_mma", [](auto& c) -> auto& { return c.gemm.rows_mma; }),
      flag(
          "rows_mma_bf16_a", [](auto& c) -> auto& { return c.gemm.rows_mma_bf16_a; }),
      flag(
          "bf16_split_a", [](auto& c) -> auto& { return c.gemm.bf16_split_a; }),
      flag(
          "rows_mma_pdl", [](auto& c) -> auto& { return c.gemm.rows_mma_pdl; }),
      flag(
          "rows_mma_waves", [](auto& c) -> auto& { return c.gemm.rows_mma_waves; }),
      pick(
          "rows_mma_wgmma", [](auto& c) -> auto& { return c.gemm.rows_mma_wgmma; }),
      shape("rows_mma_warps", [](auto& c) -> auto& { return c.gemm.rows_mma_warps; }, {4, 8, 16}),
      shape("rows_mma_kw", [](auto& c) -> auto& { return c.gemm.rows_mma_kw; }, {1, 2, 4, 8}),
      shape("rows_mma_splits", [](auto& c) -> auto& { return c.gemm.rows_mma_splits; }, {1, 2, 4, 8}),
      shape("rows_mma_share", [](auto& c) -> auto& { return c.gemm.rows_mma_share; }, {1, 2, 4, 8}),
      rows(
          "stream_mma_max_rows", [](auto& c) -> auto& { return c.gemm.stream_mma_max_rows; }),
      rows(
          "stream_mma_one_row_tiles", [](auto& c) -> auto& { return c.gemm.stream_mma_one_row_tiles; }),
      flag(
          "f32_scale_mma", [](auto& c) -> auto& { return c.gemm.f32_scale_mma; }),
      rows(
          "decode_direct_max_rows", [](auto& c) -> auto& { return c.gemm.decode_direct_max_rows; }),
      flag(
          "moe_shared_stream", [](auto& c) -> auto& { return c.moe_shared_stream; }),
      rows(
          "grouped_one_launch_rows", [](auto& c) -> auto& { return c.grouped_one_launch_rows; }),
      flag(
          "grouped_output_one_launch", [](auto& c) -> auto& { return c.grouped_output_one_launch; }),
  };
  return k;
}

std::string key_list() {
  std::string out;
  for (const Key& k : keys()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

}  // namespace

cuda::KernelChoices parse_kernel_choices(const std::vector<std::string>& specs) {
  cuda::KernelChoices c;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    DI_CHECK_CODE(eq != std::string::npos && eq > 0, ErrorCode::kInvalidArgument)
        << "--kernel-choice '" << spec << "': expected KEY=VALUE with KEY one of " << key_list();
    const std::string_view key = std::string_view(spec).substr(0, eq), value = std::string_view(spec).substr(eq + 1);
    const auto& all = keys();
    const auto it = std::find_if(all.begin(), all.end(), [&](const Key& k) { return k.name == key; });
    DI_CHECK_CODE(it != all.end(), ErrorCode::kInvalidArgument)
        << "--kernel-choice " << spec << ": unknown key '" << key << "' (one of " << key_list() << ")";
    it->parse(c, value, spec);
  }
  return c;
}

std::string describe_kernel_choices(const cuda::KernelChoices& c) {
  const cuda::KernelChoices d;
  std::string out;
  for (const Key& k : keys())
    if (!k.same(c, d)) out += (out.empty() ? "" : ", ") + std::string(k.name) + "=" + k.print(c);
  return out;
}

}  // namespace deepinfer
