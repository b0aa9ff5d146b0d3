// Temporary A/B switches of the CUDA kernels (same-process comparisons on the device): DEEPINFER_AB_<NAME> = "0"
// selects the previous kernel, unset or any other value the current one. Read on every call so that a test or a bench
// can flip it between calls (a CUDA graph keeps the choice made while it was captured).
#pragma once

#include <cstdlib>
#include <cstring>

namespace deepinfer::cuda {

inline bool ab_new_kernel(const char* env_name) {
  const char* v = std::getenv(env_name);
  return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace deepinfer::cuda
