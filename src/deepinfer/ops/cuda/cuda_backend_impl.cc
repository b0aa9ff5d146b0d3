// CudaBackend::Impl's larger pieces (cuda_backend_impl.h): cuBLASLt plans, the dense linear of block formats, the
// MoE pipeline and the shared expert's GEMM.
#include "deepinfer/ops/cuda/cuda_backend_impl.h"

#include <type_traits>

#include "deepinfer/core/logging.h"
#include "deepinfer/ops/cuda/fp8_codes.cuh"
#include "deepinfer/ops/cuda/swiglu_bf16.h"

namespace deepinfer {

void CudaBackend::Impl::pick_algo(LtPlan& p, const std::string& shape, int c_align) {
  cublasLtMatmulPreference_t pref = nullptr;
  DI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      owned(pref, &cublasLtMatmulPreferenceDestroy);
  const size_t ws = lt_workspace.size();
  DI_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  if (c_align > 0) {
    const uint32_t a = static_cast<uint32_t>(c_align);
    DI_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a, sizeof(a)));
    DI_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a, sizeof(a)));
  }
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  DI_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &heur, &found));
  DI_CHECK_CODE(found > 0, ErrorCode::kUnsupported) << "cuBLASLt has no algorithm for " << shape;
  p.algo = heur.algo;
}

const CudaBackend::Impl::LtPlan& CudaBackend::Impl::lt_plan(cudaDataType_t type, int64_t m, int64_t n, int64_t k,
                                                            bool block_scaled, int64_t ldc, int c_align) {
  if (ldc <= 0) ldc = n;
  const auto key = std::make_tuple(m, n, k, ldc, c_align, static_cast<int>(type) + (block_scaled ? 1000 : 0));
  if (auto it = lt_plans.find(key); it != lt_plans.end()) return it->second;
  if (lt_plans.size() >= kMaxLtPlans) {
    for (auto& [unused, p] : lt_plans) destroy(p);
    lt_plans.clear();
  }
  LtPlan p;
  try {
    // f32 x f32 uses full fp32 (no TF32): the f32 Backend::linear promises CPU-level accuracy.
    DI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (block_scaled) {
      const int32_t wm = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, xm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &wm, sizeof(wm)));
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &xm, sizeof(xm)));
      // The heuristic refuses block scaling without scale pointers (CUBLAS_STATUS_INVALID_VALUE, H100, cuBLAS 13.1):
      // any aligned device address until a call sets its own.
      const void* any = lt_workspace.data();
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof(any)));
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof(any)));
    }
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, k, n, k));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, k, m, k));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, m, ldc));
    pick_algo(p, std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k), c_align);
  } catch (...) {
    destroy(p);
    throw;
  }
  return lt_plans.emplace(key, p).first->second;
}

void CudaBackend::Impl::lt_batched(const LtBatched& g) {
  if (g.rows == 0 || g.cols == 0 || g.batch == 0) return;
  DI_CHECK(g.k > 0) << "lt_batched: k = 0";
  const bool tf32 = g.tf32 && !g.bf16;  // TF32 is f32 operands' alone
  const std::array<int64_t, 14> key = {g.trans_a, g.trans_b, g.rows,     g.cols,     g.k,        g.batch, g.lda,
                                       g.ldb,     g.ldd,     g.stride_a, g.stride_b, g.stride_d, tf32,    g.bf16};
  auto it = lt_batched_plans.find(key);
  if (it == lt_batched_plans.end()) {
    if (lt_batched_plans.size() >= kMaxLtPlans) {
      for (auto& [unused, p] : lt_batched_plans) destroy(p);
      lt_batched_plans.clear();
    }
    LtPlan p;
    try {
      DI_CUBLAS_CHECK(
          cublasLtMatmulDescCreate(&p.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cudaDataType_t ab = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
      const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, g.trans_a ? g.k : g.rows, g.trans_a ? g.rows : g.k, g.lda));
      DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, g.trans_b ? g.cols : g.k, g.trans_b ? g.k : g.cols, g.ldb));
      DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, g.rows, g.cols, g.ldd));
      if (g.batch > 1) {
        const int32_t count = static_cast<int32_t>(g.batch);
        const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {
            {p.a, g.stride_a}, {p.b, g.stride_b}, {p.c, g.stride_d}};
        for (const auto& [layout, stride] : strided) {
          DI_CUBLAS_CHECK(
              cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
          DI_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof(stride)));
        }
      }
      pick_algo(p, std::string(g.bf16 ? "bf16 " : "fp32 ") + std::to_string(g.batch) + " x " + std::to_string(g.rows) +
                       "x" + std::to_string(g.cols) + "x" + std::to_string(g.k));
    } catch (...) {
      destroy(p);
      throw;
    }
    it = lt_batched_plans.emplace(key, p).first;
  }
  const LtPlan& p = it->second;
  const float alpha = 1.0f;
  DI_CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &alpha, g.a, p.a, g.b, p.b, &g.beta, g.d, p.c, g.d, p.c, &p.algo,
                                 lt_workspace.data(), lt_workspace.size(), s()));
}

