#!/usr/bin/env python3
"""Trains the tiny model's byte-level BPE tokenizer and tokenizes its training data (CPU; `pip install tokenizers`).

  tools/train_tokenizer.py --data DIR --out DIR [--vocab-size 4096]

DIR is what tools/prepare_train_data.sh wrote (train.jsonl, val.jsonl). The tokenizer has DeepSeek-V3's
pre-tokenizer (the three Isolated regex Splits, then ByteLevel without its own regex), ByteLevel decoder and
post-processor, no normalizer, and DeepSeek's three special tokens at ids 0-2 (begin/end of sentence, pad). It is
trained on the training split only. Writes OUT/tokenizer.json, OUT/tokenizer_config.json and the token streams
OUT/train.bin, OUT/val.bin (little-endian uint16; every document followed by <｜end▁of▁sentence｜>).
"""
import argparse
import json
import os

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# DeepSeek-V3's pre-tokenizer regexes (tokenizer.json of deepseek-ai/DeepSeek-V3).
SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    # DeepSeek's JSON has literal CR/LF characters inside the classes (not the escapes backslash-r, backslash-n): kept identical.
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^""" + "\r\n" + r"""\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+["""
    + "\r\n" + r"""]*|\s*[""" + "\r\n" + r"""]+|\s+(?!\S)|\s+""",
]


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def build_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=4096)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train = read_docs(os.path.join(a.data, "train.jsonl"))
    val = read_docs(os.path.join(a.data, "val.jsonl"))

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train, trainer=trainer, length=len(train))
    assert [tok.token_to_id(t) for t in (BOS, EOS, PAD)] == [0, 1, 2]
    tok.save(os.path.join(a.out, "tokenizer.json"))

    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 1024,
        "tokenizer_class": "LlamaTokenizerFast",
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")

    eos = tok.token_to_id(EOS)
    for name, docs in (("train", train), ("val", val)):
        ids = []
        for enc in tok.encode_batch(docs, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos)
        arr = np.asarray(ids, dtype=np.uint16)
        arr.tofile(os.path.join(a.out, f"{name}.bin"))
        nbytes = sum(len(d.encode()) for d in docs)
        print(f"{name}: {len(docs)} documents, {nbytes} bytes, {len(arr)} tokens ({nbytes / len(arr):.2f} bytes/token)")


if __name__ == "__main__":
    main()
