#!/usr/bin/env python3
"""Trains DeepInfer's tiny DeepSeek-V3-architecture model with its MTP draft layer (runs on the GPU machine).

  train_tiny_v3.py --data DIR --out DIR [--time-budget 300] [--smoke]

DIR holds what tools/train_tokenizer.py wrote: train.bin / val.bin (uint16 token streams), tokenizer.json and
tokenizer_config.json. Needs torch and transformers (5.x: its DeepseekV3ForCausalLM is the main model, so the
architecture is exactly the one transformers and DeepInfer implement). --smoke shrinks model, batch and steps so
the whole path (training, evaluation, export, reload check) runs on a CPU in a minute.

The MTP module (DeepSeek-V3 §2.2, MODELS.md Part B §5) is implemented here since transformers has none for
deepseek_v3: at position i it sees z = eh_proj([enorm(Emb(t[i+1])); hnorm(h[i])]) where h is the main model's
final hidden state after model.norm, runs one more decoder block (MoE, layer index num_hidden_layers) at RoPE
position i, and predicts t[i+2] with shared_head.norm + the head. Embedding and head are shared with the main
model during training (as in the paper) and written as copies under the layer's own names. It trains jointly:
loss = CE(main) + mtp_weight · CE(MTP), gradients flowing into the main model.

Routing: the released V3 recipe (sigmoid scores + e_score_correction_bias, top-k renormalised) with the
auxiliary-loss-free balancing update of the bias: after every step, bias += gamma · sign(mean load − load).

Writes to OUT: model.safetensors (bf16, DeepSeek-V3 / transformers per-expert names, MTP as layer
num_hidden_layers), config.json (num_nextn_predict_layers = 1), tokenizer files, metrics.json (loss curve, held-out
losses, MTP acceptance) and samples.txt. The exported file is reloaded with DeepseekV3ForCausalLM.from_pretrained
and its logits compared against the trained model (the run fails if they differ beyond bf16 rounding).
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm


def log(*a):
    print(*a, flush=True)


def model_config(vocab_size, smoke):
    c = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        routed_scaling_factor=1.0,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        hidden_act="silu",
        max_position_embeddings=1024,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rope_interleave=True,
        attention_bias=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    if smoke:
        c.update(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=128)
    return c


class MTP(nn.Module):
    """One DeepSeek-V3 MTP module (depth 1) on top of a DeepseekV3ForCausalLM."""

    def __init__(self, config):
        super().__init__()
        D = config.hidden_size
        self.enorm = DeepseekV3RMSNorm(D, eps=config.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(D, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * D, D, bias=False)
        self.block = DeepseekV3DecoderLayer(config, layer_idx=config.num_hidden_layers)
        self.head_norm = DeepseekV3RMSNorm(D, eps=config.rms_norm_eps)

    def forward(self, main, hidden, next_ids, position_ids):
        """hidden [B, T, D] (post model.norm) at positions i, next_ids [B, T] = t[i+1]; returns logits for t[i+2]."""
        e = self.enorm(main.model.embed_tokens(next_ids))
        z = self.eh_proj(torch.cat([e, self.hnorm(hidden)], dim=-1))  # embedding first (vLLM/SGLang order)
        pos_emb = main.model.rotary_emb(z, position_ids)
        z = self.block(z, attention_mask=None, position_ids=position_ids, position_embeddings=pos_emb)
        return main.lm_head(self.head_norm(z))


class BiasBalancer:
    """Aux-loss-free load balancing: counts the experts each router picks and nudges e_score_correction_bias."""

    def __init__(self, model, gamma):
        self.gamma = gamma
        self.routers = [m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]
        self.counts = [torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers]
        for r, c in zip(self.routers, self.counts):
            r.register_forward_hook(self._hook(c))

    @staticmethod
    def _hook(count):
        def hook(module, inputs, output):
            if module.training:
                count.add_(torch.bincount(output[2].flatten(), minlength=count.numel()).float())
        return hook

    def step(self):
        loads = []
        with torch.no_grad():
            for r, c in zip(self.routers, self.counts):
                r.e_score_correction_bias += self.gamma * torch.sign(c.mean() - c)
                loads.append(c / c.sum().clamp(min=1))
                c.zero_()
        return loads


def batches(data, batch, length, gen, device):
    """Random windows of `length` tokens from the token stream."""
    starts = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(length)[None, :]
    return data[idx].to(device, non_blocking=True)


def losses(model, mtp, w, autocast):
    """w [B, T+2]: main CE over t[1..T], MTP CE over t[2..T+1]; also returns the logits."""
    x = w[:, :-2]
    T = x.shape[1]
    pos = torch.arange(T, device=w.device)[None, :].expand(x.shape[0], -1)
    with autocast:
        hidden = model.model(input_ids=x, position_ids=pos).last_hidden_state
        logits = model.lm_head(hidden)
        mtp_logits = mtp(model, hidden, w[:, 1:-1], pos)
    main_loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:-1].flatten())
    mtp_loss = F.cross_entropy(mtp_logits.float().flatten(0, 1), w[:, 2:].flatten())
    return main_loss, mtp_loss, logits, mtp_logits


@torch.no_grad()
def evaluate(model, mtp, val, length, batch, autocast, device):
    """Held-out losses and top-1 agreements over non-overlapping windows of the whole validation stream."""
    model.eval(), mtp.eval()
    n = (val.numel() - 2) // length
    tot = {"main_loss": 0.0, "mtp_loss": 0.0, "main_top1": 0.0, "mtp_top1": 0.0, "mtp_vs_main_greedy": 0.0}
    count = pairs = 0
    for b0 in range(0, n, batch):
        rows = [val[i * length: i * length + length + 2] for i in range(b0, min(n, b0 + batch))]
        w = torch.stack(rows).to(device)
        main_loss, mtp_loss, logits, mtp_logits = losses(model, mtp, w, autocast)
        k = w.shape[0] * length
        main_pred = logits.argmax(-1)  # [B, T]: greedy t[i+1] given the real text
        mtp_pred = mtp_logits.argmax(-1)  # draft of t[i+2] given the real t[i+1]
        tot["main_loss"] += main_loss.item() * k
        tot["mtp_loss"] += mtp_loss.item() * k
        tot["main_top1"] += (main_pred == w[:, 1:-1]).float().sum().item()
        tot["mtp_top1"] += (mtp_pred == w[:, 2:]).float().sum().item()
        # The draft for t[i+2] against the main model's own greedy pick at position i+1 (same real prefix).
        tot["mtp_vs_main_greedy"] += (mtp_pred[:, :-1] == main_pred[:, 1:]).float().sum().item()
        pairs += k - w.shape[0]
        count += k
    model.train(), mtp.train()
    out = {key: v / count for key, v in tot.items()}
    out["mtp_vs_main_greedy"] = tot["mtp_vs_main_greedy"] / pairs
    return out | {"tokens": count}


@torch.no_grad()
def greedy_acceptance(model, mtp, val, prompt_len, new_tokens, num, autocast, device):
    """Speculative decoding as it would run: greedy generation from held-out prompts; at every generated step the
    MTP draft of the token after next (from h[i] and the just-emitted greedy token) is accepted iff the main model's
    next greedy token equals it. Returns the acceptance rate and the number of drafts."""
    model.eval(), mtp.eval()
    stride = max(1, (val.numel() - prompt_len) // num)
    seqs = torch.stack([val[i * stride: i * stride + prompt_len] for i in range(num)]).to(device)
    for _ in range(new_tokens):  # no KV cache: recomputing is cheap at this size and obviously right
        with autocast:
            logits = model(input_ids=seqs).logits[:, -1]
        seqs = torch.cat([seqs, logits.argmax(-1, keepdim=True)], dim=1)
    T = seqs.shape[1]
    pos = torch.arange(T, device=device)[None, :].expand(num, -1)
    with autocast:
        hidden = model.model(input_ids=seqs, position_ids=pos).last_hidden_state
        next_ids = torch.cat([seqs[:, 1:], seqs[:, -1:]], dim=1)  # t[i+1] (last column unused)
        draft = mtp(model, hidden, next_ids, pos).argmax(-1)  # draft for t[i+2]
    # Positions i whose t[i+1] and t[i+2] were both produced by greedy decoding: i = P-1 .. T-3.
    i0 = prompt_len - 1
    hit = (draft[:, i0:T - 2] == seqs[:, i0 + 2:T]).float()
    model.train(), mtp.train()
    return hit.mean().item(), hit.numel(), seqs


def export(model, mtp, cfg, out_dir, shard_mb):
    """bf16 safetensors with DeepSeek-V3's per-expert names; the MTP module as layer num_hidden_layers."""
    L = cfg.num_hidden_layers
    sd = {}
    for name, t in model.state_dict().items():
        sd[name] = t
    for name, t in mtp.state_dict().items():
        sd[name] = t
    out = {}

    def put(name, t):
        out[name] = t.detach().to(torch.float32 if name.endswith("e_score_correction_bias") else torch.bfloat16)

    def put_experts(prefix, gate_up, down):
        inter = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            put(f"{prefix}experts.{e}.gate_proj.weight", gate_up[e, :inter])
            put(f"{prefix}experts.{e}.up_proj.weight", gate_up[e, inter:])
            put(f"{prefix}experts.{e}.down_proj.weight", down[e])

    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("experts.gate_up_proj")]
            put_experts(prefix, t, model.state_dict()[prefix + "experts.down_proj"])
        elif name.endswith("mlp.experts.down_proj"):
            continue
        else:
            put(name, t)
    P = f"model.layers.{L}."
    m = mtp.state_dict()
    put(P + "enorm.weight", m["enorm.weight"])
    put(P + "hnorm.weight", m["hnorm.weight"])
    put(P + "eh_proj.weight", m["eh_proj.weight"])
    put(P + "shared_head.norm.weight", m["head_norm.weight"])
    put(P + "shared_head.head.weight", model.lm_head.weight)
    put(P + "embed_tokens.weight", model.model.embed_tokens.weight)
    for name, t in m.items():
        if not name.startswith("block."):
            continue
        rest = name[len("block."):]
        if rest.endswith("mlp.experts.gate_up_proj"):
            put_experts(P + "mlp.", t, m["block.mlp.experts.down_proj"])
        elif rest.endswith("mlp.experts.down_proj"):
            continue
        else:
            put(P + rest, t)
    out = {k: v.contiguous().cpu() for k, v in out.items()}
    # Shards of at most shard_mb (the device tool returns files up to 16 MiB) with transformers' index file.
    shards, cur, size = [], {}, 0
    for k in sorted(out):
        nbytes = out[k].numel() * out[k].element_size()
        if cur and size + nbytes > shard_mb * 1e6:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = out[k]
        size += nbytes
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    if len(shards) > 1:
        total = sum(v.numel() * v.element_size() for v in out.values())
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
            f.write("\n")

    config = cfg.to_dict()
    for k in ("_name_or_path", "transformers_version", "use_cache", "output_router_logits", "id2label", "label2id",
              "chunk_size_feed_forward", "dtype", "output_attentions", "output_hidden_states", "return_dict",
              "problem_type", "is_encoder_decoder"):
        config.pop(k, None)
    config["architectures"] = ["DeepseekV3ForCausalLM"]
    config["model_type"] = "deepseek_v3"
    config["num_nextn_predict_layers"] = 1
    config["torch_dtype"] = "bfloat16"
    config["scoring_func"] = "sigmoid"
    config["topk_method"] = "noaux_tc"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    return sum(v.numel() for v in out.values())


