"""LLM: the offline entry point (vLLM-shaped). A thin layer over deepinfer._core.Llm."""

import json
import os
import sys

from deepinfer import _core
from deepinfer._core import SamplingParams


def _default_device():
    return "cuda" if _core.cuda_device_count() > 0 else "cpu"


def _is_token_ids(x):
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, int) for t in x)


def _as_prompt_list(prompts, prompt_token_ids):
    """One prompt or a list of prompts (str or token-id list) -> a list; token-id lists are never split."""
    if prompts is not None and prompt_token_ids is not None:
        raise ValueError("pass prompts or prompt_token_ids, not both")
    if prompt_token_ids is not None:
        return [list(prompt_token_ids)] if _is_token_ids(prompt_token_ids) else [list(p) for p in prompt_token_ids]
    if prompts is None:
        raise ValueError("no prompts: pass prompts (str, list of str or list of token-id lists) or prompt_token_ids")
    if isinstance(prompts, str) or _is_token_ids(prompts):
        return [prompts]
    return list(prompts)


def _as_params_list(sampling_params):
    if sampling_params is None:
        return [SamplingParams()]
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params]
    return list(sampling_params)


class _Progress:
    """tqdm when it is installed, else a one-line counter on stderr."""

    def __init__(self, total, desc):
        self.done = 0
        self.total = total
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True)
        except ImportError:
            self.bar = None
            self.desc = desc
            self._draw()

    def _draw(self):
        width = 30
        filled = width * self.done // max(self.total, 1)
        sys.stderr.write(f"\r{self.desc}: [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
        sys.stderr.flush()

    def __call__(self, finished, total):
        if finished == self.done:
            return
        if self.bar is not None:
            self.bar.update(finished - self.done)
            self.done = finished
        else:
            self.done = finished
            self._draw()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")


class LLM:
    """An engine over one checkpoint directory.

    model: a local Hugging Face directory (config.json + safetensors, tokenizer.json for text). When None,
    DEEPINFER_HF_MODEL_DIR, then the embedded default model of the build. ep/dp > 1 run expert / attention
    data parallelism with in-process ranks on the CPU backend (docs/PARALLEL.md); cp > 1 splits long prompt chunks
    zig-zag over cp in-process ranks (CPU backend; with ep/dp each DP shard's ranks are its CP group, so the world
    lcm(ep, dp·cp) must be dp·cp; docs/CONTEXT_PARALLEL.md). device: "cpu" or "cuda" (default: "cuda" when this
    build has CUDA and sees a GPU). KV cache memory: on CUDA gpu_memory_utilization of the device minus the
    weights; on the CPU kv_cache_bytes of host memory. exact_prefill (V4.1): every layer on every prompt token
    (transformers parity) instead of decoder SWA bounded replay. batch_invariant: a request's output is
    bit-identical whatever else is in the batch (CUDA: fixed-order kernels, slower; the CPU backend always is).
    activation_quant: "none" (transformers' numerics), "mxfp8" (V4/V4.1: the inputs of GEMMs over FP8 / MXFP4
    weights rounded to e4m3 per 32 values, as the reference and vLLM compute) or "fp8" (the V3 family: per 128
    values with an f32 scale, the reference's gemm_impl "fp8", vLLM's and SGLang's block-FP8 GEMMs).
    kernel_choices (CUDA): "KEY=VALUE" strings, the CUDA backend's kernel choices for A/Bs (the keys of `deepinfer
    bench --kernel-choice`, e.g. ["f32_scale_mma=1"]; one string is one spec); refused on the CPU device.
    kv_cache_dtype: "f32" (the cache rows as computed), "bf16" (the paged caches rounded to bf16 as written, as
    vLLM keeps them in the model's dtype: half the bytes a decode step reads, twice the cached tokens; lossless for
    V4.1, whose cached rows are fake-quantized), "fp8" (V4.1 on the CPU: the rows' FP8 / FP4 records with their
    block scales, as the reference stores them: lossless, ~a quarter of bf16's bytes) or "auto" (bf16 for V4.1 on the CPU,
    f32 otherwise).
    """

    def __init__(
        self,
        model=None,
        *,
        max_model_len=32768,
        max_num_seqs=4,
        gpu_memory_utilization=0.85,
        ep=1,
        dp=1,
        cp=1,
        device=None,
        seed=0,
        max_num_batched_tokens=2048,
        kv_cache_bytes=1 << 30,
        threads=0,
        chat_format=None,
        exact_prefill=False,
        speculative="off",
        num_draft_tokens=1,
        batch_invariant=False,
        activation_quant="none",
        kernel_choices=(),
        kv_cache_dtype="auto",
    ):
        self.model_dir, self.model_source = _core.resolve_model_dir(
            model, os.environ.get("DEEPINFER_HF_MODEL_DIR"), _core.embedded_model_dir()
        )
        self._llm = _core.Llm(
            model_dir=self.model_dir,
            device=device or _default_device(),
            threads=threads,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_bytes=kv_cache_bytes,
            ep=ep,
            dp=dp,
            cp=cp,
            seed=seed,
            chat_format=chat_format or "",
            exact_prefill=exact_prefill,
            speculative=speculative,
            num_draft_tokens=num_draft_tokens,
            batch_invariant=batch_invariant,
            activation_quant=activation_quant,
            kernel_choices=[kernel_choices] if isinstance(kernel_choices, str) else list(kernel_choices),
            kv_cache_dtype=kv_cache_dtype,
        )

    # Model facts.
    device = property(lambda self: self._llm.device)
    max_model_len = property(lambda self: self._llm.max_model_len)
    vocab_size = property(lambda self: self._llm.vocab_size)
    model_type = property(lambda self: self._llm.model_type)
    eos_token_ids = property(lambda self: self._llm.eos_token_ids)
    chat_format = property(lambda self: self._llm.chat_format)
    has_tokenizer = property(lambda self: self._llm.has_tokenizer)

    def encode(self, text):
        return self._llm.encode(text)

    def decode(self, token_ids, skip_special_tokens=False):
        return self._llm.decode(list(token_ids), skip_special_tokens)

    def stats(self):
        """Engine counters since the LLM was created (steps, prompt tokens computed, generated tokens, ...)."""
        return self._llm.stats()

    def generate(self, prompts=None, sampling_params=None, *, prompt_token_ids=None, use_tqdm=True):
        """Generates for each prompt; returns RequestOutputs in input order.

        prompts: a str, a token-id list, or a list of those. sampling_params: one SamplingParams for all prompts or
        a list with one per prompt (default SamplingParams()).
        """
        items = _as_prompt_list(prompts, prompt_token_ids)
        params = _as_params_list(sampling_params)
        progress = _Progress(len(items), "Processed prompts") if use_tqdm and items else None
        try:
            return self._llm.generate(items, params, progress)
        finally:
            if progress is not None:
                progress.close()

    def generate_stream(self, prompts=None, sampling_params=None, *, prompt_token_ids=None):
        """An iterator of StreamDelta (new tokens and text of one sample) as the engine produces them.

        Joining a sample's deltas gives the same token_ids and text as generate(). The delta that finishes a
        request carries its RequestOutput (delta.request_output). Closing the iterator (or leaving a `with`
        block) aborts what is unfinished; while it is open, other generate calls on this LLM raise.
        """
        items = _as_prompt_list(prompts, prompt_token_ids)
        return self._llm.generate_stream(items, _as_params_list(sampling_params))

    def _chat_request(self, messages, tools, thinking, reasoning_effort, tool_choice):
        req = {"messages": messages}
        if tools is not None:
            req["tools"] = tools
        if thinking is not None:
            req["thinking"] = bool(thinking)
        if reasoning_effort is not None:
            req["reasoning_effort"] = reasoning_effort
        if tool_choice is not None:
            req["tool_choice"] = tool_choice
        return json.dumps(req, ensure_ascii=False)

    def encode_chat(self, messages, *, tools=None, thinking=False, reasoning_effort=None, tool_choice=None):
        """Token ids of one conversation rendered by the model's C++ chat encoder (llm.chat_format).

        thinking=False renders the non-thinking prompt (as `deepinfer tokenize --chat` does without --thinking).
        """
        return self._llm.encode_chat(self._chat_request(messages, tools, thinking, reasoning_effort, tool_choice))

    def chat(
        self,
        messages,
        sampling_params=None,
        *,
        tools=None,
        thinking=False,
        reasoning_effort=None,
        tool_choice=None,
        use_tqdm=True,
    ):
        """Generates replies to one conversation (a list of {"role", "content", ...} dicts) or a list of them."""
        batch = messages and isinstance(messages, (list, tuple)) and isinstance(messages[0], (list, tuple))
        conversations = list(messages) if batch else [messages]
        ids = [self.encode_chat(c, tools=tools, thinking=thinking, reasoning_effort=reasoning_effort,
                                tool_choice=tool_choice) for c in conversations]
        return self.generate(prompt_token_ids=ids, sampling_params=sampling_params, use_tqdm=use_tqdm)
