#!/usr/bin/env bash
# Decode graphs on vs off in the engine (docs/PERF.md): a random-weight V3-shaped checkpoint with FP8 block-scaled
# weights kept FP8 on the GPU (hidden 2048, 16 heads, MLA ranks 768/512, 8 layers of which 7 MoE with 16 routed
# experts of width 1024, top-4, vocab 32768; about 0.8 B parameters), then the same `deepinfer offline` workload with
# the default (batched decode steps replayed as CUDA graphs) and with --enforce-eager, at several batch sizes. One
# "[graphbench]" line per run: the decode step time (median wall time of the engine steps that ran no prompt token),
# the engine's throughput line (model load excluded) and the decode-graph counters.
#   usage: bash tools/decode_graph_bench.sh   (CLI=build-gpu/bin/deepinfer; BATCHES, MAX_TOKENS override)
#   IDLE=1: instead, an nsys timeline of the same offline run (graphs and --enforce-eager, IDLE_BATCHES) and the GPU's
#   idle share over its decode part (tools/gpu_idle.py).
set -uo pipefail
cd "$(dirname "$0")/.."
cli=${CLI:-build-gpu/bin/deepinfer}
work=${BENCH_DIR:-/tmp/graphbench}
mkdir -p "$work/model"
python3 tools/v3_fp8_bench_config.py "$work/config.json"
t0=$(date +%s.%N)
"$cli" make-checkpoint --config "$work/config.json" --out "$work/model" --seed 5 >"$work/make.log" 2>&1 ||
  { echo "[graphbench] make-checkpoint FAILED"; tail -5 "$work/make.log"; exit 1; }
echo "[graphbench] checkpoint: $(du -sh "$work/model" | cut -f1) in $(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')") s"
if [ -n "${IDLE:-}" ]; then  # GPU idle share of a decode-heavy run (nsys timeline, tools/gpu_idle.py) instead
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  [ -n "$nsys" ] || { echo "[gpu-idle] nsys not found"; exit 0; }
  for b in ${IDLE_BATCHES:-1 16 64}; do
    for mode in graphs eager; do
      flag=""
      [ "$mode" = eager ] && flag=--enforce-eager
      timeout ${IDLE_TIMEOUT:-90} "$nsys" profile -t cuda --cuda-graph-trace=node -o "$work/idle_${b}_$mode" \
        --force-overwrite true "$cli" offline --device cuda --model "$work/model" --num-prompts $b \
        --max-tokens ${MAX_TOKENS:-96} --ignore-eos --max-num-seqs $b $flag >"$work/idle_${b}_$mode.log" 2>&1
      "$nsys" stats --report cuda_gpu_trace --format csv --force-export true --output "$work/idle_${b}_$mode" \
        "$work/idle_${b}_$mode.nsys-rep" >/dev/null 2>&1
      python3 tools/gpu_idle.py "$work/idle_${b}_${mode}_cuda_gpu_trace.csv" --label "batch $b $mode" ||
        tail -3 "$work/idle_${b}_$mode.log"
    done
  done
  exit 0
fi
if [ -n "${NCU:-}" ]; then  # per-kernel GPU time of an eager decode run instead of the timing loop
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  b=${NCU_BATCH:-1}
  timeout ${NCU_TIMEOUT:-300} "$ncu" --clock-control none --csv --print-units base --metrics gpu__time_duration.sum \
    --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-3000} "$cli" offline --device cuda --model "$work/model" \
    --num-prompts $b --max-tokens ${MAX_TOKENS:-16} --ignore-eos --max-num-seqs $b --enforce-eager >"$work/ncu.csv" 2>"$work/ncu.err"
  echo "[graphbench] ncu rc=$? ($ncu)"; tail -3 "$work/ncu.err"
  python3 tools/ncu_kernel_summary.py "$work/ncu.csv" 40
  if [ -n "${NCU_DETAIL:-}" ]; then  # a kernel-name regex: ncu's speed-of-light, memory and occupancy sections
    timeout ${NCU_TIMEOUT:-300} "$ncu" --clock-control none --kernel-name "regex:$NCU_DETAIL" \
      --launch-skip ${NCU_DETAIL_SKIP:-100} --launch-count ${NCU_DETAIL_COUNT:-4} --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats "$cli" offline --device cuda \
      --model "$work/model" --num-prompts $b --max-tokens ${MAX_TOKENS:-16} --ignore-eos --max-num-seqs $b \
      --enforce-eager 2>&1 | grep -v "^\[" | tail -${NCU_DETAIL_LINES:-200}
  fi
  exit 0
fi
for b in ${BATCHES:-1 8 64}; do
  for mode in "" "--enforce-eager"; do
    workload="--num-prompts $b --max-tokens ${MAX_TOKENS:-256} --ignore-eos --max-num-seqs $b --max-num-batched-tokens 8192"
    timeout ${RUN_TIMEOUT:-120} "$cli" offline --device cuda --model "$work/model" $workload $mode >"$work/run.log" 2>&1
    rc=$?
    echo "[graphbench] batch $b ${mode:-graphs}: rc=$rc; $(grep -h '^decode steps:' "$work/run.log" | head -1); $(grep -h '^offline:' "$work/run.log" | head -1) $(grep -h '^decode graphs:' "$work/run.log" | head -1)"
    [ $rc = 0 ] || tail -5 "$work/run.log"
  done
done
