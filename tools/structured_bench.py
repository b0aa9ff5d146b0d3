#!/usr/bin/env python3
"""Structured-output mask benchmark: the peers (xgrammar, llguidance) on the same cases as DeepInfer.

Samples maskbench schemas deterministically (every --stride-th case that has a valid instance), tokenizes the
first valid instance (compact rendering) with the reference `tokenizers` library and DeepSeek-V3's
tokenizer.json, writes the cases to --out (one JSON line: id, schema, tokens) for DeepInfer's benchmark
(tests/structured/token_mask_test.cc, DISABLED_Benchmark), and replays the same token sequences through each
peer on one thread, printing one JSON line per engine (times are process CPU time, so that a loaded shared machine
does not inflate them; wall time would include waiting for a core):

  compile_us p50/p99  - schema -> ready matcher (the vocabulary/tokenizer setup is done once, outside)
  first_mask_us p50   - the first mask of each case (lazy engines pay part of the compile here)
  mask_us p50/p99     - every later mask along the token sequence

Usage (CPU timings; see docs/PERF.md):
  python3 tools/structured_bench.py --out /tmp/structured_bench_cases.jsonl
  DEEPINFER_STRUCTURED_BENCH_CASES=/tmp/structured_bench_cases.jsonl \
    build-so/bin/deepinfer_tests --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Benchmark'
"""
import argparse
import gzip
import json
import os
import sys
import time

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def compact_json(s):
    out, in_str, esc = [], False, False
    for c in s:
        if in_str:
            out.append(c)
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif c not in " \n\r\t":
            out.append(c)
    return "".join(out)


def pct(values, p):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def summary(engine, cases, failed, rejected, compile_us, first_us, mask_us):
    return {"engine": engine, "cases": cases, "compile_failed": failed, "rejected_valid": rejected,
            "compile_us_p50": pct(compile_us, 0.5), "compile_us_p99": pct(compile_us, 0.99),
            "first_mask_us_p50": pct(first_us, 0.5), "mask_us_p50": pct(mask_us, 0.5),
            "mask_us_p99": pct(mask_us, 0.99), "masks": len(mask_us)}


def run_xgrammar(cases, tok_path, vocab, eos):
    import xgrammar as xgr
    strings = [None] * vocab
    with open(tok_path) as f:
        j = json.load(f)
    for s, i in j["model"]["vocab"].items():
        strings[i] = s
    for t in j["added_tokens"]:
        strings[t["id"]] = t["content"]
    strings = [s if s is not None else "" for s in strings]
    info = xgr.TokenizerInfo(strings, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    compile_us, first_us, mask_us, failed, rejected = [], [], [], 0, 0
    for c in cases:
        t0 = time.process_time()
        try:
            cg = compiler.compile_json_schema(json.dumps(c["schema"]), any_whitespace=True, max_whitespace_cnt=16,
                                              strict_mode=False)
            m = xgr.GrammarMatcher(cg)
        except Exception:
            failed += 1
            continue
        compile_us.append((time.process_time() - t0) * 1e6)
        for k, t in enumerate(c["tokens"]):
            a = time.process_time()
            m.fill_next_token_bitmask(bitmask)
            (first_us if k == 0 else mask_us).append((time.process_time() - a) * 1e6)
            if not m.accept_token(t):
                rejected += 1
                break
    return summary("xgrammar", len(cases), failed, rejected, compile_us, first_us, mask_us)


def run_llguidance(cases, tok_path, vocab, eos):
    import llguidance
    import llguidance.numpy as lln
    with open(tok_path) as f:
        lltok = llguidance.LLTokenizer(f.read(), n_vocab=vocab, eos_token=eos)
    bitmask = lln.allocate_token_bitmask(1, vocab)
    compile_us, first_us, mask_us, failed, rejected = [], [], [], 0, 0
    for c in cases:
        t0 = time.process_time()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(c["schema"]), defaults={"whitespace_flexible": True})
            m = llguidance.LLMatcher(lltok, grammar, log_level=0)
            if m.is_error():
                raise RuntimeError(m.get_error())
        except Exception:
            failed += 1
            continue
        compile_us.append((time.process_time() - t0) * 1e6)
        for k, t in enumerate(c["tokens"]):
            a = time.process_time()
            lln.fill_next_token_bitmask(m, bitmask, 0)
            (first_us if k == 0 else mask_us).append((time.process_time() - a) * 1e6)
            if not m.consume_token(t):
                rejected += 1
                break
    return summary("llguidance", len(cases), failed, rejected, compile_us, first_us, mask_us)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--maskbench", default=os.path.join(SHARED, "maskbench", "cases.jsonl.gz"))
    ap.add_argument("--tokenizer", default=os.path.join(SHARED, "tokenizers", "deepseek_v3", "tokenizer.json"))
    ap.add_argument("--stride", type=int, default=25)
    ap.add_argument("--out", default="/tmp/structured_bench_cases.jsonl")
    ap.add_argument("--engines", default="xgrammar,llguidance")
    args = ap.parse_args()

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.tokenizer) as f:
        j = json.load(f)
    vocab = max(max(j["model"]["vocab"].values()), max(t["id"] for t in j["added_tokens"])) + 1
    eos = tok.token_to_id("<｜end▁of▁sentence｜>")

    cases = []
    with gzip.open(args.maskbench, "rt") as f:
        for i, line in enumerate(f):
            if i % args.stride:
                continue
            c = json.loads(line)
            valid = [t for t in c["tests"] if t["valid"]]
            if not valid:
                continue
            text = compact_json(valid[0]["data"])
            ids = tok.encode(text, add_special_tokens=False).ids + [eos]
            cases.append({"id": c["id"], "schema": c["schema"], "tokens": ids})
    with open(args.out, "w") as f:
        for c in cases:
            f.write(json.dumps(c) + "\n")
    print(json.dumps({"cases_written": len(cases), "path": args.out, "vocab": vocab}), flush=True)
    for engine in [e for e in args.engines.split(",") if e]:  # --engines "" only writes the cases
        fn = {"xgrammar": run_xgrammar, "llguidance": run_llguidance}[engine]
        print(json.dumps(fn(cases, args.tokenizer, vocab, eos)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
