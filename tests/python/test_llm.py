"""deepinfer.LLM on the V4.1 golden fixture model (random weights, WordLevel tokenizer): the same tokens as the
C++ CLI, input order, errors as Python exceptions, streaming equal to generate, the GIL released while the
engine runs."""

import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

import deepinfer
from deepinfer import LLM, SamplingParams


def cli_offline(cli, model, args):
    r = subprocess.run([cli, "offline", "--model", model, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    samples = {}
    for m in re.finditer(r"\[sample (\d+)\] [^\n]*decode_ppl=([0-9.]+)[^\n]*\n  ids: ([0-9,]*)", r.stdout):
        samples[int(m.group(1))] = ([int(t) for t in m.group(3).split(",") if t], float(m.group(2)))
    return samples


def test_generate_matches_cli_same_prompts_and_seed(cli, golden_v41):
    # The CLI's --seed is the engine seed and every request's seed; it queues text prompts first, then id prompts.
    text = "w1 W2 v3 w4"
    ids = [[7, 300, 12, 5, 9], [100 + i for i in range(40)]]
    args = ["--prompt", text, "--max-tokens", "8", "--temperature", "0.8", "--top-p", "0.95", "--seed", "11",
            "--max-num-seqs", "2", "--max-model-len", "512"]
    for p in ids:
        args += ["--prompt-ids", ",".join(map(str, p))]
    want = cli_offline(cli, golden_v41, args)
    assert sorted(want) == [0, 1, 2]

    llm = LLM(golden_v41, max_model_len=512, max_num_seqs=2, seed=11, device="cpu")
    outs = llm.generate([text] + ids, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8, seed=11),
                        use_tqdm=False)
    assert [o.index for o in outs] == [0, 1, 2]
    assert outs[0].prompt == text and outs[0].prompt_token_ids == llm.encode(text)
    assert outs[1].prompt is None and outs[1].prompt_token_ids == ids[0]
    for i, o in enumerate(outs):
        c = o.outputs[0]
        assert c.token_ids == want[i][0], f"prompt {i}"
        assert c.decode_ppl == pytest.approx(want[i][1], abs=1e-4)
        assert c.finish_reason == "length" and c.stop_reason is None
        assert c.text == llm.decode(c.token_ids, skip_special_tokens=True)
        assert o.acceptance_rate is None and o.finished


def test_context_parallel_prefill_equals_one_rank(golden_v41):
    # Prompts of >= 2*cp tokens run zig-zag over cp in-process ranks; greedy and sampled ids equal cp=1's.
    prompts = [[100 + (7 * i) % 200 for i in range(47)], [5, 6, 7], [300 + i for i in range(20)]]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.9, max_tokens=6, seed=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)]
    got = {}
    for cp in (1, 2, 3):
        llm = LLM(golden_v41, max_model_len=256, max_num_seqs=2, max_num_batched_tokens=32, seed=1, device="cpu",
                  cp=cp)
        got[cp] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got[2] == got[1] and got[3] == got[1]


def test_batch_invariant_output_does_not_depend_on_the_batch(golden_v41):
    # The flag reaches the engine; a seeded request's ids alone equal its ids among others (the CPU reference is
    # batch-invariant with or without it; CUDA's mode is tested on the GPU).
    x = [100 + (7 * i) % 200 for i in range(31)]
    others = [[5 + i for i in range(3 + 4 * j)] for j in range(5)]
    p = SamplingParams(temperature=0.8, max_tokens=6, seed=3, ignore_eos=True)
    alone = LLM(golden_v41, max_model_len=256, max_num_seqs=1, device="cpu", batch_invariant=True)
    want = alone.generate([x], [p], use_tqdm=False)[0].outputs[0].token_ids
    crowd = LLM(golden_v41, max_model_len=256, max_num_seqs=6, max_num_batched_tokens=16, device="cpu",
                batch_invariant=True)
    outs = crowd.generate(others[:2] + [x] + others[2:], [SamplingParams(max_tokens=5, seed=9)] * 2 + [p] +
                          [SamplingParams(max_tokens=5, seed=9)] * 3, use_tqdm=False)
    assert outs[2].outputs[0].token_ids == want


