#!/usr/bin/env python3
"""Exactness check of DeepInfer's C++ tokenizer against Hugging Face `tokenizers` (the reference).

  tokenizer_reference.py corpus    --out DIR [--size-mb 24]    build corpus.bin from text on this machine
  tokenizer_reference.py reference --tokenizer JSON --dir DIR  encode corpus.bin with `tokenizers` → ref.bin
  tokenizer_reference.py check     --tokenizer JSON --dir DIR --tests BIN [--size-mb 24]
                                   all of the above, then run the C++ comparison (TokenizerCorpus.*)
  tokenizer_reference.py small     --tokenizer JSON --dir DIR  a ~1 MB corpus + reference (used by ctest)

corpus.bin: u32 count, then per document u32 length + raw bytes (documents may be invalid UTF-8: the reference
sees them as `bytes.decode("utf-8", "replace")`, which is what the C++ tokenizer does to its input).
ref.bin: u32 count, then per document u32 n + n little-endian u32 ids (tokenizer.encode(text,
add_special_tokens=False), i.e. transformers' tokenizer(text, add_special_tokens=False)).
Exit code 77 means "cannot run here" (no `tokenizers`, no data) so that callers can skip.
"""
import argparse
import glob
import gzip
import json
import os
import random
import struct
import subprocess
import sys
import time

SKIP = 77


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- corpus sources

def read_maybe_gz(path, limit=1 << 20):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read(limit)
        with open(path, "rb") as f:
            return f.read(limit)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None


def looks_textual(data):
    if not data or b"\x00" in data[:4096]:
        return False
    try:
        data[:4096].decode("utf-8")
        return True
    except UnicodeDecodeError as e:
        return e.start > 4000  # cut in the middle of a character at the end of the sample


def chunk(data, size=64 << 10):
    """Cut a big file into documents of ~size bytes at line ends (keeps the document count manageable)."""
    out = []
    while len(data) > size:
        cut = data.rfind(b"\n", 0, size)
        cut = size if cut <= 0 else cut + 1
        out.append(data[:cut])
        data = data[cut:]
    if data:
        out.append(data)
    return out


def files_from(patterns, budget, exts=None):
    docs, total = [], 0
    paths = []
    for pat in patterns:
        paths.extend(sorted(glob.glob(pat, recursive=True)))
    for p in paths:
        if total >= budget:
            break
        if not os.path.isfile(p) or os.path.islink(p):
            continue
        if exts and not any(p.endswith(e) for e in exts):
            continue
        data = read_maybe_gz(p)
        if not looks_textual(data):
            continue
        for c in chunk(data):
            docs.append(c)
            total += len(c)
    return docs, total


def unicode_sweep():
    """Scalar values in a few contexts: alone, inside a word, in a run, next to digits and spaces. All of planes
    0-3 and 14 (everything assigned), one in 61 elsewhere (unassigned: all the same category)."""
    docs = []
    block = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if 0x40000 <= cp < 0xE0000 or cp >= 0xF0000:
            if cp % 61:
                continue
        c = chr(cp)
        block.append(f"{c} a{c}b {c}{c}1{c} ,{c}\n")
        if len(block) == 2048:
            docs.append("".join(block).encode())
            block = []
    if block:
        docs.append("".join(block).encode())
    return docs


def generated(rng):
    docs = []
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u3000", "\xa0", "\u2028", "\u2029", "\u180e", "\u200b",
              "\u2003", "\x0b", "\x0c", "\x85", "\u202f", "\ufeff"]
    letters = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéüßçñøåÆŒ" "αβγδΩЖжщЯ" "你好世界中文汉字测试"
               "こんにちはカタカナひらがな" "한국어" "مرحبا" "שלום" "हिन्दी" "ภาษาไทย" "\u0301\u0308\u20dd")
    punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~。，、；：？！…—–·«»“”‘’【】（）《》"
    digits = "0123456789٠١٢٣٤٥٦٧٨٩０１２３４５６７８９½²³①"
    emoji = ["😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "❤️", "🇯🇵", "🧑🏿\u200d💻", "✌︎", "#️⃣", "🫠"]
    pools = [letters, punct, digits, "".join(spaces), "".join(emoji)]
    # Whitespace runs between words, and mixed-script noise.
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(50, 400)):
            kind = rng.random()
            if kind < 0.35:
                parts.append("".join(rng.choice(letters) for _ in range(rng.randint(1, 12))))
            elif kind < 0.55:
                parts.append("".join(rng.choice(spaces) for _ in range(rng.randint(1, 6))))
            elif kind < 0.7:
                parts.append("".join(rng.choice(punct) for _ in range(rng.randint(1, 4))))
            elif kind < 0.85:
                parts.append("".join(rng.choice(digits) for _ in range(rng.randint(1, 9))))
            else:
                parts.append(rng.choice(emoji))
        docs.append("".join(parts).encode())
    # Numbers in many shapes.
    nums = []
    for _ in range(20000):
        n = rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 30))), f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}",
                        f"{rng.randint(0, 99)}:{rng.randint(0, 59):02d}", f"0x{rng.getrandbits(64):x}", f"{rng.random():e}"])
        nums.append(n)
    docs.append(" ".join(nums).encode())
    docs.append(",".join(nums).encode())
    # Pure random code points.
    for _ in range(100):
        s = []
        for _ in range(2000):
            pool = rng.choice(pools)
            s.append(rng.choice(pool) if rng.random() < 0.8 else chr(rng.randint(0x20, 0x2FFFF)))
        docs.append("".join(c for c in "".join(s) if not 0xD800 <= ord(c) <= 0xDFFF).encode())
    return docs


