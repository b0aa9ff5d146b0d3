#!/usr/bin/env bash
# The product path (`deepinfer offline`, the engine) on a checkpoint with the REAL dimensions of DeepSeek-V4-Flash
# (FAMILY=v4, the default) or V4.1-Flash (FAMILY=v41) and a few layers (tools/v4_real_dims_config.py; docs/PERF.md).
# V4-Flash: hidden 4096, 64 heads of 512 (rope 64), q_lora 1024, 8 output groups of rank 1024, 256 routed experts of
# width 2048 top-6 (MXFP4) + 1 shared, FP8 e4m3 128x128 UE8M0 block weights, hc_mult 4, indexer 64 heads of 128
# top-512, window 128, vocab 129280; the real schedule ([0,0] + [4,128]*20 + [4], layers 0-2 hash-routed) truncated
# to LAYERS (default 4: SWA, SWA, CSA, HCA), or SCHEDULE's compress ratios ("0,4,128": the slice's one layer of
# each kind). V4.1-Flash: hidden 5120, q_lora 1280, 384 experts of 2304, 32 index heads, 32x32 blocks; SCHEDULE
# default "0,2,2,1,1" (the slice's kinds: SWA, r=2 source + reuse, r=1 source + candidate source + reuse); no
# Engram, no DSpark. Random weights in the real formats (`deepinfer make-checkpoint` on all cores; V4 ~3.5 GB, V4.1
# ~7.5 GB a layer; routed experts >= DISTINCT_EXPERTS (16) of a layer repeat the bytes of expert e % 16 in their own
# tensors, so that writing takes seconds, not minutes: the kernels' work and bytes do not depend on the values;
# DISTINCT_EXPERTS=0 makes them all random), kept quantized on the GPU (--weight-format auto). Then, in one call:
#   prefill: NUM_PREFILL (3) prompts of PREFILL (8192) random tokens one at a time, one step each (the first is cold:
#            the warm rate is over the others, from the progress lines);
#   decode:  each of BATCHES ("1 16 64") sequences of CONTEXT (4096) random tokens, MAX_TOKENS (32) generated;
#   bench:   `deepinfer bench --model v4-flash` (v41-flash) on the same shapes: the synthetic slice, one layer of
#            each kind, for the slice-vs-engine per-layer comparison (SLICE_BENCH=0 skips it).
# One "[realdims]" line per figure: the engine's own lines (offline:, prefill work, decode steps, decode rate), the
# model load time (from the "device:" to the "weights:" log line), the cache budget the engine computed, the peak
# device memory (nvidia-smi every 200 ms), and an estimate from the checkpoint's tensors of the weight bytes on the
# device, those read by a batch-1 decode step, and the prefill GEMM FLOPs a token.
#   usage: bash tools/v4_real_dims_bench.sh   (CLI=build-gpu/bin/deepinfer; FAMILY, LAYERS, SCHEDULE, PREFILL,
#          NUM_PREFILL, CONTEXT, BATCHES, MAX_TOKENS, RUN_TIMEOUT (each offline run, s; default 150), BENCH_TIMEOUT,
#          GPU_UTIL (--gpu-memory-utilization, default 0.8), OFFLINE_FLAGS (added to every offline run, e.g.
#          --exact-prefill: V4.1 without bounded replay, as the slice), MAKE_THREADS, DISTINCT_EXPERTS, BENCH_DIR,
#          LOG_DIR (run logs copied there), KEEP_CHECKPOINT=1 (reuse BENCH_DIR/model when its config is the same))
#   dev check without a GPU: DIMS=small DEVICE=cpu bash tools/v4_real_dims_bench.sh (the same plumbing on dimensions
#          scaled down ~8x; DEVICE=cpu keeps the block formats quantized with --weight-format fp8)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
cli=${CLI:-build-gpu/bin/deepinfer}
work=${BENCH_DIR:-/tmp/v4realdims}
device=${DEVICE:-cuda}
dims=${DIMS:-real}
layers=${LAYERS:-4}
family=${FAMILY:-v4}
if [ "$dims" = small ]; then
  prefill=${PREFILL:-512} num_prefill=${NUM_PREFILL:-2} context=${CONTEXT:-256} batches=${BATCHES:-1 4}
  max_tokens=${MAX_TOKENS:-4}
