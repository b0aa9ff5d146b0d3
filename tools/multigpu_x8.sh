#!/usr/bin/env bash
# Issue #16's 8-GPU run: a random-weight checkpoint with DeepSeek-V4.1-Flash's REAL dimensions (FAMILY=v41, the
# default; FAMILY=v4 for V4-Flash) written by `deepinfer make-checkpoint` (tools/v4_real_dims_config.py), its block
# formats kept quantized on every GPU (--weight-format fp8: FP8 projections, MXFP4 routed experts; each EP rank loads
# only its experts), then `deepinfer offline --device cuda` over one process per GPU (NCCL):
#   1. sizing: a 2-layer probe checkpoint gives the bytes of a layer (routed experts apart) and of the rest; the
#      layer count L is the largest that fits every GPU at --ep NGPU (GPU_UTIL of the device less RESERVE_GB for
#      the KV cache and activations), the host (HOST_UTIL of the RAM: each rank holds its weights on the host
#      before uploading them), the disk (85% of what is free) and MAX_LAYERS (default 43, the released depth);
#      R, the layer count of the comparison view, is the largest that also fits --ep 2 (a DP shard of 2 GPUs holds
#      half of the experts each);
#   2. the full checkpoint (L layers, the schedule's pattern repeated) and a view of its first R layers (its own
#      config.json, the same safetensors files linked: layers past R are not read);
#   3. on the L layers, --ep NGPU: --check_structured_output (random weights rarely finish a constrained output:
#      the line counts passes and fails; it does not stop the script), then prefill (NUM_PREFILL prompts of PREFILL
#      tokens, one step each) and decode (BATCH sequences of CONTEXT tokens, MAX_TOKENS greedy tokens each);
#   4. on the R-layer view: the same greedy decode prompts with --ep NGPU, --ep 2 --dp NGPU/2 (world NGPU/2),
#      --ep 2 --dp NGPU (world NGPU) and --ep 2 (2 GPUs, the reference: the smallest parallelism that holds the
#      weights), the greedy ids of each compared with the
#      reference's (how many sequences are identical, where the first differs); and --ep 2 --cp NGPU/2 (world
#      NGPU/2: context parallelism inside EP, the CP ranks holding the same quantized weights).
# One "[x8]" line per figure: prefill and decode tokens/s/GPU (the engine's "offline:" and "decode rate:" lines
# divided by the layout's world, i.e. its GPUs), wall time (model load included), peak device memory. Greedy ids of different layouts need not be
# bit-identical on CUDA (each rank's expert GEMMs see another row count, and the many-row path rounds its inputs to
# bf16); on random weights near-ties can flip a token, so the comparison reports and does not fail.
#   usage (device tool, kind nvidia-h200-x8): bash tools/multigpu_x8.sh
#     STEPS ("build ckpt run", default all; a warm machine's later call can skip build / ckpt), CLI
#     (build-gpu/bin/deepinfer), WORK (/tmp/x8), NGPU (8), FAMILY, SCHEDULE (the pattern repeated to L layers;
#     default the config tool's), MAX_LAYERS, LAYERS / REF_LAYERS (force L / R), GPU_UTIL (0.85), RESERVE_GB (24),
#     HOST_UTIL (0.8), PREFILL (4096), NUM_PREFILL (3), CONTEXT (1024), BATCH (32), MAX_TOKENS (16), RUN_TIMEOUT (s,
#     each offline run; 420), OFFLINE_FLAGS (added to every run), DISTINCT_EXPERTS (16), RUNS (a subset of
#     "structured prefill decode ref ep8 ep2dp4 ep2dp8 ep2cp4", default all: each run loads the model, so a
#     10-minute call may hold only some; the comparisons need `ref` first, in the same WORK)
#   dry run without GPUs: DRY_RUN=1 bash tools/multigpu_x8.sh   (small dims, --device cpu, in-process ranks, the CLI
#     of build/; the same steps and comparisons; sizing from GPU_GB (default 1.5) so that L and R come out small)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dry=${DRY_RUN:-0}
family=${FAMILY:-v41}
ngpu=${NGPU:-8}
half=$((ngpu / 2))
if [ "$dry" = 1 ]; then
  device=cpu dims=small cli=${CLI:-build/bin/deepinfer} work=${WORK:-/tmp/x8dry} steps=${STEPS:-ckpt run}
  prefill=${PREFILL:-256} num_prefill=${NUM_PREFILL:-2} context=${CONTEXT:-64} batch=${BATCH:-4}
  max_tokens=${MAX_TOKENS:-4} gpu_gb=${GPU_GB:-1.5} reserve_gb=${RESERVE_GB:-0.2} max_layers=${MAX_LAYERS:-8}
