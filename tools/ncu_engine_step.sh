#!/usr/bin/env bash
# Every kernel of a short engine run (`deepinfer offline`, eager) under ncu, in launch order: one prompt of PROMPT (64)
# random tokens, then MAX_TOKENS - 1 (2) decode steps, on the checkpoint MODEL (default: the real-dimension one that
# tools/v4_real_dims_bench.sh leaves in /tmp/v4realdims/model). ncu serialises the kernels and flushes the caches
# between them, so a kernel's time is its cold time; the list says what a decode step launches and what each costs.
# Output: $OUT/ncu_engine.csv.xz and tools/ncu_engine_steps.py's per-step table in the summary (stdout).
#   usage: MODEL=/tmp/v4realdims/model CLI=build-gpu/bin/deepinfer bash tools/ncu_engine_step.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
cli=${CLI:-build-gpu/bin/deepinfer}
timeout "${NCU_ENGINE_TIMEOUT:-150}" "$ncu" --clock-control none --csv --print-units base \
  --metrics gpu__time_duration.sum "$cli" offline --device cuda --model "${MODEL:-/tmp/v4realdims/model}" \
  --num-prompts 1 --random-prompt-len "${PROMPT:-64}" --max-tokens "${MAX_TOKENS:-3}" --ignore-eos --enforce-eager \
  --gpu-memory-utilization 0.8 ${ENGINE_FLAGS:-} >"$out/ncu_engine.csv" 2>"$out/ncu_engine.err"
echo "[ncu-engine] rc=$? ($ncu)"
python3 tools/ncu_engine_steps.py "$out/ncu_engine.csv"
xz -9 -f "$out/ncu_engine.csv" 2>/dev/null || true
