// The fixture of the decode-kernel CUDA tests (cuda_fused_decode_test.cc, cuda_decode_small_ops_test.cc): host copies,
// the one-launch hc_mix's arrival counters (zeroed, and checked to be left zeroed), and hc_mix run directly through
// the kernel in its two-launch and one-launch forms.
#pragma once

#include <array>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::testing {

class CudaDecodeOpTest : public CudaOpTest {
 protected:
  static HostTensor clone(const HostTensor& t) {
    HostTensor out(t.dtype(), t.shape());
    std::memcpy(out.view().data(), t.view().data(), t.view().nbytes());
    return out;
  }
  static HostTensor zeros_i32(int64_t n) {
    HostTensor t(DType::kI32, {n});
    std::memset(t.view().data(), 0, t.view().nbytes());
    return t;
  }
  // kHcMixArrivalSlots zeroed counters for the one-launch hc_mix.
  DeviceTensor hc_mix_arrivals() { return up(zeros_i32(cuda::kHcMixArrivalSlots)); }
  // Every call must leave the counters at zero (a stuck one would skip a finish).
  void expect_arrivals_zero(const DeviceTensor& arrivals) {
    const HostTensor left = down(arrivals);
    for (int i = 0; i < cuda::kHcMixArrivalSlots; ++i) EXPECT_EQ(left.data<int32_t>()[i], 0) << "arrival slot " << i;
  }
  // `forms` calls of cuda::run_hc_mix (legacy stream, then a device sync) on streams [t, hc, d] with fn / base / scale
  // (mix: rows (2 + hc)·hc; head: hc): form 0 in two launches, the others in one launch with `arrivals`, all over one
  // NaN-poisoned split-K scratch. out[form] = {pre, post, comb} (pre only for the head), each from a NaN-poisoned
  // output.
  void hc_mix_forms(int forms, const DeviceTensor& streams, const DeviceTensor& fn, const DeviceTensor& base,
                    const DeviceTensor& scale, const DeviceTensor& arrivals, int64_t t, int64_t hc, int64_t d,
                    bool head, std::vector<std::array<HostTensor, 3>>& out) {
    const int64_t rows = head ? hc : (2 + hc) * hc;
    const int splits = cuda::hc_mix_splits(hc, d);
    DeviceTensor partial = poisoned({splits * t * (rows + 1)});
    out.clear();
    out.resize(forms);
    for (int form = 0; form < forms; ++form) {
      DeviceTensor pre = poisoned({t, hc}), post = poisoned({t, hc}), comb = poisoned({t, hc, hc});
      cuda::HcMixKernelParams k;
      k.streams = static_cast<const float*>(streams.data());
      k.fn = static_cast<const float*>(fn.data());
      k.base = static_cast<const float*>(base.data());
      k.scale = static_cast<const float*>(scale.data());
      k.pre = static_cast<float*>(pre.data());
      k.post = head ? nullptr : static_cast<float*>(post.data());
      k.comb = head ? nullptr : static_cast<float*>(comb.data());
      k.tokens = t;
      k.hc = hc;
      k.d = d;
      k.head = head;
      k.partial = static_cast<float*>(partial.data());
      k.splits = splits;
      k.arrivals = form == 0 ? nullptr : static_cast<unsigned*>(arrivals.data());
      cuda::run_hc_mix(k, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out[form][0] = down(pre);
      if (!head) {
        out[form][1] = down(post);
        out[form][2] = down(comb);
      }
    }
  }
};

}  // namespace deepinfer::testing
