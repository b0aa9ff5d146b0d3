#!/usr/bin/env bash
# V4-Flash base MTP speculation on the GPU (device tool, after tools/device_check.sh built build-gpu): the golden
# V4 target with its MTP module (tests/data/golden/deepseek_v4_mtp), greedy and seeded sampled (sampled drafts),
# on cuda vs cpu and with vs without speculation; one "[v4mtp]" line per comparison (ids equal or not).
set -u
cd "$(dirname "$0")/.."
cli=${CLI:-build-gpu/bin/deepinfer}
out=${OUT:-/tmp/v4mtp}
mkdir -p "$out"
args="--model tests/data/golden/deepseek_v4_mtp --prompt-ids 5,17,42,99,100,7 --prompt-ids 3,4,5,200,11 \
--prompt-ids 9,8,7,6,5,4,3,2,1,0,31,77 --max-tokens 24 --ignore-eos --max-num-seqs 3"
run() {  # name device extra...
  local name=$1 dev=$2
  shift 2
  "$cli" offline --device "$dev" $args "$@" >"$out/$name.txt" 2>&1
  echo "$?"
}
ids() { grep "  ids:" "$out/$1.txt"; }
same() { [ -n "$(ids "$1")" ] && diff <(ids "$1") <(ids "$2") >/dev/null && echo equal || echo DIFFER; }
spec="--speculative mtp --num-draft-tokens 2"
sampled="--temperature 0.8 --top-k 50 --seed 7"
for dev in cpu cuda; do
  echo "[v4mtp] $dev: off rc=$(run off_$dev $dev) greedy rc=$(run greedy_$dev $dev $spec)" \
    "sampled rc=$(run sampled_$dev $dev $spec --draft-sampling sampled $sampled)" \
    "sampled-off rc=$(run sampled_off_$dev $dev $sampled)"
done
echo "[v4mtp] greedy: cuda spec vs cuda off $(same greedy_cuda off_cuda); cuda vs cpu $(same greedy_cuda greedy_cpu)"
# Sampled speculation is lossless in distribution, not draw for draw: only cuda vs cpu (same seed) is compared.
echo "[v4mtp] sampled: cuda vs cpu $(same sampled_cuda sampled_cpu); without speculation cuda vs cpu $(same sampled_off_cuda sampled_off_cpu)"
grep -h "^speculative:" "$out/greedy_cuda.txt" "$out/sampled_cuda.txt" | sed 's/^/[v4mtp] cuda /'
