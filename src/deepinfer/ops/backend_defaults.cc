// Default bodies of Backend virtuals added after a backend existed: the MLA ones throw Unsupported so a backend
// that has not implemented an op family fails loudly and by name instead of silently computing something else;
// the quantized-weight ones are the reference (dequantize exactly to f32, then the f32 op); the fused decode ops are
// their compositions (the CPU reference; a device backend overrides them with one launch each).
#include "deepinfer/core/error.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {
namespace {

// f32 [rows, cols] of m on the backend's memory (m itself when it already is f32).
OwnedTensor dequantized(Backend& be, const QuantMatrix& m, const char* op) {
  DI_CHECK(m.weight.data() != nullptr && m.weight.rank() == 2) << op << ": weight must be a matrix";
  TensorMemory& mem = backend_memory(be);
  if (m.format == QuantFormat::kFloat && m.weight.dtype() == DType::kF32) return mem.upload(m.weight);
  OwnedTensor out = mem.zeros(DType::kF32, {m.rows(), m.cols()});
  DequantizeParams p;
  p.weight = m.weight;
  p.scale = m.scale;
  p.format = m.format;
  p.block_n = m.block_n;
  p.block_k = m.block_k;
  p.out = out.view();
  be.dequantize(p);
  return out;
}

}  // namespace

const char* act_quant_name(ActQuant q) {
  switch (q) {
    case ActQuant::kNone:
      return "none";
    case ActQuant::kMxfp8:
      return "mxfp8";
    case ActQuant::kFp8Block128:
      return "fp8";
    case ActQuant::kFp8Block128Ue8m0:
      return "fp8-ue8m0";
  }
  return "?";
}

int fake_quant_block_len(FakeQuantKind kind) {
  switch (kind) {
    case FakeQuantKind::kFP4E4m3Block16:
      return 16;
    case FakeQuantKind::kFP8E4M3Block128:
    case FakeQuantKind::kFP8E4M3Ue8m0Block128:
      return 128;
    default:
      return 32;
  }
}

FakeQuantKind act_quant_kind(ActQuant q) {
  switch (q) {
    case ActQuant::kFp8Block128:
      return FakeQuantKind::kFP8E4M3Block128;
    case ActQuant::kFp8Block128Ue8m0:
      return FakeQuantKind::kFP8E4M3Ue8m0Block128;
    default:
      DI_CHECK(q == ActQuant::kMxfp8) << "act_quant_kind: no rounding for " << act_quant_name(q);
      return FakeQuantKind::kFP8E4M3Ue8m0Block32;
  }
}

void check_split_in(const QuantLinearParams& p, const char* op) {
  DI_CHECK(!p.split_in || (p.weight.format == QuantFormat::kFloat && p.weight.weight.dtype() == DType::kBF16))
      << op << ": split_in needs a bf16 float weight, got " << p.weight.weight.str();
  DI_CHECK(!p.split_in || p.act_quant == ActQuant::kNone) << op << ": split_in and act_quant do not combine";
}

void Backend::linear_quant(const QuantLinearParams& p) {
  check_split_in(p, "linear_quant");
  // split_in asks a device for near-f32 accuracy; the reference is exact either way.
  const OwnedTensor w = dequantized(*this, p.weight, "linear_quant");
  linear({p.in, w.view(), p.out, p.act_quant});
}

QuantMatrix quant_rows(const QuantMatrix& w, int64_t r0, int64_t r1) {
  DI_CHECK(w.format != QuantFormat::kFloat && 0 <= r0 && r0 <= r1 && r1 <= w.rows())
      << "quant_rows: rows " << r0 << ".." << r1 << " of a " << w.rows() << "-row block-format matrix";
  QuantMatrix q = w;
  q.weight = w.weight.slice(r0, r1);
  if (w.format == QuantFormat::kFP8Block) {
    const int64_t bn = w.block_n;
    DI_CHECK(r0 % bn == 0 && (r1 % bn == 0 || r1 == w.rows()))
        << "quant_rows: rows " << r0 << ".." << r1 << " cut the " << bn << "-row scale blocks";
    q.scale = w.scale.slice(r0 / bn, (r1 + bn - 1) / bn);
  } else {
    q.scale = w.scale.slice(r0, r1);  // MXFP4 / per-32 rows: one scale row a weight row
  }
  return q;
}

void Backend::grouped_linear_quant(const GroupedQuantLinearParams& p) {
  validate(p);
  const int64_t g_count = p.groups, t = p.in.dim(0) / g_count, n = p.weight.rows() / g_count;
  for (int64_t g = 0; g < g_count; ++g) {
    QuantLinearParams q{p.in.slice(g * t, (g + 1) * t), quant_rows(p.weight, g * n, (g + 1) * n),
                        p.out.slice(g * t, (g + 1) * t)};
    q.act_quant = p.act_quant;
    linear_quant(q);
  }
}

