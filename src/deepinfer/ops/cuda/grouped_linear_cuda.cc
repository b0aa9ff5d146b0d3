// grouped_linear.h: the plan's device arrays and the one-launch grouped GEMM (cuda::run_gemm with groups, the
// machinery moe_quant uses for its experts; here every group has the same row count, so the arrays are fixed).
#include "deepinfer/ops/cuda/grouped_linear.h"

#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"

#include <algorithm>
#include <limits>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

constexpr const char* kOp = "grouped_linear_quant";

bool on_device(const Tensor& t, const Device& dev) { return t.data() == nullptr || t.device() == dev; }

// The weight checks of linear_quant, for the first weight (the others must equal it in everything but storage).
void check_weight(const QuantMatrix& m, const Device& dev) {
  DI_CHECK(m.weight.data() && m.weight.rank() == 2 && m.weight.is_contiguous())
      << kOp << ": a weight must be a contiguous matrix, got " << m.weight.str();
  DI_CHECK(on_device(m.weight, dev) && on_device(m.scale, dev)) << kOp << ": weights must be on the backend's device";
  const int64_t n = m.weight.dim(0), k = m.cols();
  switch (m.format) {
    case QuantFormat::kFloat:
      DI_CHECK(m.weight.dtype() == DType::kF32 || m.weight.dtype() == DType::kBF16)
          << kOp << ": float weight must be f32 or bf16, got " << m.weight.str();
      break;
    case QuantFormat::kFP8Block:
    case QuantFormat::kFP8Row32: {
      DI_CHECK(m.weight.dtype() == DType::kF8E4M3) << kOp << ": FP8 weight must be fp8_e4m3, got " << m.weight.str();
      DI_CHECK(m.scale.dtype() == DType::kE8M0 || m.scale.dtype() == DType::kF32) << kOp << ": scale dtype";
      const bool block = m.format == QuantFormat::kFP8Block;
      DI_CHECK(!block || (m.block_n > 0 && m.block_k > 0)) << kOp << ": block sizes must be positive";
      const Shape want =
          block ? Shape{(n + m.block_n - 1) / m.block_n, (k + m.block_k - 1) / m.block_k} : Shape{n, (k + 31) / 32};
      DI_CHECK(m.scale.shape() == want && m.scale.is_contiguous())
          << kOp << ": scale must be " << shape_str(want) << ", got " << m.scale.str();
      break;
    }
    case QuantFormat::kMXFP4:
      DI_CHECK(m.weight.dtype() == DType::kU8 || m.weight.dtype() == DType::kI8) << kOp << ": MXFP4 weight is u8/i8";
      DI_CHECK(m.scale.dtype() == DType::kE8M0 && m.scale.shape() == Shape({n, k / 32}) && m.scale.is_contiguous())
          << kOp << ": MXFP4 scale must be e8m0 [" << n << ", " << k / 32 << "], got " << m.scale.str();
      break;
  }
}

bool same_layout(const QuantMatrix& a, const QuantMatrix& b) {
  const bool blocks = a.format != QuantFormat::kFP8Block || (a.block_n == b.block_n && a.block_k == b.block_k);
  return a.format == b.format && blocks && a.weight.dtype() == b.weight.dtype() &&
         a.weight.shape() == b.weight.shape() && a.weight.is_contiguous() && b.weight.is_contiguous() &&
         a.scale.dtype() == b.scale.dtype() && a.scale.shape() == b.scale.shape() &&
         (b.scale.data() == nullptr || b.scale.is_contiguous()) &&
         (a.scale.data() == nullptr) == (b.scale.data() == nullptr) && a.weight.device() == b.weight.device() &&
         (b.scale.data() == nullptr || b.scale.device() == a.weight.device());
}

// UE8M0-scaled block formats: the tensor-core kernels' weights are exact in bf16, so only A's rounding differs from
// the per-group cuBLASLt path (which rounds A too).
bool ue8m0_block(const QuantMatrix& w) {
  return w.format != QuantFormat::kFloat && (w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0);
}

}  // namespace

