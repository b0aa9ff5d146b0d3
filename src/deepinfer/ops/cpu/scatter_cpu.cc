// scatter_rows on the CPU: a row copy per index; an index outside [-1, N) is the caller's bug in the block
// tables and fails with the row named (the CUDA kernel raises a status bit for the same case).
#include <cstring>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::scatter_rows(const ScatterRowsParams& p) {
  validate(p);
  const int64_t rows = p.src.dim(0), width = p.src.dim(1), n = p.dst.dim(0);
  const int64_t* index = p.index.data_as<int64_t>();
  for (int64_t t = 0; t < rows; ++t)
    DI_CHECK(index[t] >= -1 && index[t] < n)
        << "scatter_rows: index[" << t << "] = " << index[t] << " outside [-1, " << n << ")";
  for (int64_t t = 0; t < rows; ++t) {
    if (index[t] < 0) continue;
    std::memcpy(p.dst.data_as<float>() + index[t] * width, p.src.data_as<float>() + t * width,
                sizeof(float) * static_cast<size_t>(width));
  }
}

}  // namespace deepinfer