def adversarial(rng, special_tokens):
    docs = []
    docs.append(b"a" * (1 << 20))  # one 1 MB word
    docs.append(("x" + "y" * ((1 << 20) - 1)).encode())
    docs.append(("漢字" * 150000).encode())
    docs.append(b" " * 100000)  # 100k spaces
    docs.append(b" " * 100000 + b"end")
    docs.append(b"\n" * 50000 + b" " * 50000 + b"x")
    docs.append(b" \n" * 50000)
    docs.append(b"1" * 100001)
    docs.append(b"!" * 100000)
    # Invalid UTF-8: random bytes, truncated sequences, surrogates, overlongs, lone continuations.
    for _ in range(50):
        docs.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4000))))
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80",
           b"\xe2\x82", b"\xf0\x9f\x98", b"\xff", b"\xfe", b"\xc2", b"\xe0\xa0"]
    for _ in range(50):
        parts = []
        for _ in range(200):
            parts.append(rng.choice(bad) if rng.random() < 0.3 else rng.choice([b"abc", b" ", "中".encode(), b"12",
                                                                                  b"\n", "é".encode(), b"<"]))
        docs.append(b"".join(parts))
    # Special tokens: all inline, glued, separated, inside words, and cut short.
    specials = list(special_tokens)
    docs.append("".join(specials).encode())
    docs.append(" ".join(specials).encode())
    docs.append("x".join(specials).encode())
    docs.append("\n".join(specials).encode())
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(5, 60)):
            t = rng.choice(specials)
            r = rng.random()
            if r < 0.2:
                t = t[: rng.randint(1, max(1, len(t) - 1))]
            elif r < 0.4:
                t = rng.choice(["hello", " ", "你好", "123", "\n", "<", "｜", "▁", "<｜", "｜>"]) + t
            parts.append(t)
        docs.append("".join(parts).encode())
    return [d for d in docs if d is not None]


