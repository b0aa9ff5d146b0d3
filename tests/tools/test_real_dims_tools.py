"""tools/v4_real_dims_config.py (the real V4-Flash / V4.1-Flash dimensions, the truncated or given schedule, the
V4.1 sources derived from the ratios, bad schedules rejected) and tools/v4_real_dims_bench.sh end to end on scaled-down
dimensions on the CPU (DEEPINFER_CLI: the deepinfer binary; skipped without it)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tools" / "v4_real_dims_config.py"
BENCH = ROOT / "tools" / "v4_real_dims_bench.sh"


def make(tmp_path, *args):
    out = tmp_path / "config.json"
    r = subprocess.run([sys.executable, str(CONFIG), str(out), *args], capture_output=True, text=True)
    return r, (json.loads(out.read_text()) if r.returncode == 0 else None)


def test_v4_real_dims_and_the_truncated_schedule(tmp_path):
    r, c = make(tmp_path)
    assert r.returncode == 0, r.stderr
    assert (c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]) == (4096, 64, 512, 1024)
    assert (c["o_groups"], c["o_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"]) == (8, 1024, 256, 2048)
    assert (c["num_experts_per_tok"], c["n_shared_experts"], c["vocab_size"], c["sliding_window"]) == (6, 1, 129280, 128)
    assert (c["index_n_heads"], c["index_head_dim"], c["index_topk"], c["hc_mult"]) == (64, 128, 512, 4)
    assert c["quantization_config"]["weight_block_size"] == [128, 128]
    assert c["quantization_config"]["expert_dtype"] == "fp4"
    assert c["num_hidden_layers"] == 4
    assert c["layer_types"] == ["sliding_attention", "sliding_attention", "compressed_sparse_attention",
                                "heavily_compressed_attention"]
    assert c["mlp_layer_types"] == ["hash_moe", "hash_moe", "hash_moe", "moe"]
    assert "[swa+hash, swa+hash, csa+hash, hca]" in r.stdout
    r, c = make(tmp_path, "--schedule", "0,4,128")
    assert c["num_hidden_layers"] == 3 and c["layer_types"][1:] == ["compressed_sparse_attention",
                                                                   "heavily_compressed_attention"]


def test_v41_sources_follow_the_ratios(tmp_path):
    r, c = make(tmp_path, "--family", "v41")
    assert r.returncode == 0, r.stderr
    t = c["text_config"]
    assert (t["hidden_size"], t["q_lora_rank"], t["n_routed_experts"], t["moe_intermediate_size"]) == (5120, 1280, 384, 2304)
    assert (t["index_n_heads"], t["candidate_topk_blocks"], t["candidate_block_size"]) == (32, 2048, 8)
    assert c["quantization_config"]["weight_block_size"] == [32, 32]
    assert t["compress_ratios"] == [0, 2, 2, 1, 1]
    assert t["kv_source_layer_ids"] == [1, 3] and t["index_source_layer_ids"] == [1, 3]
    assert t["candidate_source_layer_id"] == 3 and t["engram_layer_ids"] == [] and t["dspark_block_size"] == 0
    assert "[swa, r2 source, r2 reuse, r1 source +candidate, r1 reuse]" in r.stdout


@pytest.mark.parametrize("args", [["--layers", "44"], ["--schedule", "0,5"], ["--family", "v41", "--schedule", "4"]])
def test_bad_schedules_are_rejected(tmp_path, args):
    r, _ = make(tmp_path, *args)
    assert r.returncode != 0
    assert "schedule" in r.stderr or "ratios" in r.stderr


@pytest.mark.parametrize("family", ["v4", "v41"])
def test_bench_end_to_end_on_small_dims(tmp_path, family):
    cli = os.environ.get("DEEPINFER_CLI")
    if not cli:
        pytest.skip("DEEPINFER_CLI not set")
    env = dict(os.environ, CLI=cli, FAMILY=family, DIMS="small", DEVICE="cpu", BENCH_DIR=str(tmp_path / "b"),
               PREFILL="64", NUM_PREFILL="2", CONTEXT="32", BATCHES="1 2", MAX_TOKENS="3", SLICE_BENCH="1",
               BENCH_MODEL="tiny", BENCH_FLAGS="--iters 1 --warmup 0")
    r = subprocess.run(["bash", str(BENCH)], capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    for s in ["[realdims] checkpoint:", "[realdims] estimate: weights on the device", "[realdims] prefill (",
              "[realdims]   prefill: first", "[realdims] decode_b1 (", "[realdims] decode_b2 (",
              "[realdims]   engine decode step", "the weight-bytes floor", "[realdims] estimate: decode batch 2:",
              "[realdims] compare prefill (ctx 64)",
              "[realdims] compare decode b2 (ctx 32)", "3 generated tokens"]:
        assert s in out, s + "\n" + out
    assert "rc=0" in out and "rc=1" not in out, out
    # DEVICE=cpu runs --weight-format fp8: the block formats kept, so the estimate counts the head as stored (bf16).
    assert "(bf16 head " in out, out
