// Expert parallelism (EP): the routed experts of every MoE layer are spread over the ranks of an EP group; a
// token's (expert, weight) pairs are dispatched to the ranks holding those experts and their outputs come back
// (all-to-all with per-peer counts both ways). The shared expert runs where the token lives.
//
// Exactness: the owner of a token sums the returned expert outputs in expert-id order, starting from zero, and
// then adds the shared expert's output, which is the order and arithmetic of the CPU reference MoE op; each
// expert output is computed by the same op on the same row. So on the CPU backend an EP run is bit-identical to a
// single-rank run (tests/parallel). A device backend gives the same greedy tokens within its own tolerance.
//
// Experts kept in their stored block format (V4/V4.1 MXFP4, V3-family FP8; --weight-format fp8): a rank holds its
// experts quantized and computes its received rows with Backend::moe_quant (k = 1 per row), the shared expert with
// moe_quant too. On the CPU backend moe_quant dequantizes exactly and runs the per-row reference, so the result is
// the single-rank quantized run's bit for bit as well.
//
// Replicated attention (DP shard with several ranks, e.g. --ep 8 without --dp): the replicas of a shard hold the
// same tokens; each dispatches a contiguous share of them and the finished rows are all-gathered among the
// replicas, so no expert computes a token twice.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "deepinfer/ops/ops.h"
#include "deepinfer/parallel/communicator.h"

namespace deepinfer {

// Where the routed experts of one layer live in an EP group. A rank holds an ordered list of experts (its
// slots); an expert may be on several ranks (EPLB redundant replicas). Every expert is on at least one rank.
class ExpertPlacement {
 public:
  ExpertPlacement() = default;
  // rank r holds experts [r·E/ep, (r+1)·E/ep) (E not divisible by ep: the first ranks get one more).
  static ExpertPlacement contiguous(int num_experts, int ep_size);
  // Explicit lists; throws InvalidArgument naming an expert on no rank or out of range.
  static ExpertPlacement from_rank_experts(int num_experts, std::vector<std::vector<int>> rank_experts);

  int num_experts() const { return num_experts_; }
  int ep_size() const { return static_cast<int>(rank_experts_.size()); }
  const std::vector<int>& experts_on(int rank) const { return rank_experts_.at(rank); }
  const std::vector<int>& ranks_of(int expert) const { return expert_ranks_.at(expert); }
  // The slot of `expert` on `rank`, or -1.
  int slot_of(int rank, int expert) const;
  int max_slots() const;
  std::string str() const;  // "r0:[0 1 5] r1:[2 3 4 5]"
  bool operator==(const ExpertPlacement& o) const { return rank_experts_ == o.rank_experts_; }

 private:
  int num_experts_ = 0;
  std::vector<std::vector<int>> rank_experts_;  // rank -> experts in slot order
  std::vector<std::vector<int>> expert_ranks_;  // expert -> ranks holding it, ascending
};

// Which routed experts a rank loads: (layer index in ModelConfig::layers, expert id) -> load it. Empty: all.
using ExpertFilter = std::function<bool(int layer, int expert)>;
// The experts `rank` holds under `placements` (one per layer; a dense layer's empty placement keeps all).
ExpertFilter placed_experts_filter(std::vector<ExpertPlacement> placements, int rank);

// FP8 dispatch (DeepEP-style): a dispatched row travels as e4m3 bytes with one f32 scale per 128 columns
// (scale = amax / 448 of the block), ~3.9x fewer bytes than f32; the combine stays f32. Lossy: the routed experts
// see the row rounded to e4m3 (relative error <= 2^-4 per element); the shared expert, run where the token lives,
// sees the exact row. The packed row is a float array so it rides the same all_to_all_v as the f32 one.
constexpr int64_t kFp8DispatchBlock = 128;
int64_t fp8_dispatch_row_floats(int64_t d);  // floats one packed row of width d occupies
void fp8_dispatch_pack(const float* x, int64_t d, float* packed);
void fp8_dispatch_unpack(const float* packed, int64_t d, float* x);

// Tokens routed to each expert of each layer (what EPLB plans from), counted where tokens are dispatched.
struct ExpertLoad {
  int num_layers = 0, num_experts = 0;
  std::vector<int64_t> counts;  // [layer · num_experts + expert]
  void resize(int layers, int experts);
  int64_t at(int layer, int expert) const { return counts[static_cast<size_t>(layer) * num_experts + expert]; }
  void add(int layer, int expert, int64_t n) { counts[static_cast<size_t>(layer) * num_experts + expert] += n; }
  void clear() { std::fill(counts.begin(), counts.end(), 0); }
};

class ExpertParallel {
 public:
  // `ep_group`: the ranks sharing the experts; `replicas`: the ranks of this rank's DP shard inside the EP group
  // (size 1 when every rank serves its own requests). placements: one per model layer (dense layers: ignored).
  ExpertParallel(Communicator& ep_group, Communicator& replicas, std::vector<ExpertPlacement> placements);

