// Sink attention against a naive double-precision reference (window visibility, compressed mask, sinks).
#include <gtest/gtest.h>

#include <cstring>

#include "op_test_util.h"
#include "ops/paged_attention_case.h"

namespace deepinfer {
namespace {

TEST(SinkAttentionOp, WindowPlusMaskedCompressedEntries) {
  auto backend = make_cpu_backend(2);
  const int64_t T = 5, H = 3, hd = 16, S = 12, N = 4;
  const int window = 6;
  const float scale = 0.25f;
  HostTensor q = testing::random_tensor({T, H, hd}, 1), kv = testing::random_tensor({S, hd}, 2);
  HostTensor comp = testing::random_tensor({N, hd}, 3), sinks = testing::random_tensor({H}, 4);
  std::vector<int64_t> kvp(S);
  for (int64_t s = 0; s < S; ++s) kvp[s] = s;
  HostTensor kv_pos = testing::positions_tensor(kvp), q_pos = testing::positions_tensor({7, 8, 9, 10, 11});
  HostTensor mask(DType::kU8, {T, N});
  for (int64_t i = 0; i < T * N; ++i) mask.data<uint8_t>()[i] = (i * 7) % 3 != 0;
  HostTensor out(DType::kF32, {T, H, hd});
  SinkAttentionParams p;
  p.q = q.view();
  p.q_positions = q_pos.view();
  p.window_kv = kv.view();
  p.kv_positions = kv_pos.view();
  p.compressed = comp.view();
  p.comp_mask = mask.view();
  p.sinks = sinks.view();
  p.out = out.view();
  p.window = window;
  p.scale = scale;
  backend->sink_attention(p);
  std::vector<double> ref(T * H * hd);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::pair<double, const float*>> logits;
      auto add = [&](const float* k) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(q.data<float>()[(t * H + h) * hd + i]) * k[i];
        logits.push_back({d * scale, k});
      };
      for (int64_t s = 0; s < S; ++s)
        if (kvp[s] <= q_pos.data<int64_t>()[t] && kvp[s] > q_pos.data<int64_t>()[t] - window)
          add(kv.data<float>() + s * hd);
      for (int64_t n = 0; n < N; ++n)
        if (mask.data<uint8_t>()[t * N + n]) add(comp.data<float>() + n * hd);
      double den = std::exp(double(sinks.data<float>()[h]));
      for (auto& l : logits) den += std::exp(l.first);
      for (auto& l : logits)
        for (int64_t i = 0; i < hd; ++i) ref[(t * H + h) * hd + i] += std::exp(l.first) / den * l.second[i];
    }
  EXPECT_LT(testing::max_rel_error(out.data<float>(), ref), 1e-5);
}

