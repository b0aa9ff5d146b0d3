"""tools/gpu_idle.py on hand-made nsys cuda_gpu_trace tables: overlapping intervals merge, gaps are counted after
the warm-up fraction only, and the idle share is what the intervals say."""
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_idle.py"
sys.path.insert(0, str(TOOL.parent))
import gpu_idle  # noqa: E402


def write(tmp_path, rows):
    p = tmp_path / "trace.csv"
    lines = ['"Start (ns)","Duration (ns)","CorrId","Name"']
    lines += [f'"{s}","{d}","{i}","kernel_{i}"' for i, (s, d) in enumerate(rows)]
    p.write_text("\n".join(lines) + "\n")
    return p


def test_overlaps_merge_and_gaps_count(tmp_path):
    # busy [0,100) [90,200) -> [0,200); gap 50; [250,300); gap 100; [400,500)
    spans = gpu_idle.intervals(write(tmp_path, [(0, 100), (90, 110), (250, 50), (400, 100)]))
    window, busy, gaps = gpu_idle.idle_report(spans, 0.0)
    assert window == 500 and busy == 350 and sorted(gaps) == [50, 100]


def test_warmup_skips_the_start(tmp_path):
    spans = gpu_idle.intervals(write(tmp_path, [(0, 10), (500, 100), (700, 100), (900, 100)]))
    window, busy, gaps = gpu_idle.idle_report(spans, 0.5)  # window from t = 500
    assert window == 500 and busy == 300 and gaps == [100, 100]


def test_cli_line(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL), str(write(tmp_path, [(0, 900), (1000, 1000)])), "--label", "x",
                          "--warmup", "0"], capture_output=True, text=True, check=True).stdout
    assert "[gpu-idle] x:" in out and "idle 5.0%" in out and "1 gaps" in out
