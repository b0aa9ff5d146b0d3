#include "deepinfer/model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/weight_schema.h"

namespace deepinfer {

namespace fs = std::filesystem;

namespace {

// splitmix64 + Box-Muller: the same values on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // The state is a counter: skipping n draws is one multiply-add, which lets a long tensor be drawn in pieces.
  void skip(uint64_t n) { s_ += n * 0x9E3779B97F4A7C15ull; }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  float normal() {
    double u1 = uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t s_;
};

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Float values for a spec, scaled like a trained model's (norms near 1, matrices N(0, 1/fan_in)). A tensor of at
// least 2 x `piece` values is drawn in up to `threads` pieces, each from the generator skipped to its first value
// (two draws a value): the same values as one sequential pass (the embedding and head are 0.5 G values each).
std::vector<float> random_values(const WeightSpec& s, const ModelConfig& c, Rng& rng, int threads, int64_t piece) {
  const int64_t n = shape_numel(s.shape);
  std::vector<float> v(static_cast<size_t>(n));
  const std::string& name = s.name;
  float mean = 0, std = 1;
  if (ends_with(name, "norm.weight") || ends_with(name, "_scale") || ends_with(name, "q_weight") ||
      ends_with(name, "k_weight")) {
    mean = 1.0f, std = 0.02f;
  } else if (ends_with(name, "attn_sink")) {
    std = 0.5f;
  } else if (ends_with(name, "bias") || ends_with(name, "bias_vl") || ends_with(name, "_base") ||
             ends_with(name, ".ape")) {
    std = 0.05f;
  } else if (s.kind == WeightKind::kEmbedding) {
    std = ends_with(name, "head.weight") ? 2.0f / std::sqrt(static_cast<float>(s.shape[1])) : 1.0f;
  } else if (s.shape.size() == 2) {
    std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
  }
  const int pieces = n >= 2 * piece ? static_cast<int>(std::min<int64_t>(threads, n / piece)) : 1;
  auto draw = [&](int64_t begin, int64_t end) {
    Rng r = rng;
    r.skip(2 * static_cast<uint64_t>(begin));
    for (int64_t i = begin; i < end; ++i) v[i] = mean + std * r.normal();
  };
  std::vector<std::thread> pool;
  for (int p = 1; p < pieces; ++p) pool.emplace_back(draw, n * p / pieces, n * (p + 1) / pieces);
  draw(0, pieces > 1 ? n / pieces : n);
  for (auto& t : pool) t.join();
  rng.skip(2 * static_cast<uint64_t>(n));
  return v;
}

// One tensor ready to write (owning its bytes).
struct Blob {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

Blob float_blob(const std::string& name, const Shape& shape, const std::vector<float>& v, DType t) {
  Blob b{name, t, shape, std::vector<uint8_t>(static_cast<size_t>(dtype_bytes(t, shape_numel(shape))))};
  for (size_t i = 0; i < v.size(); ++i) store_from_f32(b.bytes.data(), t, static_cast<int64_t>(i), v[i]);
  return b;
}

// FP8 e4m3 with one scale per (bn x bk) block; UE8M0 scales are powers of two rounded up.
void quantize_fp8(const WeightSpec& s, const std::vector<float>& v, int bn, int bk, bool ue8m0,
                  const std::string& scale_name, std::vector<Blob>& out) {
  const int64_t N = s.shape[0], K = s.shape[1];
  const int64_t SN = (N + bn - 1) / bn, SK = (K + bk - 1) / bk;
  std::vector<float> scales(static_cast<size_t>(SN * SK));
  for (int64_t i = 0; i < SN; ++i)
    for (int64_t j = 0; j < SK; ++j) {
      float amax = 0;
      for (int64_t r = i * bn; r < std::min(N, (i + 1) * bn); ++r)
        for (int64_t k = j * bk; k < std::min(K, (j + 1) * bk); ++k) amax = std::max(amax, std::fabs(v[r * K + k]));
      float sc = std::max(amax, 1e-4f) / kE4M3Max;
      if (ue8m0) sc = e8m0_to_f32(f32_to_e8m0_ceil(sc));
      scales[i * SK + j] = sc;
    }
  Blob w{s.name, DType::kF8E4M3, s.shape, std::vector<uint8_t>(static_cast<size_t>(N * K))};
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < K; ++k) w.bytes[r * K + k] = f32_to_e4m3(v[r * K + k] / scales[(r / bn) * SK + k / bk]);
  out.push_back(std::move(w));
  out.push_back(float_blob(scale_name, {SN, SK}, scales, ue8m0 ? DType::kE8M0 : DType::kF32));
}

// MXFP4: e2m1 pairs packed low nibble first, one UE8M0 scale per 32 inputs.
void quantize_mxfp4(const WeightSpec& s, const std::vector<float>& v, const std::string& scale_name,
                    std::vector<Blob>& out) {
  const int64_t N = s.shape[0], K = s.shape[1];
  DI_CHECK(K % 32 == 0) << "MXFP4 needs the input dimension of '" << s.name << "' to be a multiple of 32, got " << K;
  std::vector<float> scales(static_cast<size_t>(N * K / 32));
  Blob w{s.name, DType::kI8, {N, K / 2}, std::vector<uint8_t>(static_cast<size_t>(N * K / 2))};
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < K / 32; ++g) {
      float amax = 0;
      for (int64_t k = g * 32; k < (g + 1) * 32; ++k) amax = std::max(amax, std::fabs(v[r * K + k]));
      float sc = e8m0_to_f32(f32_to_e8m0_ceil(std::max(amax, 1e-30f) / 6.0f));
      scales[r * (K / 32) + g] = sc;
      for (int64_t k = g * 32; k < (g + 1) * 32; ++k)
        fp4_set(w.bytes.data(), r * K + k, f32_to_e2m1(v[r * K + k] / sc));
    }
  out.push_back(std::move(w));
  out.push_back(float_blob(scale_name, {N, K / 32}, scales, DType::kE8M0));
}

std::vector<Blob> realise(const WeightSpec& s, const ModelConfig& c, Rng& rng, int threads, int64_t piece) {
  std::vector<Blob> out;
  const std::string scale_name = c.family == ModelFamily::kDeepseekV3 ? scale_names(s.name)[1] : scale_names(s.name)[0];
  if (s.kind == WeightKind::kIntTable) {
    // Hash routing: distinct experts per token.
    const int64_t rows = s.shape[0], k = s.shape[1];
    Blob b{s.name, DType::kI64, s.shape, std::vector<uint8_t>(static_cast<size_t>(rows * k * 8))};
    auto* p = reinterpret_cast<int64_t*>(b.bytes.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int64_t> perm(static_cast<size_t>(c.moe.n_routed_experts));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
      for (int64_t i = 0; i < k; ++i) {
        size_t j = i + rng.next() % (perm.size() - i);
        std::swap(perm[i], perm[j]);
        p[r * k + i] = perm[i];
      }
    }
    out.push_back(std::move(b));
    return out;
  }
  std::vector<float> v = random_values(s, c, rng, threads, piece);
  if (s.quantized && s.kind == WeightKind::kExpert && c.quant.experts_fp4) {
    quantize_mxfp4(s, v, scale_name, out);
  } else if (s.quantized && s.kind == WeightKind::kEngramTable) {
    quantize_fp8(s, v, 1, 32, true, scale_names(s.name)[0], out);
  } else if (s.quantized) {
    quantize_fp8(s, v, c.quant.block_n, c.quant.block_k, c.quant.scale_ue8m0, scale_name, out);
  } else {
    const bool f32 = ends_with(s.name, "attn_sink") || s.name.find("hc_") != std::string::npos ||
                     ends_with(s.name, "gate.bias") || ends_with(s.name, "bias_vl") ||
                     ends_with(s.name, "e_score_correction_bias") || ends_with(s.name, ".ape");
    out.push_back(float_blob(s.name, s.shape, v, f32 && c.quant.fp8 ? DType::kF32 : DType::kBF16));
  }
  return out;
}

void flush_shard(std::vector<Blob>& blobs, const std::string& path) {
  std::vector<SafetensorsWriteItem> items;
  for (const auto& b : blobs) items.push_back({b.name, b.dtype, b.shape, b.bytes.data()});
  write_safetensors(path, items, {{"format", "pt"}, {"generator", "deepinfer make-checkpoint"}});
  blobs.clear();
}

// "<prefix>experts.<e>.<rest>" (a routed expert's matrix): e and the name with e replaced by `to`; -1 otherwise.
int routed_expert(const std::string& name, int to, std::string* renamed) {
  static const std::regex re(R"(^(.*\.experts\.)([0-9]+)(\..*)$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  if (renamed) *renamed = m[1].str() + std::to_string(to) + m[3].str();
  return std::stoi(m[2].str());
}

}  // namespace

int64_t write_random_checkpoint(const RandomCheckpointOptions& o) {
  const std::string text = read_text_file(o.config_path);
  ModelConfig c = parse_model_config(text, o.config_path);
  fs::create_directories(o.out_dir);
  {
    std::ofstream cfg(o.out_dir + "/config.json", std::ios::trunc);
    DI_CHECK_CODE(cfg.good(), ErrorCode::kNotFound) << "cannot write " << o.out_dir << "/config.json";
    cfg << text;
  }
  // Stale shards from an earlier run would be picked up by the directory scan.
  for (const auto& e : fs::directory_iterator(o.out_dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      fs::remove(e.path());

  const auto specs = expected_weights(c);
  std::vector<Blob> pending;
  int64_t pending_bytes = 0, total = 0;
  std::vector<std::vector<std::string>> shard_names(1);
  std::vector<std::string> shard_files;
  auto shard_path = [&](size_t i) { return o.out_dir + "/model-" + std::to_string(i) + ".safetensors"; };
  auto append = [&](Blob&& b) {
    if (pending_bytes > 0 && pending_bytes + static_cast<int64_t>(b.bytes.size()) > o.shard_bytes) {
      shard_files.push_back(shard_path(shard_files.size()));
      flush_shard(pending, shard_files.back());
      shard_names.emplace_back();
      pending_bytes = 0;
    }
    pending_bytes += static_cast<int64_t>(b.bytes.size());
    total += static_cast<int64_t>(b.bytes.size());
    shard_names.back().push_back(b.name);
    pending.push_back(std::move(b));
  };
  // Tensors are realised on `threads` workers (a real-size V4 layer is ~770 expert matrices of 8 M values each:
  // minutes on one core) while this thread appends them in spec order, so the shards do not depend on the thread
  // count. The workers run at most `lead` tensors ahead of the writer: the memory is a few hundred tensors', not
  // the model's, and a long tensor (the embedding: one sequential stream of 0.5 G values) does not stall the others.
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t lead = std::max<size_t>(64, 32 * static_cast<size_t>(threads));
  std::vector<std::vector<Blob>> done(specs.size());
  std::vector<char> ready(specs.size(), 0);
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0, written = 0;
  std::exception_ptr error;
  auto work = [&] {
    for (;;) {
      size_t i = 0;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return error || next >= specs.size() || next < written + lead; });
        if (error || next >= specs.size()) return;
        i = next++;
      }
      std::vector<Blob> blobs;
      std::exception_ptr failed;
      try {
        Rng rng(o.seed ^ hash_name(specs[i].name));
        // A repeated expert is copied by the writer from the one it repeats.
        if (o.distinct_experts <= 0 || routed_expert(specs[i].name, 0, nullptr) < o.distinct_experts)
          blobs = realise(specs[i], c, rng, threads, std::max<int64_t>(1, o.piece_values));
      } catch (...) {
        failed = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        if (failed && !error) error = failed;
        done[i] = std::move(blobs);
        ready[i] = 1;
      }
      cv.notify_all();
    }
  };
  // distinct_experts > 0: routed expert e >= n of a layer is expert e % n's tensors under its own names (the same
  // bytes, its own storage): the writer keeps the first n experts' blobs of the layer being written.
  std::map<std::string, std::vector<Blob>> repeated;
  std::string repeated_layer;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  try {
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<Blob> blobs;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return error || ready[i]; });
        if (error) break;
        blobs = std::move(done[i]);
        written = i + 1;
      }
      cv.notify_all();
      const std::string& name = specs[i].name;
      const int n = o.distinct_experts;
      const int e = n > 0 ? routed_expert(name, 0, nullptr) : -1;
      if (e >= 0 && e < n) {
        const std::string layer = name.substr(0, name.find(".experts."));
        if (layer != repeated_layer) {
          repeated.clear();
          repeated_layer = layer;
        }
        repeated[name] = blobs;
      } else if (e >= n && n > 0) {
        std::string source;
        routed_expert(name, e % n, &source);
        const auto it = repeated.find(source);
        DI_CHECK_CODE(it != repeated.end(), ErrorCode::kInternal) << "make-checkpoint: " << source << " not kept";
        for (const Blob& b : it->second) {
          Blob copy = b;
          routed_expert(b.name, e, &copy.name);
          blobs.push_back(std::move(copy));
        }
      }
      for (auto& b : blobs) append(std::move(b));
    }
  } catch (...) {  // a shard that could not be written: stop the workers before rethrowing
    std::lock_guard<std::mutex> lk(mu);
    if (!error) error = std::current_exception();
  }
  cv.notify_all();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  if (shard_files.empty()) {
    flush_shard(pending, o.out_dir + "/model.safetensors");
  } else {
    shard_files.push_back(shard_path(shard_files.size()));
    flush_shard(pending, shard_files.back());
    nlohmann::json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = nlohmann::json::object();
    for (size_t i = 0; i < shard_files.size(); ++i)
      for (const auto& n : shard_names[i]) idx["weight_map"][n] = fs::path(shard_files[i]).filename().string();
    std::ofstream f(o.out_dir + "/model.safetensors.index.json", std::ios::trunc);
    f << idx.dump(2);
  }
  DI_LOG_INFO("wrote {} tensors ({:.1f} MB) to {}", specs.size(), total / 1e6, o.out_dir);
  return total;
}

}  // namespace deepinfer
