#!/usr/bin/env bash
# The product path (`deepinfer offline`, the engine) on a checkpoint with the REAL dimensions of DeepSeek-V4-Flash
# (docs/PERF.md): hidden 4096, 64 heads of 512 (rope 64), q_lora 1024, 8 output groups of rank 1024, 256 routed
# experts of width 2048 top-6 (MXFP4) + 1 shared, FP8 e4m3 128x128 UE8M0 block weights, hc_mult 4, indexer 64 heads
# of 128 top-512, window 128, vocab 129280, the real layer schedule ([0,0] + [4,128]*20 + [4]; layers 0-2
# hash-routed) truncated to LAYERS layers (default 4: SWA, SWA, CSA, HCA). Random weights in the real formats
# (`deepinfer make-checkpoint` on all cores; ~3.5 GB a layer; routed experts >= DISTINCT_EXPERTS (16) of a layer
# repeat the bytes of expert e % 16 in their own tensors, so that writing takes seconds, not minutes: the kernels'
# work and bytes do not depend on the values; DISTINCT_EXPERTS=0 makes all 256 random), kept quantized on the GPU
# (--weight-format auto).
# Then, in the same call:
#   prefill: NUM_PREFILL (3) prompts of PREFILL (8192) random tokens one at a time, one step each (the first
#            is cold: the warm rate is over the others, from the progress lines);
#   decode:  BATCHES ("1 16 64") sequences of CONTEXT (4096) random tokens each, MAX_TOKENS (32) generated;
#   bench:   `deepinfer bench --model v4-flash` (the synthetic slice, one layer of each kind) on the same shapes,
#            for the slice-vs-engine per-layer comparison (SLICE_BENCH=0 skips it).
# One "[realdims]" line per figure: the engine's own lines (offline:, prefill work, decode steps, decode rate), the
# model load time (the "device:" to "weights:" log lines), the cache budget the engine computed, the peak device
# memory (nvidia-smi, sampled every 200 ms), and an estimate from the checkpoint's tensors of the weight bytes on
# the device, read per batch-1 decode step, and the prefill GEMM FLOPs per token.
#   usage: bash tools/v4_real_dims_bench.sh   (CLI=build-gpu/bin/deepinfer; LAYERS, PREFILL, NUM_PREFILL, CONTEXT,
#          BATCHES, MAX_TOKENS, SCHEDULE (compress ratios instead of the truncated schedule: "0,4,128" is
#          the slice's one layer of each kind; layers 0-2 stay hash-routed), RUN_TIMEOUT (per offline run, s), MAKE_THREADS, BENCH_DIR, LOG_DIR (run logs copied
#          there), KEEP_CHECKPOINT=1 (reuse BENCH_DIR/model when its config matches))
#   dev check without a GPU: DIMS=small DEVICE=cpu bash tools/v4_real_dims_bench.sh (the same plumbing on
#          dimensions scaled down ~8x; DEVICE=cpu keeps the block formats quantized with --weight-format fp8)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
cli=${CLI:-build-gpu/bin/deepinfer}
work=${BENCH_DIR:-/tmp/v4realdims}
device=${DEVICE:-cuda}
dims=${DIMS:-real}
layers=${LAYERS:-4}
[ -n "${SCHEDULE:-}" ] && layers=$(echo "$SCHEDULE" | tr ',' '\n' | grep -c .)
if [ "$dims" = small ]; then
  prefill=${PREFILL:-512} num_prefill=${NUM_PREFILL:-2} context=${CONTEXT:-256} batches=${BATCHES:-1 4}
  max_tokens=${MAX_TOKENS:-4}
else
  prefill=${PREFILL:-8192} num_prefill=${NUM_PREFILL:-3} context=${CONTEXT:-4096} batches=${BATCHES:-1 16 64}
  max_tokens=${MAX_TOKENS:-32}
fi
mkdir -p "$work"
say() { echo "[realdims] $*"; }
python3 - "$work/config.json" "$dims" "$layers" "${SCHEDULE:-}" <<'PY' || { say "config FAILED"; exit 1; }
import json, sys
out, dims, L = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = json.load(open("tests/data/golden/deepseek_v4/config.json"))
ratios = ([0, 0] + [4, 128] * 20 + [4])[:L]          # the released compress_ratios, truncated
if L > len(ratios):
    sys.exit(f"LAYERS={L}: the real schedule has 43 layers")
if sys.argv[4]:  # SCHEDULE: the compress ratios of the layers instead (e.g. 0,4,128: one of each kind, as the slice)
    ratios = [int(r) for r in sys.argv[4].split(",")]
    L = len(ratios)
