#!/usr/bin/env bash
# Same-run A/B of per-kernel GPU time under ncu: `deepinfer bench --device cuda $NCU_AB_ARGS` once as is and once
# with the kernel choices $NCU_AB_CHOICE (space-separated KEY=VALUE, each passed as --kernel-choice) and / or the
# environment assignment $NCU_AB_ENV (e.g. a temporary switch in the code), each summed per kernel name
# (tools/ncu_kernel_summary.py); NCU_AB_DETAIL=REGEX adds ncu's sections for the first 2 matching launches of the
# plain run. Run on the device from the repo root after a build (tools/device_check.sh builds build-gpu/).
# Env: NCU_AB_ARGS (bench options), NCU_AB_CHOICE, NCU_AB_ENV (VAR=value), NCU_AB_KERNELS (ncu name regex, default all
# of ours; cuBLASLt's kernels are nvjet*), NCU_BYTES=1 (also each kernel's DRAM bytes read / written and their rate),
# OUT (results folder).
set -u
OUT=${OUT:-/tmp/deepinfer-out}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
args=${NCU_AB_ARGS:---model v4-flash --prompt 8192 --batch 1 --context 1024 --layers-per-kind 1 --warmup 0 --iters 1 --no-graphs}
kernels=${NCU_AB_KERNELS:-gemm|moe|swiglu|router|combine|plan|hc_|rms|rope|attention|indexer|topk|dequant|cast|embed|scatter|compress|engram}
metrics=gpu__time_duration.sum
[ "${NCU_BYTES:-0}" != 0 ] && metrics="$metrics,dram__bytes_read.sum,dram__bytes_write.sum"
choice_args=()
for c in ${NCU_AB_CHOICE:-}; do choice_args+=(--kernel-choice "$c"); done
run() {  # $1: label, $2: 1 = with the kernel choices; the rest: environment assignments
  local label=$1 with_choice=$2
  shift 2
  local extra=()
  [ "$with_choice" = 1 ] && extra=("${choice_args[@]}")
  # shellcheck disable=SC2086
  env "$@" timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none --csv --print-units base \
    --metrics "$metrics" --kernel-name "regex:$kernels" build-gpu/bin/deepinfer bench --device cuda $args \
    "${extra[@]}" >"$OUT/ncu_ab_$label.csv" 2>"$OUT/ncu_ab_$label.err"
  echo "[ncu-ab] $label ($* ${extra[*]}): rc=$?"
  python3 tools/ncu_kernel_summary.py "$OUT/ncu_ab_$label.csv" 12 | sed "s/^/[ncu-ab $label] /"
}
run plain 0
if [ -n "${NCU_AB_ENV:-}" ] || [ ${#choice_args[@]} -gt 0 ]; then
  # shellcheck disable=SC2086
  run switched 1 ${NCU_AB_ENV:-}
fi
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
