#!/usr/bin/env python3
"""The peer of `deepinfer bench`'s V4-Flash slice: transformers' DeepseekV4 on the same dimensions.

Builds transformers' DeepseekV4ForCausalLM with the layers of our bench slice (src/deepinfer/bench/bench_model.cc,
v4_flash_slice: one sliding-window layer, one CSA layer with compress ratio 4 and its indexer, one HCA layer with
ratio 128; every MLP a top-k routed MoE, no hash routing) on the real V4-Flash dimensions, random bf16 weights
initialised directly on the device (no checkpoint), and times

  prefill: one sequence of P tokens (a fresh cache each step), and
  decode:  one token for each of B sequences whose cache holds C tokens (a median over consecutive steps, so the
           context grows by one per step from C),

as our bench does. What is timed is the decoder stack (`model.model` with `inputs_embeds`: the three layers, the
mHC head and the final norm), the part our slice covers; `--with-head` adds the embedding and the LM head of the
last position. Attention: the first implementation of `--attn` that transformers accepts and runs for V4 (5.17
ships V4 eager-only, so `sdpa` is expected to be refused); MoE experts: the first of `--experts` likewise. Both
choices, and why the others were refused, are printed.

Output: JSON Lines on stdout: one {"kind": "config", ...} line, then one line per row with phase, batch, context,
tokens, step_ms (median), steps_ms, tokens_per_s; a row the peer cannot run has "error" instead (OOM, refusal).
tools/peer_join.py joins these with our bench's output.

  python3 tools/peer_transformers_v4.py                       # the real slice on cuda
  python3 tools/peer_transformers_v4.py --tiny --device cpu   # small dims, for the test
"""

import argparse
import json
import math
import statistics
import sys
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def emit(obj):
    print(json.dumps(obj), flush=True)


# Our slice's dimensions (src/deepinfer/bench/bench_model.cc: v4_flash_slice / tiny_slice).
REAL = dict(hidden=4096, heads=64, head_dim=512, rope_dim=64, q_lora=1024, o_groups=8, o_lora=1024, window=128,
            index_heads=64, index_dim=128, index_topk=512, experts=256, topk=6, moe_inter=2048, hc=4,
            csa_ratio=4, hca_ratio=128, vocab=129280)
TINY = dict(hidden=64, heads=4, head_dim=32, rope_dim=8, q_lora=32, o_groups=2, o_lora=16, window=8,
            index_heads=2, index_dim=16, index_topk=4, experts=4, topk=2, moe_inter=32, hc=4,
            csa_ratio=2, hca_ratio=4, vocab=256)
LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]


def make_config(dims):
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=dims["vocab"],
        hidden_size=dims["hidden"],
        moe_intermediate_size=dims["moe_inter"],
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=dims["heads"],
        num_key_value_heads=1,
        head_dim=dims["head_dim"],
        q_lora_rank=dims["q_lora"],
        partial_rotary_factor=dims["rope_dim"] / dims["head_dim"],
        num_experts_per_tok=dims["topk"],
        n_routed_experts=dims["experts"],
        n_shared_experts=1,
        layer_types=list(LAYER_TYPES),
        mlp_layer_types=["moe"] * len(LAYER_TYPES),
        compress_rates={"compressed_sparse_attention": dims["csa_ratio"],
                        "heavily_compressed_attention": dims["hca_ratio"]},
        hc_mult=dims["hc"],
        sliding_window=dims["window"],
        o_groups=dims["o_groups"],
        o_lora_rank=dims["o_lora"],
        index_n_heads=dims["index_heads"],
        index_head_dim=dims["index_dim"],
        index_topk=dims["index_topk"],
        swiglu_limit=10.0,
        max_position_embeddings=1 << 20,
    )


def build(config, device, attn, experts, torch):
    from transformers import DeepseekV4ForCausalLM

    with torch.device(device):
        model = DeepseekV4ForCausalLM._from_config(config, dtype=torch.bfloat16, attn_implementation=attn,
                                                   experts_implementation=experts)
    return model.eval()


