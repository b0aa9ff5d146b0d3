// DeepSeek-V4 and V4.1 forward pass (text), exact against transformers' deepseek_v4 / deepseek_v41 (cache
// path). One `forward` call appends a chunk of tokens to a sequence: the per-sequence state below is all
// that carries across calls, so one-shot prefill, chunked prefill and token-by-token decode give the same
// logits. The state structs are plain data so that a paged cache manager can own them later.
//
// Device placement: weights, activations and the per-sequence state live in the backend's memory
// (backend_memory(): host for the CPU reference, device memory for CudaBackend); weights are uploaded once
// at construction. Only the returned logits (and a trace) come back to the host.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/model/decode_graphs.h"
#include "deepinfer/model/deepseek_v4_weights.h"
#include "deepinfer/model/engram_hash.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/model/paged_rows.h"
#include "deepinfer/model/v4_slot_pool.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/parallel/context_parallel.h"
#include "deepinfer/parallel/expert_parallel.h"

namespace deepinfer {

class StepUploads;

// Sliding-window KV of one layer: the last `capacity` post-RoPE (V4.1: FP8-fake-quantized) K=V rows; token
// at position p lives in slot p % capacity. The rows are allocated (zeros) by the first forward that uses the ring:
// a paged sequence's layers below pages->ring_from_layer never do (their windows are paged).
struct SwaRing {
  int64_t capacity = 0;
  OwnedTensor rows;  // [capacity, hd], or empty until first used
  // Set by the batched decode: the rows live in the pages' slot pool at the sequence's slot (rows empty);
  // forward() takes them back first.
  bool pooled = false;
};

// Tokens a compressor has seen but not yet pooled (an incomplete group), plus the emitted-group counter
// that fixes each entry's RoPE position (group g covers tokens [g·r, (g+1)·r)).
struct CompressorState {
  OwnedTensor pending_kv, pending_gate;  // [n_pending, width] (gate includes V4 position biases)
  int64_t pending = 0;
  int64_t emitted = 0;
  // V4 CSA overlap: the first-half (Ca) slice of the last closed window, [r, width/2] each (none before it).
  OwnedTensor prev_kv, prev_gate;
  // Set by the batched decode: the pending rows and the overlap slice live in the pages' slot pool at the
  // sequence's slot (V4SlotPool) and the four tensors above are empty; forward() takes them back first.
  bool pooled = false;
  bool pooled_prev = false;  // the pool holds a previous window (as prev_kv non-empty would)
};

// Everything a layer keeps per sequence. Compressed entries and indexer keys live on the kv-source layer
// (V4: every compressed layer is its own source).
struct V4LayerState {
  SwaRing window;
  CompressorState compressor;        // kv sources
  CompressorState index_compressor;  // V4 CSA: the indexer's own compressor
  RowBuffer entries;                 // [n_entries, hd], rotated (V4.1: FP4 fake-quantized)
  RowBuffer index_keys;              // [n_entries, Id], rotated (V4.1: FP4 fake-quantized)
  int64_t n_entries = 0;
};

// The engine runner's paged storage (see paged_rows.h): per layer the window rows (per token), and on kv-source
// layers the compressed entries and indexer keys (per group). Layers from ring_from_layer on keep their window
// in the per-slot ring instead (V4.1 bounded replay: decoder windows depend on the sequence's prompt length,
// so they cannot be shared through the prefix cache).
struct V4KvPages {
  std::vector<PagedRows> window, entries, index_keys;
  int ring_from_layer = 0;
  V4SlotPool slot_pool;  // the batched decode's open compressor groups and rings (pooled states)
  int64_t bytes_per_block(int block_size) const;
  int64_t bytes_allocated() const;
  void set_max_blocks(int64_t blocks);
  void set_max_sequences(int64_t n) { slot_pool.set_max_slots(n); }
};

// What the last forward changed in a sequence's per-slot state, recorded when V4SequenceState::record_undo is set,
// so that DeepseekV4Model::truncate can take back the chunk's last positions exactly (speculative decoding's
// rollback after rejected drafts). Everything that is positional needs nothing: paged rows and compressed entries
// past the kept length are ignored and rewritten before anything reads them. What a chunk overwrites or folds is
// kept here: the ring slots it overwrote, and per compressor the state before the chunk plus every row it saw
// since its last closed group (the pending rows of any shorter prefix are a slice of them).
struct V4Undo {
  int64_t p0 = 0;  // num_tokens before the forward
  // Engram look-back before the forward followed by the chunk's compressed ids; `carried` of them came before.
  std::vector<int64_t> engram_history;
  int64_t engram_carried = 0;
  struct Ring {
    int64_t first = 0;     // the chunk wrote the ring slots of positions [first, first + rows)
    OwnedTensor old_rows;  // [rows, hd]: what those slots held before (null: nothing written)
    int64_t chunk_first = 0;
    OwnedTensor chunk_rows;  // the chunk's rows from position chunk_first (a chunk longer than the ring)
  };
  struct Compressor {
    bool ran = false;
    CompressorState before;  // a copy is a snapshot: a forward replaces the tensors, never writes into them
    OwnedTensor kv, gate;    // [n, width]: rows of positions [before.emitted·r, ...) (r > 1; gate with V4 biases)
  };
  struct Layer {
    Ring ring;
    Compressor compressor, index_compressor;
  };
  std::vector<Layer> layers;
};

struct V4SequenceState {
  int64_t num_tokens = 0;  // tokens already in the cache = position of the next token
  // V4.1 causal encoder-decoder "decoder SWA bounded replay" (MODELS.md Part A §2.3): positions below this run
  // only the encoder (layers before DeepseekV4Model::decoder_start()) plus the decoder-start layer's
  // compressor; the decoder layers run from here on and their sliding windows never reach below it.
  // 0 = every layer on every token (transformers parity).
  int64_t decoder_from = 0;
  std::vector<V4LayerState> layers;
  std::vector<int64_t> engram_recent;  // compressed ids of the last (n-1) tokens, oldest first
  // Paged mode (the engine's runner): window rows, entries and keys live in `pages` at `ref`'s block table
  // (the layers' `window`, `entries` and `index_keys` stay empty, except rings from pages->ring_from_layer on).
  V4KvPages* pages = nullptr;
  PageRef ref;
  // Speculative decoding: every forward records what truncate() needs (V4Undo) when set.
  bool record_undo = false;
  std::optional<V4Undo> undo;
  // The sequence's slot in pages->slot_pool, from its first batched decode step on.
  std::unique_ptr<V4SlotPool::Slot> pool_slot;
};

// Optional per-call record of intermediates (for tests and debugging), copied to the host.
struct V4ForwardTrace {
  std::vector<HostTensor> attn_inputs;      // per layer: attn_norm output [T, D]
  std::vector<HostTensor> attn_outputs;     // per layer: attention output [T, D]
  std::vector<HostTensor> ffn_outputs;      // per layer: MoE output [T, D]
  std::vector<HostTensor> layer_outputs;    // per layer: streams after the layer [T, hc, D]
  HostTensor final_hidden;                  // after the final norm [T, D]
  std::vector<HostTensor> engram_hash_ids;  // per Engram layer: i64 [T, cols] (absolute table rows)
};

// DSpark context capture (MODELS.md Part A §4): for each layer in `layers` (ascending), the mean over the hc
// copies of the streams entering that layer's attention site, concatenated along features. `rows` is
// [n, |layers|·D] in backend memory for the chunk's positions first_position .. first_position + n - 1 (under
// bounded replay only the decoder rows: positions >= decoder_from). Does not change the forward's outputs.
// MTP capture (V4 base MTP, `final_streams` set, `layers` empty): the hc streams after the last layer (before
// hc_head), rows [n, hc·D].
struct V4StreamCapture {
  std::vector<int> layers;
  OwnedTensor rows;
  int64_t first_position = 0;
  bool final_streams = false;
};

class DeepseekV4Model {
 public:
  // Loads config.json and the safetensors of `dir`. V4.1 checkpoints with Engram layers need the token map:
  // from `token_map` when given, else built from `dir`/tokenizer.json. keep_quant: the projections and experts
  // stored in block formats (FP8 + block scales, MXFP4) stay so (V4Weights); otherwise every weight is f32.
  // resident (expert parallelism): only the routed experts it names are loaded (load_v4_weights).
  static std::unique_ptr<DeepseekV4Model> load(const std::string& dir, Backend& backend,
                                               std::optional<std::vector<int64_t>> token_map = std::nullopt,
                                               bool keep_quant = false, const ExpertFilter& resident = {});

