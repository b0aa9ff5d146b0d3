"""tools/ncu_kernel_summary.py on hand-made ncu CSV logs: launches of one kernel name sum, units scale, the DRAM byte
columns and their rate appear only when the log has those metrics, and ncu's own non-CSV lines are skipped."""
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ncu_kernel_summary.py"
sys.path.insert(0, str(TOOL.parent))
import ncu_kernel_summary  # noqa: E402

HEADER = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'


def write(tmp_path, rows):
    p = tmp_path / "ncu.csv"
    lines = ["==PROF== Connected to process 1", HEADER]
    lines += [f'"{i}","{name}","{metric}","{unit}","{value}"' for i, name, metric, unit, value in rows]
    p.write_text("\n".join(lines) + "\n")
    return p


def test_time_sums_per_name_and_scales_units(tmp_path):
    log = write(tmp_path, [(0, "dequant", "gpu__time_duration.sum", "nsecond", "10,000"),
                           (1, "dequant", "gpu__time_duration.sum", "usecond", "6"),
                           (2, "gemm", "gpu__time_duration.sum", "msecond", "0.5"),
                           (2, "gemm", "sm__cycles_elapsed.avg", "cycle", "7")])
    us, count, rd, wr, has_bytes = ncu_kernel_summary.summarize(str(log))
    assert us["dequant"] == 16.0 and count["dequant"] == 2
    assert us["gemm"] == 500.0 and count["gemm"] == 1
    assert not has_bytes and not rd and not wr


def test_bytes_and_rate_columns(tmp_path):
    log = write(tmp_path, [(0, "dequant", "gpu__time_duration.sum", "usecond", "10"),
                           (0, "dequant", "dram__bytes_read.sum", "byte", "4000000"),
                           (0, "dequant", "dram__bytes_write.sum", "Mbyte", "8"),
                           (1, "gemm", "gpu__time_duration.sum", "usecond", "30"),
                           (1, "gemm", "dram__bytes_read.sum", "byte", "3000000")])
    us, count, rd, wr, has_bytes = ncu_kernel_summary.summarize(str(log))
    assert has_bytes and rd["dequant"] == 4e6 and wr["dequant"] == 8e6 and wr["gemm"] == 0
    out = subprocess.run([sys.executable, str(TOOL), str(log)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "[ncu] 2 kernels, 40 us in all"
    assert lines[1].split()[-1] == "gemm" and "rd       3.0 MB" in lines[1] and "100 GB/s" in lines[1]
    assert lines[2].split()[-1] == "dequant" and "wr       8.0 MB" in lines[2] and "1200 GB/s" in lines[2]


def test_time_only_log_prints_no_byte_columns(tmp_path):
    log = write(tmp_path, [(0, "k", "gpu__time_duration.sum", "usecond", "5")])
    out = subprocess.run([sys.executable, str(TOOL), str(log)], capture_output=True, text=True, check=True).stdout
    assert "GB/s" not in out and out.splitlines()[1].endswith("  k")
