// The tensor-core indexer scores (indexer_mma_cuda.cu) against the CPU op and against the SIMT kernels, chosen
// through KernelChoices::indexer_mma. Random data (never zeros), prefill-like causal positions (from tokens that see
// nothing to tokens that see every entry), unsorted positions, partial token blocks and key tiles, padded head
// counts, V4-Flash (64 x 128) and V4.1-Flash (32 x 128) dims, keys no token may read poisoned with NaN, paged keys
// of several sequences with tokens interleaved across blocks, a sequence without entries, bad pages.
// Tolerance: on arbitrary fp32 data the kernel's split-bf16 products (hi·hi + hi·lo + lo·hi) are off by at most
// 3·2^-16 of |q||k| each; CPU emulation of that arithmetic (torch, fp64 sums) gives a norm-relative error of
// 3.5e-6 to 4.7e-6 on this kind of data (16-64 heads, dim 64 / 128, 65-2048 entries) where fp32 gives 2e-7,
// so 2e-5 against the CPU op and the SIMT kernel. On bf16-exact data (V4.1's FP4-quantized q and keys) every
// product is exact and only the fp32 sums' order differs: 2e-6. Dropping the lo terms on fp32 data would give
// ~2e-3 (emulated), so the tests also catch a wrong single-mma shortcut.
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#include "deepinfer/ops/cuda/indexer_mma.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "ops/op_test_util.h"

namespace deepinfer::testing {
namespace {

constexpr double kSplitTol = 2e-5, kExactTol = 2e-6;

constexpr cuda::KernelPick kAuto = cuda::KernelPick::kAuto, kNever = cuda::KernelPick::kNever,
                           kAlways = cuda::KernelPick::kAlways;

double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isfinite(a.data<float>()[i]) && std::isfinite(b.data<float>()[i]))
      m = std::max(m, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

class CudaIndexerMma : public CudaOpTest {
 protected:
  // FP4-like values as V4.1 feeds them (kFP4Ue8m0Block32): ±e2m1 (0.5 .. 6, never 0) times a power-of-two scale
  // per 32 values. Exact in bf16.
  HostTensor fp4_like(Shape shape) {
    static constexpr float kE2m1[] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    HostTensor t(DType::kF32, std::move(shape));
    std::uniform_int_distribution<int> mag(0, 6), sign(0, 1), scale(-6, -2);
    float s = 1.0f;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (i % 32 == 0) s = std::ldexp(1.0f, scale(rng()));
      t.data<float>()[i] = (sign(rng()) ? -1.0f : 1.0f) * kE2m1[mag(rng())] * s;
    }
    return t;
  }
  // Prefill-like positions: token i of t at ratio·n − 1 − (t − 1 − i)·step, step = ratio·n / t (so the first
  // tokens see few entries or none and the last sees all n).
  static HostTensor prefill_positions(int64_t t, int64_t n, int ratio) {
    HostTensor pos(DType::kI64, {t});
    const int64_t step = std::max<int64_t>(1, ratio * n / t);
    for (int64_t i = 0; i < t; ++i) pos.data<int64_t>()[i] = std::max<int64_t>(0, ratio * n - 1 - (t - 1 - i) * step);
    return pos;
  }
  // Keys no token of `pos` can see: NaN (they must never be read).
  static void poison_invisible(HostTensor& keys, const HostTensor& pos, int ratio) {
    const int64_t n = keys.shape()[0], dim = keys.shape()[1];
    int64_t max_visible = 0;
    for (int64_t i = 0; i < pos.numel(); ++i) max_visible = std::max(max_visible, (pos.data<int64_t>()[i] + 1) / ratio);
    for (int64_t e = max_visible; e < n; ++e)
      for (int64_t c = 0; c < dim; ++c) keys.data<float>()[e * dim + c] = NAN;
  }
  // indexer_scores on the GPU with KernelChoices::indexer_mma = mma, into a NaN-poisoned output.
  HostTensor run(cuda::KernelPick mma, const HostTensor& q, const HostTensor& keys, const HostTensor& w,
                 const HostTensor& pos, int ratio, float score_scale, float weight_scale) {
    ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& k) { k.indexer_mma = mma; });
    DeviceTensor dq = up(q), dk = up(keys), dw = up(w), dp = up(pos), dout = poisoned({q.shape()[0], keys.shape()[0]});
    gpu().indexer_scores({dq, dk, dw, dp, dout, ratio, score_scale, weight_scale});
    return down(dout);
  }
  // CPU op, tensor-core kernel (under `mma`) and SIMT kernel on one case: each against the CPU op, and the two
  // kernels against each other (and differing: the choice must change the kernel).
  void check(const std::string& name, const HostTensor& q, const HostTensor& keys, const HostTensor& w,
             const HostTensor& pos, int ratio, cuda::KernelPick pick, double tol) {
    const int64_t t = q.shape()[0], n = keys.shape()[0];
    const float score_scale = 1.0f / std::sqrt(static_cast<float>(q.shape()[2]));
    const float weight_scale = 1.0f / std::sqrt(static_cast<float>(q.shape()[1]));
    HostTensor want(DType::kF32, {t, n});
    cpu().indexer_scores({q, keys, w, pos, want, ratio, score_scale, weight_scale});
    const HostTensor mma = run(pick, q, keys, w, pos, ratio, score_scale, weight_scale);
    const HostTensor simt = run(kNever, q, keys, w, pos, ratio, score_scale, weight_scale);
    rel_err(("indexer mma vs cpu " + name).c_str(), mma, want, tol);
    rel_err(("indexer simt vs cpu " + name).c_str(), simt, want, 1e-5);
    rel_err(("indexer mma vs simt " + name).c_str(), mma, simt, tol);
    EXPECT_GT(max_abs_diff(mma, simt), 0.0) << name << ": indexer_mma did not change the kernel";
  }
};

