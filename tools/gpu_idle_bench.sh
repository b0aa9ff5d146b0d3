#!/usr/bin/env bash
# GPU idle between decode steps in the engine, without nsys: `deepinfer offline --device cuda` prints it from CUDA
# events on the backend's stream (engine/gpu_idle.h: per decode step the gap since the previous step's end, over the
# gaps plus the steps' own GPU time). Greedy runs at several batch sizes on the V4.1 and V3 golden test models and
# on a random-weight V3-shaped FP8 checkpoint of ~0.8 B parameters (tools/decode_graph_bench.sh's), each in the modes
# of MODES (default: fast logprobs logprobs-host):
#   fast          --no-logprobs: every step takes the greedy fast path, the argmax on the device (ids copied back)
#   host          --no-logprobs --no-device-argmax: the same steps with the full [rows, vocab] logits copied back
#   logprobs      the default offline run: the fast path with the chosen token's logprob (decode perplexity) also
#                 reduced on the device (ids and logprobs copied back); expected close to `fast`
#   logprobs-host the default run with --no-device-argmax: rows copied back, argmax and logprob on the host
# One "[gpu-idle]" line per run: the idle figure, the fast-path step counts and the decode-steps line.
#   usage: bash tools/gpu_idle_bench.sh   (CLI=build-gpu/bin/deepinfer; BATCHES, MODES, MODELS, MAX_TOKENS override)
set -uo pipefail
cd "$(dirname "$0")/.."
cli=${CLI:-build-gpu/bin/deepinfer}
work=${BENCH_DIR:-/tmp/gpu_idle_bench}
mkdir -p "$work"
models=${MODELS:-"golden-v41 golden-v3 v3-0.8b"}
if [[ " $models " == *" v3-0.8b "* ]] && [ ! -f "$work/v3/config.json" ]; then
  mkdir -p "$work/v3"
  python3 tools/v3_fp8_bench_config.py "$work/v3-config.json"
  "$cli" make-checkpoint --config "$work/v3-config.json" --out "$work/v3" --seed 5 >"$work/make.log" 2>&1 ||
    { echo "[gpu-idle] make-checkpoint FAILED"; tail -5 "$work/make.log"; }
fi
dir_of() {
  case $1 in
    golden-v41) echo tests/data/golden/deepseek_v41 ;;
    golden-v3) echo tests/data/golden/deepseek_v3 ;;
    v3-0.8b) echo "$work/v3" ;;
    *) echo "$1" ;;  # a checkpoint directory
  esac
}
for m in $models; do
  dir=$(dir_of "$m")
  [ -f "$dir/config.json" ] || { echo "[gpu-idle] $m: no checkpoint at $dir"; continue; }
  for b in ${BATCHES:-1 8 64}; do
    for mode in ${MODES:-fast logprobs logprobs-host}; do
      case $mode in
        fast) flags=--no-logprobs ;;
        host) flags="--no-logprobs --no-device-argmax" ;;
        logprobs-host) flags=--no-device-argmax ;;
        *) flags="" ;;
      esac
      log="$work/run_${m}_${b}_$mode.log"
      # shellcheck disable=SC2086
      timeout "${RUN_TIMEOUT:-90}" "$cli" offline --device cuda --model "$dir" --num-prompts "$b" \
        --max-tokens "${MAX_TOKENS:-128}" --ignore-eos --max-num-seqs "$b" --max-num-batched-tokens 8192 $flags \
        >"$log" 2>&1
      rc=$?
      echo "[gpu-idle] $m batch $b $mode: rc=$rc; $(grep -h '^gpu idle between decode steps' "$log" | head -1);" \
        "$(grep -h '^decode steps:' "$log" | head -1 | cut -d';' -f1)"
      [ $rc = 0 ] || tail -3 "$log"
    done
  done
done
