// scatter_rows on the CPU: a row copy per index (rounded to bf16 into a bf16 cache, encoded into a record cache); an
// index outside [-1, N) is the caller's bug in the block tables and fails with the row named (the CUDA kernel raises a
// status bit for the same case).
#include <cstring>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/memory.h"

namespace deepinfer {

void CpuBackend::scatter_rows(const ScatterRowsParams& p) {
  validate(p);
  const int64_t rows = p.src.dim(0), width = p.src.dim(1), n = p.dst.dim(0);
  const int64_t* index = p.index.data_as<int64_t>();
  for (int64_t t = 0; t < rows; ++t)
    DI_CHECK(index[t] >= -1 && index[t] < n)
        << "scatter_rows: index[" << t << "] = " << index[t] << " outside [-1, " << n << ")";
  const bool bf16 = p.dst.dtype() == DType::kBF16;
  for (int64_t t = 0; t < rows; ++t) {
    if (index[t] < 0) continue;
    const float* src = p.src.data_as<float>() + t * width;
    if (p.dst.dtype() == DType::kU8) {
      host_memory().convert_records(p.dst.slice(index[t], index[t] + 1), p.src.slice(t, t + 1), p.record);
    } else if (bf16) {
      uint16_t* dst = p.dst.data_as<uint16_t>() + index[t] * width;
      for (int64_t j = 0; j < width; ++j) dst[j] = f32_to_bf16(src[j]);
    } else {
      std::memcpy(p.dst.data_as<float>() + index[t] * width, src, sizeof(float) * static_cast<size_t>(width));
    }
  }
}

}  // namespace deepinfer
