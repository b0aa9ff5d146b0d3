// The fixture of the CUDA paged_sink_attention tests (the SIMT kernel's, cuda_paged_attention_test.cc, and the
// tensor-core kernel's, cuda_paged_attention_mma_test.cc): a case's inputs on the device, the GPU op over them into
// a NaN-poisoned output (whole case, mask form, or a subset of the queries with padded selections), and the case's
// selection as a mask.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "ops/op_test_util.h"
#include "ops/paged_attention_case.h"

namespace deepinfer::testing {

inline PagedAttentionSpec make_spec(int64_t seqs, int64_t heads, int64_t hd, int64_t tps, int64_t k_sel, int bs,
                                    int ratio, int window, int64_t min_ctx, int64_t max_ctx) {
  PagedAttentionSpec s;
  s.seqs = seqs;
  s.heads = heads;
  s.hd = hd;
  s.tokens_per_seq = tps;
  s.k_sel = k_sel;
  s.block_size = bs;
  s.ratio = ratio;
  s.window = window;
  s.min_context = min_ctx;
  s.max_context = max_ctx;
  return s;
}

class CudaPagedAttentionTest : public CudaOpTest {
 protected:
  struct Device {
    DeviceTensor q, q_pos, q_seq, tables, window_pool, window_begin, comp_pool, comp_idx, sinks;
  };
  Device upload(const PagedAttentionCase& c) {
    return {up(c.q),         up(c.q_pos),    up(c.q_seq), up(c.tables), up(c.window_pool), up(c.window_begin),
            up(c.comp_pool), up(c.comp_idx), up(c.sinks)};
  }
  // The GPU op on the device copies, into a NaN-poisoned output; `mask`, when given, replaces comp_idx.
  HostTensor run_op(const PagedAttentionCase& c, const Device& d, const DeviceTensor* mask = nullptr) {
    DeviceTensor out = poisoned({c.tokens, c.spec.heads, c.spec.hd});
    PagedSinkAttentionParams p = c.params(
        {d.q, d.q_pos, d.q_seq, d.tables, d.window_pool, d.window_begin, d.comp_pool, d.comp_idx, d.sinks}, out);
    if (mask) {
      p.comp_idx = Tensor{};
      p.comp_mask = *mask;
    }
    gpu().paged_sink_attention(p);
    return down(out);
  }
  // The GPU op on the queries `rows` of c (in that order) alone, their selections followed by `pad` unselected
  // (-1) columns; the pools, tables and sinks are d's.
  HostTensor run_queries(const PagedAttentionCase& c, const Device& d, const std::vector<int64_t>& rows, int64_t pad) {
    const int64_t n = static_cast<int64_t>(rows.size()), k_sel = c.spec.k_sel, cols = k_sel + pad;
    HostTensor idx(DType::kI32, {n, cols});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < cols; ++j)
        idx.data<int32_t>()[i * cols + j] = j < k_sel ? c.comp_idx.data<int32_t>()[rows[i] * k_sel + j] : -1;
    const DeviceTensor dq = up(take_rows(c.q, rows)), dqp = up(take_rows(c.q_pos, rows)),
                       dqs = up(take_rows(c.q_seq, rows)), di = up(idx), dout = poisoned({n, c.spec.heads, c.spec.hd});
    gpu().paged_sink_attention(
        c.params({dq, dqp, dqs, d.tables, d.window_pool, d.window_begin, d.comp_pool, di, d.sinks}, dout));
    return down(dout);
  }
  // The selection of c as a u8 mask [T, N] over the entries (N = the largest selected id + 1).
  static HostTensor mask_of(const PagedAttentionCase& c) {
    int32_t n = 1;
    for (int64_t i = 0; i < c.comp_idx.numel(); ++i) n = std::max(n, c.comp_idx.data<int32_t>()[i] + 1);
    HostTensor mask(DType::kU8, {c.tokens, n});
    std::memset(mask.view().data(), 0, mask.view().nbytes());
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t j = 0; j < c.spec.k_sel; ++j)
        if (const int32_t e = c.comp_idx.data<int32_t>()[t * c.spec.k_sel + j]; e >= 0)
          mask.data<uint8_t>()[t * n + e] = 1;
    return mask;
  }
};

}  // namespace deepinfer::testing
