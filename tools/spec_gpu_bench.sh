#!/usr/bin/env bash
# MTP speculative decoding on the GPU (device tool, after `tools/device_check.sh ci` built build-gpu): the tiny
# model, batch 1/8/64, speculation off vs K = 1, 2 drafts; greedy ids compared with the off run. PROMPTS: the
# held-out id lines of `tools/tiny_model_eval.py spec-prompts` (docs/PERF.md). Writes $OUT/spec_b*_k*.txt.
set -u
B=build-gpu/bin/deepinfer
for b in 1 8 64; do
  N=96; [ $b = 64 ] && N=48
  P=$(head -n $b "${PROMPTS:?PROMPTS: id lines, one prompt per line}" | sed 's/^/--prompt-ids /' | tr '\n' ' ')
  for k in off 1 2; do
    extra=""; [ $k != off ] && extra="--speculative mtp --num-draft-tokens $k"
    f=$OUT/spec_b${b}_k$k.txt
    $B offline $P --max-tokens $N --ignore-eos --max_num_seqs $b --device cuda $extra > $f 2>&1
    rc=$?
    same=""; [ $k != off ] && { diff <(grep "  ids:" $OUT/spec_b${b}_koff.txt) <(grep "  ids:" $f) >/dev/null && same="ids==off" || same="IDS DIFFER"; }
    echo "b=$b k=$k rc=$rc $same | $(grep -E '^speculative:' $f | cut -c1-200) | $(grep -E '^offline:' $f)"
  done
done
