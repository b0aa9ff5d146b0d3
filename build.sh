#!/usr/bin/env bash
# DeepInfer build entry point.
#   ./build.sh deps    install the Debian packages the build needs (idempotent, no prompts)
#   ./build.sh build   configure + build (build/bin/deepinfer)
#   ./build.sh run     deps + build + offline generation on the embedded default model (models/default)
#   ./build.sh test    deps + build + every test (ctest) and the fuzz targets for FUZZ_SECONDS each (default 20); CI
#                      runs this
#   ./build.sh bench   deps + build + benchmarks
#   ./build.sh fuzz    deps + libFuzzer targets for FUZZ_SECONDS each (default 300)
#   ./build.sh sanitize [gtest filter]  deps + build + the unit and integration tests under ASan+UBSan (clang,
#                      $BUILD_DIR/fuzz/sanitized_tests; not part of `test`: its cold cost would take CI near 30 min,
#                      docs/RELIABILITY.md "CI cost"; e.g. `./build.sh sanitize '*'`)
#   ./build.sh tsan [gtest filter]  deps + build + the HTTP server's and the engine's threading tests under TSan
#                      (clang, $BUILD_DIR/fuzz/tsan_server_tests; not part of `test`: docs/RELIABILITY.md)
# Environment: DEEPINFER_ACCELERATOR=cpu|nvidia (default: nvidia when nvcc is found), BUILD_DIR (default build),
# DEEPINFER_BUILD_TYPE (default Release), DEEPINFER_JOBS (default: number of cores), DEEPINFER_PYTHON (the
# interpreter the Python module is built for and tested with; default: Debian's /usr/bin/python3, which the
# python3-* packages below install into). The module lands in $BUILD_DIR/python: PYTHONPATH=$BUILD_DIR/python.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${DEEPINFER_JOBS:-$(nproc)}

DEB_PACKAGES=(build-essential cmake ninja-build pkg-config git python3 python3-dev python3-pytest python3-setuptools
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev libicu-dev libgtest-dev libgmock-dev
  libbenchmark-dev pybind11-dev clang python3-jsonschema libboost-dev)

log() { echo "[build.sh] $*" >&2; }

deps() {
  local missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "dependencies present"; return; fi
  log "installing: ${missing[*]}"
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

accelerator() {
  local acc=${DEEPINFER_ACCELERATOR:-auto}
  case "$acc" in
    ascend) echo "DEEPINFER_ACCELERATOR=ascend: Ascend is not supported by this build (supported: cpu, nvidia)" >&2; exit 2;;
    cpu|nvidia) ;;
    auto) if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then acc=nvidia; else acc=cpu; fi;;
    *) echo "DEEPINFER_ACCELERATOR must be cpu, nvidia or ascend (got '$acc')" >&2; exit 2;;
  esac
  if [ "$acc" = nvidia ] && ! command -v nvcc >/dev/null 2>&1; then export PATH=/usr/local/cuda/bin:$PATH; fi
  echo "$acc"
}

python_exe() {
  if [ -n "${DEEPINFER_PYTHON:-}" ]; then echo "$DEEPINFER_PYTHON"
  elif [ -x /usr/bin/python3 ]; then echo /usr/bin/python3
  else command -v python3; fi
}

build() {
  local acc; acc=$(accelerator)
  local py; py=$(python_exe)
  log "accelerator: $acc, build dir: $BUILD_DIR, python: $py"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${DEEPINFER_BUILD_TYPE:-Release}" \
    -DDEEPINFER_ACCELERATOR="$acc" -DPython_EXECUTABLE="$py" ${DEEPINFER_CMAKE_ARGS:-} >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
  embedded_model
}

