"""tools/ncu_engine_steps.py on hand-made ncu CSV logs: the decode step is the longest tail block that repeats the block
before it (a prefill's different launches ahead of it are not part of it), launch times keep their order and units,
and a run whose last steps differ falls back to its tail."""
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ncu_engine_steps.py"
sys.path.insert(0, str(TOOL.parent))
import ncu_engine_steps  # noqa: E402

HEADER = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'


def write(tmp_path, names, unit="nsecond", value="2,000"):
    p = tmp_path / "ncu.csv"
    lines = ["==PROF== Connected to process 1", HEADER]
    lines += [f'"{i}","{n}","gpu__time_duration.sum","{unit}","{value}"' for i, n in enumerate(names)]
    p.write_text("\n".join(lines) + "\n")
    return p


def test_the_step_is_the_repeating_tail(tmp_path):
    step = ["embedding_kernel(p)", "gemm<1>(p)", "hc_mix(p)", "gemm<1>(p)", "argmax(p)"]
    log = write(tmp_path, ["embedding_kernel(p)", "prefill_attention(p)", "gemm<2>(p)"] + step * 2)
    runs = ncu_engine_steps.launches(str(log))
    assert [n for n, _ in runs][-5:] == step and all(t == 2.0 for _, t in runs)
    assert ncu_engine_steps.step_length([n for n, _ in runs]) == 5


def test_units_scale_and_steps_that_differ_have_no_step(tmp_path):
    log = write(tmp_path, ["a(p)", "b(p)", "a(p)", "c(p)"], unit="usecond", value="3")
    runs = ncu_engine_steps.launches(str(log))
    assert runs == [("a(p)", 3.0), ("b(p)", 3.0), ("a(p)", 3.0), ("c(p)", 3.0)]
    assert ncu_engine_steps.step_length([n for n, _ in runs]) == 0