else
  prefill=${PREFILL:-8192} num_prefill=${NUM_PREFILL:-3} context=${CONTEXT:-4096} batches=${BATCHES:-1 16 64}
  max_tokens=${MAX_TOKENS:-32}
fi
mkdir -p "$work"
say() { echo "[realdims] $*"; }
python3 tools/v4_real_dims_config.py "$work/config.json" --family "$family" --dims "$dims" --layers "$layers" \
  --schedule "${SCHEDULE:-}" || { say "config FAILED"; exit 1; }
layers=$(python3 -c "import json, sys; c = json.load(open(sys.argv[1])); print(c.get('text_config', c)['num_hidden_layers'])" \
  "$work/config.json")
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

# Estimate from the checkpoint's tensors: bytes on the device (block formats and the head as stored, the rest f32, as
# the V4 loader keeps them; with --weight-format f32 in OFFLINE_FLAGS the head is f32 too), bytes read by one decode
# step at each batch (every non-expert matrix, the shared expert and the head once, the routed experts the batch
# touches; one embedding row a token; no KV), and prefill GEMM FLOPs
# a token (2 x the weights a token goes through: the layers' matrices with 6 routed experts; not the head, which
# runs on the last token only).
keep_head=1
case " ${OFFLINE_FLAGS:-} " in *" --weight-format f32 "* | *" --weight-format=f32 "*) keep_head=0 ;; esac
python3 - "$work/model" "$batches" "$keep_head" >"$work/estimate.txt" <<'PY'
import json, sys
sys.path.insert(0, "tools")
from checkpoint_bytes import bf16_copy_bytes, tensors
cfg = json.load(open(sys.argv[1] + "/config.json"))
cfg = cfg.get("text_config", cfg)
batches = [int(b) for b in sys.argv[2].split()]
keep_head = sys.argv[3] == "1"  # a bf16 head kept as stored beside the quantized weights (model/output_head.h)
head = 0
dev = dense = experts = flops = 0  # bytes: on the device, read once a step, all routed experts; GEMM FLOPs a token
n_exp, topk, layers = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
for name, t, n, _, b in tensors(sys.argv[1], keep_head):
    if name == "head.weight":
        head = b
    dev += b
    logical = 0 if ".scale" in name or t["dtype"] == "I64" else n * (2 if t["dtype"] == "I8" else 1)  # MXFP4: 2 a byte
    if name == "embed.weight":
        dense += b // t["shape"][0]  # one row a token
        continue
    if ".experts." in name:
        experts += b
    elif not name.endswith(".tid2eid"):
        dense += b - bf16_copy_bytes(name, t, n, keep_head)  # a decode step reads the compressors' f32 copies
    if len(t["shape"]) == 2 and not name.endswith("_fn") and name != "head.weight":  # head: last token only
        flops += 2 * logical * (topk / n_exp if ".experts." in name else 1.0)
head_kind = "bf16" if head == 2 * cfg["vocab_size"] * cfg["hidden_size"] else "f32"
print(f"[realdims] estimate: weights on the device {dev / 1e9:.2f} GB ({head_kind} head {head / 1e9:.2f} GB); prefill GEMMs "
      f"{flops / 1e9:.2f} GFLOP a token ({flops / 989e12 * 1e6:.3f} us a token at 989 TFLOP/s bf16 dense; + attention)")