  // One routed-MoE layer across the EP group, with the contract of Backend::moe for p (p.experts indexed by
  // global expert id; only the entries this rank's placement holds are read). Collective over the EP group:
  // every rank calls it for the same layers in the same order, with 0 tokens when it has none (idle()).
  void moe(Backend& backend, int layer, const MoeParams& p);
  // The same with experts kept in their block format (the contract of Backend::moe_quant for p).
  void moe(Backend& backend, int layer, const QuantMoeParams& p);
  // Takes part in one layer's exchange without tokens (a rank with fewer sequences this step, or a forward that
  // stopped before the layer).
  void idle(Backend& backend, int layer, const std::vector<ExpertWeights>& experts, float swiglu_limit,
            bool weight_before_w2);
  void idle(Backend& backend, int layer, const std::vector<QuantExpertWeights>& experts, float swiglu_limit,
            bool weight_before_w2);

  Communicator& ep_group() const { return ep_; }
  Communicator& replicas() const { return replicas_; }
  const ExpertPlacement& placement(int layer) const { return placements_.at(layer); }
  void set_placement(int layer, ExpertPlacement p);
  // Dispatch rows in FP8 (see fp8_dispatch_pack); every rank of the EP group must agree.
  void set_fp8_dispatch(bool on) { fp8_dispatch_ = on; }
  bool fp8_dispatch() const { return fp8_dispatch_; }
  int num_layers() const { return static_cast<int>(placements_.size()); }
  // Counted since construction or the last clear (this rank's dispatches only; EPLB sums them over the world).
  ExpertLoad& load() { return load_; }
  const ExpertLoad& load() const { return load_; }
  // (token, expert) pairs this rank computed per layer (its measured share of the layer's expert work).
  const std::vector<int64_t>& computed() const { return computed_; }
  void clear_counters();

 private:
  struct Experts;  // one layer's experts, f32 or quantized (expert_parallel.cc)
  void run(Backend& backend, int layer, const Tensor& x, const Tensor& weights, const Tensor& indices,
           const Tensor& out, const Experts& experts);
  // The exchange for this rank's share [t0, t1) of the tokens; writes the finished rows to out_host.
  void exchange(Backend& backend, int layer, const Experts& experts, const float* x, const int32_t* idx, const float* w,
                int64_t k, int64_t t0, int64_t t1, int64_t d, float* out_host);

  Communicator& ep_;
  Communicator& replicas_;
  std::vector<ExpertPlacement> placements_;
  ExpertLoad load_;
  std::vector<int64_t> computed_;
  bool fp8_dispatch_ = false;
  // Per layer: the held routed experts in slot order and the shared expert, as the backend MoE calls take them.
  // Kept here so each list keeps its address: a device backend caches its per-expert pointer tables by it.
  std::vector<std::vector<ExpertWeights>> f32_lists_, f32_shared_;
  std::vector<std::vector<QuantExpertWeights>> quant_lists_, quant_shared_;
};

}  // namespace deepinfer
