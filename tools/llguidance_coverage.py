#!/usr/bin/env python3
"""llguidance on the maskbench cases, scored like `deepinfer structured-check` / tools/structured_sweep.py.

For each case: compile the schema with llguidance (`LLMatcher.grammar_from_json_schema` + `validate_grammar`; an
error counts as unsupported), then feed each instance's compact rendering (whitespace outside strings removed, as
structured-check does) token by token with the DeepSeek-V3 tokenizer: accepted = every token consumed and the
matcher accepting at the end. Prints per-split and total counts (JSON lines) and a Markdown table.

  python3 tools/llguidance_coverage.py --cases ../shared/data/maskbench/cases.jsonl.gz \\
      --tokenizer ../shared/data/tokenizers/deepseek_v3/tokenizer.json [--whitespace-flexible]
"""
import argparse
import collections
import gzip
import json
import os
import sys
import time

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def compact_json(s):
    """All whitespace outside string literals removed (structured_check_cmd.cc's compact_json)."""
    out, in_str, esc = [], False, False
    for ch in s:
        if in_str:
            out.append(ch)
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif ch not in " \t\n\r":
            out.append(ch)
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=os.path.join(SHARED, "maskbench", "cases.jsonl.gz"))
    ap.add_argument("--tokenizer", default=os.path.join(SHARED, "tokenizers", "deepseek_v3", "tokenizer.json"))
    ap.add_argument("--whitespace-flexible", action="store_true",
                    help="llguidance's flexible whitespace (default: its compact default, like the compact rendering)")
    ap.add_argument("--no-instances", action="store_true", help="compile only")
    ap.add_argument("--stride", type=int, default=1)
    args = ap.parse_args()
    import llguidance

    with open(args.tokenizer) as f:
        text = f.read()
    j = json.loads(text)
    vocab = max(max(j["model"]["vocab"].values()), max(t["id"] for t in j["added_tokens"])) + 1
    eos = next(t["id"] for t in j["added_tokens"] if t["content"] == "<｜end▁of▁sentence｜>")
    lltok = llguidance.LLTokenizer(text, n_vocab=vocab, eos_token=eos)
    opener = gzip.open if args.cases.endswith(".gz") else open
    with opener(args.cases, "rt") as f:
        cases = [json.loads(line) for line in f if line.strip()][::args.stride]
    keys = ["cases", "compiled", "unsupported", "valid", "valid_accepted", "invalid", "invalid_rejected",
            "invalid_accepted"]
    per = collections.defaultdict(lambda: dict.fromkeys(keys, 0))
    defaults = {"whitespace_flexible": True} if args.whitespace_flexible else None
    t0 = time.time()
    for c in cases:
        split = c.get("split", c["id"].split("---")[0])
        rows = [per[split], per["total"]]
        for a in rows:
            a["cases"] += 1
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(c["schema"]), defaults=defaults)
            err = llguidance.LLMatcher.validate_grammar(grammar)
        except Exception as e:  # noqa: BLE001 - any failure to build the grammar is "unsupported"
            err = str(e) or "error"
        if err:
            for a in rows:
                a["unsupported"] += 1
            continue
        for a in rows:
            a["compiled"] += 1
        if args.no_instances:
            continue
        for t in c["tests"]:
            m = llguidance.LLMatcher(lltok, grammar, log_level=0)
            ok = not m.is_error()
            if ok:
                for tok in lltok.tokenize_str(compact_json(t["data"])):
                    if not m.consume_token(tok):
                        ok = False
                        break
                ok = ok and m.is_accepting()
            for a in rows:
                if t["valid"]:
                    a["valid"] += 1
                    a["valid_accepted"] += ok
                else:
                    a["invalid"] += 1
                    a["invalid_rejected"] += not ok
                    a["invalid_accepted"] += ok
    order = sorted(s for s in per if s != "total") + ["total"]
    for s in order:
        print(json.dumps({"split": s, **per[s]}))
    print(json.dumps({
    "wall_s" : round(time.time() - t0, 1),
               "llguidance" : llguidance.__version__ if hasattr (llguidance, "__version__") else "?",
               "whitespace_flexible" : args.whitespace_flexible}))
    print("| split | cases | compiled | unsupported | valid accepted (compact) | invalid rejected |")
    print("|:--|--:|--:|--:|--:|--:|")
    for s in order:
        a = per[s]
        print(f"| {s} | {a['cases']} | {a['compiled']} | {a['unsupported']} | {a['valid_accepted']} / {a['valid']} | "
              f"{a['invalid_rejected']} / {a['invalid']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