else
  device=cuda dims=real cli=${CLI:-build-gpu/bin/deepinfer} work=${WORK:-/tmp/x8} steps=${STEPS:-build ckpt run}
  prefill=${PREFILL:-4096} num_prefill=${NUM_PREFILL:-3} context=${CONTEXT:-1024} batch=${BATCH:-32}
  max_tokens=${MAX_TOKENS:-16} gpu_gb=${GPU_GB:-} reserve_gb=${RESERVE_GB:-24} max_layers=${MAX_LAYERS:-43}
fi
# NVLink multicast stays off (it can take a shared host's GPUs down), also in the processes deepinfer spawns.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$work/logs"
say() { echo "[x8] $*"; }
has() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
elapsed() { python3 -c "print(f'{$(date +%s.%N)-$1:.1f}')"; }

if has build; then
  t0=$(date +%s.%N)
  if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_ACCELERATOR=nvidia \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DDEEPINFER_PYTHON=OFF -DDEEPINFER_BUILD_TESTS=OFF >"$work/configure.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target deepinfer_cli >"$work/build.log" 2>&1; then
    say "build (deepinfer_cli, CUDA): ok in $(elapsed "$t0") s"
  else
    say "build FAILED"; tail -20 "$work/build.log"; exit 1
  fi
fi
[ -x "$cli" ] || { say "no CLI at $cli (STEPS=build, or CLI=...)"; exit 1; }

# A config of n layers: the schedule's pattern repeated (V4.1 default 0,2,2,1,1; V4: the released schedule).
pattern=${SCHEDULE:-$([ "$family" = v41 ] && echo 0,2,2,1,1)}
config() {  # n out.json
  local sched=""
  [ -n "$pattern" ] && sched=$(python3 -c "import sys; p = sys.argv[1].split(','); n = int(sys.argv[2]); print(','.join((p * n)[:n]))" "$pattern" "$1")
  python3 tools/v4_real_dims_config.py "$2" --family "$family" --dims "$dims" --layers "$1" --schedule "$sched" >/dev/null
}
make_ckpt() {  # config dir label
  local t0
  t0=$(date +%s.%N)
  rm -rf "$2"
  "$cli" make-checkpoint --config "$1" --out "$2" --seed 11 --shard-mb 4000 --distinct-experts "${DISTINCT_EXPERTS:-16}" \
    >"$work/logs/make_$3.log" 2>&1 || { say "make-checkpoint ($3) FAILED"; tail -5 "$work/logs/make_$3.log"; exit 1; }
  # A ByteLevel tokenizer for the text prompts of --check_structured_output (its 4096 ids are inside the vocab).
  cp models/default/tokenizer.json "$2/"
  say "checkpoint $3: $(du -sh "$2" | cut -f1) in $(elapsed "$t0") s"
}

if has ckpt; then
  config 2 "$work/probe.json"
  make_ckpt "$work/probe.json" "$work/probe" probe
  # Bytes as the loader keeps them: block formats as stored, everything else f32; per layer, routed experts apart.
  gpu_total=${gpu_gb:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 |
    awk '{printf "%.1f", $1 / 1024 * 1.073741824}')}
  python3 - "$work/probe" "${gpu_total:-139}" "${GPU_UTIL:-0.85}" "$reserve_gb" "${HOST_UTIL:-0.8}" "$ngpu" \
    "$max_layers" "$work" >"$work/sizing.txt" <<'PY' || { say "sizing FAILED"; exit 1; }
import os, re, sys
sys.path.insert(0, "tools")
from checkpoint_bytes import tensors
probe, gpu, util, reserve, host_util, ngpu, max_layers, work = sys.argv[1:]
gpu, util, reserve, host_util, ngpu, max_layers = float(gpu), float(util), float(reserve), float(host_util), int(ngpu), int(max_layers)
stored = {"rest": 0, "other": [0, 0], "experts": [0, 0]}
dev = {"rest": 0, "other": [0, 0], "experts": [0, 0]}
for name, t, n, s, d in tensors(probe):
    m = re.match(r"layers\.(\d+)\.", name)
    if not m:
        stored["rest"] += s
        dev["rest"] += d
        continue
    part = "experts" if ".ffn.experts." in name else "other"
    stored[part][int(m.group(1))] += s
    dev[part][int(m.group(1))] += d