  DeepseekV4Model(ModelConfig config, V4Weights weights, std::optional<EngramTables> engram, Backend& backend);

  const ModelConfig& config() const { return config_; }
  int64_t weight_bytes() const { return v4_weight_bytes(w_); }
  // The numerics of the GEMMs over block-format weights (main layers, DSpark / MTP blocks, Engram's wkv):
  // kNone (HF's, the default: the golden fixtures) or kMxfp8 (the reference's and vLLM's per-32 FP8 activations;
  // MODELS.md §5). Matrices the checkpoint stores in bf16 / f32 are never rounded. Set it before the first forward
  // (recorded decode steps keep the numerics they were recorded with).
  void set_activation_quant(ActQuant q);
  ActQuant activation_quant() const { return act_quant_; }
  // The element type of the paged caches (new_kv_pages: window rows, compressed entries, indexer keys): f32 (the
  // default) or bf16, each row rounded to nearest even as it is written and widened exactly as it is read. V4.1's
  // rows are FP8 / FP4 fake-quantized before they are cached, so each is a bf16 value already: its bf16 cache is
  // lossless (the same outputs, half the bytes). V4's rows are not quantized (HF parity), so for V4 it rounds, as the
  // V3 family's bf16 cache does. Rows kept outside the pools (rings, unpaged row buffers) stay f32 storage holding the
  // same rounded values (rounds_bf16).
  // kF8E4M3 (--kv-cache-dtype fp8, V4.1 only: cached_rows_quantized) keeps each row as the reference stores it, a
  // quantized record of codes and block scales (ops/kv_record.h: FP8 window rows, FP4 entries and keys), also lossless
  // and ~a quarter of bf16's bytes; the pools are then host memory (the CPU backend).
  void set_kv_cache_dtype(DType dtype);
  DType kv_cache_dtype() const { return kv_dtype_; }
  const std::optional<EngramTables>& engram() const { return engram_; }
  V4SequenceState new_sequence() const;