const uint8_t* CudaBackend::Impl::mxfp4_fold(int which, const void* key, const std::vector<const void*>& ptrs,
                                             const void* const* codes, const void* const* scales, int64_t n,
                                             int64_t k) {
  FoldTable& f = folds[which][key];
  if (f.host != ptrs || !f.refs.data()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DI_CUDA_CHECK(cudaStreamIsCapturing(s(), &capture));
    if (capture != cudaStreamCaptureStatusNone) return nullptr;
    cuda::ScopedAllocatorPool shared(alloc, nullptr);  // the table outlives the call's scratch
    const int groups = static_cast<int>(ptrs.size());
    f.refs = cuda::DeviceBuffer(alloc, static_cast<size_t>(groups) * n);
    cuda::DeviceBuffer count(alloc, sizeof(unsigned));
    DI_CUDA_CHECK(cudaMemsetAsync(count.data(), 0, sizeof(unsigned), s()));
    cuda::Mxfp4FoldKernelParams fp;
    fp.codes = codes;
    fp.scales = scales;
    fp.groups = groups;
    fp.n = n;
    fp.k = k;
    fp.refs = f.refs.data_as<uint8_t>();
    fp.misfits = count.data_as<unsigned>();
    cuda::run_mxfp4_fold(fp, s());
    unsigned misfits = 0;
    DI_CUDA_CHECK(cudaMemcpyAsync(&misfits, count.data(), sizeof(unsigned), cudaMemcpyDeviceToHost, s()));
    DI_CUDA_CHECK(cudaStreamSynchronize(s()));
    f.host = ptrs;
    f.fits = misfits == 0;
    if (!f.fits)
      DI_LOG_WARN(
          "FP8 expert GEMM: {} of {} MXFP4 weight rows span more than {} binades of block scales (not exact "
          "in e4m3): that matrix keeps the bf16 kernel",
          misfits, static_cast<int64_t>(groups) * n, cuda::fp8::kFoldSpan);
  }
  return f.fits ? f.refs.data_as<uint8_t>() : nullptr;
}