layer_stored = max(stored["other"][l] + stored["experts"][l] for l in range(2))
other, experts = max(dev["other"]), max(dev["experts"])
G = 1e9
free_disk = os.statvfs(work).f_bavail * os.statvfs(work).f_frsize
ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
budget = gpu * G * util - reserve * G


def fits(ep, procs):  # layers that fit each GPU and the host with EP size ep and `procs` processes
    per_layer = other + experts / ep
    by_gpu = int((budget - dev["rest"]) // per_layer)
    by_host = int((ram * host_util / procs - dev["rest"]) // per_layer)
    return max(0, min(by_gpu, by_host)), by_gpu, by_host


L8, g8, h8 = fits(ngpu, ngpu)
L2, g2, h2 = fits(2, ngpu)  # --ep 2 --dp ngpu/2: every GPU holds half of the experts, ngpu processes
by_disk = int((free_disk * 0.85 - stored["rest"]) // layer_stored)
L = min(L8, by_disk, max_layers)
R = min(L2, L)
print(f"[x8] sizing: a layer {layer_stored / G:.2f} GB stored, on a device {other / G:.2f} GB + routed experts "
      f"{experts / G:.2f} GB / ep; the rest {dev['rest'] / G:.2f} GB; per GPU {gpu:.0f} GB x {util} - {reserve:.0f} GB; "
      f"host {ram / G:.0f} GB x {host_util}; disk free {free_disk / G:.0f} GB")
print(f"[x8] sizing: --ep {ngpu}: {g8} layers fit a GPU, {h8} the host; --ep 2: {g2} / {h2}; disk {by_disk}; "
      f"cap {max_layers} -> L={L} layers, comparison view R={R}")
print(f"L={L}")
print(f"R={R}")
PY
  grep "^\[x8\]" "$work/sizing.txt"
  L=${LAYERS:-$(sed -n 's/^L=//p' "$work/sizing.txt")}
  R=${REF_LAYERS:-$(sed -n 's/^R=//p' "$work/sizing.txt")}
  rm -rf "$work/probe"
  [ "${L:-0}" -ge 1 ] && [ "${R:-0}" -ge 1 ] || { say "sizing: no layer fits (L=$L R=$R)"; exit 1; }
  config "$L" "$work/full.json"
  make_ckpt "$work/full.json" "$work/model" "full ($L layers)"
  # The first R layers of the same files: its own config.json (the same schedule's prefix), the shards linked.
  rm -rf "$work/view" && mkdir -p "$work/view"
  config "$R" "$work/view/config.json"
  for f in "$work/model"/*.safetensors "$work/model"/*.index.json "$work/model/tokenizer.json"; do
    [ -e "$f" ] && ln -s "$f" "$work/view/$(basename "$f")"
  done
  echo "$L $R" >"$work/layers.txt"
fi

[ -s "$work/layers.txt" ] || { say "no checkpoint in $work (STEPS=ckpt)"; exit 1; }
read -r L R <"$work/layers.txt"
flags="--device $device --weight-format fp8 ${OFFLINE_FLAGS:-}"
[ "$device" = cuda ] && flags="$flags --gpu-memory-utilization ${GPU_UTIL:-0.85}"
[ "$device" = cpu ] && flags="$flags --kv-budget-mb 2000"
run() {  # label gpus model offline-args...
  local label=$1 gpus=$2 model=$3 smi="" t0 rc
  shift 3
  if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
    timeout $((${RUN_TIMEOUT:-420} + 10)) nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 \
      >"$work/smi.log" 2>/dev/null &
    smi=$!
  fi
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout "${RUN_TIMEOUT:-420}" "$cli" offline $flags --model "$model" "$@" >"$work/logs/$label.log" 2>&1
  rc=$?
  [ -n "$smi" ] && { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }
  local peak=""
  [ -s "$work/smi.log" ] && peak=", peak device memory $(sort -n "$work/smi.log" | tail -1) MiB (max over GPUs)"
  say "$label ($*): rc=$rc, $(elapsed "$t0") s$peak"
  grep -h "parallel layout:\|^structured output checks:\|refused\|Unsupported\|error" "$work/logs/$label.log" | head -3 |
    sed 's/^/[x8]   /'
  # Throughput per GPU from the engine's own lines; the GPUs are the layout's world (its log line).
  local world
  world=$(sed -n 's/.*parallel layout: world \([0-9]*\) .*/\1/p' "$work/logs/$label.log" | head -1)
  gpus=${world:-$gpus}
  awk -v g="$gpus" '/^offline:/{ for (i = 1; i <= NF; ++i) if ($i ~ /prompt$/ && $(i+2) == "tok/s,") p = $(i+1) }
    /^decode rate:/{ for (i = 1; i <= NF; ++i) if ($i == "delivered") r = $(i+1) }
    END { if (p != "") printf "[x8]   prefill %.1f tokens/s/GPU (%s tok/s over %d GPUs)\n", p / g, p, g;
      if (r != "") printf "[x8]   decode %.1f tokens/s/GPU (delivered %s tok/s over %d GPUs)\n", r / g, r, g }' \
    "$work/logs/$label.log"
  [ "$rc" = 0 ] || tail -3 "$work/logs/$label.log" | sed 's/^/[x8]   ! /'
  return $rc
}
# The greedy ids of a run, one line per request in request order.
ids() { awk '/^\[sample /{ id = $2 } /^  ids: /{ print id, $2 }' "$work/logs/$1.log" | sort -n; }
compare() {  # label reference
  local a b same total first
  a=$(ids "$1") b=$(ids "$2")
  [ -n "$a" ] && [ -n "$b" ] || { say "compare $1 vs $2: no ids"; return; }
  total=$(echo "$b" | wc -l)
  same=$(paste -d' ' <(echo "$a") <(echo "$b") | awk '$2 == $4' | wc -l)
  first=$(paste -d' ' <(echo "$a") <(echo "$b") | awk '$2 != $4 { n = split($2, x, ","); split($4, y, ",");
    for (i = 1; i <= n; ++i) if (x[i] != y[i]) { print "request " $1 " token " i - 1; exit } }')
  say "greedy ids $1 vs $2: $same of $total sequences identical${first:+ (first difference: $first)}"
}

# RUNS picks the offline runs (default all, in this order); a 10-minute device call may not hold all of them.
runs=${RUNS:-structured prefill decode ref ep$ngpu ep2dp$half ep2dp$ngpu ep2cp$half}
want() { case " $runs " in *" $1 "*) return 0 ;; esac; return 1; }
if has run; then
  ep_all="--ep $ngpu"
  workload="--num-prompts $batch --random-prompt-len $context --max-tokens $max_tokens --max-num-seqs $batch \
    --max-num-batched-tokens $prefill --max-model-len $((context + max_tokens + 16)) --ignore-eos --temperature 0"
  say "layers: $L on --ep $ngpu, comparison view $R ($family, $dims dims)"
  # shellcheck disable=SC2086
  want structured && run structured "$ngpu" "$work/model" $ep_all --check_structured_output --num-prompts 1 \
    --max-tokens 1 --max-model-len 512
  # shellcheck disable=SC2086
  want prefill && run prefill "$ngpu" "$work/model" $ep_all --num-prompts "$num_prefill" --random-prompt-len "$prefill" \
    --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens "$prefill" --max-model-len $((prefill + 16))
  # shellcheck disable=SC2086
  want decode && run decode "$ngpu" "$work/model" $ep_all $workload
  # The comparison on the first R layers: the reference is --ep 2 on 2 GPUs.
  # shellcheck disable=SC2086
  want ref && run ref_ep2 2 "$work/view" --ep 2 $workload
  # shellcheck disable=SC2086
  want "ep$ngpu" && run "view_ep$ngpu" "$ngpu" "$work/view" $ep_all $workload && compare "view_ep$ngpu" ref_ep2
  # shellcheck disable=SC2086
  want "ep2dp$half" && run "view_ep2_dp$half" "$half" "$work/view" --ep 2 --dp "$half" $workload &&
    compare "view_ep2_dp$half" ref_ep2
  # shellcheck disable=SC2086
  want "ep2dp$ngpu" && run "view_ep2_dp$ngpu" "$ngpu" "$work/view" --ep 2 --dp "$ngpu" $workload &&
    compare "view_ep2_dp$ngpu" ref_ep2
  # shellcheck disable=SC2086
  want "ep2cp$half" && run "view_ep2_cp$half" "$half" "$work/view" --ep 2 --cp "$half" $workload &&
    compare "view_ep2_cp$half" ref_ep2
fi
exit 0
