#!/usr/bin/env bash
# Runs on the GPU machine (device tool) in one call: build with CUDA, run the GPU tests (ctest -L gpu), a
# compute-sanitizer memcheck and racecheck of the op harness, the CUDA micro-benchmark, and (full mode) the CPU tests and the
# benchmarks; logs + a summary under $OUT (more than 8 files there are packed into $OUT/logs.tgz on exit: the device
# tool returns at most 8).
#   usage (device tool): bash tools/device_check.sh [gpu|full|model|bench|ci|multigpu]      (carry: .deps, which the image
#   needs for the -dev packages: `bash tools/make_device_deps.sh` here first, once a checkout)
#   model: build the CUDA tests (+ the CLI they run) and run every GPU test once, directly, with the golden-model
#   figures in the summary; no benchmarks, so it fits one 10-minute device call; MEMCHECK_FILTER / RACECHECK_FILTER
#   (a gtest filter, or "harness" for the op harness) run those tests again under compute-sanitizer memcheck / racecheck;
#   MODEL_FILTER runs only the GPU tests it matches; OP_BENCH_FILTER runs those CudaBench micro-benchmarks (the summary
#   names any pattern of these filters that matches no test).
#   bench: build the CUDA tests + the CLI; the GEMM/MoE comparisons first, then `deepinfer bench --device cuda`
#   (model slices vs ceilings), the op micro-bench, and the remaining GPU tests, each under its own time limit
#   so that one 10-minute call returns whatever finished. BENCH_ARGS overrides the bench command's options;
#   SKIP_OP_BENCH=1 skips the op micro-bench; MEMCHECK_FILTER runs those tests again under memcheck; OTHER_FILTER
#   picks the remaining GPU tests (a gtest filter; default all).
#   tok: a CPU build of the CLI only, then tools/tokenizer_bench.py (ours vs HF `tokenizers`, same corpus, same run)
#   on a quiet many-core machine; TOKBENCH_DIR holds corpus.bin (or corpus.bin.xz), TOKENIZER_JSON the vocabulary.
#   multigpu: build the CUDA tests + the CLI, run the two-GPU tests (CudaMultiGpu.*, ctest label multigpu: EP2,
#   DP2xEP2 and CP2 greedy == one GPU over NCCL) with their figures in the summary, then tools/multigpu_bench.sh
#   (one GPU vs --ep 2 / --ep 2 --dp 2 / --cp 2 throughput; MULTIGPU_BENCH=0 skips it).
#   structured: a CPU build of the CLI only, then tools/structured_sweep.py (`deepinfer structured-check` over every
#   case of SWEEP_CASES, a maskbench JSON Lines file (.gz/.xz), on all cores); with SWEEP_TOKENIZER (.json/.xz) a second
#   pass feeds every SWEEP_TOKEN_STRIDE-th case token by token through the masks for SWEEP_TOKEN_SECONDS at most
#   (SWEEP_SECONDS bounds the first pass the same way; the summary then says how many cases finished).
#   graphbench: build the CUDA CLI only, then tools/decode_graph_bench.sh (decode graphs vs --enforce-eager).
#   idlebench: build the CUDA CLI only, then tools/gpu_idle_bench.sh (GPU idle between decode steps from CUDA events:
#   device argmax vs host argmax vs the logprobs path, batch 1/8/64; MODELS / BATCHES / MODES / MAX_TOKENS narrow it).
#   peer: build the CUDA CLI only (no tests: no GTest needed), then in the same call `deepinfer bench --device cuda
#   --model v4-flash` and tools/peer_transformers_v4.py (transformers' DeepseekV4 on the same slice, bf16, its best
#   attention) on the same shapes, and tools/peer_join.py: a table with the speed-up per row (peer_table.md).
#   PEER_PROMPTS / PEER_BATCHES / PEER_CONTEXTS: the shapes (default "1024 4096 8192" / "1 16 64" / "1024");
#   BENCH_TIMEOUT / PEER_TIMEOUT bound each side. The peer runs even when our build fails.
#   model with BI_BENCH=1: then tools/batch_invariant_bench.sh (the bench slices with and without --batch-invariant);
#   with REALDIMS_BENCH=1 (model) tools/v4_real_dims_bench.sh: the engine (`deepinfer offline`) on a random-weight
#   checkpoint with V4-Flash's real dimensions (LAYERS, default 4, of the real schedule; ~14 GB written, weights kept
#   quantized), prefill 8192 and decode at batch 1/16/64 at context 4096, then `deepinfer bench --model v4-flash` on
#   the same shapes; REALDIMS_BENCH_TIMEOUT (default 330 s) bounds it, its run logs land in $OUT/realdims/
#   (MODEL_FILTER=NONE skips the GPU tests before it); mode realdims: the same after a build of the CUDA CLI only
#   (the script's knobs pass through: FAMILY=v41, LAYERS, SCHEDULE, BATCHES, PREFILL, CONTEXT, ...);
#   x8 (kind nvidia-h200-x8): build the CUDA CLI only, then tools/multigpu_x8.sh (#16: a V4.1-Flash real-dimension
#   checkpoint sized to the 8 GPUs with its block formats kept quantized, --ep 8 / --ep 2 --dp 4 / --ep 2 --dp 8 /
#   --ep 2 --cp 4 against the --ep 2 reference, tokens/s/GPU); X8_STEPS (default "ckpt run"), RUNS, X8_TIMEOUT
#   (default 540 s) and the script's knobs pass through; run logs in $OUT/x8/;
#   with SLICE_BENCH=1 (model) `deepinfer bench` decode of the V4 slices (SLICE_BENCH_ARGS); with SLICE_AB="SET;SET"
#   (model) the same slices once per set of `--kernel-choice` KEY=VALUE (space-separated; "default" = none;
#   act=none|mxfp8 sets `--activation-quant`, ffn=bf16|f32 `--v2-lite-ffn`, kv=f32|bf16|fp8 `--kv-cache-dtype`);
#   with NCU_SLICE=1 (also in ci) an ncu per-kernel time summary of one synthetic decode step (NCU_SLICE_ARGS;
#   NCU_DETAIL=REGEX adds ncu's sections for those kernels; NCU_STALLS=REGEX the stall reasons and the instructions
#   that hold them for the first matching launch, from ncu's source page: tools/ncu_source_stalls.py, the CSV kept
#   xz-packed); with IDLE_BENCH=1 (model or ci)
#   the GPU idle between decode steps of greedy engine runs, from CUDA events (no nsys: tools/gpu_idle_bench.sh,
#   device argmax vs the default logprobs run on the device and on the host at batch 1/8/64; IDLE_BENCH_TIMEOUT,
#   default 400 s).
#   ci: (SPEC_PROMPTS=FILE adds tools/spec_gpu_bench.sh, GRAPH_BENCH=1 tools/decode_graph_bench.sh, V4BATCH_BENCH=1
#   tools/v4_decode_batch_bench.sh) build everything, every GPU test once, MEMCHECK_FILTER under memcheck, the op harness under racecheck
#   (RACECHECK_FILTER overrides which tests), the op micro-bench (rows matching
#   BENCH_FILTER in the summary) and the CPU suite on all cores: the checks a landing needs, in one call.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
OUT=${OUT:-/tmp/deepinfer-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
summary="$OUT/summary.txt"
# NVLink multicast stays off (it can take a shared host's GPUs down): NCCL, PyTorch and NVSHMEM, also in the
# processes deepinfer spawns (they inherit this environment).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
# The device tool brings back at most 8 files from $OUT: on exit, when there are more, everything but the summary
# goes into logs.tgz (PACK_OUT=0 leaves the files as they are).
pack_out() {
  [ "${PACK_OUT:-1}" = 1 ] || return 0
  [ "$(find "$OUT" -type f | wc -l)" -le 8 ] && return 0
  (cd "$OUT" && tar czf /tmp/deepinfer-logs.tgz --exclude=./summary.txt --exclude=./logs.tgz . &&
    mv /tmp/deepinfer-logs.tgz logs.tgz && find . -type f ! -name summary.txt ! -name logs.tgz -delete)
}
trap pack_out EXIT
# The op harness under compute-sanitizer: memcheck (out-of-bounds / misaligned / leaked device memory) and
# racecheck (shared-memory hazards between threads of a block). GraphCaptureRejectsSyncAndAllocation provokes CUDA
# API errors on purpose, so it is left out of both (RecordedWorkKeepsItsTemporariesApart too).
OP_HARNESS='CudaOpTest.*:CudaPagedAttentionTest.*:CudaRouterTest.*:CudaDecodeOpTest.*:CudaMoeTest.*:CudaSampleTest.*:CudaArgmaxTest.*:-CudaOpTest.GraphCaptureRejectsSyncAndAllocation:CudaOpTest.RecordedWorkKeepsItsTemporariesApart'
# Names each positive pattern of a gtest filter that matches no test of the binary ($3: more gtest flags, e.g. the
# disabled benchmarks'): a pattern such as 'CudaGolden.*' runs nothing of a parametrized suite
# ('Fixtures/CudaGolden.*'), silently (session 42's calls).
unmatched_patterns() {
  local bin=$1 filter=${2%%-*} pat
  [ -z "$filter" ] || [ "$filter" = NONE ] || [ "$filter" = harness ] && return 0
  for pat in ${filter//:/ }; do
    # shellcheck disable=SC2086
    "$bin" --gtest_list_tests ${3:-} --gtest_filter="$pat" 2>/dev/null | grep -q '^  ' ||
      note "filter pattern '$pat' matches no test (a parametrized suite's tests are 'Prefix/Suite.Name/N': '*$pat')"
  done
}
sanitize() {  # tool filter seconds; filter "harness" = $OP_HARNESS
  unmatched_patterns build-gpu/bin/deepinfer_cuda_tests "$2"
  [ "$2" = harness ] && set -- "$1" "$OP_HARNESS" "$3"
  command -v compute-sanitizer >/dev/null 2>&1 || { note "$1: compute-sanitizer not found"; return; }
  timeout "$3" compute-sanitizer --tool "$1" --error-exitcode 9 build-gpu/bin/deepinfer_cuda_tests \
    --gtest_filter="$2" >"$OUT/$1.log" 2>&1
  local rc=$?
  note "$1 ($2): rc=$rc$([ $rc = 124 ] && echo ' (timed out)') $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$1.log" | tail -1) $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/$1.log" | tr '\n' ' ')"
}

# NCU_SLICE=1: per-kernel GPU time of one synthetic decode step (NCU_SLICE_ARGS: bench options; default the
# V4.1-Flash slice at batch 1, context 4k), summed per kernel name (tools/ncu_kernel_summary.py; NCU_KERNELS: the name
# regex, NCU_BYTES=1: each kernel's DRAM bytes and their rate too; NCU_METRICS: more metrics, comma-separated, kept
# per launch in ncu_slice.csv); NCU_DETAIL=REGEX
# then ncu's speed-of-light, memory, occupancy, launch and warp-stall sections for the first 2 matching launches.
ncu_slice() {
  [ -n "${NCU_SLICE:-}" ] || return 0
  local ncu args
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  args=${NCU_SLICE_ARGS:---model v41-flash --no-prefill --batch 1 --context 4096 --warmup 0 --iters 1 --no-graphs}
  # shellcheck disable=SC2086
  local metrics=gpu__time_duration.sum
  [ "${NCU_BYTES:-0}" != 0 ] && metrics="$metrics,dram__bytes_read.sum,dram__bytes_write.sum"
  metrics="$metrics${NCU_METRICS:+,$NCU_METRICS}"  # more per-launch metrics (e.g. launch__grid_size) in ncu_slice.csv
  timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none --csv --print-units base --metrics "$metrics" \
    --kernel-name "regex:${NCU_KERNELS:-gemm|moe|swiglu|router|combine|plan|hc_|rms|rope|attention|indexer|topk|dequant|cast|embed|scatter|compress|engram}" \
    build-gpu/bin/deepinfer bench --device cuda $args >"$OUT/ncu_slice.csv" 2>"$OUT/ncu_slice.err"
  note "ncu slice: rc=$? ($ncu)"
  python3 tools/ncu_kernel_summary.py "$OUT/ncu_slice.csv" 40 | tee -a "$summary"
  if [ -n "${NCU_DETAIL:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none --kernel-name-base "${NCU_DETAIL_BASE:-function}" \
      --kernel-name "regex:$NCU_DETAIL" --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
      build-gpu/bin/deepinfer bench --device cuda $args >"$OUT/ncu_detail.txt" 2>&1
    note "ncu detail ($NCU_DETAIL): rc=$?"
    grep -E "^  [a-z_:<>, ]+\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Grid Size|Waves Per SM|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit|Issue Slots Busy|Issued Warp Per|No Eligible|Eligible Warps|Executed Ipc" \
      "$OUT/ncu_detail.txt" | head -80 | tee -a "$summary"
  fi
  if [ -n "${NCU_STALLS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none --kernel-name-base function \
      --kernel-name "regex:$NCU_STALLS" --launch-count 1 --section SourceCounters --page source --print-source sass \
      --csv build-gpu/bin/deepinfer bench --device cuda $args >"$OUT/ncu_stalls.csv" 2>&1
    note "ncu stalls ($NCU_STALLS): rc=$?"
    python3 tools/ncu_source_stalls.py "$OUT/ncu_stalls.csv" "${NCU_STALLS_TOP:-25}" | tee -a "$summary"
    xz -9 -f "$OUT/ncu_stalls.csv" 2>/dev/null || true
  fi
}

# A tree copied without .git (git archive into an ignored folder) names its commit in DEVTREE_COMMIT.
if [ -n "${DEVTREE_COMMIT:-}" ]; then
  note "commit: $DEVTREE_COMMIT (git archive) mode: $MODE"
else
  note "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +dirty) mode: $MODE"
fi
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)"
note "tools: $(nvcc --version | tail -1); $(cmake --version | head -1); $(c++ --version | head -1)"
# The device machine reaches no package registry: the -dev packages travel as .deb files in .deps (carried).
# They are unpacked aside and copied into /usr without replacing anything the image already has.
if [ ! -f /usr/include/pcre2.h ] || [ ! -f /usr/include/spdlog/spdlog.h ] || [ ! -d /usr/include/gtest ]; then
  if compgen -G ".deps/*.deb" >/dev/null || compgen -G ".deps/*.tar.xz" >/dev/null; then
    # .deb files, or .tar.xz archives of an extracted usr/ tree (trimmed to fit the transfer limit).
    mkdir -p /tmp/dideps && for f in .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /tmp/dideps; done
    for f in .deps/*.tar.xz; do [ -f "$f" ] && tar -C /tmp/dideps -xJf "$f"; done
    cp -a --update=none /tmp/dideps/usr/. /usr/ && ldconfig
    note "deps: unpacked $(ls .deps/*.deb .deps/*.tar.xz 2>/dev/null | wc -l) carried files"
  else
    export DEBIAN_FRONTEND=noninteractive
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends nlohmann-json3-dev libcli11-dev libfmt-dev \
      libspdlog-dev libpcre2-dev libicu-dev libgtest-dev libgmock-dev pkg-config ninja-build) \
      >"$OUT/apt.log" 2>&1 || note "apt-get failed (see apt.log)"
  fi
fi
# NCCL (multi-GPU): the CUDA toolkit's, else the nvidia-nccl-cu13 pip package (headers + libnccl.so.2).
if [ -z "${NCCL_ROOT:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ]; then
  NCCL_ROOT=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null || true)
fi
[ -n "${NCCL_ROOT:-}" ] && export NCCL_ROOT && export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
note "nccl: ${NCCL_ROOT:-cuda toolkit} $(ls ${NCCL_ROOT:-/usr/local/cuda}/lib*/libnccl.so* 2>/dev/null | head -1)"
start=$(date +%s)
if [ "$MODE" = tok ]; then
  cmake -S . -B build-tok -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_ACCELERATOR=cpu -DDEEPINFER_PYTHON=OFF \
    >"$OUT/configure.log" 2>&1 && cmake --build build-tok -j "$(nproc)" --target deepinfer_cli >"$OUT/build.log" 2>&1 ||
    { note "build FAILED"; tail -30 "$OUT/build.log" | tee -a "$summary"; exit 1; }
  note "build (cpu cli): ok in $(( $(date +%s) - start ))s; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  dir=${TOKBENCH_DIR:?TOKBENCH_DIR: a folder with corpus.bin or corpus.bin.gz}
  work=/tmp/tokbench && mkdir -p $work
  if [ -f "$dir/corpus.bin.xz" ]; then xz -dc "$dir/corpus.bin.xz" >$work/corpus.bin; else cp "$dir/corpus.bin" $work/; fi
  for r in 1 2 3; do  # cold word cache: one pass per process
    build-tok/bin/deepinfer tokenize --tokenizer "${TOKENIZER_JSON:?}" --bench $work/corpus.bin --threads 1 --repeat 1 \
      2>/dev/null | tail -1 | sed "s/^/cold pass $r: /" | tee -a "$summary"
  done
  python3 tools/tokenizer_bench.py --cli build-tok/bin/deepinfer --tokenizer "$TOKENIZER_JSON" --dir $work \
    --repeat ${TOKBENCH_REPEAT:-2} >"$OUT/tokbench.json" 2>"$OUT/tokbench.err"
  note "tokenizer_bench: rc=$?"; cat "$OUT/tokbench.json" >>"$summary"; tail -5 "$OUT/tokbench.err" >>"$summary"
  exit 0
fi
if [ "$MODE" = structured ]; then
  cmake -S . -B build-tok -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_ACCELERATOR=cpu -DDEEPINFER_PYTHON=OFF \
    >"$OUT/configure.log" 2>&1 && cmake --build build-tok -j "$(nproc)" --target deepinfer_cli >"$OUT/build.log" 2>&1 ||
    { note "build FAILED"; tail -30 "$OUT/build.log" | tee -a "$summary"; exit 1; }
  note "build (cpu cli): ok in $(( $(date +%s) - start ))s; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  cases=${SWEEP_CASES:?SWEEP_CASES: maskbench cases (.jsonl, .jsonl.gz or .jsonl.xz)}
  case "$cases" in *.xz) xz -dc "$cases" >/tmp/sweep_cases.jsonl && cases=/tmp/sweep_cases.jsonl ;; esac
  tok=()  # SWEEP_TOKENIZER: a second pass through the token masks (below), not the coverage pass
  if [ -n "${SWEEP_TOKENIZER:-}" ]; then
    case "$SWEEP_TOKENIZER" in *.xz) xz -dc "$SWEEP_TOKENIZER" >/tmp/sweep_tokenizer.json && SWEEP_TOKENIZER=/tmp/sweep_tokenizer.json ;; esac
    tok=(--tokenizer "$SWEEP_TOKENIZER")
  fi
  start=$(date +%s)
  python3 tools/structured_sweep.py --cli build-tok/bin/deepinfer --cases "$cases" --jobs "$(nproc)" \
    --case-timeout "${SWEEP_CASE_TIMEOUT:-60}" --deadline "${SWEEP_SECONDS:-0}" --out "$OUT/sweep" >"$OUT/sweep.txt" \
    2>"$OUT/sweep.err"
  note "structured_sweep: rc=$? in $(( $(date +%s) - start ))s"; cat "$OUT/sweep.txt" >>"$summary"; tail -5 "$OUT/sweep.err" >>"$summary"
  if [ ${#tok[@]} -gt 0 ]; then  # then the token-mask path on every SWEEP_TOKEN_STRIDE-th case, for what time is left
    start=$(date +%s)
    python3 tools/structured_sweep.py --cli build-tok/bin/deepinfer --cases "$cases" --jobs "$(nproc)" \
      --stride "${SWEEP_TOKEN_STRIDE:-1}" --deadline "${SWEEP_TOKEN_SECONDS:-120}" "${tok[@]}" --out "$OUT/sweep_tok" \
      >"$OUT/sweep_tok.txt" 2>"$OUT/sweep_tok.err"
    note "structured_sweep with tokens: rc=$? in $(( $(date +%s) - start ))s"; tail -4 "$OUT/sweep_tok.txt" >>"$summary"
  fi
  exit 0
fi
if [ "$MODE" = peer ]; then
  # Ours first, then the peer, one after the other on the same GPU; the peer runs even if our build failed.
  prompts=${PEER_PROMPTS:-1024 4096 8192} batches=${PEER_BATCHES:-1 16 64} contexts=${PEER_CONTEXTS:-1024}
  shape=()
  for p in $prompts; do shape+=(--prompt "$p"); done
  for b in $batches; do shape+=(--batch "$b"); done
  for c in $contexts; do shape+=(--context "$c"); done
  if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_ACCELERATOR=nvidia \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DDEEPINFER_PYTHON=OFF -DDEEPINFER_BUILD_TESTS=OFF >"$OUT/configure.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target deepinfer_cli >"$OUT/build.log" 2>&1; then
    note "build (deepinfer_cli): ok in $(( $(date +%s) - start ))s"
    timeout "${BENCH_TIMEOUT:-150}" build-gpu/bin/deepinfer bench --device cuda --model v4-flash "${shape[@]}" \
      >"$OUT/bench_v4.log" 2>&1
    note "deepinfer bench (v4-flash): rc=$?"
    cat "$OUT/bench_v4.log" >>"$summary"
  else
    note "build FAILED (configure.log / build.log); the peer runs anyway"
    grep -hE "FAILED:|error:|Could NOT|CMake Error" "$OUT/configure.log" "$OUT/build.log" 2>/dev/null | head -20 | tee -a "$summary"
  fi
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >>"$summary" 2>&1
  PYTHONUNBUFFERED=1 timeout "${PEER_TIMEOUT:-240}" python3 tools/peer_transformers_v4.py --device cuda "${shape[@]}" \
    >"$OUT/peer.jsonl" 2>"$OUT/peer.err"
  note "peer (transformers): rc=$? $(grep -c '"kind": "row"' "$OUT/peer.jsonl") rows"
  tail -5 "$OUT/peer.err" >>"$summary"
  cat "$OUT/peer.jsonl" >>"$summary"
  touch "$OUT/bench_v4.log"
  python3 tools/peer_join.py --ours "$OUT/bench_v4.log" --peer "$OUT/peer.jsonl" >"$OUT/peer_table.md" 2>&1
  note "peer_join: rc=$?"
  cat "$OUT/peer_table.md" >>"$summary"
  echo "================ summary"
  cat "$summary"
  exit 0
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_ACCELERATOR=nvidia \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DDEEPINFER_PYTHON=OFF >"$OUT/configure.log" 2>&1 || { note "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
target=deepinfer_cuda_tests
[ "$MODE" = full ] && target=all
[ "$MODE" = ci ] && target=all
[ "$MODE" = bench ] && target="deepinfer_cuda_tests deepinfer_cli"
[ "$MODE" = multigpu ] && target="deepinfer_cuda_tests deepinfer_cli"
[ "$MODE" = graphbench ] && target=deepinfer_cli
[ "$MODE" = idlebench ] && target=deepinfer_cli
[ "$MODE" = realdims ] && target=deepinfer_cli
[ "$MODE" = x8 ] && target=deepinfer_cli
keep=()
[ "$MODE" = ci ] && keep=(-- -k 0)  # ci: build what compiles, list every failure, test what was built
cmake --build build-gpu -j "$(nproc)" --target $target "${keep[@]}" >"$OUT/build.log" 2>&1 || {
  note "build FAILED"; grep -E "FAILED:|error:" "$OUT/build.log" | head -40 | tee -a "$summary"; [ "$MODE" = ci ] || exit 1; }
note "build ($target): ok in $(( $(date +%s) - start ))s"
if [ "$MODE" = graphbench ]; then
  CLI=build-gpu/bin/deepinfer timeout "${GRAPH_BENCH_TIMEOUT:-400}" bash tools/decode_graph_bench.sh | tee -a "$summary"
  exit 0
fi
if [ "$MODE" = realdims ]; then
  CLI=build-gpu/bin/deepinfer LOG_DIR="$OUT/realdims" timeout "${REALDIMS_BENCH_TIMEOUT:-330}" \
    bash tools/v4_real_dims_bench.sh | tee -a "$summary"
  note "realdims bench: rc=${PIPESTATUS[0]}"
  echo "================ summary"
  cat "$summary"
  exit 0
fi
if [ "$MODE" = x8 ]; then
  CLI=build-gpu/bin/deepinfer STEPS="${X8_STEPS:-ckpt run}" timeout "${X8_TIMEOUT:-540}" bash tools/multigpu_x8.sh |
    tee -a "$summary"
  note "multigpu_x8: rc=${PIPESTATUS[0]}"
  mkdir -p "$OUT/x8" && cp "${WORK:-/tmp/x8}"/logs/*.log "${WORK:-/tmp/x8}"/sizing.txt "$OUT/x8/" 2>/dev/null
  echo "================ summary"
  cat "$summary"
  exit 0
fi
if [ "$MODE" = idlebench ]; then
  CLI=build-gpu/bin/deepinfer timeout "${IDLE_BENCH_TIMEOUT:-400}" bash tools/gpu_idle_bench.sh | tee -a "$summary"
  echo "================ summary"
  cat "$summary"
  exit 0
fi
if [ "$MODE" = bench ]; then
  bin=build-gpu/bin/deepinfer_cuda_tests
  timeout 90 "$bin" --gtest_filter='CudaLinearTest.*:CudaMoeTest.*' >"$OUT/gpu_tests.log" 2>&1
  note "gemm/moe tests: rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/gpu_tests.log" | tr '\n' ' ')"
  grep -h "\[cuda-op\]" "$OUT/gpu_tests.log" | tee -a "$summary"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >>"$summary" 2>&1
  timeout ${BENCH_TIMEOUT:-200} build-gpu/bin/deepinfer bench --device cuda ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  note "deepinfer bench: rc=$?"
  cat "$OUT/bench.log" >>"$summary"
  if [ -z "${SKIP_OP_BENCH:-}" ]; then
    timeout 60 "$bin" --gtest_also_run_disabled_tests --gtest_filter='CudaBench.*' >"$OUT/cuda_bench.log" 2>&1
    note "cuda op bench: rc=$?"
    grep -h "^\[bench\]" "$OUT/cuda_bench.log" | tee -a "$summary"
  fi
  # OTHER_FILTER: which of the remaining GPU tests to run (default: all of them).
  timeout ${OTHER_TIMEOUT:-60} "$bin" --gtest_filter="${OTHER_FILTER:--CudaLinearTest.*:CudaMoeTest.*}" >>"$OUT/gpu_tests.log" 2>&1
  note "other gpu tests: rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/gpu_tests.log" | tail -1)"
  grep -hE "^\[cuda-golden|^\[cuda-v3" "$OUT/gpu_tests.log" | tee -a "$summary"
  # MEMCHECK_FILTER: a gtest filter to run once more under compute-sanitizer memcheck (new kernels).
  if [ -n "${MEMCHECK_FILTER:-}" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin" --gtest_filter="$MEMCHECK_FILTER" \
      >"$OUT/memcheck.log" 2>&1
    note "memcheck ($MEMCHECK_FILTER): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  fi
  grep -h "\[cuda-op\]" "$OUT/gpu_tests.log" >"$OUT/op_errors.txt"
  note "op comparisons: $(grep -c ' ok' "$OUT/op_errors.txt") ok, $(grep -c 'FAIL' "$OUT/op_errors.txt") FAIL (op_errors.txt)"
  grep -h "FAILED  \]" "$OUT/gpu_tests.log" | tee -a "$summary"
  echo "================ summary"
  cat "$summary"
  exit 0
fi
if [ "$MODE" = multigpu ]; then
  note "gpus: $(nvidia-smi -L 2>/dev/null | wc -l); NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
  (cd build-gpu && ctest -N -L multigpu | tail -1 | sed 's/^/ctest -L multigpu: /') | tee -a "$summary"
  timeout ${MULTIGPU_TIMEOUT:-330} build-gpu/bin/deepinfer_cuda_tests --gtest_filter="${MULTIGPU_FILTER:-CudaMultiGpu.*}" \
    >"$OUT/multigpu_tests.log" 2>&1
  note "multigpu tests: rc=$? $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$OUT/multigpu_tests.log" | tr '\n' ' ')"
  grep -hE "^\[cuda-multigpu\]|^\[       OK|FAILED  \]" "$OUT/multigpu_tests.log" | tee -a "$summary"
  if [ "${MULTIGPU_BENCH:-1}" != 0 ]; then
    timeout ${BENCH_TIMEOUT:-240} bash tools/multigpu_bench.sh 2>&1 | tee "$OUT/multigpu_bench.log" | grep "mgbench" |
      tee -a "$summary"
  fi
  echo "================ summary"
  cat "$summary"
  exit 0
fi
if [ "$MODE" = ci ]; then
  # Everything a landing needs in one call: the whole build (CUDA config, as CI on a machine with nvcc), every
  # GPU test once, MEMCHECK_FILTER under memcheck, the op micro-bench rows matching BENCH_FILTER, then the CPU
  # suite (ctest -LE gpu) on all cores.
  timeout 300 build-gpu/bin/deepinfer_cuda_tests >"$OUT/gpu_tests_direct.log" 2>&1
  note "gpu tests (direct): rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/gpu_tests_direct.log" | tr '\n' ' ')"
  grep -h "\[cuda-op\]" "$OUT/gpu_tests_direct.log" >"$OUT/op_errors.txt"
  note "op comparisons: $(grep -c ' ok' "$OUT/op_errors.txt") ok, $(grep -c 'FAIL' "$OUT/op_errors.txt") FAIL (op_errors.txt)"
  grep -hE "FAILED  \]|decode graphs|^\[batch-invariance\]|^\[cuda-greedy-fast-path|^\[cuda-gpu-idle|^\[cuda-argmax|^\[cuda-timeline" \
    "$OUT/gpu_tests_direct.log" | tee -a "$summary"
  if [ -n "${MEMCHECK_FILTER:-}" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/bin/deepinfer_cuda_tests \
      --gtest_filter="$MEMCHECK_FILTER" >"$OUT/memcheck.log" 2>&1
    note "memcheck ($MEMCHECK_FILTER): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  fi
  sanitize racecheck "${RACECHECK_FILTER:-$OP_HARNESS}" "${RACECHECK_TIMEOUT:-200}"
  (cd build-gpu && timeout 240 ctest -LE gpu -j "$(nproc)" --output-on-failure >"$OUT/cpu_tests.log" 2>&1)
  note "cpu tests: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/cpu_tests.log" | tail -1)"
  grep -E "^\s+[0-9]+ - .*\(Failed|Timeout|Exception\)" "$OUT/cpu_tests.log" | head -20 | tee -a "$summary"
  # SPEC_PROMPTS: MTP speculative decoding on the tiny model, off vs K = 1, 2 (docs/PERF.md).
  if [ -n "${SPEC_PROMPTS:-}" ]; then
    PROMPTS="$SPEC_PROMPTS" timeout 120 bash tools/spec_gpu_bench.sh | tee -a "$summary"
  fi
  # GRAPH_BENCH=1: decode graphs on vs --enforce-eager in the engine (docs/PERF.md).
  if [ -n "${GRAPH_BENCH:-}" ]; then
    CLI=build-gpu/bin/deepinfer timeout "${GRAPH_BENCH_TIMEOUT:-240}" bash tools/decode_graph_bench.sh | tee -a "$summary"
  fi
  # IDLE_BENCH=1: GPU idle between decode steps (CUDA events; tools/gpu_idle_bench.sh, docs/PERF.md).
  if [ -n "${IDLE_BENCH:-}" ]; then
    CLI=build-gpu/bin/deepinfer timeout "${IDLE_BENCH_TIMEOUT:-400}" bash tools/gpu_idle_bench.sh | tee -a "$summary"
  fi
  # V4BATCH_BENCH=1: V4.1 batched decode on vs --no-batch-decode in the engine (docs/PERF.md).
  if [ -n "${V4BATCH_BENCH:-}" ]; then
    CLI=build-gpu/bin/deepinfer timeout "${V4BATCH_BENCH_TIMEOUT:-150}" bash tools/v4_decode_batch_bench.sh | tee -a "$summary"
  fi
  ncu_slice
  if [ -z "${SKIP_OP_BENCH:-}" ]; then
    timeout 90 build-gpu/bin/deepinfer_cuda_tests --gtest_also_run_disabled_tests --gtest_filter='CudaBench.*' \
      >"$OUT/cuda_bench.log" 2>&1
    note "cuda op bench: rc=$?"
    grep -h "^\[bench\]" "$OUT/cuda_bench.log" | grep -E "${BENCH_FILTER:-.}" | tee -a "$summary"
  fi
  echo "================ summary"
  cat "$summary"
  exit 0
fi
if [ "$MODE" = model ]; then
  # MODEL_FILTER: a gtest filter to run only those GPU tests (a re-check after a fix).
  unmatched_patterns build-gpu/bin/deepinfer_cuda_tests "${MODEL_FILTER:-}"
  timeout 360 build-gpu/bin/deepinfer_cuda_tests ${MODEL_FILTER:+--gtest_filter="$MODEL_FILTER"} >"$OUT/gpu_tests_direct.log" 2>&1
  note "gpu tests (direct): rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/gpu_tests_direct.log" | tr '\n' ' ')"
  grep -h "\[cuda-op\]" "$OUT/gpu_tests_direct.log" >"$OUT/op_errors.txt"
  note "op comparisons: $(grep -c ' ok' "$OUT/op_errors.txt") ok, $(grep -c 'FAIL' "$OUT/op_errors.txt") FAIL (op_errors.txt)"
  grep -hE "^\[cuda-golden|^\[cuda-offline|^\[perf\]|^\[batch-invariance\]|^\[cuda-greedy-fast-path|^\[cuda-gpu-idle|^\[cuda-argmax|^\[cuda-timeline|FAILED  \]" "$OUT/gpu_tests_direct.log" |
    tee -a "$summary"
  [ -n "${MEMCHECK_FILTER:-}" ] && sanitize memcheck "$MEMCHECK_FILTER" "${MEMCHECK_TIMEOUT:-150}"
  [ -n "${RACECHECK_FILTER:-}" ] && sanitize racecheck "$RACECHECK_FILTER" "${RACECHECK_TIMEOUT:-200}"
  # SLICE_BENCH=1: the synthetic slices (SLICE_BENCH_ARGS: bench options; default decode of both V4 slices).
  slice_args=${SLICE_BENCH_ARGS:---model v4-flash --model v41-flash --no-prefill --batch 1 --batch 16 --batch 64 --context 4096 --no-graphs}
  if [ -n "${SLICE_BENCH:-}" ] && [ "$SLICE_BENCH" != 0 ]; then
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-150}" build-gpu/bin/deepinfer bench --device cuda $slice_args >"$OUT/slice_bench.log" 2>&1
    note "slice bench: rc=$? (slice_bench.log)"
    grep -E "^\||avg_SPS|ceiling" "$OUT/slice_bench.log" | head -80 | tee -a "$summary"
  fi
  # SLICE_AB="SET;SET;...": the slices (SLICE_BENCH_ARGS) once per set of kernel choices (space-separated KEY=VALUE for
  # `deepinfer bench --kernel-choice`; "default" = none), back to back in this call: a same-build A/B. One log for all.
  if [ -n "${SLICE_AB:-}" ]; then
    IFS=';' read -r -a ab_sets <<<"$SLICE_AB"
    for ab_set in "${ab_sets[@]}"; do
      ab_args=()
      for choice in $ab_set; do
        case "$choice" in
          default) ;;
          act=*) ab_args+=(--activation-quant "${choice#act=}") ;;  # the GEMMs' activation numerics, not a kernel
          ffn=*) ab_args+=(--v2-lite-ffn "${choice#ffn=}") ;;       # the v2-lite slice's FFN weights (bf16 | f32)
          kv=*) ab_args+=(--kv-cache-dtype "${choice#kv=}") ;;      # the slices' paged caches (f32 | bf16 | fp8)
          *) ab_args+=(--kernel-choice "$choice") ;;
        esac
      done
      echo "==== kernel choices: $ab_set" >>"$OUT/slice_ab.log"
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-150}" build-gpu/bin/deepinfer bench --device cuda $slice_args "${ab_args[@]}" \
        >>"$OUT/slice_ab.log" 2>&1
      note "slice A/B [$ab_set]: rc=$?"
      sed -n "/^==== kernel choices: $ab_set\$/,\$p" "$OUT/slice_ab.log" | grep -E "^V[0-9]|ceiling" | grep -v avg_SPS |
        tee -a "$summary"
    done
  fi
  # OP_BENCH_FILTER: these op micro-benchmarks (a gtest filter over CudaBench.*), their [bench] lines in the summary.
  if [ -n "${OP_BENCH_FILTER:-}" ]; then
    unmatched_patterns build-gpu/bin/deepinfer_cuda_tests "$OP_BENCH_FILTER" --gtest_also_run_disabled_tests
    timeout "${OP_BENCH_TIMEOUT:-150}" build-gpu/bin/deepinfer_cuda_tests --gtest_also_run_disabled_tests \
      --gtest_filter="$OP_BENCH_FILTER" >"$OUT/op_bench.log" 2>&1
    note "op bench ($OP_BENCH_FILTER): rc=$?"
    grep -h "^\[bench\]" "$OUT/op_bench.log" | tee -a "$summary"
  fi
  # BI_BENCH=1: the slices with and without --batch-invariant (docs/PERF.md).
  [ -n "${BI_BENCH:-}" ] && CLI=build-gpu/bin/deepinfer bash tools/batch_invariant_bench.sh | tee -a "$summary"
  # IDLE_BENCH=1: GPU idle between decode steps (CUDA events; tools/gpu_idle_bench.sh, docs/PERF.md).
  [ -n "${IDLE_BENCH:-}" ] && CLI=build-gpu/bin/deepinfer timeout "${IDLE_BENCH_TIMEOUT:-400}" \
    bash tools/gpu_idle_bench.sh | tee -a "$summary"
  # REALDIMS_BENCH=1: the engine on a real-dimension V4-Flash checkpoint, then the slice on the same shapes.
  if [ -n "${REALDIMS_BENCH:-}" ]; then
    CLI=build-gpu/bin/deepinfer LOG_DIR="$OUT/realdims" timeout "${REALDIMS_BENCH_TIMEOUT:-330}" \
      bash tools/v4_real_dims_bench.sh | tee -a "$summary"
    note "realdims bench: rc=${PIPESTATUS[0]}"
  fi
  ncu_slice
  echo "================ summary"
  cat "$summary"
  exit 0
fi
(cd build-gpu && timeout 420 ctest -L gpu --output-on-failure --timeout 240 >"$OUT/gpu_tests.log" 2>&1)
note "gpu tests: rc=$? $(grep -E 'tests passed|No tests were found' "$OUT/gpu_tests.log" | tail -1)"
bin=build-gpu/bin/deepinfer_cuda_tests
# ctest shows the output of failing tests only; one direct run gives every comparison's figure.
timeout 240 "$bin" >"$OUT/gpu_tests_direct.log" 2>&1
grep -h "\[cuda-op\]" "$OUT/gpu_tests_direct.log" >"$OUT/op_errors.txt"
note "op comparisons: $(grep -c ' ok' "$OUT/op_errors.txt") ok, $(grep -c 'FAIL' "$OUT/op_errors.txt") FAIL (op_errors.txt)"
grep -E "FAIL|Failed|failed" "$OUT/gpu_tests.log" | grep -v "0 tests failed" | head -20 | tee -a "$summary"
sanitize memcheck "$OP_HARNESS" 240
sanitize racecheck "$OP_HARNESS" 300
timeout 300 "$bin" --gtest_also_run_disabled_tests --gtest_filter='CudaBench.*' >"$OUT/cuda_bench.log" 2>&1
note "cuda bench: rc=$?"
grep -h "^\[bench\]" "$OUT/cuda_bench.log" | tee -a "$summary"
if [ "$MODE" = full ]; then
  (cd build-gpu && ctest -LE gpu -j 16 --output-on-failure >"$OUT/cpu_tests.log" 2>&1)
  note "cpu tests: rc=$? $(grep -E 'tests passed' "$OUT/cpu_tests.log" | tail -1)"
  if [ -x build-gpu/bin/deepinfer ] && build-gpu/bin/deepinfer bench --help >/dev/null 2>&1; then
    build-gpu/bin/deepinfer bench >"$OUT/bench.log" 2>&1
    note "bench: rc=$? (bench.log)"
  fi
fi
echo "================ summary"
cat "$summary"
