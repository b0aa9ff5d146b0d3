// The tensor-core paged sink attention (attention_paged_mma_cuda.cu) against the CPU op and against the SIMT
// kernel, chosen through KernelChoices::attn_mma. Random data (never zeros), shuffled pages, NaN in every pool row no
// query may read, several sequences of different lengths, window-only and window + compressed (index and mask
// forms), one head block and several, one split and several. Tolerance: the kernel's split-bf16 products are
// off by at most 3·2^-16 of |x||y| each; CPU emulation of the same arithmetic gives a norm-relative error of
// 3.8e-6 to 4.4e-6 on this data (hd 512, 128-2048 keys), so 2e-5 against both the CPU op and the SIMT kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "cuda_paged_attention_util.h"

namespace deepinfer::testing {
namespace {

constexpr double kMmaTol = 2e-5;

constexpr cuda::KernelPick kAuto = cuda::KernelPick::kAuto, kNever = cuda::KernelPick::kNever,
                           kAlways = cuda::KernelPick::kAlways;

// e4m3 round-to-nearest-even of y, |y| <= 448 (subnormal below 2^-6); zero results become the smallest subnormal
// of y's sign, so that quantized test keys are never zeros.
float e4m3_rne(float y) {
  const float a = std::fabs(y);
  int e = 0;
  std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1): the binade's exponent is e − 1
  const float quantum = std::ldexp(1.0f, std::max(e - 1, -6) - 3);
  float r = std::nearbyint(a / quantum) * quantum;
  if (r == 0.0f) r = std::ldexp(1.0f, -9);
  return std::copysign(r, y);
}

// The model's FP8 window-KV fake-quant (MODELS.md 3.3) of one row: blocks of 32 channels, scale the power of two
// s >= max(amax, 1e-4) / 448, v = e4m3(x / s)·s. The results are bf16 values (4 significant bits times 2^k).
void fp8_fake_quant_row(float* row, int64_t hd) {
  for (int64_t b0 = 0; b0 < hd; b0 += 32) {
    float amax = 0.0f;
    for (int64_t i = b0; i < b0 + 32; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float t = std::max(amax, 1e-4f) * (1.0f / 448.0f);
    int e = 0;
    const float m = std::frexp(t, &e);
    const float s = m == 0.5f ? t : std::ldexp(1.0f, e);
    for (int64_t i = b0; i < b0 + 32; ++i) row[i] = e4m3_rne(std::clamp(row[i] / s, -448.0f, 448.0f)) * s;
  }
}

// FP8-fake-quantizes the readable (non-NaN) rows of `pool` [rows, hd], each with probability `fraction`, and checks
// that the result is bf16-exact. Returns how many rows it quantized.
int64_t quantize_rows(HostTensor& pool, int64_t hd, double fraction, std::mt19937_64& rng) {
  std::bernoulli_distribution pick(fraction);
  int64_t n = 0;
  for (int64_t r = 0; r < pool.shape()[0]; ++r) {
    float* row = pool.data<float>() + r * hd;
    if (std::isnan(row[0]) || !pick(rng)) continue;
    fp8_fake_quant_row(row, hd);
    for (int64_t i = 0; i < hd; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &row[i], 4);
      EXPECT_EQ(bits & 0xffffu, 0u) << "quantized key not bf16-exact: " << row[i];
      EXPECT_NE(row[i], 0.0f);
    }
    ++n;
  }
  return n;
}

class CudaPagedAttentionMma : public CudaPagedAttentionTest {
 protected:
  // The GPU op with KernelChoices::attn_mma = mma; `mask`, when given, replaces comp_idx.
  HostTensor run(const PagedAttentionCase& c, const Device& d, cuda::KernelPick mma,
                 const DeviceTensor* mask = nullptr) {
    ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& k) { k.attn_mma = mma; });
    return run_op(c, d, mask);
  }
};

double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