void Backend::moe_quant(const QuantMoeParams& p) {
  DI_CHECK(p.experts != nullptr && !p.experts->empty()) << "moe_quant: experts are required";
  DI_CHECK(p.indices.dtype() == DType::kI32 && p.indices.rank() == 2) << "moe_quant: indices must be i32 [T, k]";
  // Only the experts this call selects are dequantized (a real-size layer's 256 experts are ~26 GB in f32), in
  // increasing id order, and the indices renumbered into that list: moe() adds a token's experts in increasing
  // index order, which the monotone renumbering keeps, so the result is the full expansion's bit for bit.
  TensorMemory& mem = backend_memory(*this);
  const HostTensor ids = mem.to_host(p.indices);
  const int64_t n = static_cast<int64_t>(p.experts->size());
  std::vector<int32_t> slot(static_cast<size_t>(n), -1);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t e = ids.data<int32_t>()[i];
    DI_CHECK(e >= 0 && e < n) << "moe_quant: expert id " << e << " out of range [0, " << n << ")";
    DI_CHECK((*p.experts)[e].w1.weight.data() != nullptr) << "moe_quant: expert " << e << " is not resident";
    slot[e] = 0;
  }
  std::vector<OwnedTensor> storage;
  std::vector<ExpertWeights> experts;
  auto expand = [&](const QuantExpertWeights& q) {
    ExpertWeights e;
    for (auto [dst, src] : {std::pair{&e.w1, &q.w1}, {&e.w3, &q.w3}, {&e.w2, &q.w2}}) {
      storage.push_back(dequantized(*this, *src, "moe_quant"));
      *dst = storage.back().view();
    }
    return e;
  };
  for (int64_t e = 0; e < n; ++e)
    if (slot[e] == 0) {
      slot[e] = static_cast<int32_t>(experts.size());
      experts.push_back(expand((*p.experts)[e]));
    }
  ExpertWeights shared;
  if (p.shared) shared = expand(*p.shared);
  HostTensor local(DType::kI32, ids.shape());
  for (int64_t i = 0; i < ids.numel(); ++i) local.data<int32_t>()[i] = slot[ids.data<int32_t>()[i]];
  const OwnedTensor indices = mem.upload(local.view());
  if (experts.empty()) {  // no token: moe() still checks the shapes of an expert
    mem.fill(p.out, 0.0f);
    return;
  }
  moe({p.x, p.weights, indices.view(), &experts, p.shared ? &shared : nullptr, p.out, p.swiglu_limit,
       p.weight_before_w2, p.act_quant});
}

void Backend::mla_attention_naive(const MlaAttentionParams&) {
  DI_FAIL(ErrorCode::kUnsupported) << "mla_attention_naive: not implemented on this backend";
}

void Backend::mla_attention_absorbed(const MlaAttentionParams&) {
  DI_FAIL(ErrorCode::kUnsupported) << "mla_attention_absorbed: not implemented on this backend";
}

void Backend::paged_mla_attention(const PagedMlaAttentionParams&) {
  DI_FAIL(ErrorCode::kUnsupported) << "paged_mla_attention: not implemented on this backend";
}

std::unique_ptr<RecordedWork> Backend::record(const std::function<void()>&, RecordingPool&) {
  DI_FAIL(ErrorCode::kUnsupported) << "record: this backend cannot record work (no graphs)";
}

void Backend::hc_collapse_norm(const HcCollapseNormParams& p) {
  validate(p);
  hc_collapse({p.streams, p.pre, p.out});
  rms_norm({p.out, p.weight, p.out, p.eps});
}

void Backend::hc_expand_mix(const HcExpandMixParams& p) {
  validate(p);
  hc_expand(p.expand);
  hc_mix(p.mix);
}

void Backend::norm_rope(const NormRopeParams& p) {
  validate(p);
  for (const NormRopePart& part : p.parts) {
    if (part.x.data() == nullptr) continue;
    const int64_t t = part.x.dim(0), h = part.x.dim(1), hd = part.x.dim(2);
    if (part.norm) {
      const Tensor rows = part.x.reshape({t * h, hd});
      rms_norm({rows, part.weight, rows, p.eps});
    }
    if (part.rope) rope({part.x, p.positions, p.inv_freq, false});
    if (part.fake_quant) fake_quant({part.x.reshape({t * h, hd}), part.quant});
  }
}

}  // namespace deepinfer
