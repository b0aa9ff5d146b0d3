#!/usr/bin/env python3
"""Offline inference with DeepInfer: the reference's example, on this engine.

    PYTHONPATH=build/python python3 examples/offline_inference.py                 # embedded default model
    DEEPINFER_HF_MODEL_DIR=/models/DeepSeek-V4.1-Flash python3 examples/offline_inference.py
    python3 examples/offline_inference.py --model_name /models/DeepSeek-V4.1-Flash --temperature 0.6 --seed 1

The model comes from --model_name (a local Hugging Face directory), else DEEPINFER_HF_MODEL_DIR, else the
build's embedded default; the log says which. DEEPINFER_ACCELERATOR=nvidia runs on CUDA device 0, cpu on the CPU
backend (default: CUDA when this build has it and sees a GPU). The reference defaults to EP8/DP8; here --ep/--dp
default to 1 and larger values run in-process ranks on the CPU backend (docs/PARALLEL.md); --cp N splits long prompt
chunks zig-zag over N in-process ranks on the CPU backend (docs/CONTEXT_PARALLEL.md).

Per sample it prints the token count, finish reason, acceptance rate (with --speculative mtp on a V3-family model with
an MTP layer, e.g. the embedded tiny model; n/a otherwise) and
decode_ppl, and exits non-zero when any value is non-finite.
"""

import argparse
import math
import os
import random
import sys

from deepinfer import LLM, SamplingParams

PROMPTS = [
    "Explain the difference between a process and a thread in two sentences.",
    "Write a haiku about the sea.",
    "What is 17 * 23? Answer with the number only.",
    "List three uses of a hash map.",
]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_name", default=None, help="local HF model directory (default: DEEPINFER_HF_MODEL_DIR, "
                   "then the embedded default)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (> 1: in-process ranks on the CPU backend)")
    p.add_argument("--dp", type=int, default=1, help="attention data-parallel size (> 1: in-process ranks on the CPU backend)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size (prefill; in-process ranks on the CPU backend)")
    p.add_argument("--speculative", default="off", choices=["off", "mtp", "dspark"],
                   help="speculative decoding (mtp: V3-family checkpoints with an MTP layer; docs/SPECULATIVE.md)")
    p.add_argument("--num_draft_tokens", type=int, default=1, help="draft tokens per step with --speculative")
    p.add_argument("--check_structured_output", action="store_true",
                   help="also check regex / JSON Schema / EBNF constrained generation on the same LLM")
    p.add_argument("--max_model_len", type=int, default=32768)
    p.add_argument("--max_num_seqs", type=int, default=4)
    p.add_argument("--gpu_memory_utilization", type=float, default=0.85)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of every request (deterministic sampling whatever the batch) and of the engine")
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable)")
    p.add_argument("--num_prompts", type=int, default=4, help="prompts to run when none are given")
    p.add_argument("--no_chat", action="store_true", help="send prompts as raw text instead of chat messages")
    return p.parse_args(argv)


def device_from_env():
    acc = os.environ.get("DEEPINFER_ACCELERATOR", "").strip().lower()
    if acc in ("", "auto"):
        return None
    if acc == "nvidia":
        return "cuda"
    if acc == "cpu":
        return "cpu"
    if acc == "ascend":
        sys.exit("DEEPINFER_ACCELERATOR=ascend: Ascend is not supported by this build (supported: cpu, nvidia)")
    sys.exit(f"DEEPINFER_ACCELERATOR must be cpu, nvidia or ascend (got '{acc}')")


