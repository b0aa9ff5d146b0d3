// DI_HD: a function for host and device code under nvcc, an inline host function under a host compiler (the CPU tests
// run the record code and the format conversions on the host: kv_record.cuh, format_math.cuh, pool_format.h).
#pragma once

#ifdef __CUDACC__
#define DI_HD __host__ __device__ __forceinline__
#else
#define DI_HD inline
#endif
