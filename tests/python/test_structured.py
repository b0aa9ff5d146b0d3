"""Structured-output options of SamplingParams reach the engine's constrained decoding: on the V3 golden model
(random weights) with a byte-level BPE tokenizer, every output is a sentence of its regex / JSON Schema / GBNF
grammar; bad specs and tokenizers that cannot support it raise."""

import json
import os
import re

import pytest

from deepinfer import LLM, SamplingParams


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory, golden_v41):
    """The V3 golden model (768 ids, EOS 1) with a byte-level tokenizer: 0 <s>, 1 </s>, 2..257 one byte each."""
    d = tmp_path_factory.mktemp("byte_model")
    golden_v3 = os.path.join(os.path.dirname(golden_v41), "deepseek_v3")
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(golden_v3, f), d / f)
    vocab = {"<s>": 0, "</s>": 1}
    for i, ch in enumerate(bytes_to_unicode().values()):
        vocab[ch] = 2 + i
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c, i in (("<s>", 0), ("</s>", 1))],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": []},
    }
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return LLM(str(d), max_model_len=320, max_num_seqs=4, device="cpu")


def test_regex_json_schema_and_grammar(byte_model):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    params = [
        SamplingParams(temperature=0, max_tokens=40, regex=r"[0-9]{3}-[a-z]{2}"),
        SamplingParams(temperature=0.9, seed=4, max_tokens=250, json_schema=schema),
        SamplingParams(temperature=0.9, seed=5, max_tokens=40, grammar='root ::= "yes" | "no" | "maybe" [0-9]'),
        SamplingParams(temperature=0.9, seed=6, max_tokens=250, json_object=True),
    ]
    outs = byte_model.generate(["Q: ", "{", "answer: ", "obj"], params, use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    for o in outs:
        assert o.outputs[0].finish_reason == "stop", (o.outputs[0].engine_stop_reason, o.outputs[0].text)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", texts[0]), texts[0]
    v = json.loads(texts[1])
    assert set(v) == {"n", "ok"} and isinstance(v["n"], int) and 0 <= v["n"] <= 99 and isinstance(v["ok"], bool)
    assert re.fullmatch(r"yes|no|maybe[0-9]", texts[2]), texts[2]
    assert isinstance(json.loads(texts[3]), dict), texts[3]


def test_structured_properties_and_errors(byte_model, golden_v41):
    sp = SamplingParams(regex="a+")
    assert sp.regex == "a+" and sp.json_schema is None and not sp.json_object
    sp.json_schema = {"type": "string"}
    assert sp.regex is None and json.loads(sp.json_schema) == {"type": "string"}
    sp.json_schema = None
    assert sp.json_schema is None
    with pytest.raises(ValueError, match="at most one"):
        SamplingParams(regex="a", grammar='root ::= "a"')
    with pytest.raises(ValueError, match=r"prompts\[0\]: .*structured output \(regex\)"):
        byte_model.generate(["x"], SamplingParams(regex="(unclosed"), use_tqdm=False)
    # The V4.1 fixture's WordLevel tokenizer puts spaces between tokens: no byte-exact vocabulary, so no constraints.
    llm = LLM(golden_v41, max_model_len=64, device="cpu")
    with pytest.raises(NotImplementedError, match="not available for this model"):
        llm.generate(["w1"], SamplingParams(regex="a"), use_tqdm=False)