def make_prompts(llm, args):
    """Chat prompts when the model's tokenizer has the chat special tokens, else raw text, else random ids."""
    texts = args.prompt or [PROMPTS[i % len(PROMPTS)] for i in range(args.num_prompts)]
    if not llm.has_tokenizer:
        rng = random.Random(args.seed)
        print("no tokenizer.json: using random token-id prompts", file=sys.stderr)
        ids = [[rng.randrange(llm.vocab_size) for _ in range(8 + 5 * i)] for i in range(len(texts))]
        return ids, [f"<{len(p)} random token ids>" for p in ids]
    if not args.no_chat:
        try:
            return [llm.encode_chat([{"role": "user", "content": t}]) for t in texts], [repr(t) for t in texts]
        except FileNotFoundError as e:  # the tokenizer lacks the chat format's special tokens
            print(f"chat encoding unavailable ({e}); sending raw text", file=sys.stderr)
    return [llm.encode(t) for t in texts], [repr(t) for t in texts]


def check_structured_output(llm):
    """Regex, JSON Schema and EBNF (GBNF) constraints on the same LLM; each output must be a sentence of its
    constraint."""
    import json
    import re

    ok = True
    cases = [
        ("regex", r"[0-9]{3}-[a-z]{2}", lambda s: re.fullmatch(r"[0-9]{3}-[a-z]{2}", s) is not None),
        ("json_schema", json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 999}},
                                    "required": ["n"], "additionalProperties": False}),
         lambda s: 0 <= json.loads(s)["n"] <= 999),
        ("grammar", 'root ::= "yes" | "no"', lambda s: s in ("yes", "no")),
    ]
    for field, value, check in cases:
        sp = SamplingParams(temperature=0, max_tokens=256)
        setattr(sp, field, value)
        try:
            out = llm.generate(["Answer:"] if llm.has_tokenizer else [[1, 2, 3]], sp, use_tqdm=False)[0].outputs[0]
        except (ValueError, NotImplementedError) as e:
            print(f"structured {field}: FAILED ({e})")
            ok = False
            continue
        try:
            good = out.finish_reason == "stop" and check(out.text)
        except (ValueError, KeyError, TypeError):
            good = False
        print(f"structured {field}: {'ok' if good else 'FAILED'} finish={out.finish_reason} text={out.text!r}")
        ok = ok and good
    return ok


def main(argv=None):
    args = parse_args(argv)
    device = device_from_env()
    try:
        llm = LLM(model=args.model_name, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  gpu_memory_utilization=args.gpu_memory_utilization, ep=args.ep, dp=args.dp, cp=args.cp,
                  device=device, seed=args.seed, speculative=args.speculative,
                  num_draft_tokens=args.num_draft_tokens)
    except (ValueError, FileNotFoundError, NotImplementedError, MemoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model resolved from {llm.model_source}: {llm.model_dir} ({llm.model_type}, device {llm.device})",
          file=sys.stderr)
    prompt_ids, texts = make_prompts(llm, args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    outputs = llm.generate(prompt_token_ids=prompt_ids, sampling_params=params)

    all_finite = True
    for out in outputs:
        o = out.outputs[0]
        ppl = o.decode_ppl
        finite = o.finish_reason != "error" and ppl is not None and math.isfinite(ppl)
        all_finite = all_finite and finite
        acc = "n/a" if out.acceptance_rate is None else f"{out.acceptance_rate:.3f}"
        ppl_s = "n/a" if ppl is None else f"{ppl:.4f}"
        print(f"[sample {out.index}] prompt_tokens={len(out.prompt_token_ids)} tokens={len(o.token_ids)} "
              f"finish={o.finish_reason} acceptance_rate={acc} decode_ppl={ppl_s} finite={'yes' if finite else 'NO'}")
        print(f"  prompt: {texts[out.index]}")
        print(f"  ids: {','.join(map(str, o.token_ids))}")
        if llm.has_tokenizer:
            print(f"  text: {o.text!r}")
    stats = llm.stats()
    print(f"offline: {len(outputs)} requests, {stats['generated_tokens']} generated tokens, {stats['steps']} steps")
    ok = all_finite
    if args.check_structured_output:
        ok = check_structured_output(llm) and ok
    if not all_finite:
        print("error: non-finite values in at least one sample", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