// Contiguous keys on fp32 data (the split path): random q / keys / weights, prefill-like or unsorted positions,
// NaN keys past what any token sees; the CPU op, the tensor-core kernel (kAuto: the default, >= 64
// tokens) and the SIMT kernel.
struct ContiguousCase {
  const char* name;
  int64_t t, ih, id, n;
  int ratio;
  bool unsorted;
  cuda::KernelPick mma;
};

class CudaIndexerMmaContiguous : public CudaIndexerMma {
 protected:
  void run_case(const ContiguousCase& c) {
    HostTensor q = rand({c.t, c.ih, c.id}), keys = rand({c.n, c.id}), w = rand({c.t, c.ih});
    // Unsorted: any position, including ones past the last entry (every entry visible) and -1 (none).
    HostTensor pos =
        c.unsorted ? ints(DType::kI64, {c.t}, -1, c.ratio * c.n + 50) : prefill_positions(c.t, c.n, c.ratio);
    poison_invisible(keys, pos, c.ratio);
    check(c.name, q, keys, w, pos, c.ratio, c.mma, kSplitTol);
  }
};

// V4-Flash and V4.1 dims above the token threshold, partial token blocks and key tiles, heads padded to 32 / 64
// rows.
TEST_F(CudaIndexerMmaContiguous, MatchesCpuAndSimtOnFp32Data) {
  const ContiguousCase cases[] = {
      {"V4 T=203 IH=64 Id=128 N=700 r=4", 203, 64, 128, 700, 4, false, kAuto},
      {"V4.1 T=130 IH=32 Id=128 N=333 r=2", 130, 32, 128, 333, 2, false, kAuto},
      {"V4.1 T=128 IH=32 Id=128 N=64 r=1", 128, 32, 128, 64, 1, false, kAuto},
      {"unsorted T=150 IH=64 Id=128 N=500 r=4", 150, 64, 128, 500, 4, true, kAuto},
      {"IH=40 (padded) T=129 Id=128 N=257 r=4", 129, 40, 128, 257, 4, false, kAuto},
  };
  for (const ContiguousCase& c : cases) run_case(c);
}

// Calls below the threshold through indexer_mma kAlways: one token, dim 64, 16 heads (padded to 32). Small
// enough for compute-sanitizer's racecheck and memcheck.
TEST_F(CudaIndexerMmaContiguous, SmallCallsThroughAll) {
  const ContiguousCase cases[] = {
      {"IH=16 Id=64 T=7 N=130 r=1 (all)", 7, 16, 64, 130, 1, false, kAlways},
      {"IH=64 Id=64 T=66 N=200 r=4 (all)", 66, 64, 64, 200, 4, true, kAlways},
      {"V4 T=1 IH=64 Id=128 N=300 r=4 (all)", 1, 64, 128, 300, 4, false, kAlways},
      {"V4.1 T=9 IH=32 Id=128 N=150 r=2 (all)", 9, 32, 128, 150, 2, false, kAlways},
  };
  for (const ContiguousCase& c : cases) run_case(c);
}

