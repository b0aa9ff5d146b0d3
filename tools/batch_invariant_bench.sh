#!/usr/bin/env bash
# The cost of batch-invariant mode (--batch-invariant) on the H200: `deepinfer bench --device cuda` over the same
# synthetic slices and shapes, default kernels vs the batch-invariant ones, in one process each, back to back
# (docs/PERF.md). Run by tools/device_check.sh model with BI_BENCH=1; CLI = the deepinfer binary,
# BI_BENCH_ARGS = the bench options (default: V4-Flash and V4.1-Flash slices, prefill 1k/4k, decode batch
# 1/16/64/128 at context 4k).
set -uo pipefail
CLI=${CLI:-build-gpu/bin/deepinfer}
OUT=${OUT:-/tmp/deepinfer-out}
ARGS=${BI_BENCH_ARGS:---model v4-flash --model v41-flash --prompt 1024 --prompt 4096 --batch 1 --batch 16 --batch 64 --batch 128 --context 4096 --no-graphs}
for mode in default invariant; do
  flag=""
  [ "$mode" = invariant ] && flag="--batch-invariant"
  # shellcheck disable=SC2086
  timeout "${BI_BENCH_STEP_TIMEOUT:-170}" "$CLI" bench --device cuda $ARGS $flag >"$OUT/bi_bench_$mode.log" 2>&1
  echo "[bi-bench] $mode: rc=$? ($OUT/bi_bench_$mode.log)"
  grep -E "^target|^slice|^model |^V4(\.1)?-Flash +(prefill|decode)" "$OUT/bi_bench_$mode.log" | sed "s/^/[bi-bench] $mode: /"
done
