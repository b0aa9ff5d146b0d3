#!/usr/bin/env python3
"""Full maskbench sweep: `deepinfer structured-check` over every case, in parallel shards, with a per-case watchdog.

Cases are dealt round-robin to --jobs shards; each shard runs one `deepinfer structured-check` process. A case
that prints nothing for --case-timeout seconds (or a process that dies) is recorded as `timeout` / `crashed` and
the shard restarts after it, so one pathological schema cannot hide the rest. Prints one summary line per split and
a total (JSON), and a Markdown table; writes every case line to OUT/cases.jsonl.

Verdicts (as structured-check): a case is `compiled` or an error (`Unsupported` = unsupported keyword/construct);
per instance: valid accepted (compact rendering), valid accepted verbatim, invalid rejected. `invalid_accepted`
must be 0 (soundness); `mask_mismatches` (with --tokenizer) must be 0.

  python3 tools/structured_sweep.py --cli build/bin/deepinfer --cases ../shared/data/maskbench/cases.jsonl.gz \\
      --jobs 16 --out /tmp/sweep
"""
import argparse
import collections
import gzip
import json
import os
import select
import subprocess
import sys
import threading
import time


def read_cases(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [line for line in f if line.strip()]


def run_shard(cli, lines, ids, extra, timeout, deadline, workdir, k, results):
    """Runs structured-check over `lines`, restarting after a case that hangs or crashes; stops at `deadline`."""
    pos = 0
    while pos < len(lines) and time.time() < deadline:
        path = os.path.join(workdir, f"shard{k}.jsonl")
        with open(path, "w") as f:
            f.writelines(lines[pos:])
        p = subprocess.Popen([cli, "structured-check", "--cases", path] + extra, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, bufsize=1)
        last = time.time()
        buf = ""
        hung = False
        while True:
            r, _, _ = select.select([p.stdout], [], [], 1.0)
            if r:
                chunk = os.read(p.stdout.fileno(), 1 << 16).decode("utf-8", "replace")
                if not chunk:
                    break
                buf += chunk
                while "\n" in buf:
                    line, buf = buf.split("\n", 1)
                    if not line.strip():
                        continue
                    j = json.loads(line)
                    if j.get("summary"):
                        continue
                    j["id"] = ids[pos]  # the CLI names cases by id; keep ours in case of duplicates
                    results.append(j)
                    pos += 1
                    last = time.time()
            elif time.time() - last > timeout:
                hung = True
                p.kill()
                break
            if time.time() > deadline:
                p.kill()
                break
        p.wait()
        if time.time() > deadline:
            break
        if pos < len(lines) and (hung or p.returncode not in (0, 1)):
            results.append({"id": ids[pos], "compiled": False, "code": "timeout" if hung else "crashed",
                            "error": f"no result within {timeout} s" if hung else f"exit code {p.returncode}"})
            pos += 1
        elif pos < len(lines):
            break  # the process ended normally without finishing: should not happen; stop this shard


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/bin/deepinfer")
    ap.add_argument("--cases", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--case-timeout", type=float, default=60.0)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--stride", type=int, default=1, help="every N-th case only")
    ap.add_argument("--deadline", type=float, default=0, help="stop after this many seconds (0: none); the "
                    "summary then covers the cases that finished")
    ap.add_argument("--out", default="/tmp/structured_sweep")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = read_cases(args.cases)[::args.stride]
    meta = [json.loads(l) for l in lines]
    ids = [m["id"] for m in meta]
    split_of = {m["id"]: m.get("split", m["id"].split("---")[0]) for m in meta}
    extra = ["--tokenizer", args.tokenizer] if args.tokenizer else []
    results = []
    threads = []
    t0 = time.time()
    deadline = t0 + args.deadline if args.deadline > 0 else float("inf")
    for k in range(args.jobs):
        idx = list(range(k, len(lines), args.jobs))
        t = threading.Thread(target=run_shard, args=(args.cli, [lines[i] for i in idx], [ids[i] for i in idx], extra,
                                                     args.case_timeout, deadline, args.out, k, results))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    wall = time.time() - t0
    results.sort(key=lambda j: j["id"])
    with open(os.path.join(args.out, "cases.jsonl"), "w") as f:
        for j in results:
            f.write(json.dumps(j) + "\n")

    keys = ["cases", "compiled", "unsupported", "invalid_schema", "timeout", "other_errors", "valid", "valid_accepted",
            "valid_verbatim_accepted", "invalid", "invalid_rejected", "invalid_accepted", "token_checked",
            "token_accepted", "mask_mismatches"]
    per = collections.defaultdict(lambda: dict.fromkeys(keys, 0))
    for j in results:
        for s in (split_of[j["id"]], "total"):
            a = per[s]
            a["cases"] += 1
            if j.get("compiled"):
                a["compiled"] += 1
            else:
                code = j.get("code", "")
                a["unsupported" if code == "Unsupported" else "invalid_schema" if code == "InvalidArgument" else
                  "timeout" if code in ("timeout", "crashed") else "other_errors"] += 1
            for r in j.get("instances", []):
                if r["valid"]:
                    a["valid"] += 1
                    a["valid_accepted"] += r["accepted"]
                    a["valid_verbatim_accepted"] += r["accepted_verbatim"]
                else:
                    a["invalid"] += 1
                    a["invalid_rejected"] += not r["accepted"]
                    a["invalid_accepted"] += r["accepted"]
                if "accepted_tokens" in r:
                    a["token_checked"] += 1
                    a["token_accepted"] += r["accepted_tokens"]
            a["mask_mismatches"] += j.get("mask_mismatches", 0)
    order = sorted(s for s in per if s != "total") + ["total"]
    for s in order:
        print(json.dumps({"split": s, **per[s]}))
    print(json.dumps({"wall_s": round(wall, 1), "jobs": args.jobs, "cases_selected": len(lines),
                      "cases_finished": len(results)}))
    print("| split | cases | compiled | unsupported | other errors | valid accepted (compact) | valid accepted "
          "(verbatim) | invalid rejected |")
    print("|:--|--:|--:|--:|--:|--:|--:|--:|")
    for s in order:
        a = per[s]
        errs = a["invalid_schema"] + a["timeout"] + a["other_errors"]
        print(f"| {s} | {a['cases']} | {a['compiled']} | {a['unsupported']} | {errs} | {a['valid_accepted']} / "
              f"{a['valid']} | {a['valid_verbatim_accepted']} / {a['valid']} | {a['invalid_rejected']} / "
              f"{a['invalid']} |")
    return 1 if per["total"]["invalid_accepted"] or per["total"]["mask_mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
