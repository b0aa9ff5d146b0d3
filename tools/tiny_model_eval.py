#!/usr/bin/env python3
"""Measurements of the committed tiny model (models/deepinfer-tiny-v3) on the CPU.

  tiny_model_eval.py heldout-ppl --val DIR/val.jsonl [--model DIR] [--window 1024] [--windows N] [--hf]
      Held-out perplexity measured by DeepInfer: the held-out split (tools/prepare_train_data.sh) tokenized with
      the model's tokenizer.json (every document followed by <｜end▁of▁sentence｜>, as in training), cut into
      windows of --window + 1 tokens at stride --window (the training script's evaluation windows), scored with
      `deepinfer score --logprobs`. --hf also scores the same windows with transformers (fp32, eager attention).
  tiny_model_eval.py mtp-acceptance --val DIR/val.jsonl [--model DIR] [--prompts 64]
      The MTP draft layer as saved (layer num_hidden_layers of the checkpoint, bf16 weights run in fp32) on the CPU
      in PyTorch, with the training script's two measures: teacher-forced top-1 agreement of the draft for t[i+2]
      with the main model's greedy pick at i+1 on the held-out windows, and the acceptance rate along greedy
      generations from held-out prompts (32 prompt tokens, 96 generated; the MTP drafts the token after next
      from h[i] and the just-emitted token, accepted iff the main model's next greedy token equals it).
  tiny_model_eval.py spec-prompts --val DIR/val.jsonl [--model DIR] [--prompts 64] [--prompt-len 32]
      The held-out prompts mtp-acceptance uses (the same stride over the held-out token stream), one line of
      comma-separated ids each, for `deepinfer offline --prompt-ids` (docs/PERF.md, speculative decoding entry).
  tiny_model_eval.py hf-greedy --prompt TEXT [--model DIR] [--max-tokens N]
      transformers' greedy continuation (fp32, eager attention; prompt without BOS as `deepinfer` encodes it):
      the ids the C++ test tests/model/tiny_model_test.cc expects.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(ROOT, "models", "deepinfer-tiny-v3")
EOS = "<｜end▁of▁sentence｜>"


def heldout_windows(model, val, window, limit):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    with open(val, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids += enc.ids + [eos]
    n = (len(ids) - 1) // window
    if limit:
        n = min(n, limit)
    return [ids[i * window: i * window + window + 1] for i in range(n)], len(docs), ids


def heldout_ppl(a):
    from safetensors.numpy import load_file
    import numpy as np
    windows, ndocs, _ = heldout_windows(a.model, a.val, a.window, a.windows)
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = os.path.join(tmp, "ids.jsonl")
        with open(ids_file, "w") as f:
            for w in windows:
                f.write(json.dumps(w) + "\n")
        out = os.path.join(tmp, "lp.safetensors")
        cmd = [a.deepinfer, "score", "--model", a.model, "--ids-file", ids_file, "--out", out, "--logprobs"]
        print("$", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
        lp = load_file(out)
    nll = -np.concatenate([lp[f"logprobs.{i}"] for i in range(len(windows))]).astype(np.float64)
    print(f"held-out: {ndocs} documents, {len(windows)} windows of {a.window} scored tokens, {nll.size} tokens")
    print(f"deepinfer (CPU, fp32): mean NLL {nll.mean():.4f} nats/token, perplexity {math.exp(nll.mean()):.3f}")
    if a.hf:
        import torch
        from transformers import DeepseekV3ForCausalLM
        model = DeepseekV3ForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
        total, count, diff = 0.0, 0, 0.0
        with torch.no_grad():
            for i, w in enumerate(windows):
                x = torch.tensor(w)[None]
                logp = torch.log_softmax(model(input_ids=x[:, :-1]).logits.float(), -1)[0]
                tok_lp = logp.gather(1, x[0, 1:, None])[:, 0]
                total += -tok_lp.sum().item()
                count += tok_lp.numel()
                diff = max(diff, (tok_lp.numpy() - lp[f"logprobs.{i}"]).__abs__().max())
        print(f"transformers (fp32, eager): mean NLL {total / count:.4f}, perplexity {math.exp(total / count):.3f}; "
              f"max |log-prob difference| vs deepinfer {diff:.2e}")


def mtp_acceptance(a):
    import torch
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM
    sys.path.insert(0, HERE)
    import train_tiny_v3 as tt
    _, ndocs, ids = heldout_windows(a.model, a.val, a.window, 0)
    val = torch.tensor(ids)  # the training script's val.bin stream
    model = DeepseekV3ForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    cfg = model.config
    mtp = tt.MTP(cfg)
    with open(os.path.join(a.model, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    sd = {}
    for fname in files:
        sd.update(load_file(os.path.join(a.model, fname)))
    P = f"model.layers.{cfg.num_hidden_layers}."
    m = {k[len(P):]: v.float() for k, v in sd.items() if k.startswith(P)}
    E = cfg.n_routed_experts
    state = {"enorm.weight": m["enorm.weight"], "hnorm.weight": m["hnorm.weight"], "eh_proj.weight": m["eh_proj.weight"],
             "head_norm.weight": m["shared_head.norm.weight"],
             "block.mlp.experts.gate_up_proj": torch.stack(
                 [torch.cat([m[f"mlp.experts.{e}.gate_proj.weight"], m[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(E)]),
             "block.mlp.experts.down_proj": torch.stack([m[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)])}
    skip = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.", "mlp.experts.")
    state.update({"block." + k: v for k, v in m.items() if not k.startswith(skip)})
    mtp.load_state_dict(state, strict=True)
    # The copies of embedding and head under the MTP layer equal the main model's (the module uses those).
    assert torch.equal(m["shared_head.head.weight"], model.lm_head.weight.data)
    assert torch.equal(m["embed_tokens.weight"], model.model.embed_tokens.weight.data)
    mtp.eval()
    off = torch.autocast("cpu", enabled=False)
    ev = tt.evaluate(model, mtp, val, a.window, 4, off, "cpu")
    model.eval(), mtp.eval()
    rate, drafts, _ = tt.greedy_acceptance(model, mtp, val, 32, 96, a.prompts, off, "cpu")
    print(f"held-out ({ndocs} documents, {ev['tokens']} positions): main loss {ev['main_loss']:.4f}, MTP loss "
          f"{ev['mtp_loss']:.4f}, main top-1 {ev['main_top1']:.4f}, MTP top-1 {ev['mtp_top1']:.4f}")
    print(f"teacher-forced: draft == main greedy next-next token at {ev['mtp_vs_main_greedy']:.4f} of positions")
    print(f"greedy generation from {a.prompts} held-out prompts: {drafts} drafts, acceptance {rate:.4f}")


def spec_prompts(a):
    _, _, ids = heldout_windows(a.model, a.val, 1024, 0)
    stride = max(1, (len(ids) - a.prompt_len) // a.prompts)  # as train_tiny_v3.greedy_acceptance
    for i in range(a.prompts):
        print(",".join(str(t) for t in ids[i * stride: i * stride + a.prompt_len]))


def hf_greedy(a):
    import torch
    from tokenizers import Tokenizer
    from transformers import DeepseekV3ForCausalLM
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    model = DeepseekV3ForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    ids = tok.encode(a.prompt, add_special_tokens=False).ids
    x = torch.tensor(ids)[None]
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=a.max_tokens, do_sample=False, eos_token_id=None, pad_token_id=1)
    gen = out[0, len(ids):].tolist()
    print(json.dumps({"prompt": a.prompt, "prompt_ids": ids, "greedy_ids": gen, "text": tok.decode(gen)},
                     ensure_ascii=False))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("heldout-ppl")
    p.add_argument("--val", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--deepinfer", default=os.path.join(ROOT, "build", "bin", "deepinfer"))
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--windows", type=int, default=0, help="score only the first N windows (0: all)")
    p.add_argument("--hf", action="store_true")
    p = sub.add_parser("mtp-acceptance")
    p.add_argument("--val", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--prompts", type=int, default=64)
    p = sub.add_parser("spec-prompts")
    p.add_argument("--val", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p = sub.add_parser("hf-greedy")
    p.add_argument("--prompt", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    {"heldout-ppl": heldout_ppl, "mtp-acceptance": mtp_acceptance, "spec-prompts": spec_prompts,
     "hf-greedy": hf_greedy}[a.cmd](a)


if __name__ == "__main__":
    main()