# A decode step of b sequences reads the dense weights once and the experts its tokens route to: with uniform routing
# a layer touches n (1 - (1 - k/n)^b) of its n experts (hash layers: random tables, the same on average).
for b in batches:
    touched = n_exp * (1 - (1 - topk / n_exp) ** b)
    read = dense + experts * touched / n_exp
    print(f"[realdims] estimate: decode batch {b}: ~{touched:.0f} of {n_exp} experts a layer, weights read "
      f"{read / 1e9:.3f} GB a step = {read / 4.8e12 * 1e3:.3f} ms at 4.8 TB/s")
PY
cat "$work/estimate.txt"

# A run of `deepinfer offline` with the peak device memory sampled beside it; the engine's lines as [realdims].
dev_flags="--device $device ${OFFLINE_FLAGS:-}"
[ "$device" = cpu ] && dev_flags="$dev_flags --weight-format fp8"
# The KV cache needs little here (64 x 4.1k tokens); the rest of the device is left to the 8192-token activations.
[ "$device" = cuda ] && dev_flags="$dev_flags --gpu-memory-utilization ${GPU_UTIL:-0.8}"
run_offline() {  # label, offline args...
  local label=$1 smi=""
  shift
  if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
    # Bounded by itself too: when an outer timeout kills this script, no sampler is left running.
    timeout $((${RUN_TIMEOUT:-150} + 10)) nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 \
      >"$work/smi.log" 2>/dev/null &
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
  cp "$work/run.log" "$work/logs/$label.log"
  [ -n "${LOG_DIR:-}" ] && mkdir -p "$LOG_DIR" && cp "$work/run.log" "$LOG_DIR/$label.log"
  local load peak=""
  load=$(awk -F'[][]' '/\] \[info\] device: /{split($2,a,":"); t0=a[1]*3600+a[2]*60+a[3]}
    /\] \[info\] weights: /{split($2,a,":"); printf "%.1f", a[1]*3600+a[2]*60+a[3]-t0; exit}' "$work/run.log")
  [ -s "$work/smi.log" ] && peak="; device memory peak $(sort -n "$work/smi.log" | tail -1) MiB (first sample $(head -1 "$work/smi.log") MiB)"
  say "$label ($*): rc=$rc, process ${wall} s, model load ${load:-?} s$peak"
  grep -h "cache budget:\|^KV cache:" "$work/run.log" | sed 's/^\[[^]]*\] \[info\] //' | head -2 | sed 's/^/[realdims]   /'
  grep -h "^offline:\|^prefill work\|layer-tokens\|^decode steps:\|^decode rate:\|^gpu idle\|GPU idle" "$work/run.log" |
    sed 's/^/[realdims]   /'
  [ "$rc" = 0 ] || tail -5 "$work/run.log" | sed 's/^/[realdims]   ! /'
  return $rc
}

# Prefill: one prompt at a time, each in one step; the warm rate from the completion times of prompts 2..n.
rm -rf "$work/logs" && mkdir -p "$work/logs"
run_offline prefill --num-prompts "$num_prefill" --random-prompt-len "$prefill" \
  --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens "$prefill" --max-model-len $((prefill + 16)) &&
  awk -v p="$prefill" -v L="$layers" '/^progress: [0-9]+\/[0-9]+ requests done/{
      split($2, a, "/"); t[a[1]] = $5 + 0; n = a[1] }
    END { if (n >= 2) printf "[realdims]   prefill: first %.3f s (cold), then %.1f ms a %d-token prompt (%.0f tok/s, %.2f ms a layer)\n",
      t[1], 1000 * (t[n] - t[1]) / (n - 1), p, p * (n - 1) / (t[n] - t[1]), 1000 * (t[n] - t[1]) / (n - 1) / L }' \
    "$work/run.log"

