#!/usr/bin/env python3
"""config.json of a DeepSeek-V4-Flash or V4.1-Flash checkpoint with the real dimensions (docs: MODELS.md section 1)
and a few layers, for `deepinfer make-checkpoint` (tools/v4_real_dims_bench.sh).

V4-Flash: the released schedule [0,0] + [4,128]*20 + [4] truncated to --layers (layers 0-2 hash-routed), or
--schedule's compress ratios (0 SWA, 4 CSA, 128 HCA). V4.1-Flash: --schedule's ratios (0, 2 or 1; default
0,2,2,1,1: the bench slice's kinds — SWA, an r=2 kv/index source and a layer reusing it, an r=1 source that is
also the candidate source and a layer reusing it); a compressed layer after one of the same ratio reuses its
compressed KV and selection, else it is a source. No Engram (its tables are 196 B parameters) and no DSpark.
--dims small scales every dimension down (same structure, multiples of the quantization blocks) for a CPU check.
"""
import argparse
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "expert_dtype": "fp4"}


def v4(dims, layers, schedule):
    c = json.load(open(os.path.join(ROOT, "tests/data/golden/deepseek_v4/config.json")))
    ratios = schedule or ([0, 0] + [4, 128] * 20 + [4])[:layers]
    if not schedule and layers > len(ratios):
        raise SystemExit(f"--layers {layers}: the real V4-Flash schedule has {len(ratios)} layers")
    kind = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    if any(r not in kind for r in ratios):
        raise SystemExit(f"V4 compress ratios are 0, 4 or 128, got {ratios}")
    n = len(ratios)
    c.update(layer_types=[kind[r] for r in ratios], mlp_layer_types=["hash_moe" if l < 3 else "moe" for l in range(n)],
             num_hidden_layers=n, compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
             n_shared_experts=1, num_experts_per_tok=6, sliding_window=128, hc_mult=4, qk_rope_head_dim=64,
             num_nextn_predict_layers=0)
    if dims == "real":
        c.update(hidden_size=4096, num_attention_heads=64, head_dim=512, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
                 n_routed_experts=256, moe_intermediate_size=2048, index_n_heads=64, index_head_dim=128,
                 index_topk=512, vocab_size=129280, max_position_embeddings=65536)
    else:
        c.update(hidden_size=512, num_attention_heads=8, head_dim=128, q_lora_rank=256, o_groups=2, o_lora_rank=128,
                 n_routed_experts=16, moe_intermediate_size=256, index_n_heads=8, index_head_dim=128, index_topk=64,
                 vocab_size=4096, max_position_embeddings=8192)
    c["rope_parameters"]["compress"].update(factor=16.0, original_max_position_embeddings=65536)
    c["quantization_config"] = dict(QUANT, weight_block_size=[128, 128])
    names = {0: "swa", 4: "csa", 128: "hca"}
    return c, [names[r] + ("+hash" if l < 3 else "") for l, r in enumerate(ratios)]


def v41(dims, schedule):
    c = json.load(open(os.path.join(ROOT, "tests/data/golden/deepseek_v41/config.json")))
    ratios = schedule or [0, 2, 2, 1, 1]
    if any(r not in (0, 1, 2) for r in ratios):
        raise SystemExit(f"V4.1 compress ratios are 0, 2 or 1, got {ratios}")
    sources, plan, last = [], [], None
    candidate = -1
    for l, r in enumerate(ratios):
        if r == 0:
            plan.append("swa")
            continue
        if last is not None and ratios[last] == r:
            plan.append(f"r{r} reuse")
        else:
            sources.append(l)
            if r == 1 and candidate < 0:
                candidate = l
            plan.append(f"r{r} source" + (" +candidate" if candidate == l else ""))
        last = l
    t = c["text_config"]
    n = len(ratios)
    t.update(num_hidden_layers=n, compress_ratios=ratios,
             layer_types=["sliding_attention" if r == 0 else "shared_compressed_attention" for r in ratios],
             kv_source_layer_ids=sources, index_source_layer_ids=sources, candidate_source_layer_id=candidate,
             engram_layer_ids=[], engram_num_embeddings=[], dspark_block_size=0, dspark_target_layer_ids=[],
             n_shared_experts=1, num_experts_per_tok=6, sliding_window=128, hc_mult=4, qk_rope_head_dim=64,
             num_nextn_predict_layers=0, candidate_block_size=8)
    if dims == "real":
        t.update(hidden_size=5120, num_attention_heads=64, head_dim=512, q_lora_rank=1280, o_groups=8, o_lora_rank=1024,
                 n_routed_experts=384, moe_intermediate_size=2304, index_n_heads=32, index_head_dim=128,
                 index_topk=512, candidate_topk_blocks=2048, vocab_size=129280, max_position_embeddings=65536)
    else:
        t.update(hidden_size=512, num_attention_heads=8, head_dim=128, q_lora_rank=256, o_groups=2, o_lora_rank=128,
                 n_routed_experts=24, moe_intermediate_size=256, index_n_heads=8, index_head_dim=128, index_topk=64,
                 candidate_topk_blocks=64, vocab_size=4096, max_position_embeddings=8192)
    t["rope_scaling"] = dict(t.get("rope_scaling") or {}, factor=16.0, original_max_position_embeddings=65536,
                             rope_type="yarn")
    c["quantization_config"] = dict(QUANT, weight_block_size=[32, 32])
    return c, plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--family", choices=["v4", "v41"], default="v4")
    ap.add_argument("--dims", choices=["real", "small"], default="real")
    ap.add_argument("--layers", type=int, default=4, help="V4: the real schedule's first N layers")
    ap.add_argument("--schedule", default="", help="comma-separated compress ratios instead")
    a = ap.parse_args()
    schedule = [int(r) for r in a.schedule.split(",")] if a.schedule else None
    c, plan = v4(a.dims, a.layers, schedule) if a.family == "v4" else v41(a.dims, schedule)
    json.dump(c, open(a.out, "w"), indent=1)
    t = c.get("text_config", c)
    print(f"[realdims] config: {'V4-Flash' if a.family == 'v4' else 'V4.1-Flash'} {a.dims} dims, {len(plan)} layers "
          f"[{', '.join(plan)}], hidden {t['hidden_size']}, {t['n_routed_experts']} experts of "
          f"{t['moe_intermediate_size']} top-{t['num_experts_per_tok']}, blocks "
          f"{c['quantization_config']['weight_block_size']}, vocab {t['vocab_size']}")


if __name__ == "__main__":
    main()
