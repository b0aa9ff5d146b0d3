// V4.1's shared top-k selections during one batched decode step (decode_batch), for all B rows at once: forward()
// keeps one Selection per sequence (the top-k and candidate masks the latest index / candidate-source layer
// published, over how many entries); here an index layer scores every row in one call and selects with one top-k over
// the padded [B, n_max] scores, and what it publishes stays alive for the whole step. Per row the state and the
// masks are exactly forward()'s: a row without entries at an index layer keeps what it had, a reindex row is
// restricted to its candidates only when they cover its entries, a row attends its latest top-k only when that
// covers its entries. tests/model/v4_step_selections_test.cc checks every path against that per-row logic.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

// The first n columns of row b of a contiguous [rows, width] tensor, as a contiguous [1, n] view.
Tensor row_prefix(const Tensor& t, int64_t b, int64_t n);

class V4StepSelections {
 public:
  // How often attended() / the reindex restriction could hand out a published mask itself, and how often they had to
  // assemble one row by row (uncommon: rows whose selections cover different entry counts).
  struct Counts {
    int64_t direct_masks = 0, assembled_masks = 0, direct_allowed = 0, assembled_allowed = 0, single_rows = 0;
  };

  void reset(int64_t rows);

  // Publishes the selection of an index layer (plan.index_source == its own index) from its scores f32 [B, n]
  // (−inf past row b's ne[b] entries and where the query cannot see). positions: i64 [B] on the device, the same
  // positions on the host.
  void select(Backend& be, TensorMemory& mem, const LayerPlan& plan, const V4AttentionConfig& ac, int ratio,
              const Tensor& scores, const Tensor& positions, const std::vector<int64_t>& ne,
              const std::vector<int64_t>& host_positions);

  // The entries each row attends of its ne[b] entries, u8 [B, n_max] (zero past ne[b]): its latest top-k when that
  // covers exactly ne[b] entries, none otherwise. Valid until the step ends.
  Tensor attended(TensorMemory& mem, const std::vector<int64_t>& ne, int64_t n_max);

  const Counts& counts() const { return counts_; }

 private:
  struct RowMask {
    int at = -1;     // held_ index
    int64_t n = -1;  // entries it covers; -1: none published yet
  };
  void publish(std::vector<RowMask>& rows, OwnedTensor&& mask, const std::vector<int64_t>& ne);
  Tensor candidates_for(TensorMemory& mem, const std::vector<int64_t>& ne, int64_t n);

  std::vector<OwnedTensor> held_;  // every mask published or assembled this step (rows view them until it ends)
  std::vector<RowMask> topk_, candidates_;
  int latest_topk_ = -1;
  std::vector<int64_t> latest_counts_;  // ne per row when the latest top-k was published
  Counts counts_;
};

}  // namespace deepinfer
