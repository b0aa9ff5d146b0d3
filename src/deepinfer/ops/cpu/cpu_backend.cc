#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

CpuBackend::CpuBackend(int num_threads, bool poison_empty)
    : pool_(std::make_unique<ThreadPool>(num_threads)), poison_empty_(poison_empty) {}

std::unique_ptr<Backend> make_cpu_backend(int num_threads, bool poison_empty) {
  return std::make_unique<CpuBackend>(num_threads, poison_empty);
}

void CpuBackend::parallel_for(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& fn) {
  // Below ~64k multiply-adds the hand-off to the pool costs more than it saves.
  constexpr int64_t kMinParallelWork = 1 << 16;
  if (n <= 1 || work < kMinParallelWork || pool_->size() <= 1) {
    fn(0, n);
    return;
  }
  pool_->parallel_for(n, fn);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums let the compiler vectorise without -ffast-math.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

}  // namespace deepinfer