# The embedded default is the committed trained model models/default (-> models/deepinfer-tiny-v3). Without it
# (a checkout that dropped models/) it is a small random-weight V4.1-shaped checkpoint generated at build time into
# $BUILD_DIR/models/default (never committed); tests that need random weights make their own with make-checkpoint.
embedded_model() {
  local dir="$BUILD_DIR/models/default"
  if [ -d "$ROOT/models/default" ] && [ -f "$ROOT/models/default/config.json" ]; then return; fi
  if [ ! -f "$dir/model.safetensors" ] || [ "$ROOT/tools/configs/embedded_default.json" -nt "$dir/model.safetensors" ]; then
    log "generating the embedded default model in $dir"
    "$BUILD_DIR/bin/deepinfer" make-checkpoint --config "$ROOT/tools/configs/embedded_default.json" --out "$dir" --seed 1
  fi
}

# The clang build of fuzz/ (the fuzz targets and the sanitized tests); tests that run the CLI run $BUILD_DIR's.
configure_fuzz() {
  mkdir -p "$BUILD_DIR"
  cmake -S "$ROOT/fuzz" -B "$BUILD_DIR/fuzz" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
    -DDEEPINFER_CLI="$(cd "$BUILD_DIR" && pwd)/bin/deepinfer" >/dev/null
}

