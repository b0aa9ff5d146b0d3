// `deepinfer bench`: runs steps of a BenchModel slice on a BenchTarget with synthetic weights and caches
// (random, made on the target: no checkpoint) and reports time against the counted FLOPs/bytes and the
// ceilings the target measured in the same run.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "deepinfer/bench/bench_mla_model.h"
#include "deepinfer/bench/bench_model.h"
#include "deepinfer/bench/bench_target.h"

namespace deepinfer::bench {

struct BenchOptions {
  std::vector<int64_t> prompts = {1024};   // prefill lengths (one sequence)
  std::vector<int64_t> batches = {1};      // decode batch sizes
  std::vector<int64_t> contexts = {1024};  // decode context lengths
  int warmup = 1;
  int iters = 3;
  uint64_t seed = 1;
  bool graphs = true;  // decode: also time the step replayed as one captured graph (targets that have graphs)
  // MLA decode attention: one paged_mla_attention call for all sequences (pages read in place), or the
  // one-sequence absorbed op once per sequence (the path before the paged kernel; for before/after rows).
  bool mla_paged_decode = true;
};

// Segments of a step for the time breakdown (one extra profiled run after the timed ones).
enum Segment { kSegMixNorm, kSegProj, kSegIndexer, kSegAttention, kSegRouter, kSegExperts, kSegEngram, kSegCount };
const char* segment_name(int s);

// GEMM calls outside the MoE (BenchTarget::linear / grouped_linear) and the copies of fused-projection parts into
// contiguous buffers in one step; counted = false where a slice does not count them (the MLA slice).
struct StepCounts {
  int64_t gemm_calls = 0;
  int64_t part_copies = 0;
  bool counted = false;
};

struct BenchRow {
  std::string model;
  StepShape shape;
  StepCost cost;
  double ms = 0;                   // median step time
  std::vector<double> segment_ms;  // kSegCount entries
  double graph_ms = 0;             // median step time as a graph replay (0: not measured)
  std::string graph_note;          // replay vs eager output check, or why there is no graph figure
  StepCounts counts;               // of the profiled step
  double tokens_per_s() const;
};

// Every prefill length, then every (batch, context) decode pair.
std::vector<BenchRow> run_slice(BenchTarget& target, const BenchModel& m, const BenchOptions& o);
// The same for an MLA model (V3 family; bench_mla_runner.cc).
std::vector<BenchRow> run_mla_slice(BenchTarget& target, const MlaBenchModel& m, const BenchOptions& o);

// The device state of one slice as the runner drives it (V4 family: bench_runner.cc, MLA: bench_mla_runner.cc).
class SliceState {
 public:
  virtual ~SliceState() = default;
  // Host-side inputs of one shape, uploaded outside the timed region.
  virtual void prepare(const StepShape& s) = 0;
  // One step; with `profile`, each op group's time is charged to its Segment (BenchTarget::profile_mark).
  virtual void step(const StepShape& s, bool profile) = 0;
  // The state a step updates in place: saved, restored, read back (the graph-replay check).
  virtual OwnedTensor save(const StepShape& s) = 0;
  virtual void restore(const StepShape& s, const OwnedTensor& saved) = 0;
  virtual HostTensor result(const StepShape& s) = 0;
  // What the last step ran (StepCounts); not counted unless the slice overrides this.
  virtual StepCounts counts() const { return {}; }
};
// The shapes of o in run order (prefill lengths, then (batch, context) pairs); validates o.
std::vector<StepShape> bench_shapes(const BenchOptions& o);
// Times every shape on a prepared slice: median step, one profiled step, the decode graph check.
std::vector<BenchRow> run_shapes(BenchTarget& target, SliceState& slice, const std::string& model,
                                 const std::vector<StepShape>& shapes,
                                 const std::function<StepCost(const StepShape&)>& cost, const BenchOptions& o);

// The table printed by the command (one line per row, ratios to the ceilings).
std::string format_table(const std::vector<BenchRow>& rows, const Ceilings& c);
std::string format_ceilings(const Ceilings& c);
std::string format_breakdown(const std::vector<BenchRow>& rows);
// Decode rows with a graph figure: eager vs replayed step time and the output check.
std::string format_graphs(const std::vector<BenchRow>& rows);
// Decode rows the way the reference reports decode (bench/decode_rate.h): avg_SPS (1 / median step), delivered
// tokens/s and the full-acceptance figure; the bench runs no drafts, so the two token figures are equal (draft
// length 0). Rows with a graph figure give the same for the replayed step.
std::string format_decode_rates(const std::vector<BenchRow>& rows);

}  // namespace deepinfer::bench
