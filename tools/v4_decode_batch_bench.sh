#!/usr/bin/env bash
# V4.1 batched decode on vs off in the engine (docs/PERF.md): a random-weight V4.1-shaped checkpoint (the golden
# fixture's 6-layer schedule — SWA, r=4 kv source + reuse, r=1 candidate source / decoder start, Engram — scaled to
# hidden 1024, 16 heads of 128, 32 routed experts of width 512, top-4, window 128, vocab 512; about 0.3 B parameters,
# f32 on the GPU), then the same `deepinfer offline` workload with the default (a step's decodes in one
# DeepseekV4Model::decode_batch, recorded in pieces as CUDA graphs), --enforce-eager (batched, eager) and
# --no-batch-decode (one forward per sequence), at several batch sizes (MODES="graphs eager perseq").
# One "[v4batch]" line per run: the engine's own throughput line (model load excluded).
#   usage: bash tools/v4_decode_batch_bench.sh   (CLI=build-gpu/bin/deepinfer; BATCHES, MAX_TOKENS override)
set -uo pipefail
cd "$(dirname "$0")/.."
cli=${CLI:-build-gpu/bin/deepinfer}
work=${BENCH_DIR:-/tmp/v4batchbench}
mkdir -p "$work/model"
python3 - "$work/config.json" <<'PY'
import json, sys
c = json.load(open("tests/data/golden/deepseek_v41/config.json"))
c["text_config"].update(hidden_size=1024, num_attention_heads=16, head_dim=128, qk_rope_head_dim=64,
                        q_lora_rank=512, o_lora_rank=256, o_groups=4, index_n_heads=8, index_head_dim=64,
                        index_topk=64, moe_intermediate_size=512, n_routed_experts=32, num_experts_per_tok=4,
                        sliding_window=128, max_position_embeddings=2048)
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
t0=$(date +%s.%N)
"$cli" make-checkpoint --config "$work/config.json" --out "$work/model" --seed 9 >"$work/make.log" 2>&1 ||
  { echo "[v4batch] make-checkpoint FAILED"; tail -5 "$work/make.log"; exit 1; }
cp tests/data/golden/deepseek_v41/tokenizer.json "$work/model/"  # the Engram token map
echo "[v4batch] checkpoint: $(du -sh "$work/model" | cut -f1) in $(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')") s"
for b in ${BATCHES:-32 64}; do
  for mode in ${MODES:-graphs perseq}; do
    case $mode in
      graphs) flags="" ;;                    # batched decode, recorded in pieces (the default)
      eager) flags="--enforce-eager" ;;      # batched decode, launched eagerly
      perseq) flags="--no-batch-decode" ;;   # one forward per sequence
      *) echo "[v4batch] unknown mode $mode"; exit 2 ;;
    esac
    workload="--num-prompts $b --max-tokens ${MAX_TOKENS:-32} --ignore-eos --max-num-seqs $b --max-num-batched-tokens 16384"
    timeout ${RUN_TIMEOUT:-60} "$cli" offline --device cuda --model "$work/model" $workload $flags >"$work/run.log" 2>&1
    rc=$?
    echo "[v4batch] batch $b $mode: rc=$rc; $(grep -h '^offline:' "$work/run.log" | head -1)"
    grep -h "decode graphs\|decode step" "$work/run.log" | head -3 | sed 's/^/[v4batch]   /'
    [ $rc = 0 ] || tail -5 "$work/run.log"
  done
done