@torch.no_grad()
def reload_check(model, out_dir, val, device):
    """The exported checkpoint, loaded by transformers, gives the trained model's logits (bf16 rounding apart)."""
    ref = DeepseekV3ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    x = val[:128][None, :].to(device)
    model.eval()
    a = model(input_ids=x).logits.float()
    b = ref(input_ids=x).logits.float()
    model.train()
    err = (a - b).abs().max().item()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    log(f"reload check: max |logit diff| {err:.4f} (bf16 export), argmax agreement {agree:.4f}")
    if agree < 0.97 or err > 1.0:
        raise SystemExit("exported checkpoint does not reproduce the trained model")
    return err, agree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of training (steps sized to fit)")
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--shard-mb", type=float, default=12.0)
    ap.add_argument("--no-tokenizer-copy", dest="copy_tokenizer", action="store_false")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.time_budget, a.max_steps, a.batch, a.seq, a.warmup, a.eval_every = 30, 12, 4, 64, 3, 6
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")
    log(f"torch {torch.__version__}, device {device}" + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))

    train = torch.from_numpy(np.fromfile(os.path.join(a.data, "train.bin"), dtype=np.uint16).astype(np.int64))
    val = torch.from_numpy(np.fromfile(os.path.join(a.data, "val.bin"), dtype=np.uint16).astype(np.int64))
    tok = json.load(open(os.path.join(a.data, "tokenizer.json")))
    vocab = len(tok["model"]["vocab"]) + sum(1 for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"])
    vocab = max(vocab, int(max(train.max(), val.max())) + 1)
    if a.smoke:
        val = val[: 8 * (a.seq + 2)]
    train = train.to(device)
    log(f"train tokens {train.numel()}, val tokens {val.numel()}, vocab {vocab}")

    cfg = DeepseekV3Config(**model_config(vocab, a.smoke))
    cfg._attn_implementation = "sdpa"
    model = DeepseekV3ForCausalLM(cfg).to(device)
    mtp = MTP(cfg).to(device)
    mtp.apply(model._init_weights)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"parameters: main {n_main / 1e6:.2f} M, MTP module {n_mtp / 1e6:.2f} M (embedding/head shared)")
    balancer = BiasBalancer(model, a.bias_gamma) if a.bias_gamma > 0 else None
    mtp_balancer = BiasBalancer(mtp, a.bias_gamma) if a.bias_gamma > 0 else None

    params = list(model.named_parameters()) + [("mtp." + n, p) for n, p in mtp.named_parameters()]
    decay = [p for n, p in params if p.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in params if not (p.dim() >= 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")
    gen = torch.Generator().manual_seed(a.seed)

    total_steps = a.max_steps
    curve, evals = [], []
    best = (float("inf"), None, -1)
    t_start = time.time()
    step_times = []
    step = 0
    while step < total_steps:
        if step == 20:
            t20 = time.time()
        if step == 80 and not a.smoke:
            # Size the run to the time budget from the step time measured past the warm-up steps (CUDA/cuBLAS
            # initialisation), plus 6 % for evaluations.
            per = (time.time() - t20) / 60 * 1.06
            total_steps = max(100, min(a.max_steps, int((a.time_budget - (time.time() - t_start)) / per) + 80))
            log(f"{per * 1000:.1f} ms/step → {total_steps} steps in {a.time_budget:.0f} s")
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            prog = (step - a.warmup) / max(1, total_steps - a.warmup)
            lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, prog))))
        for g in opt.param_groups:
            g["lr"] = lr
        w = batches(train, a.batch, a.seq + 2, gen, device)
        main_loss, mtp_loss, _, _ = losses(model, mtp, w, autocast)
        loss = main_loss + a.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        if balancer:
            loads = balancer.step()
            mtp_balancer.step()
        step += 1
        if step % 25 == 0 or step == 1 or step == total_steps:
            entry = {"step": step, "tokens": step * a.batch * a.seq, "lr": lr, "main_loss": main_loss.item(),
                     "mtp_loss": mtp_loss.item(), "grad_norm": gnorm.item(), "time_s": time.time() - t_start}
            curve.append(entry)
            if step % 100 == 0 or step == 1 or a.smoke:
                load = " ".join(f"{x:.2f}" for x in loads[-1].tolist()) if balancer else ""
                log(f"step {step}/{total_steps} lr {lr:.2e} loss {entry['main_loss']:.4f} mtp {entry['mtp_loss']:.4f} "
                    f"gnorm {entry['grad_norm']:.2f} last-layer load [{load}] {entry['time_s']:.0f}s")
        if step % a.eval_every == 0 or step == total_steps:
            ev = evaluate(model, mtp, val, a.seq, 16, autocast, device) | {"step": step}
            evals.append(ev)
            log(f"eval step {step}: val loss {ev['main_loss']:.4f} (ppl {math.exp(ev['main_loss']):.2f}) "
                f"mtp {ev['mtp_loss']:.4f} main top1 {ev['main_top1']:.3f} mtp top1 {ev['mtp_top1']:.3f} "
                f"mtp vs main greedy {ev['mtp_vs_main_greedy']:.3f}")
            if ev["main_loss"] < best[0]:
                state = ({k: v.detach().clone() for k, v in model.state_dict().items()},
                         {k: v.detach().clone() for k, v in mtp.state_dict().items()})
                best = (ev["main_loss"], state, step)
    train_s = time.time() - t_start
    log(f"trained {step} steps in {train_s:.0f} s; best held-out loss {best[0]:.4f} at step {best[2]}")
    model.load_state_dict(best[1][0])
    mtp.load_state_dict(best[1][1])

    final = evaluate(model, mtp, val, a.seq, 16, autocast, device)
    n_prompts, p_len, new = (4, 8, 8) if a.smoke else (64, 32, 96)
    acc, drafts, seqs = greedy_acceptance(model, mtp, val, p_len, new, n_prompts, autocast, device)
    log(f"best checkpoint: val loss {final['main_loss']:.4f} mtp loss {final['mtp_loss']:.4f}; "
        f"greedy speculative acceptance {acc:.3f} over {drafts} drafts; "
        f"teacher-forced draft vs main greedy {final['mtp_vs_main_greedy']:.3f}")

    n_saved = export(model, mtp, cfg, a.out, a.shard_mb)
    if a.copy_tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.data, f), os.path.join(a.out, f))
    err, agree = reload_check(model, a.out, val, device)

    try:
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(os.path.join(a.data, "tokenizer.json"))
        with open(os.path.join(a.out, "samples.txt"), "w") as f:
            for row in seqs[:8].tolist():
                f.write(tk.decode(row[:p_len]) + " ⟪" + tk.decode(row[p_len:], skip_special_tokens=False) + "⟫\n---\n")
    except ImportError:
        pass
    metrics = {
        "args": vars(a), "config": model_config(vocab, a.smoke), "device": device,
        "torch": torch.__version__, "train_tokens_stream": train.numel(), "val_tokens": val.numel(),
        "params_main": n_main, "params_mtp_module": n_mtp, "params_saved": n_saved, "steps": step,
        "train_seconds": train_s, "best_step": best[2], "final_eval": final,
        "greedy_speculative_acceptance": {"rate": acc, "drafts": drafts, "prompts": n_prompts,
                                          "prompt_tokens": p_len, "new_tokens": new},
        "reload_check": {"max_abs_logit_diff": err, "argmax_agreement": agree},
        "evals": evals, "curve": curve,
    }
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    log("done")


if __name__ == "__main__":
    sys.exit(main())