def test_activation_quant_reaches_the_engine(golden_v41):
    # The golden model stores no FP8 / MXFP4 weights, so mxfp8 rounds nothing: the same ids as the default; a value
    # that does not exist, mxfp8 on a V3-family model and fp8 (the V3 family's rounding) on a V4 one are refused by
    # name; fp8 on the embedded tiny V3 model (bf16 weights) runs and rounds nothing either.
    p = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompt = [[11, 22, 33, 44, 55]]
    plain = LLM(golden_v41, max_model_len=128, max_num_seqs=1, device="cpu")
    rounded = LLM(golden_v41, max_model_len=128, max_num_seqs=1, device="cpu", activation_quant="mxfp8")
    assert (rounded.generate(prompt, [p], use_tqdm=False)[0].outputs[0].token_ids ==
            plain.generate(prompt, [p], use_tqdm=False)[0].outputs[0].token_ids)
    with pytest.raises(ValueError, match="activation_quant"):
        LLM(golden_v41, max_model_len=128, device="cpu", activation_quant="fp4")
    tiny = str(pathlib.Path(__file__).resolve().parents[2] / "models" / "deepinfer-tiny-v3")
    with pytest.raises(Exception, match="mxfp8 is DeepSeek-V4 / V4.1's rounding"):
        LLM(tiny, max_model_len=128, device="cpu", activation_quant="mxfp8")
    with pytest.raises(Exception, match="fp8 is the DeepSeek-V3 family's rounding"):
        LLM(golden_v41, max_model_len=128, device="cpu", activation_quant="fp8")
    tiny_plain = LLM(tiny, max_model_len=128, max_num_seqs=1, device="cpu")
    tiny_fp8 = LLM(tiny, max_model_len=128, max_num_seqs=1, device="cpu", activation_quant="fp8")
    assert (tiny_fp8.generate(prompt, [p], use_tqdm=False)[0].outputs[0].token_ids ==
            tiny_plain.generate(prompt, [p], use_tqdm=False)[0].outputs[0].token_ids)


def test_kv_cache_dtype_reaches_the_engine(golden_v41):
    # bf16 on the embedded tiny V3 model runs to the end, and on a V4.1 model gives the f32 cache's tokens (its rows
    # are fake-quantized: lossless); a value that does not exist is refused by name.
    p = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    tiny = str(pathlib.Path(__file__).resolve().parents[2] / "models" / "deepinfer-tiny-v3")
    bf16 = LLM(tiny, max_model_len=128, max_num_seqs=1, device="cpu", kv_cache_dtype="bf16")
    assert len(bf16.generate([[11, 22, 33, 44, 55]], [p], use_tqdm=False)[0].outputs[0].token_ids) == 5
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(tiny, max_model_len=128, device="cpu", kv_cache_dtype="int8")
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8'"):  # the V3 family's rows are not quantized
        LLM(tiny, max_model_len=128, device="cpu", kv_cache_dtype="fp8")
    outs = [LLM(golden_v41, max_model_len=128, max_num_seqs=1, device="cpu", kv_cache_dtype=d)
            .generate([[11, 22, 33, 44, 55]], [p], use_tqdm=False)[0].outputs[0].token_ids
            for d in ("f32", "bf16", "fp8")]
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 5


def test_kernel_choices_are_the_cuda_backends(golden_v41):
    # KEY=VALUE specs of the CUDA backend's kernel choices: refused by name on the CPU device.
    for choices in (["mla_tf32=1"], "mla_tf32=1"):  # a list of specs, or one spec
        with pytest.raises(ValueError, match="kernel_choice='mla_tf32=1': kernel choices are the CUDA backend's"):
            LLM(golden_v41, max_model_len=128, device="cpu", kernel_choices=choices)