void CudaBackend::Impl::quant_linear(const float* in, const QuantMatrix& w, float* out, int64_t m, bool split_in,
                                     ActCodes codes) {
  const int64_t n = w.rows(), k = w.cols();
  if (batch_invariant) {
    // Exact fp32 products (bf16 weights widened), whatever split_in asks: nothing nearer to ask for.
    cuda::WorkspaceArena::Scope scope(ws());
    shared_gemm(in, k, w, out, n, m, invariant_tile(w, m) ? bf16_copy(in, m * k) : nullptr);
    return;
  }
  if (w.format == QuantFormat::kFloat && w.weight.dtype() == DType::kF32) {
    lt_matmul(in, w.weight.data(), CUDA_R_32F, out, m, n, k);
  } else if (w.format == QuantFormat::kFloat && split_in) {
    // Two GEMMs of M rows (the second adds into out through beta) rather than one of 2M rows and a sum of its
    // halves: the same products and one rounding of the sum, 3·M·N floats moved instead of 5. W is read twice,
    // from L2 the second time for a compressor's few MB.
    cuda::WorkspaceArena::Scope scope(ws());
    void* hi = ws().take(sizeof(uint16_t) * m * k);
    void* lo = ws().take(sizeof(uint16_t) * m * k);
    cuda::run_split_f32_to_bf16(in, hi, lo, m * k, s());
    lt_matmul(hi, w.weight.data(), CUDA_R_16BF, out, m, n, k);
    lt_matmul(lo, w.weight.data(), CUDA_R_16BF, out, m, n, k, /*accumulate=*/true);
  } else if (w.format == QuantFormat::kFloat) {
    cuda::WorkspaceArena::Scope scope(ws());
    void* in_bf16 = ws().take(sizeof(uint16_t) * m * k);
    cuda::run_cast_f32_to_bf16(in, in_bf16, m * k, s());
    lt_matmul(in_bf16, w.weight.data(), CUDA_R_16BF, out, m, n, k);
  } else if (dense_scratch(w, m)) {
    // Opt-in (wgmma_split_k = always), short of the device fill, up to decode_direct's rows: the wgmma kernel split
    // along K, from the stored codes. Else the weight is read once either way, so dequantizing it to a
    // bf16 scratch (N·K·2 bytes written and read once more) costs little next to the GEMM, and cuBLASLt's bf16
    // kernels are near peak.
    cuda::WorkspaceArena::Scope scope(ws());
    const void* in_bf16 = bf16_copy(in, m * k);
    cuda::GemmKernelParams g = split_k_params(in, in_bf16, k, w, out, n, m);
    if (g.k_splits > 1) {
      run_split_k(g);
      return;
    }
    void* w_bf16 = ws().take(sizeof(uint16_t) * n * k);
    dequantize_bf16(w, w_bf16);
    lt_matmul(in_bf16, w_bf16, CUDA_R_16BF, out, m, n, k);
  } else {
    // Few rows (the streaming kernels), 9-64 rows (the rows kernel, gemm_rows_mma.h), or a decode batch whose tiles
    // fill the device: the tensor-core kernels then decode the stored codes themselves (run_gemm: wgmma on sm_90a,
    // else the mma.sync kernel) from a bf16 copy of A, reading N·K bytes once where the bf16 scratch above moves
    // N·K + 4·N·K before cuBLASLt's compute; the same bf16 A and exact bf16 weights. (The rows kernel rounds f32
    // rows itself as it stages them: no cast kernel a call, unless rows_mma_bf16_a.)
    cuda::WorkspaceArena::Scope scope(ws());
    const bool cast = m >= lt_min_rows(w) && (choices.gemm.rows_mma_bf16_a || !rows_direct(w, m));
    cuda::GemmKernelParams g = dense_params(in, cast ? bf16_copy(in, m * k) : nullptr, k, w, out, n, m);
    attach_codes(g, codes);
    run_gemm(g);
  }
}

