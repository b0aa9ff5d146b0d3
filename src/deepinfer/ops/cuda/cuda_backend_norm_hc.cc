// CudaBackend ops: norms, RoPE, fake quantization, the mHC mixes and the fused decode ops.
#include "deepinfer/ops/cuda/cuda_backend_impl.h"

namespace deepinfer {

// ============================================================================ norms, rope, fake quant
void CudaBackend::rms_norm(const RmsNormParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("rms_norm", "in", p.in, dev);
  expect_on("rms_norm", "weight", p.weight, dev);
  expect_on("rms_norm", "out", p.out, dev);
  cuda::RmsNormKernelParams k;
  k.in = p.in.data_as<float>();
  k.weight = cptr<float>(p.weight);
  k.out = p.out.data_as<float>();
  k.rows = p.in.dim(0);
  k.dim = p.in.dim(1);
  k.eps = p.eps;
  cuda::run_rms_norm(k, impl_->s());
}

void CudaBackend::rope(const RopeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("rope", "x", p.x, dev);
  expect_on("rope", "positions", p.positions, dev);
  expect_on("rope", "inv_freq", p.inv_freq, dev);
  cuda::RopeKernelParams k;
  k.x = p.x.data_as<float>();
  k.positions = p.positions.data_as<int64_t>();
  k.inv_freq = p.inv_freq.data_as<float>();
  k.tokens = p.x.dim(0);
  k.heads = p.x.dim(1);
  k.hd = p.x.dim(2);
  k.half = p.inv_freq.dim(0);
  k.inverse = p.inverse;
  cuda::run_rope(k, impl_->s());
}

void CudaBackend::fake_quant(const FakeQuantParams& p) {
  validate(p);
  expect_on("fake_quant", "x", p.x, impl_->device);
  cuda::FakeQuantKernelParams k;
  k.x = p.x.data_as<float>();
  k.rows = p.x.dim(0);
  k.cols = p.x.dim(1);
  k.kind = p.kind;
  cuda::run_fake_quant(k, impl_->s());
}

// ============================================================================ mHC
void CudaBackend::hc_mix(const HcMixParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams},
                         {"fn", &p.fn},
                         {"base", &p.base},
                         {"scale", &p.scale},
                         {"pre", &p.pre},
                         {"post", &p.post},
                         {"comb", &p.comb}})
    expect_on("hc_mix", name, *t, dev);
  cuda::HcMixKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.fn = p.fn.data_as<float>();
  k.base = p.base.data_as<float>();
  k.scale = p.scale.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.post = p.post.data_as<float>();
  k.comb = p.comb.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.norm_eps = p.norm_eps;
  k.hc_eps = p.hc_eps;
  k.sinkhorn_iters = p.sinkhorn_iters;
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  k.splits = cuda::hc_mix_splits(k.hc, k.d);
  k.partial =
      impl_->ws().take_as<float>(std::max<int64_t>(1, k.splits * k.tokens * ((k.head ? k.hc : (2 + k.hc) * k.hc) + 1)));
  k.arrivals = impl_->hc_mix_arrivals.data_as<unsigned>();
  cuda::run_hc_mix(k, impl_->s());
}

void CudaBackend::hc_head(const HcHeadParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] :
       {std::pair{"streams", &p.streams}, {"fn", &p.fn}, {"base", &p.base}, {"scale", &p.scale}, {"pre", &p.pre}})
    expect_on("hc_head", name, *t, dev);
  cuda::HcMixKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.fn = p.fn.data_as<float>();
  k.base = p.base.data_as<float>();
  k.scale = p.scale.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.norm_eps = p.norm_eps;
  k.hc_eps = p.hc_eps;
  k.head = true;
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  k.splits = cuda::hc_mix_splits(k.hc, k.d);
  k.partial =
      impl_->ws().take_as<float>(std::max<int64_t>(1, k.splits * k.tokens * ((k.head ? k.hc : (2 + k.hc) * k.hc) + 1)));
  k.arrivals = impl_->hc_mix_arrivals.data_as<unsigned>();
  cuda::run_hc_mix(k, impl_->s());
}

void CudaBackend::hc_collapse(const HcCollapseParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("hc_collapse", "streams", p.streams, dev);
  expect_on("hc_collapse", "pre", p.pre, dev);
  expect_on("hc_collapse", "out", p.out, dev);
  cuda::HcCollapseKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  cuda::run_hc_collapse(k, impl_->s());
}

