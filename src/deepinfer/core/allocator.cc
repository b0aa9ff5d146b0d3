#include "deepinfer/core/allocator.h"

#include <cstdlib>
#include <cstring>

#include "deepinfer/core/error.h"

namespace deepinfer {

void* aligned_alloc_zeroed(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment, rounded);
  DI_CHECK_CODE(p != nullptr, ErrorCode::kResourceExhausted) << "host allocation of " << bytes << " bytes failed";
  std::memset(p, 0, rounded);
  return p;
}

void aligned_free(void* p) { std::free(p); }

}  // namespace deepinfer
