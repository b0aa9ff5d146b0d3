#!/usr/bin/env bash
# Same-run A/B of per-kernel GPU time under ncu: `deepinfer bench --device cuda $NCU_AB_ARGS` once as is and once
# with the environment assignment $NCU_AB_ENV (e.g. a temporary switch in the code), each summed per kernel name
# (tools/ncu_kernel_summary.py); NCU_AB_DETAIL=REGEX adds ncu's sections for the first 2 matching launches of the
# plain run. Run on the device from the repo root after a build (tools/device_check.sh builds build-gpu/).
# Env: NCU_AB_ARGS (bench options), NCU_AB_ENV (VAR=value), NCU_AB_KERNELS (ncu name regex, default all of ours),
# OUT (results folder).
set -u
OUT=${OUT:-/tmp/deepinfer-out}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
args=${NCU_AB_ARGS:---model v4-flash --prompt 8192 --batch 1 --context 1024 --layers-per-kind 1 --warmup 0 --iters 1 --no-graphs}
kernels=${NCU_AB_KERNELS:-gemm|moe|swiglu|router|combine|plan|hc_|rms|rope|attention|indexer|topk|dequant|cast|embed|scatter|compress|engram}
run() {  # $1: label; the rest: environment assignments
  local label=$1
  shift
  # shellcheck disable=SC2086
  env "$@" timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum --kernel-name "regex:$kernels" build-gpu/bin/deepinfer bench --device cuda $args \
    >"$OUT/ncu_ab_$label.csv" 2>"$OUT/ncu_ab_$label.err"
  echo "[ncu-ab] $label ($*): rc=$?"
  python3 tools/ncu_kernel_summary.py "$OUT/ncu_ab_$label.csv" 12 | sed "s/^/[ncu-ab $label] /"
}
run plain
[ -n "${NCU_AB_ENV:-}" ] && run switched "$NCU_AB_ENV"
if [ -n "${NCU_AB_DETAIL:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none --kernel-name-base function \
    --kernel-name "regex:$NCU_AB_DETAIL" --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    build-gpu/bin/deepinfer bench --device cuda $args >"$OUT/ncu_ab_detail.txt" 2>&1
  echo "[ncu-ab] detail ($NCU_AB_DETAIL): rc=$?"
  grep -E "^  [a-z_:<>, ]+\(|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|L1/TEX Hit|L2 Hit" \
    "$OUT/ncu_ab_detail.txt" | head -40
fi
