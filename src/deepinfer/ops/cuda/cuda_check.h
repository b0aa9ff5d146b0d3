// Error checks for the CUDA runtime, cuBLAS(Lt) and kernel launches, in the DI_CHECK family: a failure throws
// deepinfer::Error (kInternal, or kResourceExhausted for out-of-memory) naming the call, the CUDA error and
// file:line. Every CUDA call in ops/cuda goes through one of these; every launch is followed by
// DI_CUDA_CHECK_LAUNCH() so that a bad configuration is reported at its launch, not at the next sync.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "deepinfer/core/error.h"

namespace deepinfer::cuda {

[[noreturn]] void raise_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void raise_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line);

}  // namespace deepinfer::cuda

#define DI_CUDA_CHECK(expr)                                                                                        \
  do {                                                                                                             \
    const cudaError_t di_cuda_err_ = (expr);                                                                       \
    if (di_cuda_err_ != cudaSuccess) ::deepinfer::cuda::raise_cuda_error(di_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define DI_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                 \
    const cublasStatus_t di_cublas_st_ = (expr);                                       \
    if (di_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::deepinfer::cuda::raise_cublas_error(di_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every <<<...>>>: catches launch-configuration errors (and earlier sticky asynchronous errors).
#define DI_CUDA_CHECK_LAUNCH() DI_CUDA_CHECK(cudaGetLastError())