// Prefill-like calls (>= 128 query tokens: the tensor-core kernel by default) against the CPU op, the SIMT
// kernel of the same call (attn_mma kNever) and each other: the choice must change the kernel (the two
// results are not bit-equal) and both must match the reference.
TEST_F(CudaPagedAttentionMma, PrefillMatchesCpuAndSimt) {
  struct Case {
    const char* name;
    PagedAttentionSpec spec;
  };
  const Case cases[] = {
      // V4's shape: 64 heads of 512, window 128, ratio-4 selections; 3 sequences x 48 queries.
      {"H=64 hd=512 window+compressed", make_spec(3, 64, 512, 48, 96, 64, 4, 128, 200, 1500)},
      // Window only, fewer heads than a block (16 of 32 rows used), splits over the keys (few blocks).
      {"H=16 hd=128 window only", make_spec(2, 16, 128, 70, 0, 16, 1, 96, 80, 400)},
      // Four head blocks, sparse selection, small pages.
      {"H=128 hd=64 window+compressed", make_spec(4, 128, 64, 32, 40, 16, 2, 32, 40, 700)},
      // Selections longer than a tile, padded with -1, several tiles of compressed rows.
      {"H=32 hd=256 long selection", make_spec(2, 32, 256, 64, 300, 32, 4, 64, 900, 2500)},
  };
  for (const Case& k : cases) {
    const PagedAttentionCase c = make_paged_attention_case(k.spec, rng()());
    ASSERT_GE(c.tokens, 128) << k.name << ": below the tensor-core kernel's token threshold";
    HostTensor want(DType::kF32, {c.tokens, k.spec.heads, k.spec.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    const Device d = upload(c);
    const HostTensor mma = run(c, d, kAuto), simt = run(c, d, kNever);
    rel_err((std::string("mma vs cpu ") + k.name).c_str(), mma, want, kMmaTol);
    rel_err((std::string("simt vs cpu ") + k.name).c_str(), simt, want, 1e-5);
    rel_err((std::string("mma vs simt ") + k.name).c_str(), mma, simt, kMmaTol);
    EXPECT_GT(max_abs_diff(mma, simt), 0.0) << k.name << ": attn_mma did not change the kernel";
    if (k.spec.k_sel == 0) continue;
    HostTensor mask = mask_of(c);
    PagedSinkAttentionParams cm = c.params(want.view());
    cm.comp_idx = Tensor{};
    cm.comp_mask = mask.view();
    cpu().paged_sink_attention(cm);
    const DeviceTensor dmask = up(mask);
    rel_err((std::string("mma mask form vs cpu ") + k.name).c_str(), run(c, d, kAuto, &dmask), want, kMmaTol);
  }
}

// attn_mma kAlways takes the tensor-core kernel below the token threshold too: decode shapes, split over
// the keys and merged by the combine kernel, and a short prefill chunk with a window floor.
TEST_F(CudaPagedAttentionMma, SmallCallsWhenForced) {
  const PagedAttentionSpec specs[] = {
      make_spec(5, 64, 512, 1, 512, 64, 4, 128, 200, 4000),  // decode, several splits
      make_spec(2, 64, 512, 9, 96, 64, 2, 128, 100, 900),
      make_spec(7, 16, 64, 1, 40, 16, 4, 32, 20, 700),
  };
  for (const PagedAttentionSpec& s : specs) {
    const PagedAttentionCase c = make_paged_attention_case(s, rng()());
    HostTensor want(DType::kF32, {c.tokens, s.heads, s.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    const Device d = upload(c);
    const std::string name =
        "forced mma H=" + std::to_string(s.heads) + " hd=" + std::to_string(s.hd) + " T=" + std::to_string(c.tokens);
    const HostTensor mma = run(c, d, kAlways);
    rel_err(name.c_str(), mma, want, kMmaTol);
    EXPECT_GT(max_abs_diff(mma, run(c, d, kNever)), 0.0) << name << ": attn_mma kAlways did not change it";
  }
}

// Key kinds the models produce, each against the CPU op and the SIMT kernel of the same call: all
// FP8-fake-quantized (V4.1's window and, FP4 being exact too, its compressed entries: bf16-exact keys whose lo
// parts are zero), generic f32, quantized window with generic compressed rows (tiles of each kind and mixed ones in
// one call), and each row quantized with probability 0.97 (tiles with one or two generic rows among exact ones).
// Prefill shapes and, forced, split decode shapes.
TEST_F(CudaPagedAttentionMma, QuantizedAndMixedKeysMatchCpuAndSimt) {
  enum class Keys { kExact, kGeneric, kExactWindow, kMostlyExact };
  const struct {
    Keys keys;
    const char* name;
  } kinds[] = {{Keys::kExact, "exact"},
               {Keys::kGeneric, "generic"},
               {Keys::kExactWindow, "exact window, generic compressed"},
               {Keys::kMostlyExact, "rows exact with p 0.97"}};
  const struct {
    PagedAttentionSpec spec;
    cuda::KernelPick mma;  // kAlways: the decode shapes, several splits
  } shapes[] = {
      {make_spec(3, 64, 512, 48, 96, 64, 4, 128, 200, 1500), kAuto},
      {make_spec(2, 32, 256, 64, 300, 32, 4, 64, 900, 2500), kAuto},
      {make_spec(4, 128, 64, 32, 40, 16, 2, 32, 40, 700), kAuto},
      {make_spec(5, 64, 512, 1, 512, 64, 4, 128, 200, 4000), kAlways},
      {make_spec(2, 16, 128, 70, 0, 16, 1, 96, 80, 400), kAlways},
  };
  for (const auto& sh : shapes)
    for (const auto& kind : kinds) {
      const PagedAttentionSpec& s = sh.spec;
      PagedAttentionCase c = make_paged_attention_case(s, rng()());
      std::mt19937_64 qrng(rng()());
      const bool exact_window = kind.keys != Keys::kGeneric, exact_comp = kind.keys == Keys::kExact;
      const double p = kind.keys == Keys::kMostlyExact ? 0.97 : 1.0;
      const int64_t qw = exact_window ? quantize_rows(c.window_pool, s.hd, p, qrng) : 0;
      const int64_t qc =
          (exact_comp || kind.keys == Keys::kMostlyExact) ? quantize_rows(c.comp_pool, s.hd, p, qrng) : 0;
      if (exact_window) {
        ASSERT_GT(qw, 0) << kind.name;
      }
      HostTensor want(DType::kF32, {c.tokens, s.heads, s.hd});
      cpu().paged_sink_attention(c.params(want.view()));
      const Device d = upload(c);
      const std::string name = std::string(kind.name) + " H=" + std::to_string(s.heads) +
                               " hd=" + std::to_string(s.hd) + " T=" + std::to_string(c.tokens) + " (" +
                               std::to_string(qw) + "+" + std::to_string(qc) + " rows quantized)";
      const HostTensor mma = run(c, d, sh.mma), simt = run(c, d, kNever);
      rel_err(("mma vs cpu, " + name).c_str(), mma, want, kMmaTol);
      rel_err(("simt vs cpu, " + name).c_str(), simt, want, 1e-5);
      rel_err(("mma vs simt, " + name).c_str(), mma, simt, kMmaTol);
      EXPECT_GT(max_abs_diff(mma, simt), 0.0) << name << ": attn_mma did not change the kernel";
    }
}

// Shapes the tensor-core kernel does not take (heads not a multiple of 16, hd 96) run the SIMT kernel whatever
// the choice says: the same bytes with kAlways and kNever.
TEST_F(CudaPagedAttentionMma, UnsupportedShapesKeepTheSimtKernel) {
  for (const PagedAttentionSpec& s :
       {make_spec(3, 24, 128, 48, 16, 16, 4, 32, 60, 300), make_spec(3, 16, 96, 48, 16, 16, 4, 32, 60, 300)}) {
    const PagedAttentionCase c = make_paged_attention_case(s, rng()());
    HostTensor want(DType::kF32, {c.tokens, s.heads, s.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    const Device d = upload(c);
    const HostTensor forced = run(c, d, kAlways);
    rel_err("unsupported shape, simt", forced, want, 1e-5);
    expect_same_bytes("unsupported shape, kAlways vs kNever", forced, run(c, d, kNever));
  }
}

// Batch-invariant mode takes it for every call of a supported shape, decode included (the choice may not depend on
// the batch), with the splits at fixed 256-slot boundaries and the partials always merged: a query's output is the
// same bytes alone, among a few queries, or in a call whose selection is padded with 600 unselected columns (three
// more, empty, splits for every query), and within the kernel's tolerance of the CPU op. kAlways changes nothing
// there; kNever (the SIMT kernel) gives other bytes, at the SIMT tolerance.
TEST_F(CudaPagedAttentionMma, BatchInvariantModeTakesItForEveryCall) {
  gpu().set_batch_invariant(true);
  for (const PagedAttentionSpec& spec : {make_spec(9, 64, 512, 1, 512, 64, 4, 128, 30, 4000),  // decode
                                         make_spec(3, 16, 128, 5, 96, 16, 2, 32, 10, 900)}) {  // short prefill
    const PagedAttentionCase c = make_paged_attention_case(spec, rng()());
    HostTensor want(DType::kF32, {c.tokens, spec.heads, spec.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    const Device d = upload(c);
    // The queries `rows` with `pad` unselected columns after the selection, under attn_mma = mma.
    auto call = [&](const std::vector<int64_t>& rows, int64_t pad, cuda::KernelPick mma) {
      ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& k) { k.attn_mma = mma; });
      return run_queries(c, d, rows, pad);
    };
    std::vector<int64_t> all(c.tokens);
    std::iota(all.begin(), all.end(), 0);
    const std::string name = "batch-invariant mma H=" + std::to_string(spec.heads) + " hd=" + std::to_string(spec.hd);
    const HostTensor full = call(all, 600, kAuto);
    rel_err(name.c_str(), full, want, kMmaTol);
    for (const auto& rows : invariance_subsets(c.tokens))
      expect_rows_bitwise(name + " queries=" + std::to_string(rows.size()), call(rows, 0, kAuto), full, rows);
    expect_same_bytes((name + ", kAlways vs kAuto").c_str(), call(all, 0, kAlways), full);
    const HostTensor simt = call(all, 600, kNever);
    rel_err((name + ", attn_mma kNever (simt)").c_str(), simt, want, 1e-5);
    EXPECT_GT(max_abs_diff(full, simt), 0.0) << name << ": attn_mma kNever did not change the kernel";
  }
}

// A bad page (block ids outside the pool) raises the status word through the tensor-core kernel's producer.
TEST_F(CudaPagedAttentionMma, BadPageRaisesStatus) {
  PagedAttentionSpec s = make_spec(2, 64, 128, 70, 16, 16, 4, 32, 80, 300);
  PagedAttentionCase c = make_paged_attention_case(s, rng()());
  for (int64_t j = 0; j < c.tables.shape()[1]; ++j) c.tables.data<int32_t>()[j] = 1 << 20;  // outside the pool
  const Device d = upload(c);
  try {
    run(c, d, kAuto);
    ADD_FAILURE() << "no error for block ids outside the pool";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paged_sink_attention"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::testing