int64_t grouped_one_launch_rows(const cuda::KernelChoices& choices) {
  // Up to 8 rows a group, UE8M0 block formats take the tensor-core streaming kernel one group at a time through
  // linear_quant too (kGemmStreamMmaMaxRows), so one grouped launch of it is the same kernel, not 8 launches.
  return choices.grouped_one_launch_rows >= 0 ? choices.grouped_one_launch_rows : cuda::kGemmStreamMmaMaxRows;
}

bool GroupedLinearPlan::one_launch(bool batch_invariant, const cuda::KernelChoices& choices) const {
  const QuantMatrix& w = weights_.front();
  // The own GEMM reads f32 weights in kFloat, never bf16 (linear_quant takes cuBLASLt there).
  const bool own_gemm_reads = w.format != QuantFormat::kFloat || w.weight.dtype() == DType::kF32;
  if (!own_gemm_reads) return false;
  if (batch_invariant) return true;
  return rows_ <= grouped_one_launch_rows(choices) && (rows_ <= cuda::kGemmSkinnyRows || ue8m0_block(w));
}

std::unique_ptr<GroupedLinearPlan> plan_grouped_linear(CudaBackend& be, std::vector<QuantMatrix> weights,
                                                       int64_t rows) {
  DI_CHECK(!weights.empty()) << kOp << ": needs at least one weight";
  DI_CHECK(rows >= 1) << kOp << ": rows per group must be >= 1, got " << rows;
  const int64_t g_count = static_cast<int64_t>(weights.size());
  DI_CHECK(g_count * rows <= std::numeric_limits<int32_t>::max())
      << kOp << ": " << g_count << " groups of " << rows << " rows overflow the i32 group offsets";
  check_weight(weights.front(), be.device());
  for (size_t g = 1; g < weights.size(); ++g)
    DI_CHECK(same_layout(weights.front(), weights[g]))
        << kOp << ": weight " << g << " (" << weights[g].weight.str() << ", scale " << weights[g].scale.str()
        << ") differs from weight 0 (" << weights.front().weight.str() << ", scale " << weights.front().scale.str()
        << ") in format, dtype, shape, blocks or device";
  auto plan = std::unique_ptr<GroupedLinearPlan>(new GroupedLinearPlan());
  plan->rows_ = rows;
  std::vector<int64_t> tables(2 * g_count);
  plan->aligned16_ = true;
  for (int64_t g = 0; g < g_count; ++g) {
    const auto w = reinterpret_cast<uintptr_t>(weights[g].weight.data());
    const auto sc = reinterpret_cast<uintptr_t>(weights[g].scale.data());
    tables[g] = static_cast<int64_t>(w);
    tables[g_count + g] = static_cast<int64_t>(sc);
    plan->aligned16_ = plan->aligned16_ && w % 16 == 0 && sc % 16 == 0;  // as moe_quant's tables (scales too)
  }
  const int64_t tiles = (rows + cuda::kGemmTileM - 1) / cuda::kGemmTileM;
  std::vector<int32_t> offsets(3 * (g_count + 1));
  for (int64_t g = 0; g <= g_count; ++g) {
    offsets[g] = static_cast<int32_t>(g * rows);                   // group_offsets
    offsets[(g_count + 1) + g] = static_cast<int32_t>(g * tiles);  // tile_offsets
    offsets[2 * (g_count + 1) + g] = static_cast<int32_t>(g);      // active_groups: every group, count at [G]
  }
  TensorMemory& mem = be.memory();
  plan->tables_ = mem.from_host(DType::kI64, {2 * g_count}, tables.data());
  plan->offsets_ = mem.from_host(DType::kI32, {3 * (g_count + 1)}, offsets.data());
  plan->weights_ = std::move(weights);
  return plan;
}

