"""The tensors of a safetensors checkpoint directory with their bytes as stored and as the V4 loader keeps them on
the device with block formats kept (--weight-format auto on CUDA): the FP8 projections, the experts (codes + scales),
int64 tables and a bf16 output head as stored, everything else widened to f32, and the bf16 compressor projections
(wkv / wgate, main and indexer) both widened and as stored (prefill reads the bf16 copy, decode the f32 one:
V4AttentionWeights::comp_wkv_bf16). Shared by tools/v4_real_dims_bench.sh (its per-step byte estimate) and
tools/multigpu_x8.sh (its layer sizing)."""
import glob
import json
import re
import struct

KEPT = re.compile(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)\.(weight|scale)$|\.(experts|shared_experts)\.")
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "I64": 8}
COMPRESSOR = re.compile(r"\.attn\.(indexer\.)?compressor\.(wkv|wgate)\.weight$")


def bf16_copy_bytes(name, t, n, kept=True):
    """Bytes of the bf16 copy the loader keeps beside a compressor projection's f32 one (0 for other tensors): a
    device byte no decode step reads."""
    return 2 * n if kept and t["dtype"] == "BF16" and COMPRESSOR.search(name) else 0


def tensors(ckpt_dir, keep_head=True):
    """(name, header entry, element count, stored bytes, device bytes) of every tensor; keep_head (block formats kept):
    a bf16 head stays bf16 (model/output_head.h) and the compressors keep their bf16 copies, else both are f32 only."""
    for path in sorted(glob.glob(ckpt_dir + "/*.safetensors")):
        with open(path, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for d in t["shape"]:
                n *= d
            stored = n * DTYPE_BYTES[t["dtype"]]
            as_stored = (KEPT.search(name) or t["dtype"] == "I64" or
                         (keep_head and name == "head.weight" and t["dtype"] == "BF16"))
            yield name, t, n, stored, (stored if as_stored else n * 4) + bf16_copy_bytes(name, t, n, keep_head)