def forward(model, x, cache, with_head, torch):
    """One step of the timed part; returns the cache. x: [B, S, hidden] embeddings (or token ids with the head)."""
    if with_head:
        out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
    else:
        out = model.model(inputs_embeds=x, past_key_values=cache, use_cache=True)
    return out.past_key_values


def pick_implementations(args, device, torch):
    """The first attention implementation of `--attn` (with eager experts), then the first experts implementation
    of `--experts` (with that attention), that builds and runs a prefill + a decode step of a tiny V4 model on the
    same device; the refused ones, with their reasons."""
    refused = []

    def works(attn, experts):
        try:
            model = build(make_config(TINY), device, attn, experts, torch)
            x = torch.randn(2, 12, TINY["hidden"], device=device, dtype=torch.bfloat16)
            with torch.inference_mode():
                cache = forward(model, x, None, False, torch)
                forward(model, x[:, :1], cache, False, torch)
            return True
        except Exception as e:  # noqa: BLE001 - any refusal moves on to the next candidate
            refused.append({"attn": attn, "experts": experts, "error": f"{type(e).__name__}: {e}"[:300]})
            return False

    attn = next((c for c in args.attn.split(",") if works(c, "eager")), None)
    experts = next((c for c in args.experts.split(",") if attn and works(attn, c)), None)
    if attn is None or experts is None:
        raise SystemExit("no attention / experts implementation of transformers runs DeepseekV4 here: "
                         + json.dumps(refused))
    return attn, experts, refused


def tile_cache(cache, batch, torch):
    """Repeats every per-sequence tensor of the cache's layers along the batch axis up to `batch` rows (the
    sliding-window keys, the compressors' entries, buffers and overlap state), so B sequences of context C can be
    seeded from a prefill of fewer sequences. The decode inputs of each sequence stay distinct (random
    embeddings), so routing and attention still differ per row."""
    seeded = None

    def tile(v):
        nonlocal seeded
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == seeded and seeded != batch:
            reps = math.ceil(batch / seeded)
            return v.repeat(reps, *([1] * (v.dim() - 1)))[:batch].contiguous()
        if isinstance(v, dict):
            return {k: tile(x) for k, x in v.items()}
        return v

    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor):
            seeded = keys.shape[0]
            break
    if seeded is None:
        raise RuntimeError("cache has no keys tensor to read its batch size from")
    for layer in cache.layers:
        for name, value in list(vars(layer).items()):
            setattr(layer, name, tile(value))
        if hasattr(layer, "keys") and hasattr(layer, "values"):
            layer.values = layer.keys  # V4 shares K and V (DeepseekV4HCACache.update)
    return cache


class Timer:
    def __init__(self, device, torch):
        self.cuda = device.startswith("cuda")
        self.torch = torch

    def ms(self, fn):
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            self.torch.cuda.synchronize()
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end), result
        t0 = time.perf_counter()
        result = fn()
        return (time.perf_counter() - t0) * 1000.0, result


def inputs(batch, length, dims, with_head, device, torch, gen):
    if with_head:
        return torch.randint(0, dims["vocab"], (batch, length), device=device, generator=gen)
    return torch.randn(batch, length, dims["hidden"], device=device, dtype=torch.bfloat16, generator=gen)


def is_oom(e, torch):
    return isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()


