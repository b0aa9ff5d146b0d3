// Dispatch packs one row per (token, expert) pair: the token's hidden row, the routing weight and the expert's
// slot on the destination rank (d + 2 floats; slots are small integers, exact in f32). Combine returns one
// output row per pair in the order it was sent, so the sender needs no ids back.
#include "deepinfer/parallel/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/memory.h"

namespace deepinfer {

namespace {
int64_t fp8_blocks(int64_t d) { return (d + kFp8DispatchBlock - 1) / kFp8DispatchBlock; }
}  // namespace

// Layout: the block scales, then the e4m3 bytes (zero-padded to whole floats).
int64_t fp8_dispatch_row_floats(int64_t d) { return fp8_blocks(d) + (d + 3) / 4; }

void fp8_dispatch_pack(const float* x, int64_t d, float* packed) {
  const int64_t nb = fp8_blocks(d);
  // The bytes go straight into the packed row (byte access may alias any object): no per-row allocation on the
  // dispatch path.
  auto* bytes = reinterpret_cast<uint8_t*>(packed + nb);
  std::fill(bytes + d, bytes + (d + 3) / 4 * 4, uint8_t{0});
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * kFp8DispatchBlock, c1 = std::min(d, c0 + kFp8DispatchBlock);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t c = c0; c < c1; ++c) {
      amax = std::max(amax, std::fabs(x[c]));
      finite = finite && std::isfinite(x[c]);
    }
    // A non-finite block arrives as NaN for the finite checks downstream; throwing here would leave the other
    // ranks waiting in the collective.
    const float scale = !finite ? std::nanf("") : amax > 0.0f ? amax / 448.0f : 1.0f;
    packed[b] = scale;
    // Clamped so that amax / scale rounding a hair above 448 never encodes as NaN.
    for (int64_t c = c0; c < c1; ++c) bytes[c] = f32_to_e4m3(std::clamp(x[c] / scale, -448.0f, 448.0f));
  }
}

void fp8_dispatch_unpack(const float* packed, int64_t d, float* x) {
  const int64_t nb = fp8_blocks(d);
  const auto* bytes = reinterpret_cast<const uint8_t*>(packed + nb);
  for (int64_t c = 0; c < d; ++c) x[c] = e4m3_to_f32(bytes[c]) * packed[c / kFp8DispatchBlock];
}

ExpertPlacement ExpertPlacement::contiguous(int num_experts, int ep_size) {
  DI_CHECK(ep_size >= 1) << "expert placement: EP size must be >= 1, got " << ep_size;
  DI_CHECK(num_experts >= ep_size) << "expert placement: " << num_experts << " routed experts cannot be split over "
                                   << ep_size << " EP ranks (each rank needs at least one)";
  std::vector<std::vector<int>> lists(ep_size);
  for (int r = 0; r < ep_size; ++r) {
    const int begin = static_cast<int>(int64_t{r} * num_experts / ep_size);
    const int end = static_cast<int>(int64_t{r + 1} * num_experts / ep_size);
    for (int e = begin; e < end; ++e) lists[r].push_back(e);
  }
  return from_rank_experts(num_experts, std::move(lists));
}

ExpertPlacement ExpertPlacement::from_rank_experts(int num_experts, std::vector<std::vector<int>> rank_experts) {
  DI_CHECK(!rank_experts.empty()) << "expert placement: no ranks";
  ExpertPlacement p;
  p.num_experts_ = num_experts;
  p.expert_ranks_.assign(num_experts, {});
  for (int r = 0; r < static_cast<int>(rank_experts.size()); ++r) {
    for (int e : rank_experts[r]) {
      DI_CHECK(e >= 0 && e < num_experts)
          << "expert placement: rank " << r << " holds expert " << e << ", outside [0, " << num_experts << ")";
      DI_CHECK(p.expert_ranks_[e].empty() || p.expert_ranks_[e].back() != r)
          << "expert placement: rank " << r << " holds expert " << e << " twice";
      p.expert_ranks_[e].push_back(r);
    }
  }
  for (int e = 0; e < num_experts; ++e)
    DI_CHECK(!p.expert_ranks_[e].empty()) << "expert placement: expert " << e << " is on no rank";
  p.rank_experts_ = std::move(rank_experts);
  return p;
}