# Decode at each batch: BATCH prompts of CONTEXT tokens (prefilled in chunks of PREFILL tokens), MAX_TOKENS each.
for b in $batches; do
  run_offline "decode_b$b" --num-prompts "$b" --random-prompt-len "$context" --max-tokens "$max_tokens" \
    --max-num-seqs "$b" --max-num-batched-tokens "$prefill" --max-model-len $((context + max_tokens + 16)) &&
    awk -v L="$layers" -v b="$b" '/^\[realdims\] estimate: decode batch /{ if ($5 == b ":") f = $(NF - 4) + 0 }
      /^decode steps:/{ for (i = 1; i <= NF; ++i) if ($i == "median") m = $(i + 1) + 0 }
      END { if (m > 0) printf "[realdims]   engine decode step %.3f ms median = %.3f ms a layer (head included)%s\n", m,
        m / L, (f > 0) ? sprintf("; %.1fx the weight-bytes floor (%.3f ms)", m / f, f) : "" }' "$work/estimate.txt" "$work/run.log"
done

# The synthetic slice on the same shapes, same machine, same call (BENCH_MODEL: v4-flash / v41-flash).
bench_model=${BENCH_MODEL:-$([ "$family" = v41 ] && echo v41-flash || echo v4-flash)}
if [ "${SLICE_BENCH:-$([ "$device" = cuda ] && echo 1 || echo 0)}" = 1 ]; then
  bench_args="--model $bench_model --prompt $prefill"
  for b in $batches; do bench_args="$bench_args --batch $b"; done
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --device "$device" $bench_args --context "$context" --no-graphs \
    ${BENCH_FLAGS:-} >"$work/bench.log" 2>&1
  say "slice bench ($bench_args --context $context --no-graphs ${BENCH_FLAGS:-}): rc=$?"
  [ -n "${LOG_DIR:-}" ] && cp "$work/bench.log" "$LOG_DIR/slice_bench.log"
  sed -n '/^ceilings/,/^breakdown/p' "$work/bench.log" | grep -v "^breakdown" | sed 's/^/[realdims]   /'
  # Per layer, engine vs slice: the engine's warm prefill time and median decode step over its layers (head,
  # sampling and scheduling included) against the slice's step over its layers (layers only).
  python3 - "$work" "$layers" "$prefill" "$context" <<'PY'
import os, re, sys
work, layers, prefill, context = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bench = open(work + "/bench.log").read()
m = re.search(r"^slice .*?: (\d+) layers", bench, re.M)
if not m:
    sys.exit("[realdims] compare: no slice in bench.log")
slice_layers = int(m.group(1))


def slice_ms(phase, batch, ctx):  # the table row: model phase batch context tokens/s(2 words) step-ms ...
    r = re.search(rf"^\S+\s+{phase}\s+{batch}\s+{ctx}\s+\S+ \S*\s+([0-9.]+)", bench, re.M)
    return float(r.group(1)) if r else None


def log(name):
    try:
        return open(f"{work}/logs/{name}.log").read()
    except OSError:
        return ""


rows = []
t = [float(x) for x in re.findall(r"^progress: \d+/\d+ requests done, ([0-9.]+) s", log("prefill"), re.M)]
if len(t) >= 2:
    rows.append(("prefill", prefill, 1000 * (t[-1] - t[0]) / (len(t) - 1), slice_ms("prefill", 1, prefill)))
batches = sorted(int(f[len("decode_b"):-4]) for f in os.listdir(work + "/logs") if re.fullmatch(r"decode_b\d+\.log", f))
for b in batches:
    d = re.search(r"^decode steps: .*?median ([0-9.]+) ms", log(f"decode_b{b}"), re.M)
    if d:
        rows.append((f"decode b{b}", context, float(d.group(1)), slice_ms("decode", b, context)))
for what, ctx, engine, sl in rows:
    e = engine / layers
    if sl is None:
        print(f"[realdims] compare {what}: engine {e:.3f} ms a layer; no slice row")
        continue
    s = sl / slice_layers
    print(f"[realdims] compare {what} (ctx {ctx}): engine {engine:.3f} ms / {layers} layers = {e:.3f} ms a layer "
          f"(head, sampling, scheduling in it); slice {sl:.3f} ms / {slice_layers} = {s:.3f} ms a layer; "
          f"engine / slice {e / s:.2f}x")
PY
fi
exit 0