def test_speculative_mtp_equals_plain_on_the_tiny_model():
    # The embedded tiny model has a trained MTP layer: greedy ids with drafts equal those without, and the request
    # reports its acceptance (None without speculation).
    prompts = ["The meaning of life is", "A fortune cookie says:"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    tiny = str(pathlib.Path(__file__).resolve().parents[2] / "models" / "deepinfer-tiny-v3")
    plain = LLM(tiny, max_model_len=256, max_num_seqs=2, device="cpu")
    spec = LLM(tiny, max_model_len=256, max_num_seqs=2, device="cpu", speculative="mtp", num_draft_tokens=2)
    a = plain.generate(prompts, params, use_tqdm=False)
    b = spec.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in b] == [o.outputs[0].token_ids for o in a]
    assert all(o.acceptance_rate is None for o in a)
    assert all(o.acceptance_rate is not None and 0 < o.acceptance_rate <= 1 for o in b)
    assert all(0 < o.num_accepted_tokens <= o.num_draft_tokens for o in b)
    with pytest.raises(ValueError, match="speculative"):
        LLM(tiny, max_model_len=256, device="cpu", speculative="eagle")


def test_input_order_kept_with_one_slot(llm):
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompts = [[3] * 60, [4, 5], [6] * 20, [7, 8, 9]]
    batch = llm.generate(prompt_token_ids=prompts, sampling_params=greedy, use_tqdm=False)
    assert [o.prompt_token_ids for o in batch] == prompts
    for p, o in zip(prompts, batch):
        alone = llm.generate(prompt_token_ids=p, sampling_params=greedy, use_tqdm=False)
        assert len(alone) == 1 and alone[0].outputs[0].token_ids == o.outputs[0].token_ids


def test_per_prompt_params_n_and_logprobs(llm):
    outs = llm.generate([[1, 2, 3], "w5 w6"],
                        [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                         SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=4, logprobs=2, ignore_eos=True)],
                        use_tqdm=False)
    assert len(outs[0].outputs) == 1 and len(outs[0].outputs[0].token_ids) == 3
    assert outs[0].outputs[0].logprobs is None and outs[0].outputs[0].cumulative_logprob is None
    samples = outs[1].outputs
    assert [s.index for s in samples] == [0, 1, 2]
    for s in samples:
        assert len(s.logprobs) == len(s.token_ids) == 4
        for tok, lp in zip(s.token_ids, s.logprobs):
            assert tok in lp and 2 <= len(lp) <= 3 and all(v <= 0 for v in lp.values())
        nll = -sum(lp[t] for t, lp in zip(s.token_ids, s.logprobs))
        assert s.decode_ppl == pytest.approx(math.exp(nll / 4), rel=1e-5)
        assert s.cumulative_logprob == pytest.approx(-nll, rel=1e-5)


def test_prefix_reuse_reported_and_equal_to_cold(llm):
    prompt = [(i * 37) % 500 for i in range(150)]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    cold = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
    warm = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
    assert cold.num_cached_prompt_tokens == 0
    assert warm.num_cached_prompt_tokens >= 64  # at least one full block of the prompt came from the cache
    assert warm.token_ids == cold.token_ids
    assert llm.stats()["prefix_cache_hit_rate"] > 0
    # GPU idle between decode steps is measured on CUDA only (CUDA events): None on the CPU backend.
    st = llm.stats()
    assert st["gpu_idle_between_decode_steps"] is None
    assert st["gpu_timed_decode_steps"] == 0


def test_stop_token_and_eos(llm):
    # Greedy once, then stop on its third token: the output ends there with finish_reason "stop".
    base = llm.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    ids = base[0].outputs[0].token_ids
    stop_at = ids[2]
    cut = ids.index(stop_at) + 1
    out = llm.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                      stop_token_ids=[stop_at]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[:cut]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at and out.engine_stop_reason == "stop_token"


