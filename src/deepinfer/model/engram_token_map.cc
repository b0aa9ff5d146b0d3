#include "deepinfer/core/error.h"
#include "deepinfer/model/engram_hash.h"

namespace deepinfer {

std::vector<int64_t> engram_token_map_from_tokenizer(const std::string& path) {
  DI_FAIL(ErrorCode::kUnsupported) << path << ": building the Engram token map from a tokenizer is not implemented yet";
}

}  // namespace deepinfer