kind = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
c.update(layer_types=[kind[r] for r in ratios], mlp_layer_types=["hash_moe" if l < 3 else "moe" for l in range(L)],
         num_hidden_layers=L, compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
         n_shared_experts=1, num_experts_per_tok=6, sliding_window=128, hc_mult=4, qk_rope_head_dim=64,
         num_nextn_predict_layers=0)
if dims == "real":  # docs: MODELS.md section 1, V4-Flash column
    c.update(hidden_size=4096, num_attention_heads=64, head_dim=512, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
             n_routed_experts=256, moe_intermediate_size=2048, index_n_heads=64, index_head_dim=128, index_topk=512,
             vocab_size=129280, max_position_embeddings=65536)
elif dims == "small":  # the same structure, every dimension a multiple of the 128 blocks
    c.update(hidden_size=512, num_attention_heads=8, head_dim=128, q_lora_rank=256, o_groups=2, o_lora_rank=128,
             n_routed_experts=16, moe_intermediate_size=256, index_n_heads=8, index_head_dim=128, index_topk=64,
             vocab_size=4096, max_position_embeddings=8192)
else:
    sys.exit(f"DIMS must be real or small, got {dims}")
c["rope_parameters"]["compress"].update(factor=16.0, original_max_position_embeddings=65536)
c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                            "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
json.dump(c, open(out, "w"), indent=1)
print(f"[realdims] config: V4-Flash {dims} dims, {L} layers {[kind[r].split('_')[0] for r in ratios]}, "
      f"hash-routed {min(L, 3)}, hidden {c['hidden_size']}, {c['n_routed_experts']} experts of "
      f"{c['moe_intermediate_size']} top-6, vocab {c['vocab_size']}")
PY
if [ "${KEEP_CHECKPOINT:-}" = 1 ] && cmp -s "$work/config.json" "$work/model/config.json"; then
  say "checkpoint: reusing $work/model ($(du -sh "$work/model" | cut -f1))"
else
  rm -rf "$work/model"
  t0=$(date +%s.%N)
  "$cli" make-checkpoint --config "$work/config.json" --out "$work/model" --seed 11 --shard-mb 4000 \
    --threads "${MAKE_THREADS:-0}" --distinct-experts "${DISTINCT_EXPERTS:-16}" >"$work/make.log" 2>&1 ||
    { say "make-checkpoint FAILED"; tail -5 "$work/make.log"; exit 1; }
  say "checkpoint: $(du -sh "$work/model" | cut -f1) written in $(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')") s" \
    "($(nproc) cores; disk left $(df -h --output=avail "$work" | tail -1 | tr -d ' '))"
fi

# Estimate from the checkpoint's tensors: bytes on the device (block formats as stored, the rest f32, as the V4
# loader keeps them), bytes read by one batch-1 decode step (every non-expert matrix, the shared expert, 6 of the
# routed experts, the f32 head; one embedding row; no KV), and prefill GEMM FLOPs per token (2 x weights touched).
python3 - "$work/model" <<'PY'
import glob, json, re, struct, sys
kept = re.compile(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)\.(weight|scale)$|\.(experts|shared_experts)\.")
size = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}
cfg = json.load(open(sys.argv[1] + "/config.json"))
dev = read = flops = 0
n_exp, topk = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    for name, t in h.items():
        if name == "__metadata__":
            continue
        n = 1
        for d in t["shape"]:
            n *= d
        b = n * size[t["dtype"]] if kept.search(name) or t["dtype"] == "I64" else n * 4
        dev += b
        logical = n * (2 if t["dtype"] == "I8" else 1)  # MXFP4 packs two weights a byte
        if ".scale" in name or t["dtype"] == "I64":
            logical = 0
        if name == "embed.weight":
            read += b // t["shape"][0]
            continue
        share = topk / n_exp if ".experts." in name else 1.0
        read += b * share
        if len(t["shape"]) == 2 and not name.endswith("_fn"):
            flops += 2 * logical * share
print(f"[realdims] estimate: weights on the device {dev / 1e9:.2f} GB; batch-1 decode step reads {read / 1e9:.3f} GB "
      f"of weights (f32 head {cfg['vocab_size'] * cfg['hidden_size'] * 4 / 1e9:.2f} GB of it; "
      f"{read / 4.8e12 * 1e3:.3f} ms at 4.8 TB/s); prefill GEMMs {flops / 1e9:.2f} GFLOP a token "
      f"(x tokens, + attention; {flops / 989e12 * 1e6:.3f} us a token at 989 TFLOP/s bf16 dense)")