# libFuzzer targets (clang): a standalone build of the parsers under ASan/UBSan.
fuzz_targets() {
  local seconds=$1
  if ! command -v clang++ >/dev/null 2>&1; then log "clang++ not found: skipping fuzz targets"; return; fi
  configure_fuzz
  cmake --build "$BUILD_DIR/fuzz" -j "$JOBS"
  # $JOBS targets at a time (each libFuzzer process is single-threaded): CI's 10 x 20 s take 100 s of wall time on
  # 2 cores instead of 200 s.
  local targets=("$ROOT"/fuzz/fuzz_*.cc) i j
  for ((i = 0; i < ${#targets[@]}; i += JOBS)); do
    local pids=() names=()
    for ((j = i; j < i + JOBS && j < ${#targets[@]}; j++)); do
      local name; name=$(basename "${targets[$j]}" .cc)
      local work="$BUILD_DIR/fuzz/corpus-${name#fuzz_}"
      mkdir -p "$work"
      log "fuzzing $name for ${seconds}s"
      "$BUILD_DIR/fuzz/$name" -max_total_time="$seconds" -print_final_stats=0 "$work" "$ROOT/fuzz/corpus/${name#fuzz_}" \
        >"$BUILD_DIR/fuzz/$name.log" 2>&1 &
      pids+=($!)
      names+=("$name")
    done
    for ((j = 0; j < ${#pids[@]}; j++)); do
      wait "${pids[$j]}" ||
        { tail -n 40 "$BUILD_DIR/fuzz/${names[$j]}.log"; log "FAILED: ${names[$j]} found a crash"; exit 1; }
    done
  done
  log "fuzz targets: no crashes"
}

# The unit and integration tests under ASan+UBSan (fuzz/sanitized_tests.cmake: it links the objects the fuzz
# targets compile instrumented and compiles the rest of the library once). Sharded over $JOBS processes; any report
# (UBSan aborts: no recover) or failed test fails the build. The filter leaves out the suites that are minutes of
# model or tokenizer-corpus work under ASan and reach no code the others miss, and the four exhaustive mask-equality
# property tests of structured/ (41% of the run's CPU time: the same matcher code, over hundreds of schemas, that the
# other structured tests and the fuzz targets reach); `./build.sh sanitize '*'` runs everything
# (docs/RELIABILITY.md has the cost of both).
SANITIZED_FILTER='-TokenizerReference.*:SpecEngineMtp.*:BatchInvariance.*:JsonSchemaTest.MaskbenchSample'
SANITIZED_FILTER+=':StructuredTokenMaskTest.CachedMasksEqualUncachedOverManySchemas'
SANITIZED_FILTER+=':StructuredTokenMaskTest.JsonSchemaMasksExactAlongRandomPaths'
SANITIZED_FILTER+=':StructuredTokenMaskTest.RegexAndEbnfMasksExact'
# DSpark's lossless-sampling chi-square test (4 engine runs of 240 seeded requests): the slowest test left in the filter
# (8.5 s uninstrumented); SpecEngineDspark's greedy, batched and preemption tests, which run, take the same paths.
SANITIZED_FILTER+=':SpecEngineDspark.SampledOutputsKeepTheDistribution'
sanitized_tests() {
  local filter=${1:-$SANITIZED_FILTER}
  if ! command -v clang++ >/dev/null 2>&1; then log "clang++ not found: skipping the sanitized tests"; return; fi
  local dir="$BUILD_DIR/fuzz"
  configure_fuzz
  cmake --build "$dir" -j "$JOBS" --target sanitized_tests
  log "ASan+UBSan tests ($JOBS shards, filter '$filter')"
  local pids=() i
  for ((i = 0; i < JOBS; i++)); do
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:check_initialization_order=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$i \
      "$dir/sanitized_tests" --gtest_filter="$filter" --gtest_brief=1 >"$dir/sanitized_tests.$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for ((i = 0; i < JOBS; i++)); do
    if ! wait "${pids[$i]}"; then tail -n 60 "$dir/sanitized_tests.$i.log"; failed=1; fi
  done
  [ $failed -eq 0 ] || { log "FAILED: sanitized tests (logs: $dir/sanitized_tests.*.log)"; exit 1; }
  log "ASan+UBSan tests: passed, no reports"
}

# The HTTP server's tests and the engine's threading tests under ThreadSanitizer (fuzz/tsan_server_tests.cmake).
# One process: the server tests run their own I/O and engine threads. Any report fails (TSan exits 66).
tsan_tests() {
  local filter=${1:-*}
  if ! command -v clang++ >/dev/null 2>&1; then log "clang++ not found: skipping the TSan tests"; return; fi
  local dir="$BUILD_DIR/fuzz"
  configure_fuzz
  cmake --build "$dir" -j "$JOBS" --target tsan_server_tests
  log "TSan tests (filter '$filter')"
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:second_deadlock_stack=1} \
    "$dir/tsan_server_tests" --gtest_filter="$filter" --gtest_brief=1 >"$dir/tsan_server_tests.log" 2>&1 ||
    { grep -A40 "WARNING: ThreadSanitizer" "$dir/tsan_server_tests.log" | head -n 120 || true
      tail -n 30 "$dir/tsan_server_tests.log"
      log "FAILED: TSan tests (log: $dir/tsan_server_tests.log)"; exit 1; }
  log "TSan tests: passed, no reports"
}

cmd=${1:-run}
shift || true
case "$cmd" in
  deps) deps ;;
  build) deps; build ;;
  run)
    deps; build
    log "running: deepinfer inspect + deepinfer offline (embedded default model)"
    "$BUILD_DIR/bin/deepinfer" inspect >/dev/null
    if [ $# -eq 0 ] && [ -f "$ROOT/models/default/tokenizer.json" ]; then
      # The trained default model writes English: show it continuing a few text prompts.
      set -- --prompt "The meaning of life is" --prompt "A fortune cookie says:" \
        --prompt "The GNU General Public License" --prompt "def fibonacci(n):" --max-tokens 48
    fi
    "$BUILD_DIR/bin/deepinfer" offline "$@"
    log "success"
    ;;
  test)
    deps; build
    # CTest includes python_tests: pytest over tests/python with PYTHONPATH=$BUILD_DIR/python.
    (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" -LE gpu "$@")
    fuzz_targets "${FUZZ_SECONDS:-20}"
    log "success: all tests passed"
    ;;
  bench)
    deps; build
    if [ -x "$BUILD_DIR/bin/deepinfer_bench" ]; then "$BUILD_DIR/bin/deepinfer_bench" "$@"; else log "no benchmarks built"; fi
    ;;
  fuzz) deps; fuzz_targets "${FUZZ_SECONDS:-300}" ;;
  sanitize) deps; build; sanitized_tests "$@"; log "success: sanitized tests passed" ;;
  tsan) deps; build; tsan_tests "$@"; log "success: TSan tests passed" ;;
  *) echo "usage: $0 {deps|build|run|test|bench|fuzz|sanitize|tsan}" >&2; exit 2 ;;
esac