int ExpertPlacement::slot_of(int rank, int expert) const {
  const std::vector<int>& l = rank_experts_.at(rank);
  auto it = std::find(l.begin(), l.end(), expert);
  return it == l.end() ? -1 : static_cast<int>(it - l.begin());
}

int ExpertPlacement::max_slots() const {
  size_t m = 0;
  for (const auto& l : rank_experts_) m = std::max(m, l.size());
  return static_cast<int>(m);
}

std::string ExpertPlacement::str() const {
  std::ostringstream s;
  for (int r = 0; r < ep_size(); ++r) {
    s << (r ? " " : "") << "r" << r << ":[";
    for (size_t i = 0; i < rank_experts_[r].size(); ++i) s << (i ? " " : "") << rank_experts_[r][i];
    s << "]";
  }
  return s.str();
}

void ExpertLoad::resize(int layers, int experts) {
  num_layers = layers;
  num_experts = experts;
  counts.assign(static_cast<size_t>(layers) * experts, 0);
}

ExpertParallel::ExpertParallel(Communicator& ep_group, Communicator& replicas, std::vector<ExpertPlacement> placements)
    : ep_(ep_group), replicas_(replicas), placements_(std::move(placements)) {
  int experts = 0;
  for (const ExpertPlacement& p : placements_) {
    if (p.num_experts() == 0) continue;  // dense layer
    DI_CHECK(p.ep_size() == ep_.size()) << "expert parallel: a placement for " << p.ep_size()
                                        << " ranks in an EP group of " << ep_.size();
    experts = std::max(experts, p.num_experts());
  }
  load_.resize(static_cast<int>(placements_.size()), experts);
  computed_.assign(placements_.size(), 0);
  f32_lists_.resize(placements_.size());
  f32_shared_.resize(placements_.size());
  quant_lists_.resize(placements_.size());
  quant_shared_.resize(placements_.size());
}

void ExpertParallel::clear_counters() {
  load_.clear();
  std::fill(computed_.begin(), computed_.end(), 0);
}

void ExpertParallel::set_placement(int layer, ExpertPlacement p) {
  DI_CHECK(layer >= 0 && layer < num_layers()) << "expert parallel: layer " << layer << " out of range";
  DI_CHECK(p.ep_size() == ep_.size()) << "expert parallel: a placement for " << p.ep_size()
                                      << " ranks in an EP group of " << ep_.size();
  placements_[layer] = std::move(p);
}

// One layer's experts as the model holds them: f32 (Backend::moe) or in their block format (Backend::moe_quant).
struct ExpertParallel::Experts {
  const std::vector<ExpertWeights>* f32 = nullptr;
  const ExpertWeights* f32_shared = nullptr;
  const std::vector<QuantExpertWeights>* quant = nullptr;
  const QuantExpertWeights* quant_shared = nullptr;
  float swiglu_limit = 0.0f;
  bool weight_before_w2 = false;
  ActQuant act_quant = ActQuant::kNone;  // row-wise, so rounding the received rows equals rounding before dispatch