// bf16-exact data (V4.1's FP4-quantized queries and keys): the single-mma path, exact products. One side exact
// and the other fp32 takes the split path (a single mma there would be ~2e-3 off).
TEST_F(CudaIndexerMma, ExactOnFp4DataAndSplitOnMixed) {
  const int64_t t = 160, ih = 32, id = 128, n = 400;
  const int ratio = 2;
  const HostTensor pos = prefill_positions(t, n, ratio);
  HostTensor q4 = fp4_like({t, ih, id}), k4 = fp4_like({n, id}), qf = rand({t, ih, id}), kf = rand({n, id});
  const HostTensor w = rand({t, ih});
  for (HostTensor* k : {&k4, &kf}) poison_invisible(*k, pos, ratio);
  check("fp4 q, fp4 keys", q4, k4, w, pos, ratio, kAuto, kExactTol);
  check("fp4 q, fp32 keys", q4, kf, w, pos, ratio, kAuto, kSplitTol);
  check("fp32 q, fp4 keys", qf, k4, w, pos, ratio, kAuto, kSplitTol);
}

// What the scores are for: the top-512 selection over them. V4-Flash's shape, 256 queries at the end of an
// 8192-token context (all 2048 entries visible): the GPU's top-k over the tensor-core scores against the CPU's
// top-k over the CPU's scores. Emulated (tools/indexer_mma_emulate.py's arithmetic, 128 such rows) no pick differs
// from fp64 for either; at ~4e-6 relative error a flip needs two scores that close at the 512th place, so more than
// 1 in 10^4 picks differing means an error well above the kernel's bound.
TEST_F(CudaIndexerMma, TopKSelectionsMatchCpu) {
  const int64_t t = 256, ih = 64, id = 128, n = 2048;
  const int k = 512;
  const HostTensor q = rand({t, ih, id}), keys = rand({n, id}), w = rand({t, ih});
  HostTensor pos(DType::kI64, {t});
  for (int64_t i = 0; i < t; ++i) pos.data<int64_t>()[i] = 8192 - t + i;
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(id)), weight_scale = 0.125f;
  HostTensor scores(DType::kF32, {t, n}), want(DType::kU8, {t, n});
  cpu().indexer_scores({q, keys, w, pos, scores, 4, score_scale, weight_scale});
  cpu().topk_mask({scores, Tensor{}, want, k});
  DeviceTensor dq = up(q), dk = up(keys), dw = up(w), dp = up(pos), dscores = poisoned({t, n});
  DeviceTensor dmask = poisoned_bytes(DType::kU8, {t, n});
  gpu().indexer_scores({dq, dk, dw, dp, dscores, 4, score_scale, weight_scale});
  gpu().topk_mask({dscores, Tensor{}, dmask, k});
  const HostTensor got = down(dmask);
  int64_t differ = 0;
  for (int64_t i = 0; i < t * n; ++i) differ += got.data<uint8_t>()[i] != want.data<uint8_t>()[i];
  differ /= 2;  // a flip drops one pick and takes another
  std::printf("[cuda-op] indexer mma top-512 picks differing from the CPU: %lld of %lld\n",
              static_cast<long long>(differ), static_cast<long long>(t * k));
  EXPECT_LE(differ, t * k / 10000) << "seed " << seed_;
}

// Batch-invariant mode never takes the tensor-core kernel: the same bytes as the SIMT kernel.
TEST_F(CudaIndexerMma, BatchInvariantModeKeepsSimt) {
  const int64_t t = 140, ih = 64, id = 128, n = 300;
  const HostTensor q = rand({t, ih, id}), keys = rand({n, id}), w = rand({t, ih}), pos = prefill_positions(t, n, 4);
  const HostTensor simt = run(kNever, q, keys, w, pos, 4, 0.088f, 0.125f);
  gpu().set_batch_invariant(true);
  const HostTensor inv = run(kAuto, q, keys, w, pos, 4, 0.088f, 0.125f);
  gpu().set_batch_invariant(false);
  expect_same_bytes("indexer batch-invariant = simt", inv, simt);
}

