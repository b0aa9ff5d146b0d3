// MLA attention (V3 family) on the GPU against the CPU op: the absorbed form at small dims and at V3's
// (H=128, dn=128, dr=64, r=512, dv=128), decode (one query, split over the keys) and a few queries with causal
// masks; cache rows no query may see are NaN; a query that sees nothing gets zeros. The CUDA naive entry point
// runs the same kernels and is compared with the CPU naive form. fp32 in another summation order: 2e-5.
#include "cuda_test_util.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaOpTest, MlaAttentionMatchesCpu) {
  struct Case {
    int64_t t, h, dn, dr, r, dv, s;
  };
  for (const Case& c :
       {Case{5, 4, 16, 8, 64, 24, 40}, Case{1, 128, 128, 64, 512, 128, 700}, Case{3, 128, 128, 64, 512, 128, 300}}) {
    HostTensor q = rand({c.t, c.h, c.dn + c.dr}), kv = rand({c.s, c.r + c.dr});
    HostTensor kv_b = rand({c.h * (c.dn + c.dv), c.r}, -0.1f, 0.1f);
    HostTensor qpos(DType::kI64, {c.t}), kvpos(DType::kI64, {c.s});
    for (int64_t i = 0; i < c.s; ++i) kvpos.data<int64_t>()[i] = 10 + i;
    // Queries near the end; the first of a multi-query case sees nothing (position before every row).
    for (int64_t i = 0; i < c.t; ++i) qpos.data<int64_t>()[i] = c.t > 1 && i == 0 ? 5 : 10 + c.s - 1 - 3 * i;
    int64_t newest = 0;
    for (int64_t i = 0; i < c.t; ++i) newest = std::max(newest, qpos.data<int64_t>()[i]);
    for (int64_t s = 0; s < c.s; ++s)
      if (kvpos.data<int64_t>()[s] > newest)
        for (int64_t j = 0; j < c.r + c.dr; ++j) kv.data<float>()[s * (c.r + c.dr) + j] = NAN;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dn + c.dr));
    HostTensor want(DType::kF32, {c.t, c.h, c.dv}), want_naive(DType::kF32, {c.t, c.h, c.dv});
    cpu().mla_attention_absorbed({q, qpos, kv, kvpos, kv_b, want, static_cast<int>(c.dr), scale});
    cpu().mla_attention_naive({q, qpos, kv, kvpos, kv_b, want_naive, static_cast<int>(c.dr), scale});
    DeviceTensor dq = up(q), dqp = up(qpos), dkv = up(kv), dkvp = up(kvpos), dkvb = up(kv_b);
    DeviceTensor dout = poisoned({c.t, c.h, c.dv}), dnaive = poisoned({c.t, c.h, c.dv});
    gpu().mla_attention_absorbed({dq, dqp, dkv, dkvp, dkvb, dout, static_cast<int>(c.dr), scale});
    gpu().mla_attention_naive({dq, dqp, dkv, dkvp, dkvb, dnaive, static_cast<int>(c.dr), scale});
    const std::string n = " T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " S=" + std::to_string(c.s);
    const HostTensor got = down(dout);
    rel_err(("mla absorbed" + n).c_str(), got, want, 2e-5);
    rel_err(("mla naive entry" + n).c_str(), down(dnaive), want_naive, 2e-5);
    if (c.t > 1)
      for (int64_t i = 0; i < c.h * c.dv; ++i) ASSERT_EQ(got.data<float>()[i], 0.0f) << "query with no visible key";
  }
}

}  // namespace
}  // namespace deepinfer::testing