void grouped_linear_quant(CudaBackend& be, const Tensor& in, const GroupedLinearPlan& plan, const Tensor& out,
                          ActQuant act_quant) {
  const int64_t g_count = plan.groups(), r = plan.rows(), n = plan.n(), k = plan.k();
  const Device dev = be.device();
  DI_CHECK(in.dtype() == DType::kF32 && in.shape() == Shape({g_count * r, k}) && in.is_contiguous())
      << kOp << ": in must be contiguous f32 [" << g_count * r << ", " << k << "] (" << g_count << " groups of " << r
      << " rows), got " << in.str();
  DI_CHECK(out.dtype() == DType::kF32 && out.shape() == Shape({g_count * r, n}) && out.is_contiguous())
      << kOp << ": out must be contiguous f32 [" << g_count * r << ", " << n << "], got " << out.str();
  DI_CHECK(in.device() == dev && out.device() == dev) << kOp << ": in and out must be on the backend's device";
  DI_CHECK(in.data() != out.data()) << kOp << ": out must not alias in";
  if (!plan.one_launch(be.batch_invariant(), be.kernel_choices())) {
    for (int64_t g = 0; g < g_count; ++g) {
      QuantLinearParams p{in.slice(g * r, (g + 1) * r), plan.weight(static_cast<int>(g)),
                          out.slice(g * r, (g + 1) * r)};
      p.act_quant = act_quant;
      be.linear_quant(p);
    }
    return;
  }
  const QuantMatrix& w = plan.weight(0);
  cuda::WorkspaceArena::Scope scope(be.workspace());
  const float* a = in.data_as<float>();
  if (act_quant != ActQuant::kNone && k % fake_quant_block_len(act_quant_kind(act_quant)) == 0) {
    // Rounded as linear_quant rounds its input (the fake_quant kernel), into a copy in one pass.
    float* copy = be.workspace().take_as<float>(g_count * r * k);
    cuda::FakeQuantKernelParams f;
    f.x = copy;
    f.in = a;
    f.rows = g_count * r;
    f.cols = k;
    f.kind = act_quant_kind(act_quant);
    cuda::run_fake_quant(f, be.stream());
    a = copy;
  }
  const void* a_bf16 = nullptr;
  const bool e8m0 = w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0;
  if (r > cuda::kGemmStreamMmaMaxRows &&
      (!be.batch_invariant() || cuda::gemm_invariant_mma_takes(w.format, e8m0, w.block_n, w.block_k, k))) {
    // Many rows (the A/B switch): the tensor-core kernels read a bf16 copy of A (gemm_mma; the WMMA tile otherwise;
    // batch-invariant mode: the invariant tile kernel). Up to kGemmStreamMmaMaxRows the streaming kernel reads A in
    // f32 (and the WMMA tile, if it declines, rounds A itself).
    void* a16 = be.workspace().take(sizeof(uint16_t) * g_count * r * k);
    cuda::run_cast_f32_to_bf16(a, a16, g_count * r * k, be.stream());
    a_bf16 = a16;
  }
  const auto* tables = static_cast<const void* const*>(plan.tables_.view().data());
  const int32_t* offsets = plan.offsets_.view().data_as<int32_t>();
  cuda::GemmKernelParams p;
  p.a = a;
  p.a_bf16 = a_bf16;
  p.lda = k;
  p.c = out.data_as<float>();
  p.ldc = n;
  p.format = w.format;
  p.b_table = tables;
  p.b_scale_table = w.scale.data() ? tables + g_count : nullptr;
  p.scale_e8m0 = w.scale.data() == nullptr || w.scale.dtype() == DType::kE8M0;
  p.block_n = w.block_n;
  p.block_k = w.block_k;
  p.scale_cols = w.scale.rank() == 2 ? w.scale.dim(1) : 0;
  p.m = g_count * r;
  p.n = n;
  p.k = k;
  p.groups = static_cast<int>(g_count);
  p.group_offsets = offsets;
  p.tile_offsets = offsets + (g_count + 1);
  p.active_groups = offsets + 2 * (g_count + 1);
  p.max_tiles_m = g_count * ((r + cuda::kGemmTileM - 1) / cuda::kGemmTileM);
  p.rows_hint = r;
  p.tables_aligned16 = plan.aligned16_;
  p.batch_invariant = be.batch_invariant();
  p.choices = be.kernel_choices().gemm;
  cuda::run_gemm(p, be.stream());
}

}  // namespace deepinfer
