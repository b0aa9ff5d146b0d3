// `--kernel-choice` (ops/kernel_choice_args.h): every key and value parses into the CUDA backend's kernel choices and
// prints back the same way; bad specs are InvalidArgument naming what is accepted.
#include "deepinfer/ops/kernel_choice_args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

using cuda::KernelPick;
using cuda::WgmmaDecode;
using cuda::WgmmaTile;

TEST(KernelChoiceArgs, NoneIsTheDefaults) {
  const cuda::KernelChoices c = parse_kernel_choices({});
  EXPECT_EQ(c.attn_mma, KernelPick::kAuto);
  EXPECT_EQ(c.gemm.wgmma_tile, WgmmaTile::kByRows);
  EXPECT_EQ(c.gemm.stream_mma_max_rows, -1);
  EXPECT_TRUE(c.gemm.f32_scale_mma);
  EXPECT_EQ(c.gemm.decode_direct_max_rows, -1);
  EXPECT_EQ(c.gemm.wgmma_split_k, KernelPick::kAuto);
  EXPECT_EQ(c.gemm.wgmma_fp8, KernelPick::kAuto);
  EXPECT_EQ(c.gemm.wgmma_fp8_wide, 1);
  EXPECT_EQ(c.gemm.rows_mma, KernelPick::kAuto);
  EXPECT_EQ(describe_kernel_choices(c), "");
}

TEST(KernelChoiceArgs, EveryKeyParsesAndPrintsBack) {
  const std::vector<std::string> specs = {"attn_mma=never",
                                          "indexer_mma=always",
                                          "indexer_mma_decode=0",
                                          "indexer_mma_ring=0",
                                          "topk_small_blocks=never",
                                          "wgmma=never",
                                          "wgmma_exact=1",
                                          "wgmma_decode=producer_staged",
                                          "wgmma_tile=256x128",
                                          "wgmma_split_k=never",
                                          "wgmma_fp8=always",
                                          "wgmma_fp8_wide=2",
                                          "lt_fp8_block=never",
                                          "mla_tf32=1",
                                          "mla_bf16x3=0",
                                          "mla_flash=0",
                                          "mla_flash_rows=128",
                                          "paged_mla_mma=never",
                                          "mla_lazy_rescale=0",
                                          "paged_mla_16=0",
                                          "paged_mla_ahead=0",
                                          "paged_mla_two_blocks=0",
                                          "mla_flash_split_s=0",
                                          "mla_flash_wgmma=0",
                                          "rows_mma=never",
                                          "rows_mma_bf16_a=1",
                                          "bf16_split_a=0",
                                          "rows_mma_pdl=1",
                                          "rows_mma_waves=0",
                                          "rows_mma_wgmma=never",
                                          "rows_mma_warps=4",
                                          "rows_mma_kw=2",
                                          "rows_mma_splits=8",
                                          "rows_mma_share=2",
                                          "stream_mma_max_rows=0",
                                          "stream_mma_one_row_tiles=512",
                                          "f32_scale_mma=0",
                                          "decode_direct_max_rows=256",
                                          "moe_shared_stream=0",
                                          "grouped_one_launch_rows=1000",
                                          "grouped_output_one_launch=1"};
  const cuda::KernelChoices c = parse_kernel_choices(specs);
  EXPECT_EQ(c.attn_mma, KernelPick::kNever);
  EXPECT_EQ(c.indexer_mma, KernelPick::kAlways);
  EXPECT_FALSE(c.indexer_mma_decode);  // on by default
  EXPECT_FALSE(c.indexer_mma_ring);    // on by default
  EXPECT_EQ(c.topk_small_blocks, KernelPick::kNever);
  EXPECT_EQ(c.gemm.wgmma, KernelPick::kNever);
  EXPECT_TRUE(c.gemm.wgmma_exact);
  EXPECT_EQ(c.gemm.wgmma_decode, WgmmaDecode::kProducerStaged);
  EXPECT_EQ(c.gemm.wgmma_tile, WgmmaTile::k256x128);
  EXPECT_EQ(c.gemm.wgmma_split_k, KernelPick::kNever);
  EXPECT_EQ(c.gemm.wgmma_fp8, KernelPick::kAlways);
  EXPECT_EQ(c.gemm.wgmma_fp8_wide, 2);
  EXPECT_EQ(c.gemm.lt_fp8_block, KernelPick::kNever);
  EXPECT_TRUE(c.mla_tf32);
  EXPECT_FALSE(c.mla_bf16x3);  // on by default
  EXPECT_FALSE(c.mla_flash);
  EXPECT_EQ(c.mla_flash_rows, 128);
  EXPECT_EQ(c.paged_mla_mma, KernelPick::kNever);
  EXPECT_FALSE(c.mla_lazy_rescale);   // on by default
  EXPECT_FALSE(c.paged_mla_16);       // on by default
  EXPECT_FALSE(c.paged_mla_ahead);    // on by default
  EXPECT_FALSE(c.mla_flash_split_s);  // on by default
  EXPECT_FALSE(c.mla_flash_wgmma);    // on by default
  EXPECT_EQ(c.gemm.rows_mma, KernelPick::kNever);
  EXPECT_TRUE(c.gemm.rows_mma_bf16_a);
  EXPECT_FALSE(c.gemm.bf16_split_a);  // on by default
  EXPECT_TRUE(c.gemm.rows_mma_pdl);
  EXPECT_EQ(c.gemm.rows_mma_wgmma, KernelPick::kNever);
  EXPECT_FALSE(c.gemm.rows_mma_waves);  // on by default
  EXPECT_EQ(c.gemm.rows_mma_warps, 4);
  EXPECT_EQ(c.gemm.rows_mma_kw, 2);
  EXPECT_EQ(c.gemm.rows_mma_splits, 8);
  EXPECT_EQ(c.gemm.rows_mma_share, 2);
  EXPECT_EQ(c.gemm.stream_mma_max_rows, 0);
  EXPECT_EQ(c.gemm.stream_mma_one_row_tiles, 512);
  EXPECT_FALSE(c.gemm.f32_scale_mma);
  EXPECT_EQ(c.gemm.decode_direct_max_rows, 256);
  EXPECT_FALSE(c.moe_shared_stream);  // on by default
  EXPECT_EQ(c.grouped_one_launch_rows, 1000);
  EXPECT_TRUE(c.grouped_output_one_launch);
  std::string joined;
  for (const std::string& s : specs) joined += (joined.empty() ? "" : ", ") + s;
  EXPECT_EQ(describe_kernel_choices(c), joined);
  // What it prints parses back to the same choices.
  std::vector<std::string> again;
  for (size_t b = 0, e; b < joined.size(); b = e + 2) {
    e = joined.find(", ", b);
    if (e == std::string::npos) e = joined.size();
    again.push_back(joined.substr(b, e - b));
  }
  EXPECT_EQ(describe_kernel_choices(parse_kernel_choices(again)), joined);
}

