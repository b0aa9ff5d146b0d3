#!/usr/bin/env bash
# DeepInfer build entry point.
#   ./build.sh deps    install the Debian packages the build needs (idempotent, no prompts)
#   ./build.sh build   configure + build (build/bin/deepinfer)
#   ./build.sh run     deps + build + offline generation on the embedded default model (models/default)
#   ./build.sh test    deps + build + every test (ctest), then the unit and integration tests under ASan+UBSan
#                      (SANITIZED_FILTER below) and the fuzz targets for FUZZ_SECONDS each (default 20); CI runs this.
#                      Each step's wall and CPU seconds are logged and written to $BUILD_DIR/test_times.txt
#   ./build.sh bench   deps + build + benchmarks
#   ./build.sh fuzz    deps + libFuzzer targets for FUZZ_SECONDS each (default 300)
#   ./build.sh sanitize [gtest filter]  deps + build + the unit and integration tests under ASan+UBSan alone (clang,
#                      $BUILD_DIR/fuzz/sanitized_tests; `test` runs them with SANITIZED_FILTER; `'*'` runs all)
#   ./build.sh tsan [gtest filter]  deps + build + the HTTP server's, the engine's and parallel/'s threading tests
#                      under TSan (clang, $BUILD_DIR/fuzz/tsan_server_tests; not part of `test`: docs/RELIABILITY.md)
#   ./build.sh tsan-serve  deps + build + `deepinfer serve` built with TSan under tools/soak_server.py
#                      (TSAN_SERVE_REQUESTS, default 300)
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
    -DDEEPINFER_ACCELERATOR="$acc" -DPython_EXECUTABLE="$py" -DPython3_EXECUTABLE="$py" ${DEEPINFER_CMAKE_ARGS:-} \
    >/dev/null
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

# Wall and CPU seconds of each step of `test` (CI's timing breakdown, docs/RELIABILITY.md "CI cost"). CPU: user + sys
# of the finished children of this shell, from /proc (fields 16-17 of /proc/PID/stat, in clock ticks).
children_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", ($16 + $17) / hz }' "/proc/$$/stat"; }
STEP_NAME="" STEP_T0=0 STEP_C0=0 STEP_LOAD=""
step_begin() { STEP_NAME=$1 STEP_T0=$SECONDS STEP_C0=$(children_cpu) STEP_LOAD=$(cut -d' ' -f1 /proc/loadavg); }
step_end() {
  local line
  line=$(printf '%-28s %6d s wall %6d CPU-s  load %s -> %s' "$STEP_NAME" $((SECONDS - STEP_T0)) \
    $(($(children_cpu) - STEP_C0)) "$STEP_LOAD" "$(cut -d' ' -f1 /proc/loadavg)")
  log "time: $line"
  echo "$line" >>"$BUILD_DIR/test_times.txt"
}

# The clang project of fuzz/ (libFuzzer targets, and the ASan+UBSan and TSan test binaries); tests that run the CLI
# run $BUILD_DIR's. `fuzz_build TARGET...` builds the given targets in one ninja run (default: the fuzz targets).
have_clang() { command -v clang++ >/dev/null 2>&1 || { log "clang++ not found: skipping $1"; return 1; }; }
configure_fuzz() {
  mkdir -p "$BUILD_DIR"
  cmake -S "$ROOT/fuzz" -B "$BUILD_DIR/fuzz" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
    -DDEEPINFER_CLI="$(cd "$BUILD_DIR" && pwd)/bin/deepinfer" >/dev/null
}
fuzz_build() { configure_fuzz; cmake --build "$BUILD_DIR/fuzz" -j "$JOBS" --target "${@:-all}"; }

# One libFuzzer target for $2 seconds (each process is single-threaded), and one shard of the sanitized tests.
fuzz_job() {
  local name=$1 seconds=$2 work="$BUILD_DIR/fuzz/corpus-${1#fuzz_}"
  mkdir -p "$work"
  "$BUILD_DIR/fuzz/$name" -max_total_time="$seconds" -print_final_stats=0 "$work" "$ROOT/fuzz/corpus/${name#fuzz_}"
}
sanitized_job() {
  local shard=$1 shards=$2 filter=$3
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:check_initialization_order=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
    "$BUILD_DIR/fuzz/sanitized_tests" --gtest_filter="$filter" --gtest_brief=1
}

