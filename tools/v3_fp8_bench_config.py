"""Writes the config.json of the random 0.8 B DeepSeek-V3-shaped FP8 checkpoint the GPU engine benchmarks use
(tools/decode_graph_bench.sh, tools/gpu_idle_bench.sh): the golden V3 test model's config widened to 2048 hidden,
16 experts (top-4 in 2 of 4 groups), 8 layers, FP8 128x128 block scales.

usage: python3 tools/v3_fp8_bench_config.py OUT.json   (run from the repository root)
"""
import json
import sys


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: v3_fp8_bench_config.py OUT.json")
    c = json.load(open("tests/data/golden/deepseek_v3/config.json"))
    c.update(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=768, kv_lora_rank=512,
             qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, qk_head_dim=192, head_dim=64,
             intermediate_size=5632, moe_intermediate_size=1024, n_routed_experts=16, num_experts_per_tok=4,
             n_group=4, topk_group=2, num_hidden_layers=8, vocab_size=32768, max_position_embeddings=4096,
             num_nextn_predict_layers=0)
    c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]}
    json.dump(c, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
