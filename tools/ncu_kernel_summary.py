#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name (docs/PERF.md: where a decode step's GPU
time goes). Prints one line per kernel, most time first: total µs, launches, mean µs, share of the profiled total."""
import collections
import csv
import sys


def main(path: str, top: int = 40) -> None:
    total = collections.Counter()
    count = collections.Counter()
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own "==PROF==" lines are not CSV
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
        us = value * scale.get(row.get("Metric Unit", "nsecond"), 1e-3)
        name = row["Kernel Name"][:90]
        total[name] += us
        count[name] += 1
    grand = sum(total.values())
    print(f"[ncu] {sum(count.values())} kernels, {grand:.0f} us in all")
    for name, us in total.most_common(top):
        print(f"[ncu] {us:10.0f} us {count[name]:6d} x {us / count[name]:9.1f} us {100 * us / grand:5.1f}%  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