TEST(KernelChoiceArgs, LaterSpecsWinAndDefaultsPrintNothing) {
  const cuda::KernelChoices c =
      parse_kernel_choices({"wgmma_tile=mixed", "wgmma_tile=by_rows", "stream_mma_max_rows=4", "wgmma_decode=split"});
  EXPECT_EQ(c.gemm.wgmma_tile, WgmmaTile::kByRows);
  EXPECT_EQ(describe_kernel_choices(c), "wgmma_decode=split, stream_mma_max_rows=4");
  EXPECT_EQ(parse_kernel_choices({"stream_mma_max_rows=4", "stream_mma_max_rows=default"}).gemm.stream_mma_max_rows,
            -1);
  // "default" is the default choice's value, whatever it is (wgmma_fp8_wide's is the wide tile, 1).
  EXPECT_EQ(parse_kernel_choices({"wgmma_fp8_wide=0", "wgmma_fp8_wide=default"}).gemm.wgmma_fp8_wide,
            cuda::KernelChoices{}.gemm.wgmma_fp8_wide);
  EXPECT_EQ(describe_kernel_choices(parse_kernel_choices({"wgmma_fp8_wide=default", "rows_mma_kw=default"})), "");
}

void expect_rejected(const std::string& spec, const std::string& says) {
  try {
    parse_kernel_choices({spec});
    ADD_FAILURE() << spec << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << spec;
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << spec << ": " << e.what();
  }
}

TEST(KernelChoiceArgs, BadSpecsAreClearErrors) {
  expect_rejected("attn_mma", "expected KEY=VALUE");
  expect_rejected("=never", "expected KEY=VALUE");
  expect_rejected("attn_mma=sometimes", "auto | never | always");
  expect_rejected("wgmma_decode=gpu", "by_format | producer | split | consumers");
  expect_rejected("wgmma_tile=64x64", "by_rows | 128x256 | 256x128 | mixed");
  expect_rejected("wgmma_exact=yes", "0 or 1");
  expect_rejected("stream_mma_max_rows=-2", "row count >= 0");
  expect_rejected("grouped_one_launch_rows=8x", "row count >= 0");
  expect_rejected("decode_direct_max_rows=", "row count >= 0");
  expect_rejected("rows_mma_warps=6", "one of 4, 8, 16 or 'default'");
  expect_rejected("rows_mma_kw=3", "one of 1, 2, 4, 8 or 'default'");
  expect_rejected("wgmma_fp8_wide=3", "one of 0, 1, 2 or 'default'");
  expect_rejected("rows_mma_splits=16", "one of 1, 2, 4, 8 or 'default'");
  expect_rejected("warp_size=64", "unknown key 'warp_size'");
}

}  // namespace
}  // namespace deepinfer
