#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum[,dram__bytes_read.sum,dram__bytes_write.sum]` log per kernel
name (docs/PERF.md: where a decode step's GPU time goes). Prints one line per kernel, most time first: total µs,
launches, mean µs, share of the profiled total; with the DRAM byte metrics in the log also the MB read and written and
the rate they make over the kernel's time (to hold against the copy rate)."""
import collections
import csv
import sys

TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
TIME_SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}
BYTE_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def csv_rows(path: str):
    """The log's metric rows (dicts by column), in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own "==PROF==" lines are not CSV
    return csv.DictReader(lines)


def summarize(path: str):
    """(us, launches, read bytes, written bytes) per kernel name (90 characters), and whether any bytes were logged."""
    us = collections.Counter()
    count = collections.Counter()
    rd = collections.Counter()
    wr = collections.Counter()
    has_bytes = False
    for row in csv_rows(path):
        metric = row.get("Metric Name")
        if metric not in (TIME, READ, WRITE):
            continue
        value = float(row["Metric Value"].replace(",", ""))
        name = row["Kernel Name"][:90]
        if metric == TIME:
            us[name] += value * TIME_SCALE.get(row.get("Metric Unit", "nsecond"), 1e-3)
            count[name] += 1
        else:
            has_bytes = True
            (rd if metric == READ else wr)[name] += value * BYTE_SCALE.get(row.get("Metric Unit", "byte"), 1.0)
    return us, count, rd, wr, has_bytes


def main(path: str, top: int = 40) -> None:
    us, count, rd, wr, has_bytes = summarize(path)
    grand = sum(us.values())
    print(f"[ncu] {sum(count.values())} kernels, {grand:.0f} us in all")
    for name, t in us.most_common(top):
        line = f"[ncu] {t:10.0f} us {count[name]:6d} x {t / count[name]:9.1f} us {100 * t / grand:5.1f}%"
        if has_bytes:
            rate = (rd[name] + wr[name]) / (t * 1e3) if t > 0 else 0.0  # bytes / ns = GB/s
            line += f"  rd {rd[name] / 1e6:9.1f} MB wr {wr[name] / 1e6:9.1f} MB {rate:7.0f} GB/s"
        print(f"{line}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
