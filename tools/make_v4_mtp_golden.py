#!/usr/bin/env python3
"""Golden draft logits of the DeepSeek-V4-Flash base MTP module, computed with transformers' own DeepSeek-V4
decoder block (CPU, fp32, eager) on the target weights of tests/data/golden/deepseek_v4.

transformers' deepseek_v4 drops the checkpoint's `mtp.*` tensors on load (no MTP module), so the module is
assembled here from its pieces: the block is a transformers `DeepseekV4DecoderLayer` (a sliding-attention, top-k
MoE layer of a copy of the config with one more layer), the final collapse a transformers `DeepseekV4HyperHead`,
the norms `DeepseekV4RMSNorm`; the wiring around them follows vLLM's deepseek_v4_mtp (MODELS.md Part A §4):
  X_i  = the target's hc streams after its last layer at position i (before hc_head), from a forward hook;
  e_i  = enorm(embed(t_{i+1})), zero at position 0;
  input stream k = h_proj(hnorm(X_i,k)) + e_proj(e_i);  block at RoPE position i (sliding window, causal);
  logits = head(norm(hc_head(streams)))  with the module's own hc_head and norm, the target's head.

Writes tests/data/golden/deepseek_v4_mtp/:
  config.json (the V4 golden config with num_nextn_predict_layers 1 and index_topk 64),
  model.safetensors -> ../deepseek_v4/model.safetensors (symlink), mtp.safetensors (the module, bf16 values,
  released names mtp.0.*), model.safetensors.index.json (both shards),
  golden.safetensors: input_ids int64 [S], mtp_logits float32 [S-1, vocab], mtp_streams float32 [S-1, hc*D].
Needs: pip install torch transformers==5.17.0 safetensors.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(ROOT, "tests/data/golden/deepseek_v4")
OUT_DIR = os.path.join(ROOT, "tests/data/golden/deepseek_v4_mtp")
LENGTH = 40  # crosses the sliding window (16) twice
# No indexer top-k cut (at most 10 CSA entries are visible): the golden config's top-8 would cut inside runs of
# exactly-0 scores, where torch.topk's order is implementation-defined (see tools/make_v4_long_fixture.py).
TOPK = 64


def bf16_values(t):
    return t.to(torch.bfloat16).to(torch.float32)


def randomize(name, t, gen):
    """Trained-model-like scales (norms near 1, matrices N(0, 1/fan_in)), rounded to bf16 values."""
    if name.endswith("norm.weight") or name.endswith("_scale"):
        v = 1.0 + 0.05 * torch.randn(t.shape, generator=gen)
    elif name.endswith("attn_sink"):
        v = 0.5 * torch.randn(t.shape, generator=gen)
    elif name.endswith("bias") or name.endswith("_base"):
        v = 0.05 * torch.randn(t.shape, generator=gen)
    elif t.dim() >= 2:
        v = torch.randn(t.shape, generator=gen) / t.shape[-1] ** 0.5
    else:
        v = torch.randn(t.shape, generator=gen)
    return bf16_values(v)


def main() -> int:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2026)
    config = transformers.AutoConfig.from_pretrained(MODEL)
    config.index_topk = TOPK
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, config=config, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    D, hc, L = config.hidden_size, config.hc_mult, config.num_hidden_layers

    # The MTP block: layer L of a config with one more (sliding-attention, top-k MoE) layer. Its weights are drawn
    # here and written under the released names by save_pretrained's own renaming (model.layers.L.* -> mtp.0.*).
    big = transformers.AutoConfig.from_pretrained(MODEL)
    big.index_topk = TOPK
    big.num_hidden_layers = L + 1
    big.layer_types = list(config.layer_types) + ["sliding_attention"]
    big.mlp_layer_types = list(config.mlp_layer_types) + ["moe"]
    big._attn_implementation = "eager"
    shell = transformers.AutoModelForCausalLM.from_config(big, dtype=torch.float32)
    shell.eval()
    tmp = os.path.join(OUT_DIR, ".shell")
    os.makedirs(tmp, exist_ok=True)
    shell.save_pretrained(tmp)
    saved = load_file(os.path.join(tmp, "model.safetensors"))
    prefix = f"model.layers.{L}."
    mtp = {}
    for name, t in saved.items():
        if name.startswith(prefix):
            mtp["mtp.0." + name[len(prefix):]] = randomize(name, t.float(), gen)
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    # Load the drawn values back into the transformers block (through the same renaming: save, then load).
    block_sd = {prefix + k[len("mtp.0."):]: v for k, v in mtp.items()}
    full = {k: v for k, v in shell.state_dict().items()}
    # Map released names back to module names with transformers' own loader: write a checkpoint holding the
    # target's layers from `model` and the block, load it into a fresh shell.
    ckpt_dir = os.path.join(OUT_DIR, ".ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    target = load_file(os.path.join(MODEL, "model.safetensors"))
    save_file({**target, **block_sd}, os.path.join(ckpt_dir, "model.safetensors"), metadata={"format": "pt"})
    big.save_pretrained(ckpt_dir)
    shell = transformers.AutoModelForCausalLM.from_pretrained(ckpt_dir, config=big, dtype=torch.float32,
                                                              attn_implementation="eager")
    shell.eval()
    # Check the round trip: the loaded block saves back to exactly the drawn tensors.
    shell.save_pretrained(ckpt_dir + "/back")
    back = load_file(os.path.join(ckpt_dir, "back", "model.safetensors"))
    for k, v in block_sd.items():
        assert torch.equal(back[k].float(), v), k
    for f in os.listdir(ckpt_dir + "/back"):
        os.remove(os.path.join(ckpt_dir, "back", f))
    os.rmdir(ckpt_dir + "/back")
    for f in os.listdir(ckpt_dir):
        os.remove(os.path.join(ckpt_dir, f))
    os.rmdir(ckpt_dir)
    block = shell.model.layers[L]
    del full
    # The pieces around the block: released names mtp.0.{enorm,hnorm,e_proj,h_proj,norm,hc_head_*}.
    extra = {
        "mtp.0.enorm.weight": torch.Size([D]), "mtp.0.hnorm.weight": torch.Size([D]),
        "mtp.0.e_proj.weight": torch.Size([D, D]), "mtp.0.h_proj.weight": torch.Size([D, D]),
        "mtp.0.norm.weight": torch.Size([D]), "mtp.0.hc_head_fn": torch.Size([hc, hc * D]),
        "mtp.0.hc_head_base": torch.Size([hc]), "mtp.0.hc_head_scale": torch.Size([1]),
    }
    for name, shape in extra.items():
        mtp[name] = randomize(name, torch.empty(shape), gen)
    enorm = v4.DeepseekV4RMSNorm(D, eps=config.rms_norm_eps)
    hnorm = v4.DeepseekV4RMSNorm(D, eps=config.rms_norm_eps)
    norm = v4.DeepseekV4RMSNorm(D, eps=config.rms_norm_eps)
    head = v4.DeepseekV4HyperHead(config)
    with torch.no_grad():
        enorm.weight.copy_(mtp["mtp.0.enorm.weight"])
        hnorm.weight.copy_(mtp["mtp.0.hnorm.weight"])
        norm.weight.copy_(mtp["mtp.0.norm.weight"])
        head.hc_fn.copy_(mtp["mtp.0.hc_head_fn"])
        head.hc_base.copy_(mtp["mtp.0.hc_head_base"])
        head.hc_scale.copy_(mtp["mtp.0.hc_head_scale"])

    ids = torch.randint(0, config.vocab_size, (1, LENGTH))
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(lambda m, i, o: captured.__setitem__("streams", o))
    with torch.no_grad():
        model(ids, use_cache=False)
        hook.remove()
        X = captured["streams"][:, : LENGTH - 1]  # [1, S-1, hc, D]
        S = LENGTH - 1
        pos = torch.arange(S).unsqueeze(0)
        e = model.model.embed_tokens(ids[:, 1:])
        e = torch.where(pos.unsqueeze(-1) == 0, torch.zeros_like(e), e)
        e = torch.nn.functional.linear(enorm(e), mtp["mtp.0.e_proj.weight"])
        h = torch.nn.functional.linear(hnorm(X), mtp["mtp.0.h_proj.weight"])
        x = h + e.unsqueeze(2)
        mask = torch.full((S, S), float("-inf"))
        for i in range(S):
            for j in range(max(0, i - config.sliding_window + 1), i + 1):
                mask[i, j] = 0.0
        mask = mask[None, None]
        pe = {"main": model.model.rotary_emb(e, position_ids=pos, layer_type="main"),
              "compress": model.model.rotary_emb(e, position_ids=pos, layer_type="compress")}
        out = block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=None,
                    past_key_values=None)
        logits = model.lm_head(norm(head(out)))[0]
    os.makedirs(OUT_DIR, exist_ok=True)
    raw = json.load(open(os.path.join(MODEL, "config.json")))
    raw["num_nextn_predict_layers"] = 1
    raw["index_topk"] = TOPK
    with open(os.path.join(OUT_DIR, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    link = os.path.join(OUT_DIR, "model.safetensors")
    if not os.path.lexists(link):
        os.symlink("../deepseek_v4/model.safetensors", link)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in mtp.items()}, os.path.join(OUT_DIR, "mtp.safetensors"),
              metadata={"format": "pt"})
    weight_map = {k: "model.safetensors" for k in target}
    weight_map.update({k: "mtp.safetensors" for k in mtp})
    with open(os.path.join(OUT_DIR, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1, sort_keys=True)
    meta = {"source": f"transformers {transformers.__version__} deepseek_v4 DecoderLayer/HyperHead/RMSNorm, torch "
                      f"{torch.__version__}, CPU fp32 eager; tools/make_v4_mtp_golden.py"}
    save_file({"input_ids": ids[0].contiguous(), "mtp_logits": logits.contiguous(),
               "mtp_streams": out[0].reshape(S, hc * D).contiguous()},
              os.path.join(OUT_DIR, "golden.safetensors"), metadata=meta)
    print("wrote", OUT_DIR, "logits", tuple(logits.shape), "absmax", float(logits.abs().max()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
