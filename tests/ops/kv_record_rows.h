// Rows as the V4.1 model caches them, for the record tests (ops/kv_record.h, ops/cuda/kv_record.cuh).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer::testing {

// Rows of `width` values over many magnitudes (block maxima from 1e-38 — the quantizers' smallest scales and f32
// subnormals — to 1e4, some blocks all zero, signed zeros), fake-quantized by `kind` as the model quantizes the rows it
// caches.
inline std::vector<float> quantized_rows(FakeQuantKind kind, int rows, int width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-38.0f, 4.0f);
  std::vector<float> v(static_cast<size_t>(rows) * width);
  const int block = fake_quant_block_len(kind);
  for (size_t b = 0; b < v.size() / block; ++b) {
    const float mag = std::pow(10.0f, log_mag(rng));
    const bool zero = b % 13 == 5;
    for (int i = 0; i < block; ++i) v[b * block + i] = zero ? (i % 2 ? -0.0f : 0.0f) : normal(rng) * mag;
  }
  fake_quant_rows(v.data(), rows, width, kind);
  return v;
}

}  // namespace deepinfer::testing
