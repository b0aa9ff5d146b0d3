// `deepinfer bench`: synthetic prefill/decode steps of a model slice (V4 family, or the MLA family: V3 and
// V2-Lite) on its real dimensions, with
// random weights made on the target (no checkpoint), against ceilings measured in the same run. See
// bench/bench_runner.h; docs/PERF.md records the results.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/bench/bench_runner.h"
#include "deepinfer/cli/commands.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/kernel_choice_args.h"

namespace deepinfer::cli {
namespace {

struct BenchArgs {
  std::string device = "cpu";
  std::vector<std::string> models;
  int per_kind = 1;
  int v3_moe_layers = 2;
  std::string v2_lite_ffn = "bf16";
  std::vector<int64_t> prompts, batches, contexts;
  int warmup = 1, iters = 3, threads = 0;
  uint64_t seed = 1;
  bool no_graphs = false;
  bool batch_invariant = false;
  std::vector<std::string> kernel_choices;
  std::string activation_quant = "none";
  bool no_prefill = false;
  bool no_engram = false;
  bool fill_device = false;
  bool mla_per_sequence = false;
  std::string kv_cache_dtype = "auto";
};

int run_bench(const BenchArgs& a) {
  const bool cpu = a.device == "cpu";
  std::vector<std::string> models = a.models;
  if (models.empty())
    models = cpu ? std::vector<std::string>{"tiny"} : std::vector<std::string>{"v41-flash", "v4-flash"};
  bench::BenchOptions o;
  o.prompts = !a.prompts.empty() ? a.prompts : (cpu ? std::vector<int64_t>{32} : std::vector<int64_t>{1024, 4096});
  if (a.no_prefill) o.prompts.clear();
  o.batches = !a.batches.empty() ? a.batches : (cpu ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{1, 16, 64});
  o.contexts = !a.contexts.empty() ? a.contexts : (cpu ? std::vector<int64_t>{64} : std::vector<int64_t>{1024, 8192});
  o.warmup = a.warmup;
  o.iters = a.iters;
  o.seed = a.seed;
  o.graphs = !a.no_graphs;
  o.mla_paged_decode = !a.mla_per_sequence;
  std::vector<bench::BenchModel> slices;  // resolved before any device work, so a typo fails at once
  std::vector<std::function<bench::BenchModel(int)>> makers;  // per slice: the slice with k layers of each kind
  std::vector<bench::MlaBenchModel> mla;
  // --no-engram and --kv-cache-dtype apply to every slice a maker makes, so that --fill-device fits the slice that
  // runs. auto is the engine's: bf16 for V4.1 (lossless there), f32 for the others.
  const auto value_bytes = [&](bool v41) {
    return a.kv_cache_dtype == "bf16" || (v41 && a.kv_cache_dtype == "auto") ? 2 : 4;
  };
  const auto add = [&](std::function<bench::BenchModel(int)> make, bool v41 = false) {
    DI_CHECK(a.kv_cache_dtype != "fp8" || v41)
        << "bench --kv-cache-dtype fp8: the quantized records are V4.1's (its cached rows are fake-quantized); run it "
           "with --model v41-flash only";
    make = [make, no_engram = a.no_engram, kv_value_bytes = value_bytes(v41),
            records = a.kv_cache_dtype == "fp8"](int per_kind) {
      bench::BenchModel m = make(per_kind);
      if (no_engram)
        for (bench::LayerSpec& l : m.layers) l.engram = false;
      m.kv_value_bytes = kv_value_bytes;
      m.kv_records = records;
      return m;
    };
    slices.push_back(make(a.per_kind));
    makers.push_back(std::move(make));
  };
  for (const std::string& name : models) {
    if (name == "v3")
      mla.push_back(bench::v3_slice(a.v3_moe_layers));
    else if (name == "v2-lite")
      mla.push_back(
          bench::v2_lite_model(a.v2_lite_ffn == "f32" ? bench::BenchFormat::kF32 : bench::BenchFormat::kBF16));
    else if (name == "tiny-mla")
      mla.push_back(bench::tiny_mla());
    else if (name == "v4-flash")
      add(bench::v4_flash_slice);
    else if (name == "v41-flash")
      add(bench::v41_flash_slice, true);
    else if (name == "tiny")
      add([](int) { return bench::tiny_slice(); });
    else
      DI_FAIL(ErrorCode::kInvalidArgument)
          << "bench --model: unknown slice '" << name << "' (v41-flash, v4-flash, v3, v2-lite, tiny, tiny-mla)";
  }
  DI_CHECK(a.kv_cache_dtype != "fp8" || mla.empty())
      << "bench --kv-cache-dtype fp8: the quantized records are V4.1's; the MLA slices take f32 or bf16";
  for (bench::MlaBenchModel& m : mla) m.kv_value_bytes = value_bytes(false);

  DI_CHECK_CODE(a.kernel_choices.empty() || !cpu, ErrorCode::kInvalidArgument)
      << "bench --kernel-choice: the choices are the CUDA backend's (--device cuda)";
  const cuda::KernelChoices choices = parse_kernel_choices(a.kernel_choices);
  std::unique_ptr<bench::BenchTarget> target =
      cpu ? bench::make_cpu_target(a.threads) : bench::make_cuda_target(0, a.batch_invariant, choices);
  // Each family's reference rounding: V4 per 32 values (mxfp8), the V3 family per 128 (fp8, f32 scales; its FP8 slices'
  // weights then carry f32 block scales, as V3 checkpoints do).
  DI_CHECK(a.activation_quant != "mxfp8" || mla.empty())
      << "bench --activation-quant mxfp8 is the V4 slices' rounding; the MLA slices (v3, v2-lite, tiny-mla) take fp8";
  DI_CHECK(a.activation_quant != "fp8" || slices.empty())
      << "bench --activation-quant fp8 is the V3 family's rounding; the V4 slices take mxfp8";
  if (a.activation_quant == "mxfp8") target->set_activation_quant(ActQuant::kMxfp8);
  if (a.activation_quant == "fp8") target->set_activation_quant(ActQuant::kFp8Block128);
  std::printf(
      "target: %s%s\n", target->describe().c_str(),
      a.activation_quant == "none" ? "" : (", activations " + a.activation_quant + " (--activation-quant)").c_str());
  if (a.fill_device) {
    const double budget = target->memory_budget_bytes();
    DI_CHECK_CODE(budget > 0, ErrorCode::kInvalidArgument) << "bench --fill-device: the target has no memory budget "
                                                              "(--device cuda)";
    const int64_t max_blocks = bench::max_cache_blocks(bench::bench_shapes(o));
    for (size_t i = 0; i < slices.size(); ++i) {
      if (slices[i].name == "tiny") continue;  // plumbing dims: one layer of each kind
      const int per_kind = bench::fit_layers_per_kind(makers[i], budget, max_blocks);
      slices[i] = makers[i](per_kind);
      std::printf("fill-device: %s, %d layers of each kind fit %.1f GB\n", slices[i].name.c_str(), per_kind,
                  budget / 1e9);
    }
  }
  const bench::Ceilings c = target->measure_ceilings();
  std::printf("%s", bench::format_ceilings(c).c_str());
  std::fflush(stdout);
  for (const bench::BenchModel& m : slices) {
    std::printf("slice %s: %zu layers (", m.name.c_str(), m.layers.size());
    for (size_t i = 0; i < m.layers.size(); ++i)
      std::printf("%s%s r=%lld", i ? ", " : "", bench::attn_kind_name(m.layers[i].kind),
                  static_cast<long long>(m.layers[i].ratio));
    std::printf("); paged caches %s\n", m.kv_records ? "fp8 records" : m.kv_value_bytes == 2 ? "bf16" : "f32");
    std::fflush(stdout);
    const std::vector<bench::BenchRow> rows = bench::run_slice(*target, m, o);
    std::printf("%s", bench::format_table(rows, c).c_str());
    std::printf("%s", bench::format_breakdown(rows).c_str());
    std::printf("%s", bench::format_graphs(rows).c_str());
    std::printf("%s", bench::format_decode_rates(rows).c_str());
    std::fflush(stdout);
  }
  for (const bench::MlaBenchModel& m : mla) {
    std::printf(
        "slice %s (MLA): %lld dense + %lld MoE layers, projections %s, FFN %s; attention: naive MLA op per "
        "sequence (prefill), %s (decode; its cache %s)\n",
        m.name.c_str(), static_cast<long long>(m.dense_layers), static_cast<long long>(m.moe_layers),
        bench::bench_format_name(m.proj_format), bench::bench_format_name(m.ffn_format),
        o.mla_paged_decode ? "one paged MLA call for all sequences" : "absorbed MLA op per sequence",
        m.kv_value_bytes == 2 && o.mla_paged_decode ? "bf16" : "f32");
    std::fflush(stdout);
    const std::vector<bench::BenchRow> rows = bench::run_mla_slice(*target, m, o);
    std::printf("%s", bench::format_table(rows, c).c_str());
    std::printf("%s", bench::format_breakdown(rows).c_str());
    std::printf("%s", bench::format_graphs(rows).c_str());
    std::printf("%s", bench::format_decode_rates(rows).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("bench", "synthetic prefill/decode steps of a model slice vs measured ceilings");
  auto a = std::make_shared<BenchArgs>();
  sub->add_option("--device", a->device, "cpu | cuda (GPU 0; needs a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--model", a->models,
                  "slice: v41-flash, v4-flash, v3, v2-lite (real dims), tiny, tiny-mla (repeatable; default: "
                  "v41-flash and v4-flash on cuda, tiny on cpu)");
  sub->add_option("--v2-lite-ffn", a->v2_lite_ffn,
                  "weights of the v2-lite FFN: bf16 (as released, kept so by --weight-format auto on cuda) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  sub->add_option("--v3-moe-layers", a->v3_moe_layers, "MoE layers of the v3 slice (after its one dense layer)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--layers-per-kind", a->per_kind, "layers of each attention kind in a real slice")
      ->check(CLI::PositiveNumber);
  sub->add_option("--prompt", a->prompts, "prefill prompt lengths (repeatable)");
  sub->add_option("--batch", a->batches, "decode batch sizes (repeatable)");
  sub->add_option("--context", a->contexts, "decode context lengths (repeatable)");
  sub->add_option("--warmup", a->warmup, "untimed steps before each shape")->check(CLI::NonNegativeNumber);
  sub->add_option("--iters", a->iters, "timed steps per shape (median reported)")->check(CLI::PositiveNumber);
  sub->add_option("--threads", a->threads, "CPU threads (0 = all cores)");
  sub->add_option("--seed", a->seed, "seed of the random weights");
  sub->add_flag("--no-graphs", a->no_graphs, "decode: skip the CUDA-graph replay timing and its output check");
  sub->add_flag("--batch-invariant", a->batch_invariant,
                "CUDA: run the slices in the backend's batch-invariant mode (to measure its cost)");
  sub->add_option("--kernel-choice", a->kernel_choices,
                  "CUDA: KEY=VALUE, run the slices under another kernel (repeatable; attn_mma, indexer_mma, "
                  "topk_small_blocks, wgmma: auto|never|always; wgmma_exact: 0|1; wgmma_decode: "
                  "by_format|producer|split|consumers; wgmma_tile: by_rows|128x256|256x128|mixed; stream_mma_max_rows, "
                  "grouped_one_launch_rows: N|default)");
  sub->add_option("--activation-quant", a->activation_quant,
                  "none | mxfp8 (V4 slices) | fp8 (MLA slices): round the inputs of the GEMMs over FP8 / MXFP4 "
                  "weights as each family's reference does")
      ->check(CLI::IsMember({"none", "mxfp8", "fp8"}))
      ->capture_default_str();
  sub->add_flag("--no-prefill", a->no_prefill, "decode shapes only");
  sub->add_flag("--fill-device", a->fill_device,
                "CUDA: as many layers of each kind as fit the device (weights and caches of the largest shape; "
                "overrides --layers-per-kind for the V4 slices)");
  sub->add_flag("--no-engram", a->no_engram,
                "V4.1 slice without its Engram layer (the slice before session 19, for comparing figures)");
  sub->add_flag(
      "--mla-per-sequence-decode", a->mla_per_sequence,
      "MLA slices: decode attention as one absorbed-MLA call per sequence (the path before the paged kernel)");
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "the paged caches the attention (and the V4 slices' decode indexer) read: f32, bf16 (half the "
                  "bytes; the engine's --kv-cache-dtype bf16), fp8 (the V4.1 slice: FP8 / FP4 records with their "
                  "block scales, the engine's --kv-cache-dtype fp8) or auto (the engine's: bf16 for the V4.1 slice, f32 "
                  "otherwise)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}))
      ->capture_default_str();
  register_bench_serve(sub, reg);
  reg.add(sub, [a] { return run_bench(*a); });
}

}  // namespace deepinfer::cli