  // Paged mode for the engine's runner. A paged sequence may start at a prefix hit `start` (a block boundary):
  // start_at() sets what is rebuilt without running the prefix — compressor counters (a compressor drops the
  // replayed rows of groups before its next boundary), Engram look-back from the ids — and the engine re-runs
  // prefix_replay_tokens() positions before the hit for the rest: V4's CSA overlap slice (the last window's
  // first half) and, with bounded replay, V4.1's decoder windows; 0 for V4.1 exact prefill. Replayed rows are
  // recomputed bit-identically and not rewritten. One window suffices for a hit inside the prompt (the replay then
  // reaches decoder_from); a hit past the prompt (recompute after preemption) needs up to
  // prefix_replay_tokens_past_prompt(): decoder layers × (window − 1) under bounded replay.
  V4KvPages new_kv_pages(bool bounded_decoder) const;
  int prefix_replay_tokens(bool bounded_decoder) const;
  int prefix_replay_tokens_past_prompt(bool bounded_decoder) const;
  // The most a paged sequence's per-slot state holds: the sliding-window rings of the layers whose windows are not
  // paged (bounded replay's decoder layers), compressors' pending rows and V4 CSA overlap slices, Engram look-back
  // ids. slot_bytes() measures a state.
  int64_t slot_bytes_bound(bool bounded_decoder) const;
  int64_t slot_bytes(const V4SequenceState& s) const;
  // ring.rows, allocated (zeros [capacity, hd]) when this is the ring's first use.
  const OwnedTensor& ring_rows(SwaRing& ring) const;
  void start_at(V4SequenceState& seq, int64_t start, std::span<const int64_t> prefix_ids) const;

