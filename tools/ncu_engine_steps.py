#!/usr/bin/env python3
"""One engine decode step's kernels from an ncu log of a short engine run (tools/ncu_engine_step.sh): the run's last
decode steps launch the same kernels in the same order, so the step is the longest tail block that repeats the block
before it. Prints the step's launches in order (cold µs each, as ncu times them) and the same summed per kernel name."""
import collections
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ncu_kernel_summary import TIME, TIME_SCALE, csv_rows  # noqa: E402


def launches(path):
    """(kernel name, µs) in launch order."""
    out = []
    for row in csv_rows(path):
        if row.get("Metric Name") == TIME:
            value = float(row["Metric Value"].replace(",", ""))
            out.append((row["Kernel Name"], value * TIME_SCALE.get(row.get("Metric Unit", "nsecond"), 1e-3)))
    return out


def step_length(names):
    """The largest n with names[-n:] == names[-2n:-n] (0 if none)."""
    for n in range(len(names) // 2, 0, -1):
        if names[-n:] == names[-2 * n:-n]:
            return n
    return 0


def main(path):
    runs = launches(path)
    names = [n for n, _ in runs]
    n = step_length(names)
    print(f"[ncu-engine] {len(runs)} launches in the run; one decode step: {n} launches")
    if n < 20:  # steps that differ (e.g. a compressor's pooling every r tokens): the run's tail instead
        n = min(len(runs), 400)
        print(f"[ncu-engine] no repeating step: the last {n} launches")
    step = runs[-n:]
    total = sum(t for _, t in step)
    print(f"[ncu-engine] step: {total:.1f} us of kernels (cold, serialised)")
    for i, (name, t) in enumerate(step):
        print(f"[ncu-engine] {i:4d} {t:9.1f} us  {name[:110]}")
    us, count = collections.Counter(), collections.Counter()
    for name, t in step:
        short = name.split("(")[0][:90]
        us[short] += t
        count[short] += 1
    for name, t in us.most_common():
        print(f"[ncu-engine] sum {t:9.1f} us {count[name]:4d} x {100 * t / total:5.1f}%  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
