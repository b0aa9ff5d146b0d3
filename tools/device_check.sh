#!/usr/bin/env bash
# Runs on the GPU machine (device tool) in one call: build with CUDA, run the GPU tests (ctest -L gpu) and the
# CPU tests, run the benchmarks, and write logs + a summary under $OUT.
#   usage (device tool): bash tools/device_check.sh [quick|full]
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
OUT=${OUT:-/tmp/deepinfer-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

note "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) mode: $MODE"
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
# The device image has no Debian -dev packages we need preinstalled; install what is missing (no prompts).
if ! dpkg-query -W nlohmann-json3-dev >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends nlohmann-json3-dev libcli11-dev libfmt-dev \
    libspdlog-dev libpcre2-dev libicu-dev libgtest-dev libgmock-dev libbenchmark-dev pkg-config ninja-build) \
    >"$OUT/apt.log" 2>&1 || note "apt-get failed (see apt.log)"
fi
start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_ACCELERATOR=nvidia \
  -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/configure.log" 2>&1 || { note "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1 || { note "build FAILED"; tail -60 "$OUT/build.log"; exit 1; }
note "build: ok in $(( $(date +%s) - start ))s"
(cd build-gpu && ctest -L gpu --output-on-failure >"$OUT/gpu_tests.log" 2>&1)
note "gpu tests: rc=$? $(grep -E 'tests passed|No tests were found' "$OUT/gpu_tests.log" | tail -1)"
if [ "$MODE" = full ]; then
  (cd build-gpu && ctest -LE gpu -j 16 --output-on-failure >"$OUT/cpu_tests.log" 2>&1)
  note "cpu tests: rc=$? $(grep -E 'tests passed' "$OUT/cpu_tests.log" | tail -1)"
  if [ -x build-gpu/bin/deepinfer ] && build-gpu/bin/deepinfer bench --help >/dev/null 2>&1; then
    build-gpu/bin/deepinfer bench >"$OUT/bench.log" 2>&1
    note "bench: rc=$? (bench.log)"
  fi
fi
cat "$summary"
