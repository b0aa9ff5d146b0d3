"""DeepInfer: the C++ DeepSeek inference engine from Python.

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="/path/to/hf_dir", max_model_len=4096, device="cpu")
    for out in llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32)):
        print(out.outputs[0].text, out.outputs[0].finish_reason)

Everything runs in C++ (src/deepinfer/api/llm.h); this package only normalises arguments and draws the
progress bar. C++ errors arrive as ValueError (invalid argument), FileNotFoundError (missing file or
directory), MemoryError (resource exhausted), NotImplementedError (unsupported) or RuntimeError (internal).
"""

from deepinfer._core import (
    CompletionOutput,
    GenerationStream,
    RequestOutput,
    SamplingParams,
    StreamDelta,
    built_with_cuda,
    cuda_device_count,
    set_log_level,
)
from deepinfer.llm import LLM

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "StreamDelta",
    "GenerationStream",
    "built_with_cuda",
    "cuda_device_count",
    "set_log_level",
]
