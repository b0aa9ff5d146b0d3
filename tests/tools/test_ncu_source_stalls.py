"""tools/ncu_source_stalls.py on a hand-made ncu source-page CSV: ncu's log lines and the kernel-name line are
skipped, samples sum per stall reason and per opcode (predicates and modifiers stripped), the busiest instructions
come first with their leading reasons, and a log without the source table is refused."""
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ncu_source_stalls.py"
sys.path.insert(0, str(TOOL.parent))
import ncu_source_stalls  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_short_sb",
          "stall_wait", "stall_barrier", "stall_short_sb (Not Issued)"]


def write(tmp_path, rows):
    p = tmp_path / "src.csv"
    lines = ["==PROF== Connected to process 7", '"Kernel Name","void k(int)",']
    lines.append(",".join(f'"{h}"' for h in HEADER))
    lines += [",".join(f'"{v}"' for v in r) for r in rows]
    p.write_text("\n".join(lines) + "\n")
    return p


ROWS = [("0x0", "LDSM.16.M88.4 R4, [R2]", "10", "1,000", "0", "10", "0", "0"),
        ("0x10", "HMMA.16816.F32.BF16 R8, R4, R6, R8", "60", "2000", "50", "10", "0", "40"),
        ("0x20", "@!P0 HMMA.16816.F32.BF16 R12, R4, R6, R12", "20", "2000", "5", "15", "0", "5"),
        ("0x30", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "10", "100", "0", "0", "10", "0")]


def test_reasons_opcodes_and_top_lines(tmp_path):
    total, by_reason, by_op, ex_op, lines = ncu_source_stalls.summarize(str(write(tmp_path, ROWS)))
    assert total == 100
    assert by_reason == {"short_sb": 55, "wait": 35, "barrier": 10}  # the Not Issued column is not a reason
    assert by_op["HMMA"] == 80 and by_op["LDSM"] == 10 and by_op["BAR"] == 10
    assert ex_op["HMMA"] == 4000 and ex_op["LDSM"] == 1000
    out = subprocess.run([sys.executable, str(TOOL), str(write(tmp_path, ROWS)), "2"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[stalls] 100 samples over 4 instructions"
    assert out[1] == "[stalls] reasons: short_sb 55.0%, wait 35.0%, barrier 10.0%"
    assert out[2].startswith("[stalls] HMMA") and "samples  80.0%" in out[2] and "executed 78.4%" in out[2]
    tops = [line for line in out if line.startswith("[stalls] #")]
    assert len(tops) == 2
    assert tops[0].startswith("[stalls] #1 ") and "60.0%" in tops[0] and tops[0].endswith("short_sb=50 wait=10")
    assert tops[1].startswith("[stalls] #2 ") and tops[1].endswith("wait=15 short_sb=5")


def test_log_without_source_table_is_refused(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("==PROF== nothing profiled\n")
    with pytest.raises(SystemExit, match="no ncu source table"):
        ncu_source_stalls.summarize(str(p))
