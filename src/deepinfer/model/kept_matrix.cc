#include "deepinfer/model/kept_matrix.h"

#include <cstring>

#include "deepinfer/core/error.h"
#include "deepinfer/model/weight_loader.h"

namespace deepinfer {
namespace {

// A host copy of a checkpoint tensor (the checkpoint's mapping is closed after loading).
HostTensor host_copy(const Tensor& t) {
  HostTensor h(t.dtype(), t.shape());
  std::memcpy(h.data<uint8_t>(), t.data(), static_cast<size_t>(t.nbytes()));
  return h;
}

}  // namespace

int64_t owned_bytes(const OwnedTensor& t) { return t.view().data() ? dtype_bytes(t.dtype(), t.numel()) : 0; }

int64_t KeptMatrix::bytes() const { return owned_bytes(f32) + owned_bytes(codes) + owned_bytes(scales); }

QuantMatrix KeptMatrix::as_quant() const {
  if (quantized()) return quant;
  return QuantMatrix{f32.view(), Tensor{}, QuantFormat::kFloat};
}

KeptMatrix load_kept(const WeightLoader& ld, const std::string& name, bool keep_quant) {
  KeptMatrix m;
  QuantMatrix stored;
  m.block_format = ld.stored_quant(name, &stored);
  if (keep_quant && m.block_format) {
    m.codes = host_copy(stored.weight);
    m.scales = host_copy(stored.scale);
    m.quant = stored;
    m.quant.weight = m.codes.view();
    m.quant.scale = m.scales.view();
  } else {
    m.f32 = ld.f32(name);
  }
  return m;
}

void set_act_quant(KeptMatrix& w, ActQuant q) { w.act_quant = w.block_format ? q : ActQuant::kNone; }

void kept_linear(Backend& backend, const Tensor& in, const KeptMatrix& w, const Tensor& out) {
  if (w.quantized()) {
    QuantLinearParams p{in, w.quant, out};
    p.act_quant = w.act_quant;
    backend.linear_quant(p);
  } else {
    backend.linear({in, w.f32.view(), out, w.act_quant});
  }
}

OwnedTensor kept_project(Backend& backend, TensorMemory& mem, const Tensor& x, const KeptMatrix& w) {
  OwnedTensor out = mem.empty(DType::kF32, {x.dim(0), w.rows()});  // the linear writes all of it
  kept_linear(backend, x, w, out.view());
  return out;
}

bool kept_row_slice_ok(const KeptMatrix& w, int64_t r0, int64_t r1) {
  if (!w.quantized() || w.quant.format != QuantFormat::kFP8Block) return true;
  return r0 % w.quant.block_n == 0 && (r1 % w.quant.block_n == 0 || r1 == w.quant.rows());
}

void kept_linear_rows(Backend& backend, const Tensor& in, const KeptMatrix& w, int64_t r0, int64_t r1,
                      const Tensor& out) {
  if (!w.quantized()) {
    backend.linear({in, w.f32.view().slice(r0, r1), out, w.act_quant});
    return;
  }
  DI_CHECK_INTERNAL(kept_row_slice_ok(w, r0, r1))
      << "rows " << r0 << ".." << r1 << " of a quantized matrix cut its " << w.quant.block_n << "-row scale blocks";
  QuantLinearParams p{in, quant_rows(w.quant, r0, r1), out};
  p.act_quant = w.act_quant;
  backend.linear_quant(p);
}

void upload_kept(TensorMemory& mem, KeptMatrix& w) {
  if (w.f32.view().data() != nullptr) w.f32 = mem.upload(w.f32.view());
  if (!w.quantized()) return;
  w.codes = mem.upload(w.codes.view());
  w.scales = mem.upload(w.scales.view());
  w.quant.weight = w.codes.view();
  w.quant.scale = w.scales.view();
}

}  // namespace deepinfer