  bool has_shared() const { return f32_shared != nullptr || quant_shared != nullptr; }
  // The hidden size, from a held routed expert.
  int64_t hidden(int expert) const { return quant ? quant->at(expert).w1.cols() : f32->at(expert).w1.dim(1); }
  // out = Σ_j E_{slots[indices[t,j]]}(x[t])·weights[t,j] over the routed experts `slots` (ids, in slot order);
  // the lists are filled with the experts the backend reads.
  void routed(Backend& backend, const std::vector<int>& slots, std::vector<ExpertWeights>& f32_list,
              std::vector<QuantExpertWeights>& quant_list, const Tensor& x, const Tensor& w, const Tensor& idx,
              const Tensor& out) const {
    if (quant) {
      quant_list.clear();
      for (int e : slots) quant_list.push_back(quant->at(e));
      backend.moe_quant({x, w, idx, &quant_list, nullptr, out, swiglu_limit, weight_before_w2, act_quant});
      return;
    }
    f32_list.clear();
    for (int e : slots) f32_list.push_back(f32->at(e));
    backend.moe({x, w, idx, &f32_list, nullptr, out, swiglu_limit, weight_before_w2, act_quant});
  }
  // The shared expert as one routed expert of weight 1 applied before w2 (the reference's form of it).
  void shared(Backend& backend, std::vector<ExpertWeights>& f32_one, std::vector<QuantExpertWeights>& quant_one,
              const Tensor& x, const Tensor& w, const Tensor& idx, const Tensor& out) const {
    if (quant_shared) {
      quant_one.assign(1, *quant_shared);
      backend.moe_quant({x, w, idx, &quant_one, nullptr, out, swiglu_limit, true, act_quant});
      return;
    }
    f32_one.assign(1, *f32_shared);
    backend.moe({x, w, idx, &f32_one, nullptr, out, swiglu_limit, true, act_quant});
  }
};

ExpertFilter placed_experts_filter(std::vector<ExpertPlacement> placements, int rank) {
  return [placements = std::move(placements), rank](int layer, int expert) {
    if (layer < 0 || layer >= static_cast<int>(placements.size())) return true;
    const ExpertPlacement& p = placements[layer];
    return p.num_experts() == 0 || p.slot_of(rank, expert) >= 0;
  };
}

namespace {
// Zero tokens of width d (an idle rank's share of a layer).
struct NoTokens {
  Tensor x, weights, indices, out;
  explicit NoTokens(int64_t d)
      : x(nullptr, DType::kF32, {0, d}),
        weights(nullptr, DType::kF32, {0, 1}),
        indices(nullptr, DType::kI32, {0, 1}),
        out(nullptr, DType::kF32, {0, d}) {}
};
}  // namespace

void ExpertParallel::idle(Backend& backend, int layer, const std::vector<ExpertWeights>& experts, float swiglu_limit,
                          bool weight_before_w2) {
  Experts ex;
  ex.f32 = &experts;
  ex.swiglu_limit = swiglu_limit;
  ex.weight_before_w2 = weight_before_w2;
  // Any held expert gives the hidden size; a rank always holds at least one (ExpertPlacement guarantees it only
  // for E >= ep, which contiguous() requires).
  const std::vector<int>& mine = placements_.at(layer).experts_on(ep_.rank());
  DI_CHECK_INTERNAL(!mine.empty()) << "expert parallel: rank " << ep_.rank() << " holds no expert of layer " << layer;
  const NoTokens none(ex.hidden(mine[0]));
  run(backend, layer, none.x, none.weights, none.indices, none.out, ex);
}

void ExpertParallel::idle(Backend& backend, int layer, const std::vector<QuantExpertWeights>& experts,
                          float swiglu_limit, bool weight_before_w2) {
  Experts ex;
  ex.quant = &experts;
  ex.swiglu_limit = swiglu_limit;
  ex.weight_before_w2 = weight_before_w2;
  const std::vector<int>& mine = placements_.at(layer).experts_on(ep_.rank());
  DI_CHECK_INTERNAL(!mine.empty()) << "expert parallel: rank " << ep_.rank() << " holds no expert of layer " << layer;
  const NoTokens none(ex.hidden(mine[0]));
  run(backend, layer, none.x, none.weights, none.indices, none.out, ex);
}

void ExpertParallel::moe(Backend& backend, int layer, const MoeParams& p) {
  DI_CHECK(p.experts != nullptr) << "expert parallel moe: experts are required";
  Experts ex;
  ex.f32 = p.experts;
  ex.f32_shared = p.shared;
  ex.swiglu_limit = p.swiglu_limit;
  ex.weight_before_w2 = p.weight_before_w2;
  ex.act_quant = p.act_quant;
  run(backend, layer, p.x, p.weights, p.indices, p.out, ex);
}

