// Helpers for the CUDA op tests: device tensors, fresh random inputs (never zeros), NaN poisoning, and the
// relative-error comparison against the CPU reference (‖got − want‖ / ‖want‖ in double; NaN never passes).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::testing {

// cudaMemcpy, then a device-wide synchronize. The backend launches on a non-blocking stream, which the legacy
// default stream of a plain cudaMemcpy does not order against: a host-to-device copy from pageable memory may return
// before its DMA lands, and a device-to-device one returns at once, so a kernel launched next could read the old
// bytes, or have its output overwritten by the late copy (seen as one-off NaN-poison / row mismatches in the GPU
// suite). Every test upload goes through here.
// The f32 values every bf16 rounding test covers: signed zeros, infinities, NaN, subnormals and the largest finite
// floats (whose RNE rounds to infinity); callers append their own ties.
inline std::vector<float> f32_rounding_specials() {
  return {0.0f,
          -0.0f,
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN(),
          std::numeric_limits<float>::denorm_min(),
          -1e-40f,
          std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max()};
}

inline cudaError_t copy_and_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t copied = cudaMemcpy(dst, src, bytes, kind);
  const cudaError_t synced = cudaDeviceSynchronize();
  return copied != cudaSuccess ? copied : synced;
}

// Device memory for one tensor, through the backend's caching allocator.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(CudaBackend& be, DType dtype, Shape shape)
      : buf_(be.allocator(), static_cast<size_t>(std::max<int64_t>(dtype_bytes(dtype, shape_numel(shape)), 1))),
        view_(buf_.data(), dtype, shape, be.device()) {}
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT
  void* data() const { return buf_.data(); }

 private:
  cuda::DeviceBuffer buf_;
  Tensor view_;
};

class CudaOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    be_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend(0);
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    RecordProperty("seed", static_cast<int>(seed_ & 0x7fffffff));
  }

  CudaBackend& gpu() { return *be_; }
  Backend& cpu() { return *cpu_; }
  std::mt19937_64& rng() { return rng_; }

  // Uniform in [lo, hi), never exactly zero (zeros hide unwritten outputs).
  HostTensor rand(Shape shape, float lo = -1.0f, float hi = 1.0f) {
    HostTensor t(DType::kF32, std::move(shape));
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v = d(rng_);
      t.data<float>()[i] = v == 0.0f ? 1e-3f : v;
    }
    return t;
  }
  // UE8M0 scales 2^(lo - 127) .. 2^(hi - 127). hi > 128 puts MXFP4 steps on the streaming kernel's two-multiply
  // decode (scales from 2^2 on); <= 128 (every realistic weight scale) on its one-multiply decode.
  HostTensor e8m0(Shape shape, int lo = 121, int hi = 131) {
    return rand_bytes(DType::kE8M0, std::move(shape), lo, hi);
  }
  HostTensor rand_bytes(DType dtype, Shape shape, int lo = 0, int hi = 255) {
    HostTensor t(dtype, std::move(shape));
    std::uniform_int_distribution<int> d(lo, hi);
    auto* p = static_cast<uint8_t*>(t.view().data());
    for (int64_t i = 0; i < t.view().nbytes(); ++i) p[i] = static_cast<uint8_t>(d(rng_));
    return t;
  }
  HostTensor ints(DType dtype, Shape shape, int64_t lo, int64_t hi) {
    HostTensor t(dtype, std::move(shape));
    std::uniform_int_distribution<int64_t> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::kI64)
        t.data<int64_t>()[i] = d(rng_);
      else if (dtype == DType::kI32)
        t.data<int32_t>()[i] = static_cast<int32_t>(d(rng_));
      else
        t.data<uint8_t>()[i] = static_cast<uint8_t>(d(rng_));
    }
    return t;
  }
  HostTensor nan_filled(Shape shape) {
    HostTensor t(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = NAN;
    return t;
  }

  DeviceTensor up(const HostTensor& h) {
    DeviceTensor d(*be_, h.dtype(), h.shape());
    if (h.view().nbytes() > 0) {
      EXPECT_EQ(copy_and_sync(d.data(), h.view().data(), h.view().nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }
  // Waits for the backend (raising device-reported errors), then copies back.
  HostTensor down(const DeviceTensor& d) {
    be_->synchronize();
    HostTensor h(d.view().dtype(), d.view().shape());
    if (h.view().nbytes() > 0) {
      EXPECT_EQ(copy_and_sync(h.view().data(), d.data(), h.view().nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
  // A NaN-poisoned device output of this shape (every element must be written by the op).
  DeviceTensor poisoned(Shape shape) { return up(nan_filled(std::move(shape))); }
  DeviceTensor poisoned_bytes(DType dtype, Shape shape) {
    HostTensor h(dtype, std::move(shape));
    std::memset(h.view().data(), 0xAB, h.view().nbytes());
    return up(h);
  }

  // ‖got − want‖ / ‖want‖; records the figure (and prints it for the device log). Any NaN/inf mismatch
  // (NaN where the reference is finite, or a differing infinity) returns +inf.
  double rel_err(const char* what, const HostTensor& got, const HostTensor& want, double tol) {
    EXPECT_EQ(got.shape(), want.shape()) << what;
    double num = 0, den = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double g = got.data<float>()[i], w = want.data<float>()[i];
      if (std::isinf(w) || std::isinf(g)) {
        if (g != w) ++bad;
        continue;
      }
      if (std::isnan(w) != std::isnan(g)) ++bad;
      if (std::isnan(w) || std::isnan(g)) continue;
      num += (g - w) * (g - w);
      den += w * w;
    }
    const double err = bad ? INFINITY : (den > 0 ? std::sqrt(num / den) : std::sqrt(num));
    std::printf("[cuda-op] %-40s rel_err=%.3e tol=%.0e %s\n", what, err, tol, err <= tol ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_LE(err, tol) << what << " (" << bad << " non-finite mismatches, seed " << seed_ << ")";
    return err;
  }
  // Exact comparison of raw bytes (integer / mask outputs).
  // hc_mix and hc_head over random streams [t, 4, d] on the GPU against the CPU ops (1e-5); the mix weights in
  // ±fn_range, `tag` ends the [cuda-op] names. Returns the streams and the CPU mix outputs for the ops that follow.
  struct HcMixed {
    HostTensor streams, pre, post, comb;
  };
  HcMixed expect_hc_mix_and_head_match_cpu(int64_t t, int64_t d, float fn_range, const std::string& tag) {
    const int64_t hc = 4, mix = (2 + hc) * hc;
    HcMixed m;
    m.streams = rand({t, hc, d}, -2, 2);
    HostTensor fn = rand({mix, hc * d}, -fn_range, fn_range), base = rand({mix}), scale = rand({3}, 0.5f, 1.5f);
    m.pre = HostTensor(DType::kF32, {t, hc});
    m.post = HostTensor(DType::kF32, {t, hc});
    m.comb = HostTensor(DType::kF32, {t, hc, hc});
    cpu().hc_mix({m.streams, fn, base, scale, m.pre, m.post, m.comb, 1e-6f, 1e-6f, 20});
    DeviceTensor ds = up(m.streams), dfn = up(fn), db = up(base), dsc = up(scale);
    DeviceTensor dpre = poisoned({t, hc}), dpost = poisoned({t, hc}), dcomb = poisoned({t, hc, hc});
    gpu().hc_mix({ds, dfn, db, dsc, dpre, dpost, dcomb, 1e-6f, 1e-6f, 20});
    rel_err(("hc_mix pre" + tag).c_str(), down(dpre), m.pre, 1e-5);
    rel_err(("hc_mix post" + tag).c_str(), down(dpost), m.post, 1e-5);
    rel_err(("hc_mix comb" + tag).c_str(), down(dcomb), m.comb, 1e-5);

    HostTensor hfn = rand({hc, hc * d}, -0.05f, 0.05f), hbase = rand({hc}), hscale = rand({1}, 0.5f, 1.5f);
    HostTensor hpre(DType::kF32, {t, hc});
    cpu().hc_head({m.streams, hfn, hbase, hscale, hpre, 1e-6f, 1e-6f});
    DeviceTensor dhfn = up(hfn), dhb = up(hbase), dhs = up(hscale), dhpre = poisoned({t, hc});
    gpu().hc_head({ds, dhfn, dhb, dhs, dhpre, 1e-6f, 1e-6f});
    rel_err(("hc_head" + tag).c_str(), down(dhpre), hpre, 1e-5);
    return m;
  }

  void expect_same_bytes(const char* what, const HostTensor& got, const HostTensor& want) {
    ASSERT_EQ(got.view().nbytes(), want.view().nbytes()) << what;
    const auto* g = static_cast<const uint8_t*>(got.view().data());
    const auto* w = static_cast<const uint8_t*>(want.view().data());
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < got.view().nbytes(); ++i)
      if (g[i] != w[i]) {
        if (first < 0) first = i;
        ++diff;
      }
    std::printf("[cuda-op] %-40s exact: %lld differing bytes %s\n", what, static_cast<long long>(diff),
                diff == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(diff, 0) << what << ": first difference at byte " << first << " (seed " << seed_ << ")";
  }

  // f32 values bit for bit, except that any NaN equals any NaN (a NaN's payload and sign are the conversion's own:
  // the device's canonical NaN is not the host's). Prints the first differences.
  void expect_same_values(const char* what, const HostTensor& got, const HostTensor& want) {
    ASSERT_EQ(got.view().dtype(), DType::kF32) << what;
    ASSERT_EQ(got.view().numel(), want.view().numel()) << what;
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    int64_t diff = 0;
    std::string firsts;
    for (int64_t i = 0; i < got.view().numel(); ++i) {
      uint32_t gb, wb;
      std::memcpy(&gb, g + i, 4);
      std::memcpy(&wb, w + i, 4);
      if (gb == wb || (std::isnan(g[i]) && std::isnan(w[i]))) continue;
      if (++diff <= 4) {
        char buf[96];
        std::snprintf(buf, sizeof buf, " [%lld] %08x want %08x", static_cast<long long>(i), gb, wb);
        firsts += buf;
      }
    }
    std::printf("[cuda-op] %-40s values: %lld differ %s%s\n", what, static_cast<long long>(diff),
                diff == 0 ? "ok" : "FAIL", firsts.c_str());
    std::fflush(stdout);
    EXPECT_EQ(diff, 0) << what << ":" << firsts << " (seed " << seed_ << ")";
  }

  // Batch-invariant mode (CudaBackend::set_batch_invariant): row subsets of an m-row call to run on their own —
  // single rows, short runs (the few-row kernels), a run of 11 (the tiled ones), all but the first row, and all rows
  // reversed. The results must equal the full call's rows byte for byte.
  static std::vector<std::vector<int64_t>> invariance_subsets(int64_t m) {
    auto run = [](int64_t a, int64_t b) {
      std::vector<int64_t> v;
      for (int64_t i = a; i < b; ++i) v.push_back(i);
      return v;
    };
    std::vector<std::vector<int64_t>> out = {
        {0}, {m / 2}, {m - 1}, run(1, std::min<int64_t>(m, 4)), run(std::max<int64_t>(0, m - 8), m), run(1, m)};
    if (m > 12) out.push_back(run(2, 13));
    std::vector<int64_t> reversed = run(0, m);
    std::reverse(reversed.begin(), reversed.end());
    out.push_back(reversed);
    return out;
  }
  // Rows `rows` of x's first dimension, in that order.
  static HostTensor take_rows(const HostTensor& x, const std::vector<int64_t>& rows) {
    Shape shape = x.shape();
    const int64_t row_bytes = x.view().nbytes() / shape[0];
    shape[0] = static_cast<int64_t>(rows.size());
    HostTensor out(x.dtype(), shape);
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(static_cast<uint8_t*>(out.view().data()) + i * row_bytes,
                  static_cast<const uint8_t*>(x.view().data()) + rows[i] * row_bytes, row_bytes);
    return out;
  }
  // part's row i must be full's row rows[i], byte for byte.
  void expect_rows_bitwise(const std::string& what, const HostTensor& part, const HostTensor& full,
                           const std::vector<int64_t>& rows) {
    const int64_t row_bytes = full.view().nbytes() / full.shape()[0];
    ASSERT_EQ(part.view().nbytes(), row_bytes * static_cast<int64_t>(rows.size())) << what;
    int64_t differ = 0;
    for (size_t i = 0; i < rows.size(); ++i)
      differ += std::memcmp(static_cast<const uint8_t*>(part.view().data()) + i * row_bytes,
                            static_cast<const uint8_t*>(full.view().data()) + rows[i] * row_bytes, row_bytes) != 0;
    if (differ)
      std::printf("[cuda-op] %-40s %lld of %zu rows differ: FAIL\n", what.c_str(), static_cast<long long>(differ),
                  rows.size());
    EXPECT_EQ(differ, 0) << what << ": rows computed in a smaller batch differ (seed " << seed_ << ")";
  }

  std::unique_ptr<CudaBackend> be_;
  std::unique_ptr<Backend> cpu_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// Edits the backend's kernel choices (kernel_choices.h) for its lifetime, then restores the previous ones.
class ScopedKernelChoices {
 public:
  template <class Edit>
  ScopedKernelChoices(CudaBackend& be, Edit edit) : be_(be), old_(be.kernel_choices()) {
    cuda::KernelChoices c = old_;
    edit(c);
    be_.set_kernel_choices(c);
  }
  ~ScopedKernelChoices() { be_.set_kernel_choices(old_); }
  ScopedKernelChoices(const ScopedKernelChoices&) = delete;
  ScopedKernelChoices& operator=(const ScopedKernelChoices&) = delete;

 private:
  CudaBackend& be_;
  cuda::KernelChoices old_;
};

}  // namespace deepinfer::testing
