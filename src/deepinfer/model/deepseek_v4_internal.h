// Private pieces shared by deepseek_v4.cc and deepseek_v4_attention.cc.
#pragma once

#include <cstring>
#include <vector>

#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

// One forward call: T tokens at absolute positions p0 .. p0+T-1.
struct DeepseekV4Model::Chunk {
  int64_t T = 0;
  int64_t p0 = 0;
  OwnedTensor positions;  // i64 [T]
  OwnedTensor ids;        // i64 [T], the token ids
  int64_t swa_floor = 0;  // sliding-window keys below this position are not visible (decoder segment start)
};

// V4.1 CSA2 selections published within one forward (the reference's per-forward `shared` dict): the
// latest index source's top-k mask over its group's entries, and the candidate-source block mask.
struct DeepseekV4Model::Selection {
  OwnedTensor topk;        // u8 [T, n_topk]
  int64_t n_topk = -1;     // entries the mask covers; -1 = none published yet
  OwnedTensor candidates;  // u8 [T, n_candidates]
  int64_t n_candidates = -1;
};

}  // namespace deepinfer