  // Causal encoder-decoder split (V4.1): the first decoder layer = the candidate-source layer when it is a
  // ratio-1 kv source and no later layer owns compressed entries (its compressor is the only decoder state
  // the encoder part of the prompt feeds); -1 when the model has no such split (V4, other schedules).
  int decoder_start() const { return decoder_start_; }
  // Tokens the decoder runs on at the end of a prompt (n_win): the sliding window, so decode finds full
  // decoder windows.
  int64_t decoder_window() const { return config_.attn.sliding_window; }
  // decoder_from for a prompt of `prompt_len` tokens under bounded replay: prompt_len - n_win (>= 0), or 0
  // without an encoder-decoder split.
  int64_t bounded_decoder_from(int64_t prompt_len) const;

  // Appends `ids` to the sequence and returns their logits, f32 [T, vocab]; under bounded replay only the rows
  // at positions >= seq.decoder_from have logits: [T - skipped, vocab] (possibly 0 rows).
  // `capture` (optional) records the averaged attention-input streams of chosen layers (the DSpark context).
  //
  // Context parallel (`cp`, a prefill chunk split across a CP group): every rank passes the whole chunk `ids` and
  // the same starting state, computes its own tokens (cp->local()) and returns their logits in that order; the
  // window rows and the compressors' per-token projections are all-gathered, so each rank's state afterwards
  // equals the one-rank state. At a bounded-replay split the chunk's decoder segment (one window of tokens) is
  // gathered and every rank runs it whole, returning the same rows as one rank.
  // `cp` and `capture` do not combine (kUnsupported).
  // `last_rows` >= 0 (without `cp`): the head runs on the last min(last_rows, rows) rows only and only those come
  // back (0: none) — the engine samples from a prompt chunk's last row, and [T, 129280] f32 logits of a long chunk
  // are GBs to compute and copy.
  HostTensor forward(V4SequenceState& seq, std::span<const int64_t> ids, V4ForwardTrace* trace = nullptr,
                     V4StreamCapture* capture = nullptr, const CpShard* cp = nullptr, int64_t last_rows = -1) const;

  // Batched decode (the engine runner's decode step, docs/ENGINE.md): the next token `ids[b]` of each paged
  // sequence `seqs[b]` in one pass, f32 logits [B, vocab] (row b = what forward(*seqs[b], {ids[b]}) returns).
  // Every per-token piece runs once over all B rows (embedding, mHC, norms, projections, RoPE, Engram, MoE, head);
  // only per-sequence state is handled per sequence (compressor groups, indexer scoring and top-k over each
  // sequence's entries, ring windows). Paged windows are attended in one paged_sink_attention call for all rows.
  // On the CPU reference the result is bit-identical to one forward() per sequence. Every sequence must satisfy
  // decode_batchable() and share the same pages (kInvalidArgument otherwise).
  // With `graphs` (enabled on CUDA) the step runs padded to a batch bucket and its batched parts are recorded in
  // pieces (model/decode_graphs.h) and replayed: piece k finishes layer k−1 and runs layer k up to its attention;
  // each layer's per-sequence middle (compressors, indexer, attention) runs eagerly between two pieces.
  // With `device_logits` the logits are handed to it on the device and the result is empty (no host copy).
  HostTensor decode_batch(std::span<V4SequenceState* const> seqs, std::span<const int64_t> ids,
                          DecodeGraphs* graphs = nullptr, const DeviceLogitsFn* device_logits = nullptr) const;
  // Recorded decode pieces for decode_batch (enabled() only on a backend that records: CUDA).
  std::unique_ptr<DecodeGraphs> new_decode_graphs() const { return std::make_unique<DecodeGraphs>(backend_); }
  // Whether decode_batch may run this sequence's next token: paged, no expert parallelism, no undo recording
  // (speculative decoding), and under bounded replay a position that runs the whole model (>= decoder_from).
  bool decode_batchable(const V4SequenceState& seq) const;

  // Speculative decoding (spec/dspark_proposer.h, spec/mtp_proposer.h): forward() that also returns, per position
  // of the chunk, the draft's features as host rows [T, feature_dim()]: with a DSpark draft its context (the
  // V4StreamCapture of the draft's target layers, |targets|·D), with MTP layers the final streams before hc_head
  // (hc·D); rows of positions that did not reach those layers (bounded replay) are NaN.
  int64_t feature_dim() const;
  HostTensor forward_features(V4SequenceState& seq, std::span<const int64_t> ids, std::vector<float>* features) const;