// Which calls take the tensor-core kernel.
TEST_F(CudaIndexerMma, DispatchRule) {
  cuda::IndexerScoresKernelParams p;
  alignas(16) static float buf[4];
  p.q = buf;
  p.keys = buf;
  p.tokens = 64;
  p.heads = 64;
  p.dim = 128;
  p.n = 100;
  EXPECT_TRUE(cuda::indexer_scores_use_mma(p, false));
  EXPECT_FALSE(cuda::indexer_scores_use_mma(p, true)) << "batch-invariant";
  cuda::IndexerScoresKernelParams q = p;
  q.tokens = 63;
  EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "below the token threshold";
  q = p;
  q.block_tables = reinterpret_cast<const int32_t*>(buf);
  q.seqs = 64;
  EXPECT_TRUE(cuda::indexer_scores_use_mma(q, false)) << "decode batch of 64: one token a sequence";
  q.tokens = q.seqs = cuda::kIndexerMmaMinDecodeTokens - 1;
  EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "decode batch below kIndexerMmaMinDecodeTokens";
  q.tokens = q.seqs = cuda::kIndexerMmaMinDecodeTokens;
  EXPECT_TRUE(cuda::indexer_scores_use_mma(q, false)) << "decode batch of kIndexerMmaMinDecodeTokens";
  q.tokens = 63;
  q.seqs = 4;
  EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "4 tokens a sequence, below kIndexerMmaMinTokens";
  q.tokens = 64;
  q.seqs = 16;
  EXPECT_TRUE(cuda::indexer_scores_use_mma(q, false)) << "4 tokens a sequence";
  for (int64_t dim : {100, 256, 32}) {
    q = p;
    q.dim = dim;
    EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "dim " << dim;
  }
  q = p;
  q.heads = 65;
  EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "65 heads";
  q = p;
  q.keys = buf + 1;
  EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "unaligned keys";
  q = p;
  q.mma = kNever;
  EXPECT_FALSE(cuda::indexer_scores_use_mma(q, false)) << "kNever";
  q = p;
  q.mma = kAlways;
  q.tokens = 1;
  EXPECT_TRUE(cuda::indexer_scores_use_mma(q, false)) << "kAlways";
}

// A batched call over paged keys: sequences of different lengths and token counts (one without entries: its
// rows are all −inf), pages in shuffled order, NaN in every pool row no token may read, tokens of a sequence
// mostly consecutive with a few swapped across sequences (blocks of 4 tokens from 2-3 sequences: several passes).
struct PagedBatch {
  int64_t dim = 128, heads = 64, n = 0;
  int block_size = 64, ratio = 4;
  HostTensor q, weights, positions, q_seq, n_entries, tables, pool;
};

