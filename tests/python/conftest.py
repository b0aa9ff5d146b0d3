"""Shared fixtures: the golden fixture models, the CLI binary, the example script.

CTest (python/CMakeLists.txt) sets PYTHONPATH to <build>/python, DEEPINFER_CLI and DEEPINFER_TEST_DATA_DIR. Run by
hand: PYTHONPATH=build/python python3 -m pytest tests/python
"""

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