void ExpertParallel::moe(Backend& backend, int layer, const QuantMoeParams& p) {
  DI_CHECK(p.experts != nullptr) << "expert parallel moe: experts are required";
  Experts ex;
  ex.quant = p.experts;
  ex.quant_shared = p.shared;
  ex.swiglu_limit = p.swiglu_limit;
  ex.weight_before_w2 = p.weight_before_w2;
  ex.act_quant = p.act_quant;
  run(backend, layer, p.x, p.weights, p.indices, p.out, ex);
}

void ExpertParallel::run(Backend& backend, int layer, const Tensor& px, const Tensor& pw, const Tensor& pidx,
                         const Tensor& pout, const Experts& ex) {
  DI_CHECK_INTERNAL(layer >= 0 && layer < num_layers() && placements_[layer].num_experts() > 0)
      << "expert parallel: layer " << layer << " has no expert placement";
  const int64_t T = px.dim(0), d = px.dim(1), k = pw.dim(1);
  TensorMemory& mem = backend_memory(backend);
  HostTensor x, idx, w;
  if (T > 0) {
    x = mem.to_host(px);
    idx = mem.to_host(pidx);
    w = mem.to_host(pw);
  }
  // This replica's share of the tokens (all of them without replicated attention).
  const int64_t R = replicas_.size(), i = replicas_.rank();
  const int64_t t0 = T * i / R, t1 = T * (i + 1) / R;
  std::vector<float> out_host(static_cast<size_t>(T * d), 0.0f);
  exchange(backend, layer, ex, T > 0 ? x.data<float>() : nullptr, T > 0 ? idx.data<int32_t>() : nullptr,
           T > 0 ? w.data<float>() : nullptr, k, t0, t1, d, out_host.data() + t0 * d);
  if (R > 1) {
    std::vector<int64_t> counts;
    std::vector<float> all =
        replicas_.all_gather_v(std::span<const float>(out_host.data() + t0 * d, (t1 - t0) * d), &counts);
    DI_CHECK_INTERNAL(static_cast<int64_t>(all.size()) == T * d)
        << "expert parallel: replicas of one shard hold different token counts ("
        << all.size() / std::max<int64_t>(d, 1) << " rows gathered, " << T << " here)";
    out_host = std::move(all);
  }
  if (T > 0) mem.copy(pout, Tensor(out_host.data(), DType::kF32, {T, d}));
}