void CudaBackend::Impl::run_moe(const float* x, const float* weights, const int32_t* indices, float* out,
                                int64_t tokens, int64_t d, int64_t k, int64_t inter, int experts, const MoeWeights& mw,
                                const QuantExpertWeights* shared, float limit, bool before_w2, ActQuant act_quant) {
  // Many rows per expert in block formats: the mma.sync kernel reads bf16 copies of x and of the SwiGLU output
  // (batch-invariant mode: the invariant tile kernel past the streaming kernel's rows, and the streaming kernel
  // from kInvariantBf16Slots slots on: each of its blocks stages all of K of its group's rows for one 16-row tile
  // at the weight's fixed K slices, half the bytes in bf16).
  const int64_t rows_per_expert = ceil_div(tokens * k, std::min<int64_t>(experts, std::max<int64_t>(tokens * k, 1)));
  // bf16 experts (never batch-invariant: moe_quant) take the tensor cores from the same rows (mma.sync, wgmma from
  // kGemmWgmmaMinRows), on x's and h's hi and lo terms unless bf16_split_a is off (A rounded to bf16, as the block
  // formats' many-row GEMMs).
  const bool bf16_inputs =
      mw.bf16 ? rows_per_expert >= cuda::kGemmMmaMinRows
              : mw.format != QuantFormat::kFloat &&
                    (batch_invariant
                         ? (rows_per_expert > cuda::kGemmStreamMmaMaxRows || tokens * k >= kInvariantBf16Slots) &&
                               (cuda::gemm_invariant_mma_takes(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, d) ||
                                cuda::gemm_invariant_mma_takes(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, inter))
                         : rows_per_expert >= cuda::kGemmMmaMinRows);
  const bool split_a = mw.bf16 && bf16_inputs && choices.gemm.bf16_split_a;
  // The shared expert is a dense GEMM of the chunk's rows: the same kernel once its tiles fill the device (with
  // its own bf16 copy of the SwiGLU output); batch-invariant mode: the invariant tile kernel's rows.
  const bool shared_bf16 =
      shared && shared->w1.format != QuantFormat::kFloat &&
      (batch_invariant ? invariant_tile(shared->w1, tokens) : cuda::gemm_mma_dense_fills(tokens, shared->w1.rows()));
  // --activation-quant mxfp8 over MXFP4 experts with their folds (opt-in, mxfp4_fold): gate / up and down on the FP8
  // tensor cores from the activations' MXFP8 codes (gemm_wgmma_fp8.h) instead of bf16 copies of the rounded values.
  // (moe_quant builds the folds only under the mode, with the choice, outside batch-invariant mode.)
  const bool fp8_ok = bf16_inputs && !mw.bf16 && d % 128 == 0 && inter % 128 == 0 && cuda::device_is_sm90();
  // --activation-quant fp8 (the V3 family) over FP8 128 x 128 experts with f32 scales: every expert GEMM on the FP8
  // tensor cores from per-128 codes (promoted once a 128 K step), unless wgmma_fp8 = never.
  const bool fp8_128 = act_quant_block128(act_quant) && fp8_gemm_chosen() && !batch_invariant && mw.aligned16 &&
                       cuda::gemm_wgmma_fp8_block128_weight_takes(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, d);
  const bool fp8_gu = fp8_ok && ((mw.fold[0] && mw.fold[1]) || fp8_128),
             fp8_down = fp8_ok && (mw.fold[2] != nullptr || fp8_128);
  const int64_t per_token = k * (3 * inter + d) * 4 + (shared ? (3 * inter + d) * 4 : 0) + (fp8_gu ? d + d / 32 : 0) +
                            // h's and x's bf16 copies, which the FP8 paths do without (their codes are above)
                            (fp8_down ? k * (inter + inter / 32) : 0) + (bf16_inputs && !fp8_down ? k * inter * 2 : 0) +
                            ((bf16_inputs && !fp8_gu) || shared_bf16 ? d * 2 : 0) +
                            (shared_bf16 ? shared->w1.rows() * 2 : 0) +
                            // the rows kernel's bf16 copies of x and h (shared_rows below)
                            (shared && tokens <= cuda::kGemmRowsMmaMaxRows ? (d + shared->w1.rows()) * 2 : 0) +
                            (split_a ? (d + k * inter) * 2 : 0) +        // x's and h's lo terms
                            (act_quant != ActQuant::kNone ? d * 4 : 0);  // the rounded copy of x
  // Chunks of at least kMoeChunkTokens tokens (a typical prefill chunk) even past 1 GiB of intermediates (~2.6
  // GiB for V4-Flash, ~3.5 GiB for V3 at 8192 tokens; the engine reserves 5% of the device for activations): with
  // 1 GiB chunks an 8192-token V4-Flash prefill ran in three chunks of ~78 rows an expert, so most experts' second
  // 64-row tensor-core tile was mostly empty (H200, slice prefill 8192: V4-Flash 98.3 -> 78.4 ms, V4.1 252.2 ->
  // 185.1 ms). Equal chunks when there are several, for the same reason.
  const int64_t cap = std::max<int64_t>({kMoeChunkTokens, (1ll << 30) / per_token});
  const int64_t chunk = ceil_div(tokens, std::max<int64_t>(1, ceil_div(tokens, cap)));
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t tc = std::min(chunk, tokens - t0), slots = tc * k;
    cuda::WorkspaceArena::Scope scope(ws());
    int32_t* perm = ws().take_as<int32_t>(std::max<int64_t>(slots, 1));
    int32_t* group_offsets = ws().take_as<int32_t>(experts + 1);
    int32_t* tile_offsets = ws().take_as<int32_t>(experts + 1);
    int32_t* active_groups = ws().take_as<int32_t>(experts + 1);
    const int64_t pass_capacity = cuda::moe_pass_capacity(slots, experts, cuda::kGemmStreamMmaMaxRows);
    int32_t* active_passes = ws().take_as<int32_t>(pass_capacity + 1);
    float* gu = ws().take_as<float>(slots * 2 * inter);
    float* h = ws().take_as<float>(slots * inter);
    float* y_slot = ws().take_as<float>(slots * d);
    const bool shared_mma = shared_bf16 && (batch_invariant ? invariant_tile(shared->w1, tc)
                                                            : cuda::gemm_mma_dense_fills(tc, shared->w1.rows()));
    // 9-64 rows: gate, up and down through the rows kernel (gemm_rows_mma.h), from x's bf16 copy when there is one
    // (or rows_mma_bf16_a asks for it), and from h's (the SwiGLU writes it in the same pass).
    const bool shared_rows = shared && !shared_mma && rows_direct(shared->w1, tc) && rows_direct(shared->w3, tc);
    // With the routed experts on the FP8 GEMM, an FP8-block shared expert past the rows kernel's rows goes there too:
    // gate / up from x's codes, down from its SwiGLU output's (the same values the rounding below makes).
    const bool shared_fp8 = fp8_gu && shared && !shared_rows && fp8_block_weight(shared->w1, act_quant) &&
                            fp8_block_weight(shared->w3, act_quant) && fp8_block_weight(shared->w2, act_quant);
    // The rounded f32 copy of x: what the bf16 paths read (the FP8 ones read x's codes).
    const bool rounded_x = !fp8_gu || (shared && !shared_fp8);
    const float* xc = act_quant_rows(x + t0 * d, tc, d, rounded_x ? act_quant : ActQuant::kNone);
    void* xc16 = nullptr;
    void* h16 = nullptr;
    void* x_lo16 = nullptr;
    void* h_lo16 = nullptr;
    if (bf16_inputs && !fp8_down) h16 = ws().take(sizeof(uint16_t) * slots * inter);
    if (split_a) h_lo16 = ws().take(sizeof(uint16_t) * slots * inter);
    // x's MXFP8 codes and scales (the same values as xc: the quantizer rounds as fake_quant does).
    uint8_t *x8 = nullptr, *x8_scale = nullptr;
    if (fp8_gu) {
      x8 = ws().take_as<uint8_t>(tc * d);
      x8_scale = ws().take_as<uint8_t>(tc * d / 32);
      act_codes(x + t0 * d, tc, d, act_quant, x8, x8_scale);
    }
    // Past the streaming kernel's rows and short of filling the device with tiles, the shared expert goes as
    // quant_linear's many-row case: gate and up dequantized into one bf16 [2·I, D] scratch and one cuBLASLt GEMM
    // (its [rows, 2·I] output is the SwiGLU's gate | up layout), down through quant_linear. The own kernels' only
    // fallback there was the SIMT tile kernel (H200, V4-Flash slice: 90 us a call, ~0.8 ms of a b64-b256 step).
    // With wgmma_split_k = always, gate and up up to decode_direct's rows take the wgmma kernel split along K
    // (split_k_params) instead, as quant_linear does.
    const bool shared_lt = shared && !shared_fp8 && !batch_invariant && !shared_mma &&
                           shared->w1.format != QuantFormat::kFloat && shared->w3.format == shared->w1.format &&
                           dense_scratch(shared->w1, tc);
    // A bf16 shared expert past the streaming kernel's rows: cuBLASLt as quant_linear's split_in (x's hi and lo terms
    // unless bf16_split_a is off), gate and up written into the halves of the SwiGLU's gate | up rows (ldc 2·I).
    // (Up to the streaming kernel's rows shared_gemm reads the bf16 weights in place.)
    const bool shared_lt16 = shared && !batch_invariant && bf16_weight(shared->w1) && bf16_weight(shared->w3) &&
                             bf16_weight(shared->w2) && tc > cuda::kGemmSkinnyRows;
    if ((bf16_inputs && !fp8_gu) || (shared_mma && !shared_fp8) || shared_lt ||
        (shared_rows && choices.gemm.rows_mma_bf16_a)) {
      xc16 = ws().take(sizeof(uint16_t) * tc * d);
      if (split_a) {  // hi is the cast's bf16 (both round to nearest even)
        x_lo16 = ws().take(sizeof(uint16_t) * tc * d);
        cuda::run_split_f32_to_bf16(xc, xc16, x_lo16, tc * d, s());
      } else {
        cuda::run_cast_f32_to_bf16(xc, xc16, tc * d, s());
      }
    }
    // --activation-quant fp8 at decode (the V3 family's f32-scaled experts on the streaming kernel): x's and the
    // SwiGLU outputs' codes as well, which that kernel reads exactly (the rounded rows above are not bf16 values).
    const int64_t rows_hint = ceil_div(slots, std::min<int64_t>(experts, slots));
    const bool routed_codes =
        !fp8_gu && !fp8_down &&
        stream_codes_take(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, d, rows_hint, act_quant) &&
        stream_codes_take(mw.format, mw.scale_e8m0, mw.block_n, mw.block_k, inter, rows_hint, act_quant);
    const bool shared_codes = shared && !shared_fp8 && !shared_lt && !shared_mma && !shared_rows &&
                              stream_codes_take(shared->w1, tc, act_quant) &&
                              stream_codes_take(shared->w3, tc, act_quant) &&
                              stream_codes_take(shared->w2, tc, act_quant);
    const ActCodes x_codes = routed_codes || shared_codes ? group_act_codes(x + t0 * d, tc, d, act_quant) : ActCodes{};
    const float* wc = weights + t0 * k;
    const int32_t* ic = indices + t0 * k;

    // The shared expert into shared_out: on the side stream when the choice has it run beside the routed experts.
    float* shared_out = nullptr;
    const auto shared_expert = [&] {
      const int64_t si = shared->w1.rows();
      float* sgu = ws().take_as<float>(tc * 2 * si);
      float* sh = ws().take_as<float>(tc * si);
      shared_out = ws().take_as<float>(tc * d);
      const cuda::GemmKernelParams split_gate =
          shared_lt ? split_k_params(xc, xc16, d, shared->w1, sgu, 2 * si, tc) : cuda::GemmKernelParams{};
      const cuda::GemmKernelParams split_up =
          shared_lt ? split_k_params(xc, xc16, d, shared->w3, sgu + si, 2 * si, tc) : cuda::GemmKernelParams{};
      if (shared_fp8) {
        run_fp8(dense_params(xc, nullptr, d, shared->w1, sgu, 2 * si, tc), x8, x8_scale, nullptr, act_quant);
        run_fp8(dense_params(xc, nullptr, d, shared->w3, sgu + si, 2 * si, tc), x8, x8_scale, nullptr, act_quant);
      } else if (split_gate.k_splits > 1 && split_up.k_splits > 1) {
        // gate and up into the two halves of sgu, each from its stored codes (as quant_linear's split case).
        run_split_k(split_gate);
        run_split_k(split_up);
      } else if (shared_lt16) {
        const bool split = choices.gemm.bf16_split_a;
        // x's terms as the routed experts' mma.sync / wgmma calls have them, else made here.
        void* hi = xc16;
        void* lo = x_lo16;
        if (!hi || (split && !lo)) {
          hi = ws().take(sizeof(uint16_t) * tc * d);
          lo = split ? ws().take(sizeof(uint16_t) * tc * d) : nullptr;
          if (split)
            cuda::run_split_f32_to_bf16(xc, hi, lo, tc * d, s());
          else
            cuda::run_cast_f32_to_bf16(xc, hi, tc * d, s());
        }
        // gate and up straight into the two halves of sgu's rows (row stride 2·I), each weight as stored.
        for (int which = 0; which < 2; ++which) {
          const void* w = (which == 0 ? shared->w1 : shared->w3).weight.data();
          float* out = sgu + which * si;
          lt_matmul(hi, w, CUDA_R_16BF, out, tc, si, d, false, 2 * si);
          if (split) lt_matmul(lo, w, CUDA_R_16BF, out, tc, si, d, /*accumulate=*/true, 2 * si);
        }
      } else if (shared_lt) {
        void* w13 = ws().take(sizeof(uint16_t) * 2 * si * d);
        dequantize_bf16(shared->w1, w13);
        dequantize_bf16(shared->w3, static_cast<uint16_t*>(w13) + si * d);
        lt_matmul(xc16, w13, CUDA_R_16BF, sgu, tc, 2 * si, d);
      } else {
        // gate/up into the two halves of sgu: run each as a dense GEMM with ldc = 2·I.
        for (int which = 0; which < 2; ++which) {
          const QuantMatrix& w = which == 0 ? shared->w1 : shared->w3;
          shared_gemm(xc, d, w, sgu + which * si, 2 * si, tc, shared_mma || shared_rows ? xc16 : nullptr,
                      shared_codes ? x_codes : ActCodes{});
        }
      }
      cuda::SwigluKernelParams ssw;
      ssw.gu = sgu;
      ssw.h = sh;
      ssw.rows = tc;
      ssw.inter = si;
      ssw.limit = limit;
      void* sh16 = nullptr;
      if ((shared_mma && !shared_fp8) || shared_rows) sh16 = ws().take(sizeof(uint16_t) * tc * si);
      uint8_t *sh8 = nullptr, *sh8_scale = nullptr;
      ActCodes sh_codes;
      if (shared_fp8) {
        cuda::run_swiglu(ssw, s());
        sh8 = ws().take_as<uint8_t>(tc * si);
        sh8_scale = ws().take_as<uint8_t>(tc * si / 32);
        act_codes(sh, tc, si, act_quant, sh8, sh8_scale);
      } else if (act_quant != ActQuant::kNone) {
        cuda::run_swiglu(ssw, s());
        if (shared_codes) sh_codes = group_act_codes(sh, tc, si, act_quant);
        round_rows_in_place(sh, tc, si, act_quant);
        if (sh16) cuda::run_cast_f32_to_bf16(sh, sh16, tc * si, s());
      } else if (sh16) {
        cuda::run_swiglu_bf16(ssw, sh16, s());
      } else {
        cuda::run_swiglu(ssw, s());
      }
      if (shared_fp8)
        run_fp8(dense_params(sh, nullptr, si, shared->w2, shared_out, d, tc), sh8, sh8_scale, nullptr, act_quant);
      else if (shared_lt)
        quant_linear(sh, shared->w2, shared_out, tc);
      else if (shared_lt16)
        quant_linear(sh, shared->w2, shared_out, tc, choices.gemm.bf16_split_a);
      else
        shared_gemm(sh, si, shared->w2, shared_out, d, tc, sh16, sh_codes);
    };
    const bool shared_side = shared && choices.moe_shared_stream && !shared_lt && !shared_lt16;
    if (shared_side) on_side_stream(shared_expert);

    cuda::MoePlanKernelParams plan;
    plan.indices = ic;
    plan.slots = slots;
    plan.experts = experts;
    plan.perm = perm;
    plan.group_offsets = group_offsets;
    plan.tile_offsets = tile_offsets;
    plan.active_groups = active_groups;
    plan.active_passes = active_passes;
    plan.pass_rows = static_cast<int>(cuda::kGemmStreamMmaMaxRows);
    plan.pass_capacity = pass_capacity;
    plan.status = status.word();
    cuda::run_moe_plan(plan, s());

    cuda::GemmKernelParams g;
    g.format = mw.format;
    g.scale_e8m0 = mw.scale_e8m0;
    g.block_n = mw.block_n;
    g.block_k = mw.block_k;
    g.groups = experts;
    g.group_offsets = group_offsets;
    g.tile_offsets = tile_offsets;
    g.max_tiles_m = ceil_div(slots, cuda::kGemmTileM) + experts;
    g.active_groups = active_groups;
    g.active_passes = active_passes;
    g.pass_rows = plan.pass_rows;
    g.pass_capacity = pass_capacity;
    g.tables_aligned16 = mw.aligned16;
    g.b_bf16 = mw.bf16;
    g.batch_invariant = batch_invariant;
    // Average rows per used expert, assuming spread routing: decode batches (a row or two per expert)
    // stream weights; prefill (tens of rows per expert) takes the tensor cores. Skew only costs speed.
    g.rows_hint = rows_hint;
    g.m = slots;
    // gate and up: gathered token rows -> gu[pos, 0:I] and gu[pos, I:2I]
    g.a = xc;
    g.a_bf16 = bf16_inputs ? xc16 : nullptr;
    g.a_lo_bf16 = x_lo16;
    g.lda = d;
    g.a_rows = perm;
    g.a_row_div = static_cast<int>(k);
    g.ldc = 2 * inter;
    g.n = inter;
    g.k = d;
    attach_codes(g, routed_codes ? x_codes : ActCodes{});
    for (int which = 0; which < 2; ++which) {
      g.c = gu + which * inter;
      g.b_table = mw.w[which];
      g.b_scale_table = mw.s[which];
      g.scale_cols = mw.scale_cols[which];
      if (fp8_gu)
        run_fp8(g, x8, x8_scale, mw.fold[which], act_quant);
      else
        run_gemm(g);
    }
    cuda::SwigluKernelParams sw;
    sw.gu = gu;
    sw.h = h;
    sw.rows = slots;
    sw.inter = inter;
    sw.limit = limit;
    sw.weights = before_w2 ? wc : nullptr;
    sw.weight_rows = perm;
    sw.rows_used = group_offsets + experts;
    uint8_t *h8 = nullptr, *h8_scale = nullptr;
    ActCodes h_codes;
    if (fp8_down) {
      // w2's input as MXFP8 codes of the SwiGLU's output (what the rounding below makes of it).
      cuda::run_swiglu(sw, s());
      h8 = ws().take_as<uint8_t>(slots * inter);
      h8_scale = ws().take_as<uint8_t>(slots * inter / 32);
      act_codes(h, slots, inter, act_quant, h8, h8_scale);
    } else if (act_quant != ActQuant::kNone) {
      // w2's input is rounded after the SwiGLU (and the routing weight), so its bf16 copy follows the rounding.
      cuda::run_swiglu(sw, s());
      if (routed_codes) h_codes = group_act_codes(h, slots, inter, act_quant);
      round_rows_in_place(h, slots, inter, act_quant);
      if (h_lo16)
        cuda::run_split_f32_to_bf16(h, h16, h_lo16, slots * inter, s());
      else if (h16)
        cuda::run_cast_f32_to_bf16(h, h16, slots * inter, s());
    } else if (h_lo16) {
      cuda::run_swiglu(sw, s());
      cuda::run_split_f32_to_bf16(h, h16, h_lo16, slots * inter, s());
    } else if (h16) {
      cuda::run_swiglu_bf16(sw, h16, s());  // h and its bf16 copy in one pass
    } else {
      cuda::run_swiglu(sw, s());
    }
    // down: h[pos] -> y_slot[perm[pos]]
    g.a = h;
    g.a_bf16 = h16;
    g.a_lo_bf16 = h_lo16;
    g.lda = inter;
    g.a_rows = nullptr;
    g.a_row_div = 1;
    g.c = y_slot;
    g.ldc = d;
    g.c_rows = perm;
    g.n = d;
    g.k = inter;
    g.b_table = mw.w[2];
    g.b_scale_table = mw.s[2];
    g.scale_cols = mw.scale_cols[2];
    attach_codes(g, h_codes);  // (clears x's)
    if (fp8_down)
      run_fp8(g, h8, h8_scale, mw.fold[2], act_quant);
    else
      run_gemm(g);

    if (shared && !shared_side) shared_expert();
    if (shared_side) join_side_stream();
    cuda::MoeCombineKernelParams cb;
    cb.y_slot = y_slot;
    cb.indices = ic;
    cb.weights = before_w2 ? nullptr : wc;
    cb.shared = shared_out;
    cb.out = out + t0 * d;
    cb.tokens = tc;
    cb.k = k;
    cb.d = d;
    cb.experts = experts;
    cuda::run_moe_combine(cb, s());
  }
}