  // Rollback after rejected drafts: the sequence becomes bit-identical to one that was fed only its first
  // `num_tokens` tokens, which must lie within the last forward's chunk (or end it); that forward must have run
  // with record_undo set. Consumes the undo record.
  void truncate(V4SequenceState& seq, int64_t num_tokens) const;

  // For the DSpark draft, which runs with the target's backend, embedding, head and main RoPE table.
  const V4Weights& weights() const { return w_; }
  Backend& backend() const { return backend_; }
  TensorMemory& memory() const { return memory_; }
  const OwnedTensor& main_inv_freq() const { return main_inv_freq_; }

  // Expert parallelism: routed experts run across the EP group of `ep` (nullptr: all local). Every rank of the
  // group then makes the same sequence of forward()/idle_forward() calls; see parallel/expert_parallel.h.
  void set_expert_parallel(ExpertParallel* ep) { ep_ = ep; }
  ExpertParallel* expert_parallel() const { return ep_; }
  // A forward without tokens: takes part in every MoE layer's exchange (EP ranks with fewer sequences).
  void idle_forward() const;
  // Frees the routed experts of `layer` that `keep` (by expert id) does not mark; load_experts reads the listed
  // ones from `dir` again (EPLB moving an expert onto this rank).
  void retain_experts(int layer, const std::vector<bool>& keep);
  // Experts kept quantized (--weight-format fp8) stay so: load_experts reads their stored block format.
  void load_experts(const std::string& dir, int layer, const std::vector<int>& experts);
  bool has_expert(int layer, int expert) const;

