"""Shared fixtures: the golden fixture models, the CLI binary, the example script.

CTest (python/CMakeLists.txt) sets PYTHONPATH to <build>/python, DEEPINFER_CLI and DEEPINFER_TEST_DATA_DIR. Run by
hand: PYTHONPATH=build/python python3 -m pytest tests/python
"""

import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if not any(pathlib.Path(p or ".").joinpath("deepinfer", "_core.py").exists() or
           list(pathlib.Path(p or ".").joinpath("deepinfer").glob("_core*.so")) for p in sys.path):
    sys.path.insert(0, str(ROOT / "build" / "python"))


def data_dir():
    return pathlib.Path(os.environ.get("DEEPINFER_TEST_DATA_DIR", ROOT / "tests" / "data"))


@pytest.fixture(scope="session")
def golden_v41():
    return str(data_dir() / "golden" / "deepseek_v41")


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("DEEPINFER_CLI", str(ROOT / "build" / "bin" / "deepinfer"))
    assert os.path.exists(path), f"deepinfer CLI not found at {path} (build it or set DEEPINFER_CLI)"
    return path


@pytest.fixture(scope="session")
def example_script():
    return str(ROOT / "examples" / "offline_inference.py")


@pytest.fixture(scope="module")
def llm(golden_v41):
    from deepinfer import LLM

    return LLM(golden_v41, max_model_len=512, max_num_seqs=2, max_num_batched_tokens=64, kv_cache_bytes=64 << 20,
               device="cpu")


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


@pytest.fixture(scope="session")
def byte_model_dir(tmp_path_factory, golden_v41):
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
    return str(d)