# Runs jobs ("fuzz:NAME" or "san:SHARD") $JOBS at a time, in the order given (the longest first), each logging to
# $BUILD_DIR/fuzz/NAME.log; a failed job (a crash, a sanitizer report, a failed test) fails the pool once all
# have finished. One queue for both kinds: the 20 s fuzz runs fill the cores while the last shards finish.
# Uses FUZZ_SECONDS_RUN, SAN_SHARDS and SAN_FILTER.
run_jobs() {
  if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501)); then log "bash >= 5.1 needed (wait -n -p)"; exit 2; fi
  local -A running=()
  local failed=() job pid rc log
  job_log() { case $1 in fuzz:*) echo "$BUILD_DIR/fuzz/${1#fuzz:}.log" ;; san:*) echo "$BUILD_DIR/fuzz/sanitized_tests.${1#san:}.log" ;; esac; }
  reap() {
    rc=0
    wait -n -p pid "${!running[@]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
      log "FAILED (exit $rc): ${running[$pid]} (log: $(job_log "${running[$pid]}"))"
      failed+=("${running[$pid]}")
    fi
    unset "running[$pid]"
  }
  for job in "$@"; do
    while [ ${#running[@]} -ge "$JOBS" ]; do reap; done
    log=$(job_log "$job")
    case $job in
      fuzz:*) fuzz_job "${job#fuzz:}" "$FUZZ_SECONDS_RUN" >"$log" 2>&1 & ;;
      san:*) sanitized_job "${job#san:}" "$SAN_SHARDS" "$SAN_FILTER" >"$log" 2>&1 & ;;
    esac
    running[$!]=$job
  done
  while [ ${#running[@]} -gt 0 ]; do reap; done
  if [ ${#failed[@]} -gt 0 ]; then
    for job in "${failed[@]}"; do
      log "--- $job: $(job_log "$job")"
      { grep -B2 -A40 -m1 "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:\|==ERROR\|\[  FAILED  \]" \
          "$(job_log "$job")" || tail -n 40 "$(job_log "$job")"; } | head -n 80
    done
    log "FAILED: ${failed[*]}"
    exit 1
  fi
}

# The fuzz targets and the sanitized-test shards as run_jobs items: shards first (the longer ones).
fuzz_items() { local t; for t in "$ROOT"/fuzz/fuzz_*.cc; do echo "fuzz:$(basename "$t" .cc)"; done; }
san_items() { local i; for ((i = 0; i < SAN_SHARDS; i++)); do echo "san:$i"; done; }

# The unit and integration tests under ASan+UBSan (fuzz/sanitized_tests.cmake: it links the objects the fuzz
# targets compile instrumented and compiles the rest of the library once), in SAN_SHARDS gtest shards (default
# 4 per job: the tests' costs are uneven, and a shard's length bounds the run's tail); any report (UBSan aborts: no
# recover) or failed test fails the build. The filter leaves out the suites that are minutes of
# model or tokenizer-corpus work under ASan and reach no code the others miss, and the four exhaustive mask-equality
# property tests of structured/ (the same matcher code, over hundreds of schemas, that the other structured tests and
# the fuzz targets reach); `./build.sh sanitize '*'` runs everything (docs/RELIABILITY.md has the cost of both).
SANITIZED_FILTER='-TokenizerReference.*:SpecEngineMtp.*:BatchInvariance.*:JsonSchemaTest.MaskbenchSample'
SANITIZED_FILTER+=':StructuredTokenMaskTest.CachedMasksEqualUncachedOverManySchemas'
SANITIZED_FILTER+=':StructuredTokenMaskTest.JsonSchemaMasksExactAlongRandomPaths'
SANITIZED_FILTER+=':StructuredTokenMaskTest.RegexAndEbnfMasksExact'
# DSpark's lossless-sampling chi-square test (4 engine runs of 240 seeded requests): the slowest test left in the filter
# (8.5 s uninstrumented); SpecEngineDspark's greedy, batched and preemption tests, which run, take the same paths.
SANITIZED_FILTER+=':SpecEngineDspark.SampledOutputsKeepTheDistribution'
SAN_SHARDS=${DEEPINFER_SAN_SHARDS:-$((4 * JOBS))}

# The HTTP server's tests and the engine's threading tests under ThreadSanitizer (fuzz/tsan_server_tests.cmake).
# One process: the server tests run their own I/O and engine threads. Any report fails (TSan exits 66).
tsan_tests() {
  local filter=${1:-*}
  have_clang "the TSan tests" || return 0
  local dir="$BUILD_DIR/fuzz"
  fuzz_build tsan_server_tests
  log "TSan tests (filter '$filter')"
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:second_deadlock_stack=1} \
    "$dir/tsan_server_tests" --gtest_filter="$filter" --gtest_brief=1 >"$dir/tsan_server_tests.log" 2>&1 ||
    { grep -A40 "WARNING: ThreadSanitizer" "$dir/tsan_server_tests.log" | head -n 120 || true
      tail -n 30 "$dir/tsan_server_tests.log"
      log "FAILED: TSan tests (log: $dir/tsan_server_tests.log)"; exit 1; }
  log "TSan tests: passed, no reports"
}

# `deepinfer serve` under TSan (fuzz/tsan_server_tests.cmake's tsan_deepinfer_cli): tools/soak_server.py's mixed
# requests (every protocol, streaming, constraints, bad requests, client aborts) and the SIGTERM drain at the end.
# Reports go to files (the server's stderr is the soak's); any report, or a soak failure, fails.
tsan_serve() {
  have_clang "the TSan server" || return 0
  local dir="$BUILD_DIR/fuzz/tsan-serve"
  fuzz_build tsan_deepinfer_cli
  rm -rf "$dir" && mkdir -p "$dir"
  log "TSan deepinfer serve: soak of ${TSAN_SERVE_REQUESTS:-300} requests (reports: $dir/report.*)"
  # The RSS check is the soak's leak check; TSan's shadow memory grows with the heap, so it is not meaningful here.
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:second_deadlock_stack=1}:log_path="$dir/report" \
    python3 "$ROOT/tools/soak_server.py" --cli "$BUILD_DIR/fuzz/deepinfer_tsan" --requests "${TSAN_SERVE_REQUESTS:-300}" \
    --concurrency 4 --max-tokens 4 --threads 2 --time-limit 1200 --rss-slack-mb 100000 >"$dir/soak.log" 2>&1 ||
    { tail -n 30 "$dir/soak.log"; log "FAILED: the soak against the TSan server (log: $dir/soak.log)"; exit 1; }
  if compgen -G "$dir/report.*" >/dev/null; then
    head -n 120 "$dir"/report.*; log "FAILED: ThreadSanitizer reports in $dir"; exit 1
  fi
  tail -n 5 "$dir/soak.log"
  log "TSan server: soak passed, no reports"
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
    rm -f "$BUILD_DIR/test_times.txt"
    step_begin "deps + build"; deps; build; step_end
    # CTest includes python_tests: pytest over tests/python with PYTHONPATH=$BUILD_DIR/python.
    step_begin "ctest"; (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" -LE gpu "$@"); step_end
    if have_clang "the fuzz targets and the sanitized tests"; then
      step_begin "fuzz + sanitized build"; fuzz_build all sanitized_tests; step_end
      FUZZ_SECONDS_RUN=${FUZZ_SECONDS:-20} SAN_FILTER=$SANITIZED_FILTER
      log "ASan+UBSan tests ($SAN_SHARDS shards, filter '$SAN_FILTER') and fuzz targets (${FUZZ_SECONDS_RUN}s each), $JOBS at a time"
      step_begin "sanitized tests + fuzzing"; run_jobs $(san_items) $(fuzz_items); step_end
      log "sanitized tests: passed, no reports; fuzz targets: no crashes"
    fi
    log "success: all tests passed ($BUILD_DIR/test_times.txt: wall and CPU seconds of each step)"
    ;;
  bench)
    deps; build
    if [ -x "$BUILD_DIR/bin/deepinfer_bench" ]; then "$BUILD_DIR/bin/deepinfer_bench" "$@"; else log "no benchmarks built"; fi
    ;;
  fuzz)
    deps
    if have_clang "the fuzz targets"; then
      fuzz_build all
      FUZZ_SECONDS_RUN=${FUZZ_SECONDS:-300}
      log "fuzz targets (${FUZZ_SECONDS_RUN}s each, $JOBS at a time)"
      run_jobs $(fuzz_items)
      log "fuzz targets: no crashes"
    fi
    ;;
  sanitize)
    deps; build
    if have_clang "the sanitized tests"; then
      fuzz_build sanitized_tests
      SAN_FILTER=${1:-$SANITIZED_FILTER}
      log "ASan+UBSan tests ($SAN_SHARDS shards, $JOBS at a time, filter '$SAN_FILTER')"
      run_jobs $(san_items)
      log "success: sanitized tests passed, no reports"
    fi
    ;;
  tsan) deps; build; tsan_tests "$@"; log "success: TSan tests passed" ;;
  tsan-serve) deps; build; tsan_serve; log "success: TSan server soak passed" ;;
  *) echo "usage: $0 {deps|build|run|test|bench|fuzz|sanitize|tsan|tsan-serve}" >&2; exit 2 ;;
esac
