// Helpers of the decode-kernel CUDA tests (cuda_fused_decode_test.cc, cuda_decode_small_ops_test.cc): host copies,
// the zeroed arrival counters of the one-launch hc_mix, and one direct launch of the hc_mix kernel.
#pragma once

#include <cstring>

#include "cuda_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::testing {

inline HostTensor clone(const HostTensor& t) {
  HostTensor out(t.dtype(), t.shape());
  std::memcpy(out.view().data(), t.view().data(), t.view().nbytes());
  return out;
}

inline HostTensor zeros_i32(int64_t n) {
  HostTensor t(DType::kI32, {n});
  std::memset(t.view().data(), 0, t.view().nbytes());
  return t;
}

// cuda::run_hc_mix on the legacy stream over device buffers (streams [t, hc, d]; fn, base, scale; pre [t, hc] and,
// unless head, post [t, hc] and comb [t, hc, hc]; partial: hc_mix_splits(hc, d) · t · (rows + 1) floats), then a
// device sync, whose status it returns. arrivals: nullptr for the two-launch form, else the one-launch form's
// kHcMixArrivalSlots counters.
inline cudaError_t launch_hc_mix(const DeviceTensor& streams, const DeviceTensor& fn, const DeviceTensor& base,
                                 const DeviceTensor& scale, const DeviceTensor& pre, const DeviceTensor& post,
                                 const DeviceTensor& comb, const DeviceTensor& partial, const DeviceTensor* arrivals,
                                 int64_t t, int64_t hc, int64_t d, bool head) {
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
  k.splits = cuda::hc_mix_splits(hc, d);
  k.arrivals = arrivals ? static_cast<unsigned*>(arrivals->data()) : nullptr;
  cuda::run_hc_mix(k, nullptr);
  return cudaDeviceSynchronize();
}

}  // namespace deepinfer::testing