class CudaIndexerMmaPaged : public CudaIndexerMma {
 protected:
  PagedBatch make(const std::vector<std::pair<int64_t, int64_t>>& seqs, int64_t heads = 64,
                  int64_t dim = 128) {  // (tokens, entries) a sequence
    PagedBatch c;
    c.heads = heads;
    c.dim = dim;
    const int64_t B = static_cast<int64_t>(seqs.size()), per_block = c.block_size / c.ratio;
    int64_t total = 0, max_entries = 0, max_blocks = 1;
    for (const auto& [tk, ne] : seqs) {
      total += tk;
      max_entries = std::max(max_entries, ne);
      max_blocks = std::max(max_blocks, (ne + per_block - 1) / per_block);
    }
    c.n = max_entries + 9;
    std::vector<int32_t> ids(B * max_blocks + 3);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    c.tables = HostTensor(DType::kI32, {B, max_blocks});
    c.pool = nan_filled({static_cast<int64_t>(ids.size()) * per_block, c.dim});
    c.q = rand({total, c.heads, c.dim});
    c.weights = rand({total, c.heads});
    c.positions = HostTensor(DType::kI64, {total});
    c.q_seq = HostTensor(DType::kI32, {total});
    c.n_entries = HostTensor(DType::kI64, {total});
    std::uniform_real_distribution<float> val(-1.0f, 1.0f);
    int64_t next = 0, row = 0;
    for (int64_t b = 0; b < B; ++b) {
      const auto [tk, ne] = seqs[b];
      for (int64_t j = 0; j < max_blocks; ++j) c.tables.data<int32_t>()[b * max_blocks + j] = ids[next++];
      // Prefill-like positions: the sequence's last token sees all its entries, earlier ones fewer.
      int64_t max_visible = 0;
      for (int64_t i = 0; i < tk; ++i, ++row) {
        const int64_t step = std::max<int64_t>(1, c.ratio * ne / std::max<int64_t>(tk, 1));
        const int64_t pos = std::max<int64_t>(0, c.ratio * ne - 1 - (tk - 1 - i) * step);
        c.positions.data<int64_t>()[row] = pos;
        c.q_seq.data<int32_t>()[row] = static_cast<int32_t>(b);
        c.n_entries.data<int64_t>()[row] = ne;
        max_visible = std::max(max_visible, std::min(ne, (pos + 1) / c.ratio));
      }
      for (int64_t g = 0; g < max_visible; ++g) {
        const int32_t id = c.tables.data<int32_t>()[b * max_blocks + g * c.ratio / c.block_size];
        float* r = c.pool.data<float>() + (id * per_block + (g * c.ratio % c.block_size) / c.ratio) * c.dim;
        for (int64_t i = 0; i < c.dim; ++i) r[i] = val(rng());
      }
    }
    // A few tokens swapped across sequences (their rows move with them).
    std::uniform_int_distribution<int64_t> pick(0, total - 1);
    for (int s = 0; s < 6; ++s) swap_rows(c, pick(rng()), pick(rng()));
    return c;
  }
  static void swap_rows(PagedBatch& c, int64_t a, int64_t b) {
    if (a == b) return;
    auto swap_span = [&](HostTensor& t, int64_t width, size_t elem) {
      auto* base = static_cast<uint8_t*>(t.view().data());
      std::vector<uint8_t> tmp(width * elem);
      std::memcpy(tmp.data(), base + a * width * elem, width * elem);
      std::memcpy(base + a * width * elem, base + b * width * elem, width * elem);
      std::memcpy(base + b * width * elem, tmp.data(), width * elem);
    };
    swap_span(c.q, c.heads * c.dim, 4);
    swap_span(c.weights, c.heads, 4);
    swap_span(c.positions, 1, 8);
    swap_span(c.q_seq, 1, 4);
    swap_span(c.n_entries, 1, 8);
  }
  static PagedIndexerScoreParams params(const PagedBatch& c, const Tensor& q, const Tensor& w, const Tensor& pos,
                                        const Tensor& seq, const Tensor& ne, const Tensor& tables, const Tensor& pool,
                                        const Tensor& out) {
    PagedIndexerScoreParams p;
    p.q = q;
    p.weights = w;
    p.positions = pos;
    p.q_seq = seq;
    p.n_entries = ne;
    p.block_tables = tables;
    p.key_pool = pool;
    p.out = out;
    p.block_size = c.block_size;
    p.key_ratio = c.ratio;
    p.ratio = c.ratio;
    p.score_scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    p.weight_scale = 1.0f / std::sqrt(static_cast<float>(c.heads));
    return p;
  }
  // c's tables point outside the pool for entries a token sees: the call raises the status bit.
  void expect_bad_page_reported(const PagedBatch& c) {
    DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
    DeviceTensor dt = up(c.tables), dpool = up(c.pool), dout = poisoned({c.q.shape()[0], c.n});
    gpu().paged_indexer_scores(params(c, dq, dw, dp, ds, dn, dt, dpool, dout));
    try {
      gpu().synchronize();
      ADD_FAILURE() << "no error for block ids outside the pool";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("paged_indexer_scores"), std::string::npos) << e.what();
    }
  }
  HostTensor run_paged(const PagedBatch& c, cuda::KernelPick mma, bool decode_form = true, bool ring = true) {
    ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& k) {
      k.indexer_mma = mma;
      k.indexer_mma_decode = decode_form;
      k.indexer_mma_ring = ring;
    });
    DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
    DeviceTensor dt = up(c.tables), dpool = up(c.pool), dout = poisoned({c.q.shape()[0], c.n});
    gpu().paged_indexer_scores(params(c, dq, dw, dp, ds, dn, dt, dpool, dout));
    return down(dout);
  }
};

TEST_F(CudaIndexerMmaPaged, MatchesCpuAndSimt) {
  const PagedBatch c = make({{61, 300}, {75, 45}, {5, 0}, {38, 512}, {23, 130}});
  HostTensor want(DType::kF32, {c.q.shape()[0], c.n});
  cpu().paged_indexer_scores(params(c, c.q, c.weights, c.positions, c.q_seq, c.n_entries, c.tables, c.pool, want));
  const HostTensor mma = run_paged(c, kAuto), simt = run_paged(c, kNever);
  rel_err("paged indexer mma vs cpu", mma, want, kSplitTol);
  rel_err("paged indexer simt vs cpu", simt, want, 1e-5);
  rel_err("paged indexer mma vs simt", mma, simt, kSplitTol);
  EXPECT_GT(max_abs_diff(mma, simt), 0.0) << "indexer_mma did not change the kernel";
}