PY

# A run of `deepinfer offline` with the peak device memory sampled beside it; the engine's lines as [realdims].
dev_flags="--device $device"
[ "$device" = cpu ] && dev_flags="$dev_flags --weight-format fp8"
run_offline() {  # label, offline args...
  local label=$1 smi=""
  shift
  if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$work/smi.log" 2>/dev/null &
    smi=$!
  fi
  local t0 rc
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout "${RUN_TIMEOUT:-150}" "$cli" offline $dev_flags --model "$work/model" --ignore-eos "$@" >"$work/run.log" 2>&1
  rc=$?
  local wall
  wall=$(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')")
  [ -n "$smi" ] && { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }
  [ -n "${LOG_DIR:-}" ] && mkdir -p "$LOG_DIR" && cp "$work/run.log" "$LOG_DIR/$label.log"
  local load peak=""
  load=$(awk -F'[][]' '/\] \[info\] device: /{split($2,a,":"); t0=a[1]*3600+a[2]*60+a[3]}
    /\] \[info\] weights: /{split($2,a,":"); printf "%.1f", a[1]*3600+a[2]*60+a[3]-t0; exit}' "$work/run.log")
  [ -s "$work/smi.log" ] && peak="; peak device memory $(sort -n "$work/smi.log" | tail -1) MiB"
  say "$label: rc=$rc, process ${wall} s, model load ${load:-?} s$peak"
  grep -h "cache budget:\|^KV cache:" "$work/run.log" | sed 's/^\[[^]]*\] \[info\] //' | head -2 | sed 's/^/[realdims]   /'
  grep -h "^offline:\|^prefill work\|layer-tokens\|^decode steps:\|^decode rate:\|^gpu idle\|GPU idle" "$work/run.log" |
    sed 's/^/[realdims]   /'
  [ "$rc" = 0 ] || tail -5 "$work/run.log" | sed 's/^/[realdims]   ! /'
  return $rc
}

# Prefill: one prompt at a time, each in one step; the warm rate from the completion times of prompts 2..n.
run_offline "prefill ${prefill}x${num_prefill}" --num-prompts "$num_prefill" --random-prompt-len "$prefill" \
  --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens "$prefill" --max-model-len $((prefill + 16)) &&
  awk -v p="$prefill" -v L="$layers" '/^progress: [0-9]+\/[0-9]+ requests done/{
      split($2, a, "/"); t[a[1]] = $5 + 0; n = a[1] }
    END { if (n >= 2) printf "[realdims]   prefill: first %.3f s (cold), then %.1f ms a %d-token prompt (%.0f tok/s, %.2f ms a layer)\n",
      t[1], 1000 * (t[n] - t[1]) / (n - 1), p, p * (n - 1) / (t[n] - t[1]), 1000 * (t[n] - t[1]) / (n - 1) / L }' \
    "$work/run.log"

# Decode at each batch: BATCH prompts of CONTEXT tokens (prefilled in chunks of PREFILL tokens), MAX_TOKENS each.
for b in $batches; do
  run_offline "decode b$b ctx $context" --num-prompts "$b" --random-prompt-len "$context" --max-tokens "$max_tokens" \
    --max-num-seqs "$b" --max-num-batched-tokens "$prefill" --max-model-len $((context + max_tokens + 16)) &&
    awk -v L="$layers" '/^decode steps:/{ for (i = 1; i <= NF; ++i) if ($i == "median") m = $(i + 1) + 0 }
      END { if (m > 0) printf "[realdims]   engine decode step %.3f ms median = %.3f ms a layer (head included)\n", m, m / L }' \
      "$work/run.log"
done

# The synthetic slice on the same shapes, same machine, same call.
if [ "${SLICE_BENCH:-1}" = 1 ] && [ "$device" = cuda ]; then
  bench_args="--model v4-flash --prompt $prefill"
  for b in $batches; do bench_args="$bench_args --batch $b"; done
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --device cuda $bench_args --context "$context" --no-graphs \
    >"$work/bench.log" 2>&1
  say "slice bench ($bench_args --context $context --no-graphs): rc=$?"
  [ -n "${LOG_DIR:-}" ] && cp "$work/bench.log" "$LOG_DIR/slice_bench.log"
  grep -E "^\||avg_SPS|ceiling" "$work/bench.log" | head -40 | sed 's/^/[realdims]   /'
fi
exit 0
