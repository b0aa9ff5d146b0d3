// CudaBackend ops: the router, MoE layers (f32 and block-format experts) and Engram.
#include "deepinfer/ops/cuda/cuda_backend_impl.h"

namespace deepinfer {

// ============================================================================ router + MoE
void CudaBackend::router(const RouterParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"x", &p.x},
                         {"weight", &p.weight},
                         {"bias", &p.bias},
                         {"hash_table", &p.hash_table},
                         {"token_ids", &p.token_ids},
                         {"weights", &p.weights},
                         {"indices", &p.indices}})
    expect_on("router", name, *t, dev);
  const int64_t tokens = p.x.dim(0), experts = p.weight.dim(0);
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  float* logits = impl_->ws().take_as<float>(std::max<int64_t>(tokens * experts, 1));
  impl_->f32_matmul(p.x.data_as<float>(), p.weight.data_as<float>(), logits, tokens, experts, p.x.dim(1));
  cuda::RouterSelectKernelParams k;
  k.logits = logits;
  k.bias = cptr<float>(p.bias);
  k.hash_table = p.hash_table.data();
  k.hash_i64 = p.hash_table.dtype() == DType::kI64;
  k.hash_rows = p.hash_table.data() ? p.hash_table.dim(0) : 0;
  k.token_ids = cptr<int64_t>(p.token_ids);
  k.weights = p.weights.data_as<float>();
  k.indices = p.indices.data_as<int32_t>();
  k.tokens = tokens;
  k.experts = experts;
  k.k = p.weights.dim(1);
  k.scoring = p.scoring;
  k.gate_temp = p.gate_temp;
  k.route_scale = p.route_scale;
  k.normalize = p.normalize;
  k.n_group = p.n_group;
  k.topk_group = p.topk_group;
  k.group_score = p.group_score;
  k.status = impl_->status.word();
  cuda::run_router_select(k, impl_->s());
}

void CudaBackend::moe(const MoeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("moe", "x", p.x, dev);
  expect_on("moe", "weights", p.weights, dev);
  expect_on("moe", "indices", p.indices, dev);
  expect_on("moe", "out", p.out, dev);
  const auto& experts = *p.experts;
  std::vector<const void*> ptrs[3];
  for (const auto& e : experts) {
    expect_on("moe", "w1", e.w1, dev);
    expect_on("moe", "w3", e.w3, dev);
    expect_on("moe", "w2", e.w2, dev);
    DI_CHECK(e.w1.shape() == experts[0].w1.shape()) << "moe: experts must share one shape on CUDA";
    ptrs[0].push_back(e.w1.data());
    ptrs[1].push_back(e.w3.data());
    ptrs[2].push_back(e.w2.data());
  }
  Impl::MoeWeights mw{};
  mw.format = QuantFormat::kFloat;
  mw.scale_e8m0 = true;
  for (int i = 0; i < 3; ++i) {
    mw.w[i] = impl_->table(i, p.experts, ptrs[i]);
    mw.s[i] = nullptr;
  }
  QuantExpertWeights shared;
  if (p.shared) {
    for (auto [name, t] :
         {std::pair{"shared.w1", &p.shared->w1}, {"shared.w3", &p.shared->w3}, {"shared.w2", &p.shared->w2}})
      expect_on("moe", name, *t, dev);
    shared.w1.weight = p.shared->w1;
    shared.w3.weight = p.shared->w3;
    shared.w2.weight = p.shared->w2;
  }
  impl_->run_moe(p.x.data_as<float>(), p.weights.data_as<float>(), p.indices.data_as<int32_t>(), p.out.data_as<float>(),
                 p.x.dim(0), p.x.dim(1), p.weights.dim(1), experts[0].w1.dim(0), static_cast<int>(experts.size()), mw,
                 p.shared ? &shared : nullptr, p.swiglu_limit, p.weight_before_w2, p.act_quant);
}