// Decode-shaped calls (fewer than 4 tokens a sequence: the decode form, all warps on one token's tile) at V4's 64 and
// V4.1's 32 heads, dims 128 and 64: one token a sequence mostly, a few with 2-3, entry counts around the 64-key tiles
// (0, 1, 63, 64, 65, ...; 9000: several key tiles a split), against the CPU, the sequence-pass form and the SIMT
// kernel; on V4.1's FP4-like data (exact products) at the exact tolerance, then with a bad page (the status bit).
TEST_F(CudaIndexerMmaPaged, DecodeFormMatchesCpuAndTheSequencePassForm) {
  std::vector<std::pair<int64_t, int64_t>> seqs;
  const int64_t entries[] = {0, 1, 63, 64, 65, 127, 200, 700, 9000, 5, 1030, 64, 129, 18};
  for (size_t i = 0; i < 20; ++i) seqs.push_back({i % 7 == 3 ? 2 + static_cast<int64_t>(i % 2) : 1, entries[i % 14]});
  for (const auto& [heads, dim] : {std::pair<int64_t, int64_t>{64, 128}, {32, 128}, {32, 64}, {64, 64}}) {
    for (const bool fp4 : {false, true}) {
      PagedBatch c = make(seqs, heads, dim);
      if (fp4) {  // V4.1's quantized values in every row a token may read (the NaN rows stay)
        c.q = fp4_like(c.q.shape());
        const HostTensor k4 = fp4_like(c.pool.shape());
        for (int64_t i = 0; i < c.pool.numel(); ++i)
          if (!std::isnan(c.pool.data<float>()[i])) c.pool.data<float>()[i] = k4.data<float>()[i];
      }
      const std::string name = "IH=" + std::to_string(heads) + " Id=" + std::to_string(dim) + (fp4 ? " fp4" : "");
      ASSERT_TRUE(cuda::indexer_scores_decode_form([&] {
        cuda::IndexerScoresKernelParams k;
        k.block_tables = reinterpret_cast<const int32_t*>(c.tables.view().data());
        k.tokens = c.q.shape()[0];
        k.seqs = static_cast<int64_t>(seqs.size());
        return k;
      }()));
      HostTensor want(DType::kF32, {c.q.shape()[0], c.n});
      cpu().paged_indexer_scores(params(c, c.q, c.weights, c.positions, c.q_seq, c.n_entries, c.tables, c.pool, want));
      const HostTensor dec = run_paged(c, kAuto), pass = run_paged(c, kAuto, false), simt = run_paged(c, kNever);
      const double tol = fp4 ? kExactTol : kSplitTol;
      rel_err(("paged indexer decode form vs cpu " + name).c_str(), dec, want, tol);
      rel_err(("paged indexer sequence-pass form vs cpu " + name).c_str(), pass, want, tol);
      rel_err(("paged indexer decode form vs simt " + name).c_str(), dec, simt, tol);
      rel_err(("paged indexer decode form vs sequence-pass form " + name).c_str(), dec, pass, tol);
    }
  }
  PagedBatch c = make(seqs, 32, 128);
  const int64_t seq_of_bad = 7;  // 700 entries: pages 1.. of its table point outside the pool
  for (int64_t j = 1; j < c.tables.shape()[1]; ++j)
    c.tables.data<int32_t>()[seq_of_bad * c.tables.shape()[1] + j] = 1 << 20;
  ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& k) { k.indexer_mma = kAuto; });
  expect_bad_page_reported(c);
}

// The decode form's ring kernel (f32 and bf16 key pools and FP4 key records: a block a token, key tiles through
// cp.async stages) against the decode form's own loop over the same pool, over an f32 pool as made, its bf16 rounding
// as a bf16 pool and as an f32 pool of the rounded values, and its FP4 records (V4.1's --kv-cache-dtype fp8) and an
// f32 pool of their values: the same values bit for bit (any NaN for a NaN), and against the CPU op. V4's 64 and
// V4.1's 32 heads, dims 128 and 64, fp32 queries (the split path) and FP4-like ones (hi only); entry counts around the
// tiles, then (the LongRanges test) 64 sequences of ~9000 entries: ranges of many tiles a block, the ring wrapping
// several times; then a bad page.
struct RingCase {
  std::vector<std::pair<int64_t, int64_t>> seqs;
  int64_t heads, dim;
  bool fp4, cpu;
};

class CudaIndexerDecodeRing : public CudaIndexerMmaPaged {
 protected:
  static std::vector<std::pair<int64_t, int64_t>> short_seqs() {
    std::vector<std::pair<int64_t, int64_t>> seqs;
    const int64_t entries[] = {0, 1, 63, 64, 65, 127, 200, 700, 9000, 5, 1030, 64, 129, 18, 255, 256, 257};
    for (size_t i = 0; i < 24; ++i) seqs.push_back({i % 7 == 3 ? 2 + static_cast<int64_t>(i % 2) : 1, entries[i % 17]});
    return seqs;
  }
  void check(const RingCase& k);
};