// paged_sink_attention must compute sink_attention of each query over its gathered rows: the window rows
// (q_pos − window, q_pos] at or above the sequence's floor, then the comp_idx entries in their order. Same
// arithmetic on the CPU, so the outputs are bit-identical; NaN in every unused pool row proves none is read.
TEST(PagedSinkAttentionOp, EqualsSinkAttentionOverGatheredRows) {
  auto backend = make_cpu_backend(2);
  for (int64_t tokens_per_seq : {1, 5}) {
    testing::PagedAttentionSpec spec;
    spec.tokens_per_seq = tokens_per_seq;
    const testing::PagedAttentionCase c = testing::make_paged_attention_case(spec, 7 + tokens_per_seq);
    HostTensor out(DType::kF32, {c.tokens, spec.heads, spec.hd});
    backend->paged_sink_attention(c.params(out.view()));
    const int64_t bs = spec.block_size, per_block = bs / spec.ratio, mb = c.tables.shape()[1];
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int64_t b = c.q_seq.data<int32_t>()[t], pos = c.q_pos.data<int64_t>()[t];
      const int32_t* table = c.tables.data<int32_t>() + b * mb;
      const int64_t lo = std::max<int64_t>({pos - spec.window + 1, c.window_begin.data<int64_t>()[b], 0});
      HostTensor win(DType::kF32, {pos - lo + 1, spec.hd}), wpos(DType::kI64, {pos - lo + 1});
      for (int64_t w = lo; w <= pos; ++w) {
        std::memcpy(win.data<float>() + (w - lo) * spec.hd,
                    c.window_pool.data<float>() + (table[w / bs] * bs + w % bs) * spec.hd, spec.hd * sizeof(float));
        wpos.data<int64_t>()[w - lo] = w;
      }
      std::vector<int32_t> sel;
      for (int64_t k = 0; k < spec.k_sel; ++k)
        if (c.comp_idx.data<int32_t>()[t * spec.k_sel + k] >= 0)
          sel.push_back(c.comp_idx.data<int32_t>()[t * spec.k_sel + k]);
      ASSERT_FALSE(sel.empty());
      HostTensor comp(DType::kF32, {static_cast<int64_t>(sel.size()), spec.hd});
      for (size_t k = 0; k < sel.size(); ++k) {
        const int64_t e = sel[k], row = table[e * spec.ratio / bs] * per_block + (e * spec.ratio % bs) / spec.ratio;
        std::memcpy(comp.data<float>() + k * spec.hd, c.comp_pool.data<float>() + row * spec.hd,
                    spec.hd * sizeof(float));
      }
      HostTensor want(DType::kF32, {1, spec.heads, spec.hd});
      SinkAttentionParams sp;
      sp.q = c.q.view().slice(t, t + 1);
      sp.q_positions = c.q_pos.view().slice(t, t + 1);
      sp.window_kv = win.view();
      sp.kv_positions = wpos.view();
      sp.compressed = comp.view();
      sp.sinks = c.sinks.view();
      sp.out = want.view();
      sp.window = spec.window;
      sp.scale = 1.0f / std::sqrt(static_cast<float>(spec.hd));
      backend->sink_attention(sp);
      const float* got = out.data<float>() + t * spec.heads * spec.hd;
      for (int64_t i = 0; i < spec.heads * spec.hd; ++i) ASSERT_FALSE(std::isnan(got[i])) << "token " << t;
      EXPECT_EQ(std::memcmp(got, want.data<float>(), spec.heads * spec.hd * sizeof(float)), 0)
          << "token " << t << " of " << c.tokens << " (" << tokens_per_seq << " per sequence)";
    }
  }
}