def run_row(row, fn, torch, device):
    try:
        row.update(fn())
    except Exception as e:  # noqa: BLE001 - the row says why it did not run; the others go on
        kind = "OOM" if is_oom(e, torch) else type(e).__name__
        row["error"] = f"{kind}: {e}"[:600]
        if device.startswith("cuda"):
            row["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    finally:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    emit(row)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="small dimensions (bench's tiny slice) for a CPU check")
    p.add_argument("--prompt", type=int, action="append", help="prefill lengths (default 1024 4096 8192)")
    p.add_argument("--batch", type=int, action="append", help="decode batch sizes (default 1 16 64)")
    p.add_argument("--context", type=int, action="append", help="decode context lengths (default 1024)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed-batch", type=int, default=8,
                   help="decode: sequences actually prefilled to seed the cache, tiled up to the batch")
    p.add_argument("--attn", default="sdpa,eager", help="attention implementations to try, best first")
    p.add_argument("--experts", default="grouped_mm,batched_mm,eager",
                   help="MoE experts implementations to try, best first")
    p.add_argument("--with-head", action="store_true", help="time the embedding and LM head (last position) too")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    for name in ("prompt", "batch", "context"):
        vals = getattr(a, name)
        if vals is not None and any(v < 1 for v in vals):
            p.error(f"--{name} must be >= 1")
    if a.iters < 1 or a.warmup < 0 or a.seed_batch < 1:
        p.error("--iters >= 1, --warmup >= 0, --seed-batch >= 1")
    prompts = a.prompt or ([24, 40] if a.tiny else [1024, 4096, 8192])
    batches = a.batch or ([1, 3] if a.tiny else [1, 16, 64])
    contexts = a.context or ([20] if a.tiny else [1024])

    import torch
    import transformers

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    torch.manual_seed(a.seed)
    dims = TINY if a.tiny else REAL
    attn, experts, refused = pick_implementations(a, a.device, torch)
    t0 = time.perf_counter()
    model = build(make_config(dims), a.device, attn, experts, torch)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    emit({
        "kind": "config", "peer": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu",
        "slice": "tiny" if a.tiny else "V4-Flash", "layer_types": LAYER_TYPES, "dims": dims,
        "attn_implementation": attn, "experts_implementation": experts, "refused": refused,
        "dtype": "bf16 (every parameter)", "parameters": params,
        "timed": "embedding + decoder + LM head (last position)" if a.with_head else
                 "decoder stack (3 layers + mHC head + final norm), inputs_embeds; no embedding / LM head",
        "build_s": round(build_s, 2), "warmup": a.warmup, "iters": a.iters,
    })
    timer = Timer(a.device, torch)
    gen = torch.Generator(device=a.device).manual_seed(a.seed)

    def prefill(length):
        steps = []
        with torch.inference_mode():
            for i in range(a.warmup + a.iters):
                x = inputs(1, length, dims, a.with_head, a.device, torch, gen)
                ms, cache = timer.ms(lambda: forward(model, x, None, a.with_head, torch))
                if cache.get_seq_length() != length:
                    raise RuntimeError(f"prefill cached {cache.get_seq_length()} tokens, not {length}")
                del cache
                if i >= a.warmup:
                    steps.append(ms)
        med = statistics.median(steps)
        return {"step_ms": round(med, 4), "steps_ms": [round(s, 4) for s in steps],
                "tokens_per_s": round(length / (med / 1000.0), 3)}

    def decode(batch, context):
        with torch.inference_mode():
            seeded = min(batch, a.seed_batch)
            cache = forward(model, inputs(seeded, context, dims, a.with_head, a.device, torch, gen), None,
                            a.with_head, torch)
            if cache.get_seq_length() != context:
                raise RuntimeError(f"seeding prefill cached {cache.get_seq_length()} tokens, not {context}")
            tile_cache(cache, batch, torch)
            steps = []
            for i in range(a.warmup + a.iters):
                x = inputs(batch, 1, dims, a.with_head, a.device, torch, gen)
                ms, cache = timer.ms(lambda: forward(model, x, cache, a.with_head, torch))
                if i >= a.warmup:
                    steps.append(ms)
            if cache.get_seq_length() != context + a.warmup + a.iters:
                raise RuntimeError("decode steps did not extend the cache by one token each")
            rows = cache.layers[0].keys.shape[0]
            if rows != batch:
                raise RuntimeError(f"cache holds {rows} sequences, not {batch}")
            del cache
        med = statistics.median(steps)
        return {"step_ms": round(med, 4), "steps_ms": [round(s, 4) for s in steps],
                "tokens_per_s": round(batch / (med / 1000.0), 3), "seeded_sequences": seeded}

    for length in prompts:
        run_row({"kind": "row", "phase": "prefill", "batch": 1, "context": length, "tokens": length},
                lambda: prefill(length), torch, a.device)
    for batch in batches:
        for context in contexts:
            run_row({"kind": "row", "phase": "decode", "batch": batch, "context": context, "tokens": batch},
                    lambda: decode(batch, context), torch, a.device)
    if a.device.startswith("cuda"):
        emit({"kind": "memory", "max_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