 private:
  // Routed experts of `layer` (resident or not), in whichever storage it keeps them.
  int routed_experts(int layer) const;
  // This rank's part of `layer`'s exchange without tokens.
  void ep_idle(int layer) const;
  struct Chunk;      // per-call activations and positions
  struct Selection;  // V4.1 per-forward shared top-k / candidate masks
  // Engram hash ids of this chunk for every Engram layer (advances the sequence's look-back).
  std::vector<OwnedTensor> engram_hash_ids(V4SequenceState& seq, std::span<const int64_t> ids) const;
  // The two halves of engram_hash_ids: the look-back token rows [T, max_ngram] on the host (advances the
  // look-back), and the hash ids of such rows for every Engram layer.
  std::vector<int64_t> engram_token_rows(V4SequenceState& seq, std::span<const int64_t> ids) const;
  std::vector<OwnedTensor> engram_hash_rows(const std::vector<int64_t>& token_rows, int64_t T) const;
  void engram_update(int layer, const Tensor& hash_ids, const Tensor& streams) const;
  // `run_compressor` false: the layer's kv-source compressor already ran (on the whole chunk, before the
  // encoder-decoder split).
  OwnedTensor attention(const Chunk& c, int layer, const OwnedTensor& x, V4SequenceState& seq, Selection& sel,
                        bool run_compressor = true) const;
  OwnedTensor moe(const Chunk& c, int layer, const OwnedTensor& x) const;
  // Compressed branch of one layer: appends closed groups to the source's state.
  void v4_compress(const Chunk& c, int layer, const OwnedTensor& x, V4SequenceState& seq, bool indexer) const;
  void v41_compress(const Chunk& c, int layer, const OwnedTensor& x, V4SequenceState& seq) const;
  // The compressors after their projections: `kv` and `gate` [n, width] are the rows of the next n positions
  // the compressor has not seen (V4: gate with the position biases; V4.1 ratio 1: no gate).
  void v4_compress_rows(int layer, const Tensor& kv, const Tensor& gate, V4SequenceState& seq, bool indexer) const;
  void v41_compress_rows(int layer, const Tensor& kv, const Tensor& gate, V4SequenceState& seq) const;
  // The batched decode's compressor step (deepseek_v4_pooled_state.cc): row b of kv / gate [B, width] is the next
  // row of sequence b's compressor (V4 main or indexer; V4.1 a kv source of ratio > 1), appended in the pages'
  // slot pool where `fresh[b]` (others are replaying rows they have: skipped); the groups that close are pooled
  // and stored in one call each. Bit-identical to v4_compress_rows / v41_compress_rows per sequence.
  void compress_batch(std::span<V4SequenceState* const> seqs, int layer, bool indexer, const Tensor& kv,
                      const Tensor& gate, const std::vector<bool>& fresh, StepUploads& up) const;
  // V4.1: latent [n, hd] of closed groups (compressed, not yet normed) of sequences `which`, group `groups[i]`:
  // its norm, indexer keys, RoPE and FP4, stored into the pages in one scatter each.
  void v41_store_groups(std::span<V4SequenceState* const> seqs, int layer, const Tensor& latent,
                        const std::vector<int64_t>& which, const std::vector<int64_t>& groups, StepUploads& up) const;
  // The batched decode's ring layers (V4.1 bounded replay's decoder layers): row b of kv [B, hd] into sequence b's
  // ring in the pages' slot pool (one scatter), then every sequence's window positions [past_begin[b], its
  // position] gathered in order into one [Σ n_b, hd] buffer (one gather); first[b] is where sequence b's rows start
  // (first[B] the total) and window_pos their positions.
  OwnedTensor ring_windows_batch(std::span<V4SequenceState* const> seqs, int layer, const Tensor& kv,
                                 const std::vector<int64_t>& past_begin, std::vector<int64_t>& first,
                                 std::vector<int64_t>& window_pos, StepUploads& up) const;
  // Takes a sequence's pooled state (compressors, rings) back into its own tensors (no-op when none is pooled).
  void unpool(V4SequenceState& seq) const;
  // decode_batch's pieces (deepseek_v4_decode_batch.cc): per layer the batched projections before attention,
  // the per-sequence state and attention, and the batched output projection.
  // Piece k (0 .. num_layers) only reads and writes the step's device buffers (recordable, idempotent); the
  // middle of layer k runs between pieces k and k + 1.
  struct DecodeBatch;
  struct DecodeQkv;
  DecodeQkv decode_qkv_views(const DecodeBatch& d, int layer) const;
  void decode_piece(const DecodeBatch& d, int piece) const;
  void decode_layer_head(const DecodeBatch& d, int layer, const Tensor& carried_pre) const;
  void decode_middle(DecodeBatch& d, int layer) const;
  // w·x for the chunk's rows [drop, total) in chunk order, [total − drop, out]: under CP each rank projects its own
  // rows and they are all-gathered (compressor groups pool rows of several ranks). w_bf16: w's bf16 copy when kept
  // (empty otherwise), which many rows read instead (compressor_linear in deepseek_v4_attention.cc).
  OwnedTensor chunk_rows(const Chunk& c, const OwnedTensor& x, const OwnedTensor& w, const OwnedTensor& w_bf16,
                         int64_t drop) const;
  // Paged or slot-owned storage of a kv-source layer's entries (or indexer keys): append groups from `first`,
  // and all of them as one [n_entries, width] view (`hold` keeps a gathered copy alive).
  void store_rows(V4SequenceState& seq, int layer, bool keys, int64_t first, const Tensor& rows) const;
  Tensor rows_view(const V4SequenceState& seq, int layer, bool keys, OwnedTensor& hold) const;
  // Moves every weight into memory_ (device backends), re-pointing the expert views.
  void upload_weights();

  ModelConfig config_;
  V4Weights w_;
  std::optional<EngramTables> engram_;
  Backend& backend_;
  TensorMemory& memory_;  // backend_memory(backend_)
  OwnedTensor main_inv_freq_, compress_inv_freq_;
  int decoder_start_ = -1;
  ExpertParallel* ep_ = nullptr;
  ActQuant act_quant_ = ActQuant::kNone;
  DType kv_dtype_ = DType::kF32;
  // Whether bf16 caches change the rows (V4; V4.1's are bf16 values already, cached_rows_quantized): then rows kept
  // outside the pools are rounded too (round_to_bf16_values).
  bool rounds_bf16() const { return kv_dtype_ == DType::kBF16 && !cached_rows_quantized(config_); }
};

}  // namespace deepinfer