void CudaBackend::hc_expand(const HcExpandParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams}, {"x", &p.x}, {"post", &p.post}, {"comb", &p.comb}})
    expect_on("hc_expand", name, *t, dev);
  cuda::HcExpandKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.x = p.x.data_as<float>();
  k.post = p.post.data_as<float>();
  k.comb = p.comb.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  cuda::run_hc_expand(k, impl_->s());
}

// ============================================================================ fused decode ops
void CudaBackend::hc_collapse_norm(const HcCollapseNormParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"streams", &p.streams}, {"pre", &p.pre}, {"weight", &p.weight}, {"out", &p.out}})
    expect_on("hc_collapse_norm", name, *t, dev);
  cuda::HcCollapseNormKernelParams k;
  k.streams = p.streams.data_as<float>();
  k.pre = p.pre.data_as<float>();
  k.weight = cptr<float>(p.weight);
  k.out = p.out.data_as<float>();
  k.tokens = p.streams.dim(0);
  k.hc = p.streams.dim(1);
  k.d = p.streams.dim(2);
  k.eps = p.eps;
  cuda::run_hc_collapse_norm(k, impl_->s());
}

void CudaBackend::hc_expand_mix(const HcExpandMixParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  const HcExpandParams& e = p.expand;
  const HcMixParams& m = p.mix;
  for (auto [name, t] : {std::pair{"expand.streams", &e.streams},
                         {"expand.x", &e.x},
                         {"expand.post", &e.post},
                         {"expand.comb", &e.comb},
                         {"mix.fn", &m.fn},
                         {"mix.base", &m.base},
                         {"mix.scale", &m.scale},
                         {"mix.pre", &m.pre},
                         {"mix.post", &m.post},
                         {"mix.comb", &m.comb}})
    expect_on("hc_expand_mix", name, *t, dev);
  cuda::HcMixKernelParams k;
  k.streams = m.streams.data_as<float>();
  k.fn = m.fn.data_as<float>();
  k.base = m.base.data_as<float>();
  k.scale = m.scale.data_as<float>();
  k.pre = m.pre.data_as<float>();
  k.post = m.post.data_as<float>();
  k.comb = m.comb.data_as<float>();
  k.tokens = m.streams.dim(0);
  k.hc = m.streams.dim(1);
  k.d = m.streams.dim(2);
  k.norm_eps = m.norm_eps;
  k.hc_eps = m.hc_eps;
  k.sinkhorn_iters = m.sinkhorn_iters;
  k.expand_streams = e.streams.data_as<float>();
  k.expand_x = e.x.data_as<float>();
  k.expand_post = e.post.data_as<float>();
  k.expand_comb = e.comb.data_as<float>();
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  k.splits = cuda::hc_mix_splits(k.hc, k.d);
  k.partial = impl_->ws().take_as<float>(std::max<int64_t>(1, k.splits * k.tokens * ((2 + k.hc) * k.hc + 1)));
  k.arrivals = impl_->hc_mix_arrivals.data_as<unsigned>();
  cuda::run_hc_expand_mix(k, impl_->s());
}

void CudaBackend::norm_rope(const NormRopeParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("norm_rope", "positions", p.positions, dev);
  expect_on("norm_rope", "inv_freq", p.inv_freq, dev);
  cuda::NormRopeKernelParams k;
  for (int i = 0; i < 2; ++i) {
    const NormRopePart& part = p.parts[i];
    if (part.x.data() == nullptr) continue;
    expect_on("norm_rope", "x", part.x, dev);
    expect_on("norm_rope", "weight", part.weight, dev);
    k.parts[i].x = part.x.data_as<float>();
    k.parts[i].weight = cptr<float>(part.weight);
    k.parts[i].heads = part.x.dim(1);
    k.parts[i].hd = part.x.dim(2);
    k.parts[i].norm = part.norm;
    k.parts[i].rope = part.rope;
    k.parts[i].fake_quant = part.fake_quant;
    k.parts[i].quant = part.quant;
  }
  k.positions = p.positions.data_as<int64_t>();
  k.inv_freq = p.inv_freq.data_as<float>();
  k.tokens = p.positions.dim(0);
  k.half = p.inv_freq.dim(0);
  k.eps = p.eps;
  cuda::run_norm_rope(k, impl_->s());
}

}  // namespace deepinfer