def test_errors_raise_python_exceptions(llm, golden_v41):
    with pytest.raises(ValueError, match=r"prompts\[1\]: .*vocabulary"):
        llm.generate([[1, 2], [1, 99999]], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[1] * 600], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="one for all prompts or one per prompt"):
        llm.generate([[1], [2]], [SamplingParams(), SamplingParams(), SamplingParams()], use_tqdm=False)
    with pytest.raises(TypeError, match=r"prompts\[0\]"):
        llm.generate([3.5], use_tqdm=False)
    with pytest.raises(ValueError, match="must be dp·cp"):
        LLM(golden_v41, ep=4, cp=2, device="cpu")
    with pytest.raises(ValueError, match="routed experts"):
        LLM(golden_v41, ep=64, device="cpu")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(golden_v41, gpu_memory_utilization=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM("/nonexistent/model/dir")
    if not deepinfer.built_with_cuda():
        with pytest.raises(NotImplementedError, match="without CUDA"):
            LLM(golden_v41, device="cuda")
    # Still usable afterwards: nothing of the failed calls stayed queued.
    out = llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_model_from_env(golden_v41, monkeypatch):
    monkeypatch.setenv("DEEPINFER_HF_MODEL_DIR", golden_v41)
    llm = LLM(max_model_len=64, device="cpu")
    assert llm.model_source == "DEEPINFER_HF_MODEL_DIR" and llm.model_dir == golden_v41
    assert llm.model_type == "deepseek_v41" and llm.vocab_size == 512


def test_stream_equals_generate(llm):
    sp = SamplingParams(temperature=0.7, seed=3, n=2, max_tokens=7, ignore_eos=True)
    prompts = ["w1 w2 w3", [9, 8, 7, 6, 5], [44] * 30]
    want = llm.generate(prompts, sp, use_tqdm=False)
    got_ids, got_text, finals = {}, {}, {}
    with llm.generate_stream(prompts, sp) as stream:
        for d in stream:
            key = (d.index, d.sample_index)
            got_ids.setdefault(key, []).extend(d.token_ids)
            got_text[key] = got_text.get(key, "") + d.text
            if d.request_output is not None:
                finals[d.index] = d.request_output
                assert d.finished
    for o in want:
        for c in o.outputs:
            assert got_ids[(o.index, c.index)] == c.token_ids
            assert got_text[(o.index, c.index)] == c.text
        assert [c.token_ids for c in finals[o.index].outputs] == [c.token_ids for c in o.outputs]


def test_open_stream_blocks_other_calls_until_closed(llm):
    stream = llm.generate_stream([[1, 2, 3]], SamplingParams(max_tokens=20, ignore_eos=True))
    first = next(stream)
    assert first.index == 0
    with pytest.raises(NotImplementedError, match="in progress"):
        llm.generate([[1]], use_tqdm=False)
    stream.close()
    assert stream.closed
    with pytest.raises(StopIteration):
        next(stream)
    assert len(llm.generate([[1]], SamplingParams(max_tokens=2), use_tqdm=False)) == 1


def test_gil_released_while_generating(llm):
    done = threading.Event()
    result = {}

    def work():
        result["out"] = llm.generate([[5] * 200, [6] * 200], SamplingParams(max_tokens=40, ignore_eos=True),
                                     use_tqdm=False)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        time.sleep(0)
    t.join()
    assert len(result["out"]) == 2
    # With the GIL held for the whole call this thread could not run at all until it returned.
    assert ticks > 100, ticks


def test_progress_bar_fallback_and_tqdm(llm, capsys):
    llm.generate([[1, 2], [3, 4]], SamplingParams(max_tokens=2), use_tqdm=True)
    err = capsys.readouterr().err
    assert "2/2" in err


def make_chat_model(tmp_path, golden_v41):
    """The V4 golden model (V4 has no Engram, whose token map would change with the tokenizer) with the V4.1
    fixture's WordLevel tokenizer plus DeepSeek's chat special tokens (ids 500..508). The tokenizer then stops short
    of the model's 512 ids, as DeepSeek's does: ids past it must add no text instead of failing."""
    d = tmp_path / "chat_model"
    d.mkdir()
    golden_v4 = os.path.join(os.path.dirname(golden_v41), "deepseek_v4")
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(golden_v4, f), d / f)
    tok = json.load(open(os.path.join(golden_v41, "tokenizer.json"), encoding="utf-8"))
    vocab = {w: i for w, i in tok["model"]["vocab"].items() if i < 500}
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
                "</think>", "<｜System｜>", "<｜latest_reminder｜>", "<｜tool▁outputs▁begin｜>"]
    tok["model"]["vocab"] = vocab
    tok["model"]["unk_token"] = next(iter(vocab))
    tok["added_tokens"] = [{"id": 500 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for i, s in enumerate(specials)]
    json.dump(tok, open(d / "tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
    return str(d)


def test_chat_uses_the_cpp_chat_encoder(tmp_path, golden_v41, cli):
    model = make_chat_model(tmp_path, golden_v41)
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 W4 v7"}]
    chat_file = tmp_path / "chat.json"
    chat_file.write_text(json.dumps({"messages": messages}, ensure_ascii=False), encoding="utf-8")
    r = subprocess.run([cli, "tokenize", "--tokenizer", str(tmp_path / "chat_model" / "tokenizer.json"), "--chat",
                        str(chat_file), "--encoding", "v4"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout.strip().splitlines()[-1])
    llm = LLM(model, max_model_len=256, device="cpu")
    assert llm.chat_format == "v4"
    assert llm.encode_chat(messages) == want
    outs = llm.chat([messages, messages[1:]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                    use_tqdm=False)
    assert outs[0].prompt_token_ids == want and len(outs) == 2
    assert len(outs[1].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"role": "robot", "content": "hi"}], use_tqdm=False)


def test_example_script_end_to_end(example_script, golden_v41):
    env = dict(os.environ, DEEPINFER_HF_MODEL_DIR=golden_v41, DEEPINFER_ACCELERATOR="cpu")
    r = subprocess.run([sys.executable, example_script, "--max_model_len", "256", "--max_tokens", "6",
                        "--num_prompts", "3", "--temperature", "0.5", "--seed", "2"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "model resolved from DEEPINFER_HF_MODEL_DIR" in r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("[sample ")]
    assert len(lines) == 3
    for l in lines:
        assert "tokens=6" in l and "acceptance_rate=n/a" in l and "finite=yes" in l
        assert re.search(r"decode_ppl=[0-9]+\.[0-9]{4}", l)
    r2 = subprocess.run([sys.executable, example_script, "--max_model_len", "256", "--max_tokens", "6",
                         "--num_prompts", "3", "--temperature", "0.5", "--seed", "2", "--cp", "2"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "context parallel" in r2.stderr
    assert [l for l in r2.stdout.splitlines() if l.startswith("[sample ")] == lines
    # The embedded tiny model has a trained MTP layer: speculation reports an acceptance rate, same greedy text.
    env3 = {k: v for k, v in env.items() if k != "DEEPINFER_HF_MODEL_DIR"}
    base = [sys.executable, example_script, "--max_model_len", "256", "--max_tokens", "12", "--num_prompts", "2"]
    plain = subprocess.run(base, capture_output=True, text=True, env=env3, timeout=300)
    spec = subprocess.run(base + ["--speculative", "mtp", "--num_draft_tokens", "2"], capture_output=True, text=True,
                          env=env3, timeout=300)
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    strip = lambda out: [re.sub(r" acceptance_rate=\S+", "", l) for l in out.splitlines() if l.startswith("[sample ")]
    assert strip(spec.stdout) == strip(plain.stdout) and len(strip(plain.stdout)) == 2
    assert re.search(r"acceptance_rate=[0-9]\.[0-9]{3}", spec.stdout), spec.stdout


def test_example_checks_structured_output(example_script, byte_model_dir):
    env = dict(os.environ, DEEPINFER_HF_MODEL_DIR=byte_model_dir, DEEPINFER_ACCELERATOR="cpu")
    r = subprocess.run([sys.executable, example_script, "--max_model_len", "320", "--max_tokens", "4",
                        "--num_prompts", "2", "--check_structured_output"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for field in ("regex", "json_schema", "grammar"):
        assert f"structured {field}: ok finish=stop" in r.stdout, r.stdout