void CudaBackend::Impl::shared_gemm(const float* a, int64_t lda, const QuantMatrix& w, float* c, int64_t ldc, int64_t m,
                                    const void* a_bf16, ActCodes codes) {
  cuda::GemmKernelParams g;
  g.a = a;
  g.a_bf16 = a_bf16;
  g.lda = lda;
  g.c = c;
  g.ldc = ldc;
  g.m = m;
  g.batch_invariant = batch_invariant;
  if (bf16_weight(w) && !batch_invariant && m <= cuda::kGemmSkinnyRows && w.cols() % 16 == 0 &&
      reinterpret_cast<uintptr_t>(w.weight.data()) % 16 == 0) {
    // The streaming kernel reads bf16 weights in place (fp32 products).
    g.format = QuantFormat::kFloat;
    g.b_bf16 = true;
    g.b = w.weight.data();
    g.n = w.rows();
    g.k = w.cols();
  } else if (bf16_weight(w)) {
    // The other own GEMMs read f32 weights only in kFloat; dequantize bf16 once into scratch.
    float* wf = ws().take_as<float>(w.rows() * w.cols());
    cuda::DequantizeKernelParams dq;
    dq.weight = w.weight.data();
    dq.format = QuantFormat::kFloat;
    dq.float_kind = cuda::FloatKind::kBF16;
    dq.n = w.rows();
    dq.k = w.cols();
    dq.out = wf;
    cuda::run_dequantize(dq, s());
    g.format = QuantFormat::kFloat;
    g.b = wf;
    g.n = w.rows();
    g.k = w.cols();
  } else {
    set_weight(g, w);
    attach_codes(g, codes);
  }
  run_gemm(g);
}

}  // namespace deepinfer