void CudaBackend::moe_quant(const QuantMoeParams& p) {
  const char* op = "moe_quant";
  const Device& dev = impl_->device;
  DI_CHECK(p.experts && !p.experts->empty()) << op << ": experts are required";
  const auto& experts = *p.experts;
  DI_CHECK(p.x.dtype() == DType::kF32 && p.x.rank() == 2 && p.x.is_contiguous()) << op << ": x must be f32 [T, D]";
  const int64_t t = p.x.dim(0), d = p.x.dim(1);
  DI_CHECK(p.weights.dtype() == DType::kF32 && p.weights.rank() == 2 && p.weights.dim(0) == t &&
           p.weights.is_contiguous())
      << op << ": weights must be f32 [T, k]";
  const int64_t k = p.weights.dim(1);
  DI_CHECK(p.indices.dtype() == DType::kI32 && p.indices.shape() == Shape({t, k}) && p.indices.is_contiguous())
      << op << ": indices must be i32 [T, k]";
  DI_CHECK(p.out.dtype() == DType::kF32 && p.out.shape() == Shape({t, d}) && p.out.is_contiguous())
      << op << ": out must be f32 [T, D]";
  for (auto [name, tt] : {std::pair{"x", &p.x}, {"weights", &p.weights}, {"indices", &p.indices}, {"out", &p.out}})
    expect_on(op, name, *tt, dev);
  const QuantExpertWeights& e0 = experts[0];
  const int64_t inter = e0.w1.rows();
  auto check_expert = [&](const QuantExpertWeights& e, bool same_as_first) {
    validate_quant(op, "w1", e.w1, dev);
    validate_quant(op, "w3", e.w3, dev);
    validate_quant(op, "w2", e.w2, dev);
    const int64_t i = e.w1.rows();
    DI_CHECK(e.w1.cols() == d && e.w3.rows() == i && e.w3.cols() == d && e.w2.rows() == d && e.w2.cols() == i)
        << op << ": expert shapes must be w1/w3 [I, " << d << "], w2 [" << d << ", I]";
    if (same_as_first) {
      DI_CHECK(i == inter && e.w1.format == e0.w1.format && e.w3.format == e0.w1.format &&
               e.w2.format == e0.w1.format && e.w1.weight.dtype() == e0.w1.weight.dtype() &&
               e.w1.scale.dtype() == e0.w1.scale.dtype() && e.w1.block_n == e0.w1.block_n &&
               e.w1.block_k == e0.w1.block_k)
          << op << ": routed experts must share one shape and format";
    }
  };
  std::vector<const void*> ptrs[6];
  for (const auto& e : experts) {
    check_expert(e, true);
    const QuantMatrix* m[3] = {&e.w1, &e.w3, &e.w2};
    for (int i = 0; i < 3; ++i) {
      ptrs[i].push_back(m[i]->weight.data());
      ptrs[3 + i].push_back(m[i]->scale.data());
    }
  }
  if (p.shared) check_expert(*p.shared, false);
  Impl::MoeWeights mw{};
  mw.aligned16 = true;
  for (const auto& v : ptrs)
    for (const void* q : v) mw.aligned16 = mw.aligned16 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
  // bf16 routed experts (a bf16 checkpoint's, kept as stored): the streaming kernel's 16-byte loads and the mma.sync
  // kernel's 32-wide K steps read them in place (gemm_vector_ok, run_gemm_mma; the wgmma GEMM where K % 64 == 0).
  mw.bf16 = e0.w1.format == QuantFormat::kFloat && e0.w1.weight.dtype() == DType::kBF16;
  if (mw.bf16) {
    DI_CHECK_CODE(!impl_->batch_invariant, ErrorCode::kUnsupported)
        << op << ": bf16 routed experts have no batch-invariant kernel on CUDA (load them as f32: --weight-format f32)";
    DI_CHECK_CODE(d % 32 == 0 && inter % 32 == 0 && mw.aligned16, ErrorCode::kUnsupported)
        << op << ": bf16 routed experts need D and I multiples of 32 and 16-byte aligned weights on CUDA (D = " << d
        << ", I = " << inter << ")";
  }
  mw.format = e0.w1.format;
  mw.scale_e8m0 = !e0.w1.scale.data() || e0.w1.scale.dtype() == DType::kE8M0;
  mw.block_n = e0.w1.block_n;
  mw.block_k = e0.w1.block_k;
  const QuantMatrix* m0[3] = {&e0.w1, &e0.w3, &e0.w2};
  for (int i = 0; i < 3; ++i) {
    mw.scale_cols[i] = m0[i]->scale.rank() == 2 ? m0[i]->scale.dim(1) : 0;
    mw.w[i] = impl_->table(i, p.experts, ptrs[i]);
    mw.s[i] = mw.format == QuantFormat::kFloat ? nullptr : impl_->table(3 + i, p.experts, ptrs[3 + i]);
  }
  // The FP8 expert GEMM's folds (unless GemmChoices::wgmma_fp8 is kNever), for calls that may take it: MXFP4 experts
  // whose GEMM inputs are rounded to MXFP8 anyway.
  if (p.act_quant == ActQuant::kMxfp8 && mw.format == QuantFormat::kMXFP4 && !impl_->batch_invariant &&
      impl_->fp8_gemm_chosen() && mw.aligned16) {
    for (int i = 0; i < 3; ++i)
      mw.fold[i] = impl_->mxfp4_fold(i, p.experts, ptrs[i], mw.w[i], mw.s[i], i < 2 ? inter : d, i < 2 ? d : inter);
  }
  impl_->run_moe(p.x.data_as<float>(), p.weights.data_as<float>(), p.indices.data_as<int32_t>(), p.out.data_as<float>(),
                 t, d, k, inter, static_cast<int>(experts.size()), mw, p.shared, p.swiglu_limit, p.weight_before_w2,
                 p.act_quant);
}

// ============================================================================ Engram
void CudaBackend::engram_hash(const EngramHashParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"tokens", &p.tokens},
                         {"multipliers", &p.multipliers},
                         {"primes", &p.primes},
                         {"offsets", &p.offsets},
                         {"out", &p.out}})
    expect_on("engram_hash", name, *t, dev);
  cuda::EngramHashKernelParams k;
  k.tokens = p.tokens.data_as<int64_t>();
  k.multipliers = p.multipliers.data_as<int64_t>();
  k.primes = p.primes.data_as<int64_t>();
  k.offsets = p.offsets.data_as<int64_t>();
  k.out = p.out.data_as<int64_t>();
  k.count = p.tokens.dim(0);
  k.n = p.tokens.dim(1);
  k.heads = p.primes.dim(1);
  cuda::run_engram_hash(k, impl_->s());
}

void CudaBackend::engram_gate(const EngramGateParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams}, {"key", &p.key}, {"value", &p.value}, {"weight", &p.weight}})
    expect_on("engram_gate", name, *t, dev);
  cuda::EngramGateKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.key = p.key.data_as<float>();
  k.value = p.value.data_as<float>();
  k.weight = p.weight.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.eps = p.eps;
  cuda::run_engram_gate(k, impl_->s());
}

}  // namespace deepinfer
