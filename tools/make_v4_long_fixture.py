#!/usr/bin/env python3
"""Long-sequence DeepSeek-V4 fixture from transformers (CPU, fp32, eager) on the weights of
tests/data/golden/deepseek_v4 with index_topk raised to 256: a 700-token prompt, so the HCA layers (ratio 16) hold
43 entries, the CSA layers (ratio 4) 175, the overlapping-window compressor and the sliding window (16) are
crossed many times, and the cached greedy continuation runs past them.

Why index_topk 256 (no top-k cut): index scores are sum_h w_h * relu(q_h . k) with w = weights_proj(x) of either
sign, so long prompts hit queries whose top-k cut falls inside a run of exactly-0 scores, where torch.topk's
implementation-defined order (CPU and CUDA differ) decides the selection (with top-8 this prompt has ~40 such
queries). The cut itself is tested by the shared fixture (72 entries, top-8, no tie at the cut).

Writes tests/data/golden/deepseek_v4_long/{config.json, golden.safetensors} and a model.safetensors symlink to
../deepseek_v4/model.safetensors; golden.safetensors holds
  input_ids int64 [700], logits_tail float32 [96, vocab] (rows 604..699 of the no-cache forward),
  generated_ids int64 [8] (greedy, with the cache).
Needs: pip install torch transformers==5.17.0 safetensors (transformers 5.17 ships deepseek_v4).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(ROOT, "tests/data/golden/deepseek_v4")
OUT_DIR = os.path.join(ROOT, "tests/data/golden/deepseek_v4_long")
LENGTH, TAIL, NEW, TOPK = 700, 96, 8, 256


def main() -> int:
    torch.manual_seed(1234)
    config = transformers.AutoConfig.from_pretrained(MODEL)
    config.index_topk = TOPK
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, config=config, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(MODEL, "config.json")) as f:
        raw = json.load(f)
    raw["index_topk"] = TOPK
    with open(os.path.join(OUT_DIR, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    link = os.path.join(OUT_DIR, "model.safetensors")
    if not os.path.lexists(link):
        os.symlink("../deepseek_v4/model.safetensors", link)
    ids = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits[0]
        # An explicit all-ones mask: without it generate() treats prompt tokens equal to pad_token_id as padding.
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                             min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)[0, LENGTH:]
    meta = {"source": f"transformers {transformers.__version__} deepseek_v4, torch {torch.__version__}, CPU fp32 "
                      "eager, index_topk 256; tools/make_v4_long_fixture.py"}
    save_file({"input_ids": ids[0].contiguous(), "logits_tail": logits[-TAIL:].contiguous(),
               "generated_ids": gen.contiguous()}, os.path.join(OUT_DIR, "golden.safetensors"), metadata=meta)
    print("wrote", OUT_DIR, "generated", gen.tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