void ExpertParallel::exchange(Backend& backend, int layer, const Experts& ex, const float* x, const int32_t* idx,
                              const float* w, int64_t k, int64_t t0, int64_t t1, int64_t d, float* out) {
  const ExpertPlacement& pl = placements_[layer];
  const int ep = ep_.size(), me = ep_.rank();
  const int64_t xw = fp8_dispatch_ ? fp8_dispatch_row_floats(d) : d, row = xw + 2;
  TensorMemory& mem = backend_memory(backend);

  // Dispatch: group this share's pairs by destination rank; a replicated expert is picked round-robin by token.
  std::vector<std::vector<int64_t>> pairs(ep);  // pair id t·k + j, in send order
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      DI_CHECK(e >= 0 && e < pl.num_experts()) << "expert parallel moe: expert id " << e << " out of range";
      load_.add(layer, e, 1);
      const std::vector<int>& holders = pl.ranks_of(e);
      pairs[holders[static_cast<size_t>(t) % holders.size()]].push_back(t * k + j);
    }
  }
  std::vector<int64_t> send_counts(ep);
  std::vector<float> send;
  for (int r = 0; r < ep; ++r) {
    send_counts[r] = static_cast<int64_t>(pairs[r].size()) * row;
    for (int64_t pid : pairs[r]) {
      const int64_t t = pid / k;
      if (fp8_dispatch_) {
        send.resize(send.size() + xw);
        fp8_dispatch_pack(x + t * d, d, send.data() + send.size() - xw);
      } else {
        send.insert(send.end(), x + t * d, x + (t + 1) * d);
      }
      send.push_back(w[pid]);
      send.push_back(static_cast<float>(pl.slot_of(r, idx[pid])));
    }
  }
  const std::vector<int64_t> recv_counts = ep_.exchange_counts(send_counts);
  const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  std::vector<float> recv(recv_total);
  ep_.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::kF32);

  // Expert compute: one backend MoE call over every received pair, each row with its one expert (k = 1).
  const int64_t P = recv_total / row;
  computed_[layer] += P;
  std::vector<float> results(static_cast<size_t>(P * d));
  if (P > 0) {
    const std::vector<int>& slots = pl.experts_on(me);
    HostTensor xin(DType::kF32, {P, d}), win(DType::kF32, {P, 1}), iin(DType::kI32, {P, 1});
    for (int64_t q = 0; q < P; ++q) {
      const float* r = recv.data() + q * row;
      if (fp8_dispatch_) {
        fp8_dispatch_unpack(r, d, xin.data<float>() + q * d);
      } else {
        std::copy(r, r + d, xin.data<float>() + q * d);
      }
      win.data<float>()[q] = r[xw];
      const int slot = static_cast<int>(r[xw + 1]);
      DI_CHECK_INTERNAL(slot >= 0 && slot < static_cast<int>(slots.size()))
          << "expert parallel: slot " << slot << " on rank " << me << " of layer " << layer;
      iin.data<int32_t>()[q] = slot;
    }
    OwnedTensor xd = mem.upload(xin), wd = mem.upload(win), id = mem.upload(iin), od = mem.zeros(DType::kF32, {P, d});
    ex.routed(backend, slots, f32_lists_[layer], quant_lists_[layer], xd.view(), wd.view(), id.view(), od.view());
    HostTensor oh = mem.to_host(od.view());
    std::copy(oh.data<float>(), oh.data<float>() + P * d, results.data());
  }

  // Combine: the rows go back to their senders in the order received.
  std::vector<int64_t> back_send(ep), back_recv(ep);
  for (int r = 0; r < ep; ++r) {
    back_send[r] = recv_counts[r] / row * d;
    back_recv[r] = static_cast<int64_t>(pairs[r].size()) * d;
  }
  const int64_t n_pairs = (t1 - t0) * k;
  std::vector<float> returned(static_cast<size_t>(n_pairs * d));
  ep_.all_to_all_v(results.data(), back_send, returned.data(), back_recv, DType::kF32);
  std::vector<const float*> contribution(static_cast<size_t>(n_pairs));
  int64_t at = 0;
  for (int r = 0; r < ep; ++r)
    for (int64_t pid : pairs[r]) contribution[pid - t0 * k] = returned.data() + (at++) * d;

  // Shared expert on this share, locally.
  std::vector<float> shared;
  if (ex.has_shared() && t1 > t0) {
    const int64_t n = t1 - t0;
    HostTensor xs(DType::kF32, {n, d}), ws(DType::kF32, {n, 1}), is(DType::kI32, {n, 1});
    std::copy(x + t0 * d, x + t1 * d, xs.data<float>());
    std::fill(ws.data<float>(), ws.data<float>() + n, 1.0f);
    std::fill(is.data<int32_t>(), is.data<int32_t>() + n, 0);
    OwnedTensor xd = mem.upload(xs), wd = mem.upload(ws), id = mem.upload(is), od = mem.zeros(DType::kF32, {n, d});
    ex.shared(backend, f32_shared_[layer], quant_shared_[layer], xd.view(), wd.view(), id.view(), od.view());
    HostTensor oh = mem.to_host(od.view());
    shared.assign(oh.data<float>(), oh.data<float>() + n * d);
  }

  // Sum in expert-id order from zero (ties in id keep slot order, as the reference's small sort does), then shared.
  std::vector<int64_t> order(k);
  for (int64_t t = t0; t < t1; ++t) {
    float* y = out + (t - t0) * d;
    std::fill(y, y + d, 0.0f);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return idx[t * k + a] < idx[t * k + b]; });
    for (int64_t j : order) {
      const float* c = contribution[(t - t0) * k + j];
      for (int64_t o = 0; o < d; ++o) y[o] += c[o];
    }
    if (!shared.empty()) {
      const float* s = shared.data() + (t - t0) * d;
      for (int64_t o = 0; o < d; ++o) y[o] += s[o];
    }
  }
}

}  // namespace deepinfer