// The mask form (the model's top-k selection as u8 [T, N]) against sink_attention over all N gathered entries with
// the same mask: the model's previous path, bit-identical.
TEST(PagedSinkAttentionOp, MaskFormEqualsSinkAttentionWithMask) {
  auto backend = make_cpu_backend(2);
  testing::PagedAttentionSpec spec;
  spec.tokens_per_seq = 4;
  spec.seqs = 2;
  testing::PagedAttentionCase c = testing::make_paged_attention_case(spec, 21);
  const int64_t bs = spec.block_size, per_block = bs / spec.ratio, mb = c.tables.shape()[1];
  // Entries 0..N-1 of every sequence must exist for the gathered reference: N = the fewest closed groups.
  int64_t n = 1 << 30;
  for (int64_t b = 0; b < spec.seqs; ++b) n = std::min(n, (c.context[b] - spec.tokens_per_seq + 1) / spec.ratio);
  ASSERT_GT(n, 4);
  HostTensor& comp_pool = c.comp_pool;
  HostTensor mask(DType::kU8, {c.tokens, n});
  for (int64_t b = 0; b < spec.seqs; ++b)
    for (int64_t e = 0; e < n; ++e) {
      const int32_t* table = c.tables.data<int32_t>() + b * mb;
      float* row = comp_pool.data<float>() +
                   (table[e * spec.ratio / bs] * per_block + (e * spec.ratio % bs) / spec.ratio) * spec.hd;
      for (int64_t i = 0; i < spec.hd; ++i) row[i] = std::sin(0.37f * static_cast<float>(i + 11 * e + 101 * b));
    }
  for (int64_t i = 0; i < c.tokens * n; ++i) mask.data<uint8_t>()[i] = (i * 7 + i / 5) % 3 == 0;
  HostTensor out(DType::kF32, {c.tokens, spec.heads, spec.hd});
  PagedSinkAttentionParams p = c.params(out.view());
  p.comp_pool = comp_pool.view();
  p.comp_idx = Tensor{};
  p.comp_mask = mask.view();
  backend->paged_sink_attention(p);
  for (int64_t t = 0; t < c.tokens; ++t) {
    const int64_t b = c.q_seq.data<int32_t>()[t], pos = c.q_pos.data<int64_t>()[t];
    const int32_t* table = c.tables.data<int32_t>() + b * mb;
    const int64_t lo = std::max<int64_t>({pos - spec.window + 1, c.window_begin.data<int64_t>()[b], 0});
    HostTensor win(DType::kF32, {pos - lo + 1, spec.hd}), wpos(DType::kI64, {pos - lo + 1});
    for (int64_t w = lo; w <= pos; ++w) {
      std::memcpy(win.data<float>() + (w - lo) * spec.hd,
                  c.window_pool.data<float>() + (table[w / bs] * bs + w % bs) * spec.hd, spec.hd * sizeof(float));
      wpos.data<int64_t>()[w - lo] = w;
    }
    HostTensor comp(DType::kF32, {n, spec.hd});
    for (int64_t e = 0; e < n; ++e)
      std::memcpy(comp.data<float>() + e * spec.hd,
                  comp_pool.data<float>() +
                      (table[e * spec.ratio / bs] * per_block + (e * spec.ratio % bs) / spec.ratio) * spec.hd,
                  spec.hd * sizeof(float));
    HostTensor want(DType::kF32, {1, spec.heads, spec.hd});
    SinkAttentionParams sp;
    sp.q = c.q.view().slice(t, t + 1);
    sp.q_positions = c.q_pos.view().slice(t, t + 1);
    sp.window_kv = win.view();
    sp.kv_positions = wpos.view();
    sp.compressed = comp.view();
    sp.comp_mask = mask.view().slice(t, t + 1);
    sp.sinks = c.sinks.view();
    sp.out = want.view();
    sp.window = spec.window;
    sp.scale = 1.0f / std::sqrt(static_cast<float>(spec.hd));
    backend->sink_attention(sp);
    EXPECT_EQ(std::memcmp(out.data<float>() + t * spec.heads * spec.hd, want.data<float>(),
                          spec.heads * spec.hd * sizeof(float)),
              0)
        << "token " << t;
  }
}

// --kv-cache-dtype bf16: bf16 pools read as the f32 pools holding the same rounded rows, bit for bit (prefill-like
// and decode calls; the unread rows are NaN in both), and not as the unrounded rows; an f16 pool or pools of two
// dtypes are refused by name.
TEST(PagedSinkAttentionOp, Bf16PoolsEqualF32PoolsOfTheRoundedRows) {
  auto backend = make_cpu_backend(2);
  for (int64_t tokens_per_seq : {1, 4}) {
    testing::PagedAttentionSpec spec;
    spec.tokens_per_seq = tokens_per_seq;
    const testing::PagedAttentionCase c = testing::make_paged_attention_case(spec, 41 + tokens_per_seq);
    const HostTensor win16 = testing::bf16_of(c.window_pool), comp16 = testing::bf16_of(c.comp_pool);
    const HostTensor win_r = testing::rounded_f32_of(c.window_pool), comp_r = testing::rounded_f32_of(c.comp_pool);
    const Shape shape{c.tokens, spec.heads, spec.hd};
    HostTensor got(DType::kF32, shape), want(DType::kF32, shape), exact(DType::kF32, shape);
    PagedSinkAttentionParams p = c.params(got.view());
    p.window_pool = win16.view();
    p.comp_pool = comp16.view();
    backend->paged_sink_attention(p);
    PagedSinkAttentionParams r = c.params(want.view());
    r.window_pool = win_r.view();
    r.comp_pool = comp_r.view();
    backend->paged_sink_attention(r);
    backend->paged_sink_attention(c.params(exact.view()));
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_FALSE(std::isnan(got.data<float>()[i])) << "value " << i;
    EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.view().nbytes()), 0) << tokens_per_seq;
    EXPECT_NE(std::memcmp(got.data<float>(), exact.data<float>(), got.view().nbytes()), 0)
        << "bf16 pools gave the unrounded rows' output: they were not read as bf16";
    PagedSinkAttentionParams mixed = p;
    mixed.comp_pool = c.comp_pool.view();
    EXPECT_THROW(backend->paged_sink_attention(mixed), Error) << "a bf16 window pool beside an f32 comp pool";
    HostTensor f16(DType::kF16, c.window_pool.shape());
    PagedSinkAttentionParams half = c.params(got.view());
    half.window_pool = f16.view();
    EXPECT_THROW(backend->paged_sink_attention(half), Error) << "an f16 pool is neither f32 nor bf16";
  }
}

