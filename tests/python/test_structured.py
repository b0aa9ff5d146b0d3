"""Structured-output options of SamplingParams reach the engine's constrained decoding: on the V3 golden model
(random weights) with a byte-level BPE tokenizer, every output is a sentence of its regex / JSON Schema / GBNF
grammar; bad specs and tokenizers that cannot support it raise."""

import json
import re

import pytest

from deepinfer import LLM, SamplingParams


@pytest.fixture(scope="module")
def byte_model(byte_model_dir):
    return LLM(byte_model_dir, max_model_len=320, max_num_seqs=4, device="cpu")


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
    import copy

    sp2 = copy.deepcopy(SamplingParams(temperature=0.5, grammar='root ::= "a"', stop=["x"]))
    assert sp2.grammar == 'root ::= "a"' and sp2.temperature == 0.5 and sp2.stop == ["x"]
    with pytest.raises(ValueError, match="at most one"):
        SamplingParams(regex="a", grammar='root ::= "a"')
    with pytest.raises(ValueError, match=r"prompts\[0\]: .*structured output \(regex\)"):
        byte_model.generate(["x"], SamplingParams(regex="(unclosed"), use_tqdm=False)
    # The V4.1 fixture's WordLevel tokenizer puts spaces between tokens: no byte-exact vocabulary, so no constraints.
    llm = LLM(golden_v41, max_model_len=64, device="cpu")
    with pytest.raises(NotImplementedError, match="not available for this model"):
        llm.generate(["w1"], SamplingParams(regex="a"), use_tqdm=False)
