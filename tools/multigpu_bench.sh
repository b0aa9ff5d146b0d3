#!/usr/bin/env bash
# Throughput of the parallel layouts on the GPUs of one node (docs/PERF.md): a random-weight V4 checkpoint (the golden
# V4 config widened so that the routed experts dominate: hidden 2048, 32 routed experts of width 1024, top-4, one
# shared expert, 5 layers, about 1 B parameters, f32 on the GPU), then the same `deepinfer offline` workload on one GPU
# and with --ep 2, --ep 2 --dp 2 and --cp 2. One "[mgbench]" line per run: the engine's own throughput line (model
# load excluded) and the wall time of the whole command (load, NCCL start-up and spawn included).
#   usage: bash tools/multigpu_bench.sh   (CLI=build-gpu/bin/deepinfer; NUM_PROMPTS, MAX_TOKENS, LAYOUTS override)
set -uo pipefail
cd "$(dirname "$0")/.."
cli=${CLI:-build-gpu/bin/deepinfer}
work=${BENCH_DIR:-/tmp/mgbench}
mkdir -p "$work/model"
python3 - "$work/config.json" <<'PY'
import json, sys
c = json.load(open("tests/data/golden/deepseek_v4/config.json"))
c.update(hidden_size=2048, moe_intermediate_size=1024, n_routed_experts=32, num_experts_per_tok=4)
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
t0=$(date +%s.%N)
"$cli" make-checkpoint --config "$work/config.json" --out "$work/model" --seed 3 >"$work/make.log" 2>&1 ||
  { echo "[mgbench] make-checkpoint FAILED"; tail -5 "$work/make.log"; exit 1; }
echo "[mgbench] checkpoint: $(du -sh "$work/model" | cut -f1) in $(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')") s"
workload="--num-prompts ${NUM_PROMPTS:-64} --max-tokens ${MAX_TOKENS:-32} --ignore-eos --max-num-seqs 64 --max-num-batched-tokens 4096"
IFS=';' read -ra layouts <<<"${LAYOUTS:-;--ep 2;--ep 2 --dp 2;--cp 2}"
for layout in "${layouts[@]}"; do
  t0=$(date +%s.%N)
  timeout ${RUN_TIMEOUT:-150} "$cli" offline --device cuda --model "$work/model" $workload $layout >"$work/run.log" 2>&1
  rc=$?
  wall=$(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')")
  echo "[mgbench] '${layout:-1 GPU}': rc=$rc wall ${wall} s; $(grep -h '^offline:' "$work/run.log" | head -1)"
  [ $rc = 0 ] || tail -5 "$work/run.log"
done