// --kv-cache-dtype fp8: pools of quantized records (FP8 window rows, FP4 entries) read as the f32 pools holding the
// rows' quantized values, bit for bit; a record pool of the wrong row size is refused by name.
TEST(PagedSinkAttentionOp, RecordPoolsEqualF32PoolsOfTheQuantizedRows) {
  auto backend = make_cpu_backend(2);
  for (int64_t tokens_per_seq : {1, 4}) {
    testing::PagedAttentionSpec spec;
    spec.tokens_per_seq = tokens_per_seq;
    const testing::PagedAttentionCase c = testing::make_paged_attention_case(spec, 43 + tokens_per_seq);
    const testing::RecordPool win = testing::records_of(c.window_pool, kWindowRecord),
                              comp = testing::records_of(c.comp_pool, kEntryRecord);
    const Shape shape{c.tokens, spec.heads, spec.hd};
    HostTensor got(DType::kF32, shape), want(DType::kF32, shape), exact(DType::kF32, shape);
    PagedSinkAttentionParams p = c.params(got.view());
    p.window_pool = win.records.view();
    p.comp_pool = comp.records.view();
    backend->paged_sink_attention(p);
    PagedSinkAttentionParams r = c.params(want.view());
    r.window_pool = win.values.view();
    r.comp_pool = comp.values.view();
    backend->paged_sink_attention(r);
    backend->paged_sink_attention(c.params(exact.view()));
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_FALSE(std::isnan(got.data<float>()[i])) << "value " << i;
    EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.view().nbytes()), 0) << tokens_per_seq;
    EXPECT_NE(std::memcmp(got.data<float>(), exact.data<float>(), got.view().nbytes()), 0)
        << "record pools gave the unquantized rows' output";
    PagedSinkAttentionParams swapped = p;
    swapped.comp_pool = win.records.view();  // FP8 window records where FP4 entry records belong: another row size
    try {
      backend->paged_sink_attention(swapped);
      ADD_FAILURE() << "window records taken as entry records";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("comp_pool"), std::string::npos) << e.what();
    }
  }
}

TEST(PagedSinkAttentionOp, BadPagesAndShapesAreClearErrors) {
  auto backend = make_cpu_backend(1);
  testing::PagedAttentionSpec spec;
  testing::PagedAttentionCase c = testing::make_paged_attention_case(spec, 3);
  HostTensor out(DType::kF32, {c.tokens, spec.heads, spec.hd});
  auto expect_error = [&](const PagedSinkAttentionParams& p, const char* needle) {
    try {
      backend->paged_sink_attention(p);
      ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PagedSinkAttentionParams p = c.params(out.view());
  p.comp_ratio = 3;  // does not divide block_size 16
  expect_error(p, "comp_ratio");
  c.q_seq.data<int32_t>()[0] = static_cast<int32_t>(spec.seqs);
  expect_error(c.params(out.view()), "q_seq[0]");
  c.q_seq.data<int32_t>()[0] = 0;
  c.comp_idx.data<int32_t>()[0] = 1 << 20;  // far beyond the sequence's block table
  expect_error(c.params(out.view()), "beyond its block table");
  c.comp_idx.data<int32_t>()[0] = 0;
  for (int64_t j = 0; j < c.tables.shape()[1]; ++j) c.tables.data<int32_t>()[j] = 1 << 20;  // outside the pool
  expect_error(c.params(out.view()), "outside the");
}

}  // namespace
}  // namespace deepinfer
