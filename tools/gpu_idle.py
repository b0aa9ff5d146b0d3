#!/usr/bin/env python3
"""GPU idle time from an nsys `cuda_gpu_trace` CSV (docs/PERF.md, issue #7's "GPU idle between decode steps"): the
union of kernel / memcpy / memset intervals over a window of the run, and the gaps between them. The window skips
the first WARMUP fraction of the GPU timeline (model load, prefill, first recordings), so a decode-heavy run
measures its decode steps. Prints one [gpu-idle] line: window length, busy time, idle share, gap count and the
largest / median gaps."""
import argparse
import csv
import statistics


def intervals(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if line.strip() and not line.startswith("NOTICE")))
    if not rows:
        return []
    start_key = next(k for k in rows[0] if k.startswith("Start"))
    dur_key = next(k for k in rows[0] if k.startswith("Duration"))
    out = []
    for r in rows:
        try:
            s, d = float(r[start_key]), float(r[dur_key])
        except (TypeError, ValueError):
            continue
        out.append((s, s + d))
    return sorted(out)


def idle_report(spans, warmup):
    """(window ns, busy ns, gaps ns list) over the part of the timeline after `warmup` of it."""
    if not spans:
        return 0.0, 0.0, []
    t0, t1 = spans[0][0], max(e for _, e in spans)
    lo = t0 + warmup * (t1 - t0)
    busy, gaps, cur_s, cur_e = 0.0, [], None, None
    for s, e in spans:
        if e <= lo:
            continue
        s = max(s, lo)
        if cur_e is None:
            cur_s, cur_e = s, e
        elif s > cur_e:
            busy += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return t1 - lo, busy, gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--label", default="")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the GPU timeline skipped")
    a = ap.parse_args()
    window, busy, gaps = idle_report(intervals(a.csv), a.warmup)
    if window <= 0:
        print(f"[gpu-idle] {a.label}: no GPU activity in {a.csv}")
        return
    big = sorted(gaps)[-3:][::-1]
    med = statistics.median(gaps) if gaps else 0.0
    print(f"[gpu-idle] {a.label}: window {window / 1e6:.2f} ms, busy {busy / 1e6:.2f} ms, idle {100 * (1 - busy / window):.1f}%, "
          f"{len(gaps)} gaps (median {med / 1e3:.1f} us, largest {', '.join(f'{g / 1e3:.0f}' for g in big)} us)")


if __name__ == "__main__":
    main()
