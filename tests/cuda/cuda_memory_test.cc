// The backend's tensor memory on the GPU (memory_cuda.cu): strided copies — whole-row 16-byte units where rows,
// strides and addresses allow, one element a thread otherwise — must move exactly the bytes the host copy does, for
// the layouts the models use (the V4 grouped output's group-major permute, the embedding's broadcast into the mHC
// streams, column slices) and for element sizes 1 / 2 / 4 / 8 at aligned and unaligned offsets; f32 <-> bf16 casts and
// scatter_rows into a bf16 cache give the host's bytes.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace deepinfer::testing {
namespace {

// A strided view of `t` (contiguous storage) starting `offset` elements in.
Tensor view_of(const Tensor& t, int64_t offset, Shape shape, Shape strides) {
  const int64_t e = static_cast<int64_t>(dtype_bits(t.dtype()) / 8);
  return Tensor(static_cast<char*>(t.data()) + offset * e, t.dtype(), std::move(shape), std::move(strides), t.device());
}

struct CopyCase {
  std::string name;
  DType dtype;
  int64_t src_elems, dst_elems;  // storage sizes
  int64_t src_offset, dst_offset;
  Shape shape, src_strides, dst_strides;
};

class CudaMemoryTest : public CudaOpTest {
 protected:
  // The GPU copy of the case's view into a random destination, against the host copy of the same bytes.
  void expect_copy_matches_host(const CopyCase& c) {
    // f32 as random values (random bytes could be NaNs, whose payload a host float copy need not keep).
    auto fresh = [&](int64_t n) { return c.dtype == DType::kF32 ? rand({n}) : rand_bytes(c.dtype, {n}); };
    const HostTensor src = fresh(c.src_elems), dst0 = fresh(c.dst_elems);
    HostTensor want(c.dtype, {c.dst_elems});
    std::memcpy(want.view().data(), dst0.view().data(), static_cast<size_t>(dst0.view().nbytes()));
    host_memory().copy(view_of(want.view(), c.dst_offset, c.shape, c.dst_strides),
                       view_of(src.view(), c.src_offset, c.shape, c.src_strides));
    const DeviceTensor ds = up(src), dd = up(dst0);
    gpu().memory().copy(view_of(dd.view(), c.dst_offset, c.shape, c.dst_strides),
                        view_of(ds.view(), c.src_offset, c.shape, c.src_strides));
    expect_same_bytes(("strided copy " + c.name).c_str(), down(dd), want);
  }
};

TEST_F(CudaMemoryTest, StridedCopiesMoveTheHostCopysBytes) {
  const int64_t T = 37, G = 4, gw = 96, D = 64, hc = 4;
  std::vector<CopyCase> cases = {
      // [T, G·gw] -> [G, T, gw] (the grouped output's copy in) and back: 16-byte units.
      {"group-major f32", DType::kF32, T * G * gw, G * T * gw, 0, 0, {G, T, gw}, {gw, G * gw, 1}, {T * gw, gw, 1}},
      {"row-major f32", DType::kF32, G * T * gw, T * G * gw, 0, 0, {G, T, gw}, {T * gw, gw, 1}, {gw, G * gw, 1}},
      // [T, D] broadcast into [T, hc, D] (zero stride).
      {"broadcast f32", DType::kF32, T * D, T * hc * D, 0, 0, {T, hc, D}, {D, 0, 1}, {hc * D, D, 1}},
      // Unaligned starts and odd widths: the element path.
      {"offset f32", DType::kF32, T * G * gw + 1, G * T * gw, 1, 0, {G, T, gw}, {gw, G * gw, 1}, {T * gw, gw, 1}},
      {"odd columns f32", DType::kF32, T * 13, T * 7, 3, 0, {T, 7}, {13, 1}, {7, 1}},
      {"bf16 rows", DType::kBF16, T * 24, T * 16, 8, 0, {T, 16}, {24, 1}, {16, 1}},
      {"bf16 odd", DType::kBF16, T * 24, T * 10, 5, 0, {T, 10}, {24, 1}, {10, 1}},
      {"u8 rows", DType::kU8, T * 48, T * 32, 16, 0, {T, 32}, {48, 1}, {32, 1}},
      {"u8 odd", DType::kU8, T * 48, T * 31, 1, 0, {T, 31}, {48, 1}, {31, 1}},
      {"i64 rows", DType::kI64, T * 6, T * 4, 2, 0, {T, 4}, {6, 1}, {4, 1}},
      {"i64 odd", DType::kI64, T * 6, T * 3, 1, 0, {T, 3}, {6, 1}, {3, 1}},
      // Rank 4 from padded rows of an odd width: the element path (copies keep the innermost dimension contiguous).
      {"rank-4 odd f32",
       DType::kF32,
       2 * 3 * 5 * 9,
       2 * 3 * 5 * 7,
       0,
       0,
       {2, 3, 5, 7},
       {135, 45, 9, 1},
       {105, 35, 7, 1}},
      // Rank 4 from padded rows, 16-byte units, a destination offset of one unit.
      {"rank-4 f32",
       DType::kF32,
       2 * 3 * 5 * 12,
       2 * 3 * 5 * 8 + 4,
       0,
       4,
       {2, 3, 5, 8},
       {180, 60, 12, 1},
       {120, 40, 8, 1}},
  };
  for (const CopyCase& c : cases) expect_copy_matches_host(c);
}

// cast (f32 -> bf16 rounded to nearest even, bf16 -> f32 exact) and scatter_rows into a bf16 cache give the host's
// bytes: random values (a wide range of exponents), exact ties and a NaN.
TEST_F(CudaMemoryTest, CastsAndBf16ScatterGiveTheHostsBytes) {
  const int64_t n = 4099;  // not a multiple of the block
  HostTensor src = rand({n}, -3.0f, 3.0f);
  for (int64_t i = 0; i < n; i += 7) src.data<float>()[i] *= std::ldexp(1.0f, static_cast<int>(i % 61) - 30);
  src.data<float>()[1] = 1.0f + 0x1p-8f;
  src.data<float>()[2] = 1.0f + 3 * 0x1p-8f;
  src.data<float>()[3] = NAN;
  HostTensor want_bf16(DType::kBF16, {n}), want_f32(DType::kF32, {n});
  host_memory().cast(want_bf16.view(), src.view());
  host_memory().cast(want_f32.view(), want_bf16.view());
  const DeviceTensor ds = up(src), dbf16 = up(rand_bytes(DType::kBF16, {n})), df32 = poisoned({n});
  gpu().memory().cast(dbf16.view(), ds.view());
  gpu().memory().cast(df32.view(), dbf16.view());
  expect_same_bytes("cast f32 -> bf16", down(dbf16), want_bf16);
  expect_same_bytes("cast bf16 -> f32", down(df32), want_f32);

  const int64_t rows = 9, width = 37, dst_rows = 14;
  const HostTensor rsrc = rand({rows, width}, -2.0f, 2.0f), dst0 = rand_bytes(DType::kBF16, {dst_rows, width});
  HostTensor index(DType::kI64, {rows});
  for (int64_t t = 0; t < rows; ++t) index.data<int64_t>()[t] = t % 4 == 3 ? -1 : (t * 5) % dst_rows;
  HostTensor want(DType::kBF16, {dst_rows, width});
  std::memcpy(want.view().data(), dst0.view().data(), static_cast<size_t>(dst0.view().nbytes()));
  cpu().scatter_rows({rsrc, index, want});
  const DeviceTensor drs = up(rsrc), didx = up(index), ddst = up(dst0);
  gpu().scatter_rows({drs, didx, ddst});
  expect_same_bytes("scatter_rows into bf16", down(ddst), want);
}

}  // namespace
}  // namespace deepinfer::testing
