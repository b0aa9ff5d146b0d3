#!/usr/bin/env python3
"""Where a kernel's warps wait, from ncu's source page (`ncu --section SourceCounters --page source --print-source sass
--csv`, one kernel launch): the stall reasons over all samples, the executed and sampled share of each opcode, and
the instructions with the most samples, each with its leading stall reasons.

    python3 tools/ncu_source_stalls.py ncu_src.csv [TOP]

Session 34 read the paged MLA attend step and the MLA flash kernel this way (docs/PERF.md): ncu's summary sections
name the stall reasons, this names the instructions that hold them."""
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _int(text):
    text = (text or "").replace(",", "").strip()
    return int(text) if text and text.lstrip("-").isdigit() else 0


def load(path):
    """The header and rows of the source table (ncu's log lines and the kernel-name line before it skipped)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Address" and "Source" in r]
    if not starts:
        raise SystemExit(f"{path}: no ncu source table (a header row starting with \"Address\", \"Source\")")
    header = rows[starts[0]]
    data = [r for r in rows[starts[0] + 1:] if len(r) == len(header)]
    return header, data


def opcode(source):
    """The opcode of a SASS line without its predicate and modifiers: `@!P0 HMMA.16816.F32.BF16 ...` -> HMMA."""
    text = re.sub(r"^@!?U?P[T0-9]+\s+", "", source.strip())
    return text.split(" ")[0].split(".")[0]


def summarize(path):
    header, data = load(path)
    col = {h: i for i, h in enumerate(header)}
    if SAMPLES not in col:
        raise SystemExit(f"{path}: no '{SAMPLES}' column (collect with --section SourceCounters)")
    reasons = [h for h in header if h.startswith("stall_") and not h.endswith("(Not Issued)")]
    total = sum(_int(r[col[SAMPLES]]) for r in data)
    by_reason = collections.Counter({h[len("stall_"):]: sum(_int(r[col[h]]) for r in data) for h in reasons})
    by_op, ex_op = collections.Counter(), collections.Counter()
    for r in data:
        op = opcode(r[col["Source"]])
        by_op[op] += _int(r[col[SAMPLES]])
        if EXECUTED in col:
            ex_op[op] += _int(r[col[EXECUTED]])
    lines = []
    for i, r in enumerate(data):
        n = _int(r[col[SAMPLES]])
        top = sorted(((_int(r[col[h]]), h[len("stall_"):]) for h in reasons), reverse=True)
        lines.append((n, i, r[col["Source"]].strip(), [(k, v) for v, k in top if v > 0][:3]))
    return total, by_reason, by_op, ex_op, lines


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    top = int(argv[2]) if len(argv) > 2 else 20
    total, by_reason, by_op, ex_op, lines = summarize(argv[1])
    executed = sum(ex_op.values())
    print(f"[stalls] {total} samples over {len(lines)} instructions")
    if total == 0:
        return
    print("[stalls] reasons: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common() if v))
    for op, n in by_op.most_common(12):
        share = f", executed {100 * ex_op[op] / executed:.1f}%" if executed else ""
        print(f"[stalls] {op:<8} samples {100 * n / total:5.1f}%{share}")
    for n, i, source, why in sorted(lines, key=lambda x: (-x[0], x[1]))[:top]:
        detail = " ".join(f"{k}={v}" for k, v in why)
        print(f"[stalls] #{i:<5} {100 * n / total:5.1f}%  {source[:64]:<64} {detail}")


if __name__ == "__main__":
    main(sys.argv)
