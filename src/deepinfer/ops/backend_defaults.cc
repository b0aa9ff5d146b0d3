// Default bodies of Backend virtuals added after a backend existed: they throw Unsupported so a backend
// that has not implemented an op family fails loudly and by name instead of silently computing something else.
#include "deepinfer/core/error.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

void Backend::mla_attention_naive(const MlaAttentionParams&) {
  DI_FAIL(ErrorCode::kUnsupported) << "mla_attention_naive: not implemented on this backend";
}

void Backend::mla_attention_absorbed(const MlaAttentionParams&) {
  DI_FAIL(ErrorCode::kUnsupported) << "mla_attention_absorbed: not implemented on this backend";
}

}  // namespace deepinfer
