"""tools/peer_transformers_v4.py (the transformers peer of `deepinfer bench`'s V4-Flash slice) on tiny dimensions on
the CPU, its cache tiling against a real batched prefill, and tools/peer_join.py on a hand-made bench log.

The peer tests skip (with the reason) where torch or a transformers with DeepseekV4 is not importable."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, TOOLS)

import peer_join  # noqa: E402


def _peer_missing():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    try:
        import transformers  # noqa: F401
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer here
        return f"transformers with DeepseekV4 is not importable: {type(e).__name__}: {e}"
    return None


PEER_MISSING = _peer_missing()
needs_peer = pytest.mark.skipif(PEER_MISSING is not None, reason=PEER_MISSING or "")

# format_table / format_breakdown / format_graphs of src/deepinfer/bench/bench_runner.cc, two slices.
BENCH_LOG = """target: NVIDIA H200
ceilings (measured in this run): HBM copy 4.26 TB/s; bf16 GEMM 780 TFLOP/s
slice V4.1-Flash: 5 layers (swa r=0, indexed r=2, reuse r=2, indexed r=1, reuse r=1)
model       phase    batch  context  tokens/s      step ms   FLOP/step   bytes/step  FLOP/s      B/s        of-gemm  of-copy  bound
V4.1-Flash  prefill      1     1024  9.42 K         108.700  4.14 T      37 GB       38.1 T      340 G         4.9%     8.0%  flop 12.5x floor
V4.1-Flash  decode       1     1024  241            4.157  4.16 G      1.45 GB     1 T         349 G         0.1%     8.2%  byte 12.2x floor
slice V4-Flash: 3 layers (swa r=0, indexed r=4, all-seen r=128)
model       phase    batch  context  tokens/s      step ms   FLOP/step   bytes/step  FLOP/s      B/s        of-gemm  of-copy  bound
V4-Flash    prefill      1     1024  29 K            35.360  1.84 T      10.7 GB     52 T        303 G         6.7%     7.1%  flop 14.1x floor
V4-Flash    prefill      1     4096  31.3 K         130.800  7.53 T      10.7 GB     57.6 T      82 G          7.4%     1.9%  flop 13.6x floor
V4-Flash    decode       1     1024  493            2.027  1.82 G      669 MB      898 G       330 G         0.1%     7.7%  byte 12.9x floor
V4-Flash    decode      16     1024  1.29 K         12.440  29.1 G      3.69 GB     2.34 T      297 G         0.3%     7.0%  byte 14.3x floor
breakdown (ms of one profiled step; events between op groups):
model       phase    batch  context      mHC+norm   q/kv/o proj       indexer     attention        router       experts  attn-bytes  attn-B/s
V4-Flash    prefill      1     1024         2.030         2.210         1.000         3.750         0.100        26.600  1 GB  1 TB/s
V4-Flash    decode       1     1024         0.438         0.590         0.050         0.099         0.010         0.830  1 MB  1 GB/s
decode step as a CUDA graph (eager ms, replay ms, speed-up; output check):
V4-Flash    batch    1 context   1024  eager     2.027  graph     1.878   1.08x  replay vs eager: 0 of 16384 values differ (max |d| 0)
V4-Flash    batch   16 context   1024  eager    12.440  graph    12.240   1.02x  replay vs eager: 0 of 16384 values differ (max |d| 0)
decode as the reference reports it (avg_SPS = 1 / median step; no drafts in the bench: delivered = full-acceptance, draft length 0):
V4-Flash    batch    1 context   1024  avg_SPS    493.34 steps/s  delivered       493.3 tokens/s  full-acceptance       493.3 tokens/s
"""

PEER_LOG = "\n".join(json.dumps(x) for x in [
    {"kind": "config", "transformers": "5.17.0", "torch": "2.11.0", "device": "NVIDIA H200",
     "attn_implementation": "eager", "experts_implementation": "grouped_mm", "dtype": "bf16", "timed": "decoder"},
    {"kind": "row", "phase": "prefill", "batch": 1, "context": 1024, "tokens": 1024, "step_ms": 102.4,
     "tokens_per_s": 10000.0},
    {"kind": "row", "phase": "prefill", "batch": 1, "context": 4096, "tokens": 4096, "error": "OOM: out of memory"},
    {"kind": "row", "phase": "decode", "batch": 1, "context": 1024, "tokens": 1, "step_ms": 20.0,
     "tokens_per_s": 50.0},
    {"kind": "row", "phase": "decode", "batch": 64, "context": 1024, "tokens": 64, "step_ms": 100.0,
     "tokens_per_s": 640.0},
]) + "\n"


def test_join_reads_only_the_slice_table_and_computes_speedups():
    ours = peer_join.parse_ours(BENCH_LOG, "V4-Flash")
    # Two prefill + two decode rows of V4-Flash; the V4.1 rows and the breakdown table are not rows.
    assert sorted(ours) == [("decode", 1, 1024), ("decode", 16, 1024), ("prefill", 1, 1024), ("prefill", 1, 4096)]
    assert ours[("prefill", 1, 1024)]["tokens_per_s"] == pytest.approx(1024 / 0.03536)
    assert ours[("decode", 16, 1024)]["tokens_per_s"] == pytest.approx(16 / 0.01244)
    assert ours[("decode", 1, 1024)]["graph_tokens_per_s"] == pytest.approx(1 / 0.001878)
    assert "graph_ms" not in ours[("prefill", 1, 1024)]
    config, peer = peer_join.parse_peer(PEER_LOG)
    assert config["attn_implementation"] == "eager"
    rows = {(r["phase"], r["batch"], r["context"]): r for r in peer_join.join(ours, peer)}
    # 1024 tokens in 35.36 ms vs 10,000 tokens/s.
    assert rows[("prefill", 1, 1024)]["speedup"] == pytest.approx(1024 / 0.03536 / 10000.0)
    assert rows[("prefill", 1, 4096)]["peer_error"].startswith("OOM")
    assert "speedup" not in rows[("prefill", 1, 4096)]
    assert rows[("decode", 1, 1024)]["speedup"] == pytest.approx((1 / 0.002027) / 50.0)
    assert rows[("decode", 1, 1024)]["speedup_graph"] == pytest.approx((1 / 0.001878) / 50.0)
    assert "peer_step_ms" not in rows[("decode", 16, 1024)]  # ours only
    assert "ours_step_ms" not in rows[("decode", 64, 1024)]  # peer only
    table = peer_join.markdown(list(rows.values()), config)
    assert "peer failed: OOM" in table and "transformers 5.17.0" in table


def test_join_cli_fails_clearly_without_rows(tmp_path):
    ours, peer = tmp_path / "ours.log", tmp_path / "peer.jsonl"
    ours.write_text("no table here\n")
    peer.write_text("\n")
    r = subprocess.run([sys.executable, os.path.join(TOOLS, "peer_join.py"), "--ours", str(ours), "--peer", str(peer)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no V4-Flash rows" in r.stderr


@needs_peer
def test_peer_tiny_cpu_prints_consistent_rows():
    r = subprocess.run([sys.executable, os.path.join(TOOLS, "peer_transformers_v4.py"), "--tiny", "--device", "cpu",
                        "--prompt", "24", "--batch", "1", "--batch", "3", "--context", "20", "--seed-batch", "2",
                        "--warmup", "0", "--iters", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    config = lines[0]
    assert config["kind"] == "config" and config["slice"] == "tiny"
    assert config["layer_types"] == ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    assert config["attn_implementation"] in ("sdpa", "eager")
    # Every refused implementation says why.
    assert all(x["error"] for x in config["refused"])
    rows = [x for x in lines if x["kind"] == "row"]
    assert [(x["phase"], x["batch"], x["context"]) for x in rows] == [
        ("prefill", 1, 24), ("decode", 1, 20), ("decode", 3, 20)]
    for x in rows:
        assert "error" not in x, x
        assert len(x["steps_ms"]) == 2 and x["step_ms"] > 0
        assert x["tokens_per_s"] == pytest.approx(x["tokens"] / (x["step_ms"] / 1000.0), rel=1e-3)
    assert rows[2]["seeded_sequences"] == 2  # batch 3 tiled from 2 prefilled sequences


@needs_peer
def test_tiled_cache_decodes_like_a_real_batched_prefill():
    import torch

    import peer_transformers_v4 as peer

    torch.manual_seed(0)
    model = peer.build(peer.make_config(peer.TINY), "cpu", "eager", "eager", torch)
    hidden = peer.TINY["hidden"]
    seqs = torch.randn(2, 21, hidden, dtype=torch.bfloat16)
    step = torch.randn(4, 1, hidden, dtype=torch.bfloat16)
    with torch.inference_mode():
        tiled = peer.tile_cache(peer.forward(model, seqs, None, False, torch), 4, torch)
        real = peer.forward(model, torch.cat([seqs, seqs]), None, False, torch)
        assert tiled.layers[0].keys.shape[0] == 4
        out_tiled = model.model(inputs_embeds=step, past_key_values=tiled, use_cache=True).last_hidden_state
        out_real = model.model(inputs_embeds=step, past_key_values=real, use_cache=True).last_hidden_state
    assert out_tiled.shape == (4, 1, hidden)
    torch.testing.assert_close(out_tiled.float(), out_real.float(), rtol=2e-2, atol=2e-2)
    assert tiled.get_seq_length() == real.get_seq_length() == 22
