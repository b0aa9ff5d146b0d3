"""tools/multigpu_x8.sh (#16's 8-GPU run) in its DRY_RUN=1 mode on the CPU: scaled-down V4.1 dimensions, in-process
ranks, --weight-format fp8, NGPU=4 so that it stays short; the sizing, the checkpoint and its first-layers view, the
tokens/s/GPU lines and the greedy-id comparisons against the --ep 2 reference (bit-identical on the CPU). DEEPINFER_CLI:
the deepinfer binary (skipped without it)."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "multigpu_x8.sh"


def test_dry_run_on_the_cpu(tmp_path):
    cli = os.environ.get("DEEPINFER_CLI")
    if not cli:
        pytest.skip("DEEPINFER_CLI not set")
    env = dict(os.environ, DRY_RUN="1", CLI=cli, WORK=str(tmp_path / "x8"), NGPU="4", MAX_LAYERS="6",
               REF_LAYERS="3", PREFILL="64", NUM_PREFILL="2", CONTEXT="24", BATCH="3", MAX_TOKENS="3",
               RUNS="prefill decode ref ep4 ep2dp2 ep2dp4 ep2cp2")
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert re.search(r"\[x8\] sizing: --ep 4: \d+ layers fit a GPU", out), out
    assert "cap 6 -> L=6 layers" in out, out
    assert "[x8] layers: 6 on --ep 4, comparison view 3 (v41, small dims)" in out, out
    # The view reads the first 3 layers of the same files.
    view = (tmp_path / "x8" / "view")
    assert '"num_hidden_layers": 3' in (view / "config.json").read_text()
    assert all(p.is_symlink() for p in view.glob("*.safetensors")) and list(view.glob("*.safetensors"))
    for run in ["prefill", "decode", "ref_ep2", "view_ep4", "view_ep2_dp2", "view_ep2_dp4", "view_ep2_cp2"]:
        assert re.search(rf"\[x8\] {run} \(.*\): rc=0", out), run + "\n" + out
    assert re.search(r"\[x8\]   prefill [0-9.]+ tokens/s/GPU \([0-9.]+ tok/s over 4 GPUs\)", out), out
    assert re.search(r"\[x8\]   decode [0-9.]+ tokens/s/GPU \(delivered [0-9.]+ tok/s over 2 GPUs\)", out), out
    for layout in ["view_ep4", "view_ep2_dp2", "view_ep2_dp4", "view_ep2_cp2"]:
        assert f"[x8] greedy ids {layout} vs ref_ep2: 3 of 3 sequences identical" in out, layout + "\n" + out
    assert "kept quantized on every rank" in (tmp_path / "x8" / "logs" / "view_ep4.log").read_text()
