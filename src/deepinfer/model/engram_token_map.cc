// The Engram compressed token map of a checkpoint, from its tokenizer.json through the tokenizer library
// (tokenizer/engram_map.h holds the normalisation: NFKC → NFD → strip accents → lowercase → collapse
// whitespace → strip).
#include "deepinfer/core/error.h"
#include "deepinfer/model/engram_hash.h"
#include "deepinfer/tokenizer/engram_map.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer {

std::vector<int64_t> engram_token_map_from_tokenizer(const std::string& path) {
  auto tok = tokenizer::Tokenizer::from_file(path);
  tokenizer::EngramTokenMap map = tokenizer::build_engram_token_map(*tok);
  DI_CHECK(!map.class_of.empty()) << path << ": the tokenizer has no tokens";
  return map.class_of;
}

}  // namespace deepinfer
