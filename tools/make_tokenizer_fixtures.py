#!/usr/bin/env python3
"""Writes the tokenizer unit-test fixtures in tests/data/tokenizer/ (run it again after changing the cases).

- synthetic_*.json: small tokenizer.json files made here (a byte-level BPE whose merges reveal every piece
  boundary, plus added tokens with every flag, normalizers and each Split behavior).
- expected.json: ids from Hugging Face `tokenizers` for each (tokenizer, text, mode), and decode results.
  Tokenizers named "shared:<path>" are read from ../shared (DeepSeek-V3's; not copied here, only our ids).
"""
import json
import os

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "tokenizer")
SHARED = os.path.join(HERE, "..", "..", "shared")


def byte_alphabet():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def synthetic_bpe(normalizer, pre_split, added, merges_as_pairs):
    alpha = byte_alphabet()
    vocab = {alpha[b]: b for b in range(256)}
    words = ["ab", "abc", "ĠHello", "Ġworld", "hello", "12", "123", "ĠĠ", "ĊĊ", "ab12", "Ġa", "aa", "aaa", "Ġab"]
    merges = []
    for w in words:  # merge left to right, adding every prefix
        cur = w[0]
        for ch in w[1:]:
            nxt = cur + ch
            if [cur, ch] not in merges:
                merges.append([cur, ch])
            if nxt not in vocab:
                vocab[nxt] = len(vocab)
            cur = nxt
    # Two pairs that produce the same token: exercises HF's stale-entry rule.
    for pair in (["a", "ab"], ["aa", "b"]):
        if "aab" not in vocab:
            vocab["aab"] = len(vocab)
        merges.append(pair)
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
             "merges": merges if merges_as_pairs else [" ".join(m) for m in merges]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_split + [
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                "use_regex": True},
            "model": model}


def added_token(i, content, special=False, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": i, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def main():
    os.makedirs(OUT, exist_ok=True)
    base = 1000
    added = [added_token(base, "<s>", special=True), added_token(base + 1, "<|sp|>", special=True),
             added_token(base + 2, "[L]", lstrip=True), added_token(base + 3, "[R]", rstrip=True),
             added_token(base + 4, "word", single_word=True), added_token(base + 5, "Mixed", normalized=True),
             added_token(base + 6, "<|sp|>x"), added_token(base + 7, "日本", special=True, normalized=True)]
    digits = {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False}
    main_re = {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                                            "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                                            "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
               "behavior": "Isolated", "invert": False}
    tokenizers = {
        "synthetic_bpe.json": synthetic_bpe({"type": "Sequence", "normalizers": []}, [digits, main_re], added, False),
        "synthetic_bpe_pairs.json": synthetic_bpe(None, [digits, main_re], added, True),
        "synthetic_lowercase.json": synthetic_bpe(
            {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                                 {"type": "Replace", "pattern": {"String": "x"}, "content": "ab"}]},
            [digits], added, False),
    }
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            split = {"type": "Split", "pattern": {"Regex": "[0-9]| "}, "behavior": behavior, "invert": invert}
            tokenizers[f"synthetic_split_{behavior}_{int(invert)}.json"] = synthetic_bpe(None, [split], [], False)
    for name, tj in tokenizers.items():
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=1)

    texts = ["", "ab", "abc aab aaab abab", "Hello world", "hello12345 123 ab12", "  \n\n  x  ",
             "<s>hello<|sp|>x<|sp|>", "a [L]b  [L]c[R]  d [R]", "word words sword word_ wordé (word)",
             "MIXED Mixed mixed", "日本語 日本", "ＡＢ① ｘ", "a\u180eb c\u3000d e\u00a0f", "Ǆ İ Σ ß ﬁ",
             "x" * 50, "12345678901", "!!!abc ?Hello\n\n\n", "\t\t a", "🙂👍🏽 é e\u0301"]
    cases = []
    for name in sorted(tokenizers):
        tok = Tokenizer.from_file(os.path.join(OUT, name))
        for text in texts:
            for mode in ["recognize", "special_as_text"]:
                tok.encode_special_tokens = mode == "special_as_text"
                ids = tok.encode(text, add_special_tokens=False).ids
                cases.append({"tokenizer": name, "text": text, "mode": mode, "ids": ids,
                              "decoded": tok.decode(ids, skip_special_tokens=False),
                              "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    v3 = os.path.join(SHARED, "data", "tokenizers", "deepseek_v3", "tokenizer.json")
    if os.path.exists(v3):
        tok = Tokenizer.from_file(v3)
        v3_texts = texts + [
            "Hello world! 12345 你好世界<｜User｜>  x\n\n", "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜>",
            "<think>\nreasoning\n</think>\n\nanswer<｜end▁of▁sentence｜>", "def f(x):\n    return x**2  # 平方\n",
            "こんにちは、世界！カタカナ。", "مرحبا بالعالم", "Приве́т, мир!", "3.14159265358979 1,000,000 ١٢٣٤",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get", "   leading and trailing   ",
            "a\r\nb\rc\u2028d", "email@example.com https://x.y/z?q=1&r=2", "😀😀😀 🇯🇵 👨‍👩‍👧‍👦"]
        for text in v3_texts:
            for mode in ["recognize", "special_as_text"]:
                tok.encode_special_tokens = mode == "special_as_text"
                ids = tok.encode(text, add_special_tokens=False).ids
                cases.append({"tokenizer": "shared:data/tokenizers/deepseek_v3/tokenizer.json", "text": text,
                              "mode": mode, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                              "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/make_tokenizer_fixtures.py", "cases": cases}, f, ensure_ascii=False, indent=0)
    print(f"{len(tokenizers)} tokenizers, {len(cases)} cases")


if __name__ == "__main__":
    main()