TEST_F(CudaIndexerDecodeRing, EqualsTheDecodeFormOverBf16Pools) {
  const auto seqs = short_seqs();
  for (const RingCase& k :
       {RingCase{seqs, 64, 128, false, true}, RingCase{seqs, 32, 128, false, true}, RingCase{seqs, 32, 128, true, true},
        RingCase{seqs, 64, 128, true, true}, RingCase{seqs, 32, 64, false, true}, RingCase{seqs, 64, 64, true, true}})
    check(k);
  PagedBatch c = make(seqs, 32, 128);
  const int64_t seq_of_bad = 7;  // 700 entries: pages 1.. of its table point outside the pool
  for (int64_t j = 1; j < c.tables.shape()[1]; ++j)
    c.tables.data<int32_t>()[seq_of_bad * c.tables.shape()[1] + j] = 1 << 20;
  ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& kc) { kc.indexer_mma = kAuto; });
  const HostTensor records = records_of(c.pool, kIndexKeyRecord).records;
  expect_bad_page_reported(c);  // the f32 ring
  c.pool = bf16_of(c.pool);
  expect_bad_page_reported(c);  // the bf16 ring
  c.pool = copy_of(records);
  expect_bad_page_reported(c);  // the record ring
}

TEST_F(CudaIndexerDecodeRing, LongRanges) {
  std::vector<std::pair<int64_t, int64_t>> seqs;
  for (int64_t i = 0; i < 64; ++i) seqs.push_back({1, 8900 + 37 * i});
  check({seqs, 32, 128, true, false});
  check({seqs, 64, 128, false, false});
}

void CudaIndexerDecodeRing::check(const RingCase& k) {
  PagedBatch c = make(k.seqs, k.heads, k.dim);
  if (k.fp4) {  // V4.1's quantized values in every row a token may read (the NaN rows stay)
    c.q = fp4_like(c.q.shape());
    const HostTensor k4 = fp4_like(c.pool.shape());
    for (int64_t i = 0; i < c.pool.numel(); ++i)
      if (!std::isnan(c.pool.data<float>()[i])) c.pool.data<float>()[i] = k4.data<float>()[i];
  }
  const std::string name = "T=" + std::to_string(c.q.shape()[0]) + " IH=" + std::to_string(k.heads) +
                           " Id=" + std::to_string(k.dim) + (k.fp4 ? " fp4" : "");
  {  // The ring takes decode calls over f32 and bf16 pools, and none with indexer_mma_ring off.
    DeviceTensor aligned = up(rand({16}));  // only the pointers' alignment and presence are read
    cuda::IndexerScoresKernelParams kp;
    kp.keys = aligned.view().data();
    kp.q = aligned.view().data_as<float>();
    kp.block_tables = reinterpret_cast<const int32_t*>(aligned.view().data());
    kp.tokens = c.q.shape()[0];
    kp.seqs = static_cast<int64_t>(k.seqs.size());
    kp.heads = k.heads;
    kp.dim = k.dim;
    for (const cuda::PoolFormat f : {cuda::PoolFormat::kF32, cuda::PoolFormat::kBf16, cuda::PoolFormat::kFp4Ue8m0B32}) {
      kp.keys_format = f;
      kp.mma_ring = true;
      ASSERT_TRUE(cuda::indexer_decode_ring_takes(kp)) << name;
      kp.mma_ring = false;
      ASSERT_FALSE(cuda::indexer_decode_ring_takes(kp)) << name;
    }
    // Records are copied by 4-byte words (a 68-byte row is word-aligned only); the other pools by 16 bytes.
    kp.mma_ring = true;
    kp.keys = static_cast<const uint8_t*>(aligned.view().data()) + 4;
    ASSERT_TRUE(cuda::indexer_decode_ring_takes(kp)) << name;
    kp.keys_format = cuda::PoolFormat::kBf16;
    ASSERT_FALSE(cuda::indexer_decode_ring_takes(kp)) << name;
    kp.keys_format = cuda::PoolFormat::kFp4E4m3B16;  // the attention's entry records: never index keys
    kp.keys = aligned.view().data();
    ASSERT_FALSE(cuda::indexer_decode_ring_takes(kp)) << name;
  }
  const auto cpu_scores = [&] {
    HostTensor want(DType::kF32, {c.q.shape()[0], c.n});
    cpu().paged_indexer_scores(params(c, c.q, c.weights, c.positions, c.q_seq, c.n_entries, c.tables, c.pool, want));
    return want;
  };
  const double tol = k.fp4 ? kExactTol : kSplitTol;
  // Its FP4 records, and an f32 pool of their values (the loop over records reads those values).
  RecordPool rec = records_of(c.pool, kIndexKeyRecord);
  HostTensor made = std::move(c.pool);
  c.pool = std::move(rec.records);
  const HostTensor ring_rec = run_paged(c, kAuto), loop_rec = run_paged(c, kAuto, true, false);
  expect_same_values(("indexer ring vs decode loop, FP4 records " + name).c_str(), ring_rec, loop_rec);
  if (k.cpu) rel_err(("indexer ring vs cpu, FP4 records " + name).c_str(), ring_rec, cpu_scores(), tol);
  c.pool = std::move(rec.values);
  const HostTensor ring_vals = run_paged(c, kAuto);
  expect_same_values(("indexer record ring vs f32 ring over their values " + name).c_str(), ring_rec, ring_vals);
  c.pool = std::move(made);
  // The f32 pool as made.
  const HostTensor ring32 = run_paged(c, kAuto), loop32 = run_paged(c, kAuto, true, false);
  expect_same_values(("indexer ring vs decode loop, f32 pool " + name).c_str(), ring32, loop32);
  if (k.cpu) rel_err(("indexer ring vs cpu, f32 pool " + name).c_str(), ring32, cpu_scores(), tol);
  // Its bf16 rounding, as a bf16 pool and as an f32 pool of the rounded values.
  HostTensor rounded = rounded_f32_of(c.pool);
  c.pool = bf16_of(c.pool);
  const HostTensor ring = run_paged(c, kAuto), loop = run_paged(c, kAuto, true, false);
  expect_same_values(("indexer ring vs decode loop, bf16 pool " + name).c_str(), ring, loop);
  if (k.cpu) rel_err(("indexer ring vs cpu, bf16 pool " + name).c_str(), ring, cpu_scores(), tol);
  c.pool = std::move(rounded);
  const HostTensor ring_r = run_paged(c, kAuto), loop_r = run_paged(c, kAuto, true, false);
  expect_same_values(("indexer bf16 ring vs decode loop, f32 pool of the rounded keys " + name).c_str(), ring, loop_r);
  expect_same_values(("indexer f32 ring vs decode loop, f32 pool of the rounded keys " + name).c_str(), ring_r, loop_r);
}