def build_corpus(size_mb, seed=0, special_tokens=()):
    rng = random.Random(seed)
    budget = int(size_mb * (1 << 20))
    docs = []
    sections = []

    def add(name, items):
        docs.extend(items)
        sections.append((name, len(items), sum(len(d) for d in items)))

    add("adversarial", adversarial(rng, special_tokens))
    add("generated", generated(rng))
    add("unicode sweep", unicode_sweep())
    add("cjk encodings tests", files_from([sys.prefix + "/lib/python3*/test/cjkencodings/*-utf8.txt",
                                           "/usr/lib/python3*/test/cjkencodings/*-utf8.txt"], 1 << 20)[0])
    langs = ["ja", "zh_CN", "zh_TW", "ko", "ru", "uk", "de", "fr", "pl", "cs", "sr", "tr", "es", "it", "pt_BR"]
    add("translated man pages", files_from([f"/usr/share/man/{l}/**/*" for l in langs], budget // 5)[0])
    add("locales", files_from(["/usr/share/i18n/locales/*"], budget // 20)[0])
    add("licenses", files_from(["/usr/share/common-licenses/*"], 1 << 20)[0])
    used = sum(len(d) for d in docs)
    add("python sources", files_from(["/usr/lib/python3*/**/*.py"], max(0, (budget - used) // 3), [".py"])[0])
    used = sum(len(d) for d in docs)
    add("debian docs", files_from(["/usr/share/doc/**/*"], max(0, budget - used))[0])
    return docs, sections


def write_corpus(path, docs):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(docs)))
        for d in docs:
            f.write(struct.pack("<I", len(d)))
            f.write(d)


def read_corpus(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<I", data, 0)
    pos, docs = 4, []
    for _ in range(n):
        (m,) = struct.unpack_from("<I", data, pos)
        docs.append(data[pos + 4: pos + 4 + m])
        pos += 4 + m
    return docs


# ------------------------------------------------------------------------------------------------- reference

def load_reference_tokenizer(path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log("SKIP: the `tokenizers` Python package is not installed (pip install tokenizers)")
        sys.exit(SKIP)
    if not os.path.exists(path):
        log(f"SKIP: {path} does not exist")
        sys.exit(SKIP)
    return Tokenizer.from_file(path)


def special_tokens_of(path):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    return [t["content"] for t in j.get("added_tokens", [])]


def write_reference(tok, docs, path):
    texts = [d.decode("utf-8", "replace") for d in docs]
    t0 = time.time()
    encs = tok.encode_batch(texts, add_special_tokens=False)
    dt = time.time() - t0
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(encs)))
        for e in encs:
            f.write(struct.pack("<I", len(e.ids)))
            f.write(struct.pack(f"<{len(e.ids)}I", *e.ids))
    return dt, sum(len(e.ids) for e in encs)


def bench_reference(tok, docs):
    """Encode throughput of `tokenizers` with one thread and with all threads (rayon), same corpus."""
    texts = [d.decode("utf-8", "replace") for d in docs]
    nbytes = sum(len(t.encode()) for t in texts)
    t0 = time.time()
    for t in texts:
        tok.encode(t, add_special_tokens=False)
    one = time.time() - t0
    t0 = time.time()
    tok.encode_batch(texts, add_special_tokens=False)
    many = time.time() - t0
    return nbytes / one / 1e6, nbytes / many / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["corpus", "reference", "check", "small"])
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(__file__),
                                                         "../../shared/data/tokenizers/deepseek_v3/tokenizer.json"))
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size-mb", type=float, default=24)
    ap.add_argument("--tests", help="the deepinfer_tests binary (check)")
    ap.add_argument("--bench", action="store_true", help="also time `tokenizers` (single thread and batch)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    corpus_path = os.path.join(args.dir, "corpus.bin")
    ref_path = os.path.join(args.dir, "ref.bin")

    if args.command in ("reference", "check", "small"):
        tok = load_reference_tokenizer(args.tokenizer)
    specials = special_tokens_of(args.tokenizer) if os.path.exists(args.tokenizer) else []
    if args.command in ("corpus", "check", "small"):
        size = 1.0 if args.command == "small" else args.size_mb
        docs, sections = build_corpus(size, special_tokens=specials)
        if args.command == "small":
            # The CI subset: every adversarial and generated document kind, trimmed.
            docs = [d[: 16 << 10] for d in docs]
            rng = random.Random(1)
            docs = docs[:400] + rng.sample(docs[400:], min(len(docs) - 400, 150))
        write_corpus(corpus_path, docs)
        total = sum(len(d) for d in docs)
        log(f"corpus: {len(docs)} documents, {total / 1e6:.1f} MB")
        for name, n, b in sections:
            log(f"  {name:24s} {n:6d} docs {b / 1e6:8.2f} MB")
    if args.command in ("reference", "check", "small"):
        docs = read_corpus(corpus_path)
        dt, ntok = write_reference(tok, docs, ref_path)
        log(f"reference: {ntok} tokens in {dt:.1f} s (tokenizers {tokenizers_version()})")
        if args.bench:
            one, many = bench_reference(tok, docs)
            log(f"tokenizers encode: {one:.1f} MB/s one thread, {many:.1f} MB/s batch ({os.cpu_count()} cpus)")
            with open(os.path.join(args.dir, "reference_bench.json"), "w") as f:
                json.dump({"one_thread_mb_s": one, "batch_mb_s": many, "cpus": os.cpu_count()}, f)
    if args.command == "check":
        env = dict(os.environ, DEEPINFER_TOKENIZER_JSON=os.path.abspath(args.tokenizer),
                   DEEPINFER_TOKENIZER_CORPUS_DIR=os.path.abspath(args.dir))
        r = subprocess.run([args.tests, "--gtest_filter=TokenizerCorpus.*"], env=env)
        sys.exit(r.returncode)


def tokenizers_version():
    import tokenizers
    return tokenizers.__version__


if __name__ == "__main__":
    main()