// The ring kernel's split rule (host only): waves of resident blocks x (tiles a block + 2), the fewest splits of the
// least cost. V4.1 b64 at 64k (256 tiles, 264 slots on an H100): 4 splits, one wave of 64 tiles a block (9 splits,
// the decode form's rule, made 2.2 waves); one token: every tile its own block; a full wave of tokens: no split.
TEST(CudaIndexerDecodeRingSplits, FewestWavesTimesTiles) {
  EXPECT_EQ(cuda::indexer_decode_ring_splits(64, 256, 264), 4);
  EXPECT_EQ(cuda::indexer_decode_ring_splits(1, 256, 264), 256);
  EXPECT_EQ(cuda::indexer_decode_ring_splits(256, 16, 264), 1);
  EXPECT_EQ(cuda::indexer_decode_ring_splits(64, 16, 264), 4);  // 4 tiles a block in one wave (8 splits: two waves)
  EXPECT_EQ(cuda::indexer_decode_ring_splits(264, 256, 264), 1);
  EXPECT_EQ(cuda::indexer_decode_ring_splits(5, 1, 264), 1);
  // Against every split count: none costs less, and no smaller count costs the same.
  const auto cost = [](int64_t tokens, int64_t tiles, int64_t slots, int64_t s) {
    const int64_t per = (tiles + s - 1) / s, blocks = tokens * ((tiles + per - 1) / per);
    return (blocks + slots - 1) / slots * (per + 2);
  };
  std::mt19937 gen(7);
  for (int i = 0; i < 2000; ++i) {
    const int64_t tokens = 1 + gen() % 600, tiles = 1 + gen() % 1200, slots = 1 + gen() % 300;
    const int64_t got = cuda::indexer_decode_ring_splits(tokens, tiles, slots);
    ASSERT_GE(got, 1);
    ASSERT_LE(got, tiles);
    const int64_t c = cost(tokens, tiles, slots, got);
    for (int64_t s = 1; s <= tiles && s <= 4 * slots; ++s) {
      ASSERT_GE(cost(tokens, tiles, slots, s), c) << tokens << " " << tiles << " " << slots << " s " << s;
      if (s < got) ASSERT_GT(cost(tokens, tiles, slots, s), c) << tokens << " " << tiles << " " << slots << " s " << s;
    }
  }
}

// A page id outside the pool for entries tokens see: the status bit, raised by the tensor-core kernel too.
TEST_F(CudaIndexerMmaPaged, BadPageRaisesStatus) {
  PagedBatch c = make({{70, 200}, {70, 150}});
  for (int64_t j = 0; j < c.tables.shape()[1]; ++j) c.tables.data<int32_t>()[j] = 1 << 20;  // sequence 0's pages
  expect_bad_page_reported(c);
}

}  // namespace
}  // namespace deepinfer::testing
