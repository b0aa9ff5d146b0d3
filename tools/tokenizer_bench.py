#!/usr/bin/env python3
"""Encode throughput of DeepInfer's tokenizer against HF `tokenizers` (Rust), same corpus, same run.

  tokenizer_bench.py --cli build/bin/deepinfer [--tokenizer JSON] [--dir /tmp/tokbench] [--size-mb 20]

Builds (once; reused when DIR/corpus.bin exists) a corpus of natural text from this machine's Debian packages
(tokenizer_reference.py's sources without its adversarial and Unicode-sweep parts: translated man pages in
ja/zh/ko/ru/..., locales, licenses, Python sources, Debian docs), then times
  - tokenizers: tok.encode(text, add_special_tokens=False) per document on one thread,
    tok.encode_batch(texts, add_special_tokens=False) over all cores (rayon), and encode_batch in a child process
    with RAYON_NUM_THREADS=1 (one thread, one Python call for the whole corpus: no per-document Python overhead),
  - deepinfer: `deepinfer tokenize --bench corpus.bin` (the same two shapes, ThreadPool over all cores),
each the best of --repeat passes (MB/s per CPU-second, the per-core rate that holds on a shared machine,
and wall-clock MB/s), and checks that both produce the same number of tokens (the ids themselves
are compared by tokenizer_reference.py). Prints one JSON object; the numbers go to docs/PERF.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_reference as ref  # noqa: E402


def natural_corpus(size_mb):
    budget = int(size_mb * (1 << 20))
    docs = []
    langs = ["ja", "zh_CN", "zh_TW", "ko", "ru", "uk", "de", "fr", "pl", "cs", "sr", "tr", "es", "it", "pt_BR"]
    docs += ref.files_from([sys.prefix + "/lib/python3*/test/cjkencodings/*-utf8.txt",
                            "/usr/lib/python3*/test/cjkencodings/*-utf8.txt"], 1 << 20)[0]
    docs += ref.files_from([f"/usr/share/man/{l}/**/*" for l in langs], budget // 5)[0]
    docs += ref.files_from(["/usr/share/i18n/locales/*"], budget // 20)[0]
    docs += ref.files_from(["/usr/share/common-licenses/*"], 1 << 20)[0]
    used = sum(len(d) for d in docs)
    docs += ref.files_from(["/usr/lib/python3*/**/*.py"], max(0, (budget - used) // 3), [".py"])[0]
    used = sum(len(d) for d in docs)
    docs += ref.files_from(["/usr/share/doc/**/*"], max(0, budget - used))[0]
    return docs


def bench_tokenizers(tok, texts, repeat):
    """Same shapes and clocks as `deepinfer tokenize --bench`: thread CPU time for one thread (tokenizers'
    encode() runs on the calling thread), process CPU time and wall time for encode_batch (rayon threads)."""
    nbytes = sum(len(t.encode()) for t in texts)
    one_cpu = one_wall = batch_cpu = batch_wall = 1e30
    tokens = 0
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.thread_time()
        tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
        one_cpu = min(one_cpu, time.thread_time() - c0)
        one_wall = min(one_wall, time.perf_counter() - w0)
        w0, c0 = time.perf_counter(), time.process_time()
        tok.encode_batch(texts, add_special_tokens=False)
        batch_cpu = min(batch_cpu, time.process_time() - c0)
        batch_wall = min(batch_wall, time.perf_counter() - w0)
    mb = nbytes / 1e6
    return {"one_thread_mb_per_cpu_s": mb / one_cpu, "one_thread_mb_s": mb / one_wall,
            "batch_mb_s": mb / batch_wall, "batch_mb_per_cpu_s": mb / batch_cpu, "tokens": tokens, "bytes": nbytes}


def hf_single_thread_batch(tokenizer_path, corpus, repeat):
    """encode_batch on one rayon thread, in a child process (rayon sizes its pool once per process)."""
    code = f"""
import json, sys, time
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import tokenizer_reference as ref
from tokenizers import Tokenizer
tok = Tokenizer.from_file({tokenizer_path!r})
texts = [d.decode("utf-8") for d in ref.read_corpus({corpus!r})]
best = 1e30
for _ in range({repeat}):
    c0 = time.process_time()
    encs = tok.encode_batch(texts, add_special_tokens=False)
    best = min(best, time.process_time() - c0)
print(json.dumps({{"cpu_s": best, "tokens": sum(len(e.ids) for e in encs)}}))
"""
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True, help="the deepinfer binary")
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "../../shared/data/tokenizers/deepseek_v3/tokenizer.json"))
    ap.add_argument("--dir", default="/tmp/tokbench")
    ap.add_argument("--size-mb", type=float, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tok = ref.load_reference_tokenizer(args.tokenizer)
    os.makedirs(args.dir, exist_ok=True)
    corpus = os.path.join(args.dir, "corpus.bin")
    if not os.path.exists(corpus):
        ref.write_corpus(corpus, natural_corpus(args.size_mb))
    docs = ref.read_corpus(corpus)
    # Valid UTF-8 only, so both sides tokenize the very same text.
    texts = [d.decode("utf-8", "replace") for d in docs]
    docs = [t.encode() for t in texts]
    ref.write_corpus(corpus, docs)
    ours = json.loads(subprocess.run([args.cli, "tokenize", "--tokenizer", args.tokenizer, "--bench", corpus,
                                      "--repeat", str(args.repeat)], check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])
    theirs = bench_tokenizers(tok, texts, args.repeat)
    single = hf_single_thread_batch(args.tokenizer, corpus, args.repeat)
    import tokenizers
    keys = ("one_thread_mb_per_cpu_s", "one_thread_mb_s", "batch_mb_s", "batch_mb_per_cpu_s")
    out = {
        "corpus_mb": ours["bytes"] / 1e6, "documents": len(docs), "cpus": os.cpu_count(),
        "tokenizers_version": tokenizers.__version__,
        "deepinfer": {k: round(ours[k], 2) for k in keys} | {"tokens": ours["tokens"], "threads": ours["threads"]},
        "tokenizers": {k: round(theirs[k], 2) for k in keys} | {"tokens": theirs["tokens"]},
        "tokenizers_batch_one_thread_mb_per_cpu_s": round(ours["bytes"] / 1e6 / single["cpu_s"], 2),
        "ratio": {k: round(ours[k] / theirs[k], 1) for k in keys},
        "same_token_count": ours["tokens"] == theirs["tokens"] == single["tokens"],
    }
    print(json.dumps(out, indent=1))
    if not out["same_token_count"]:
        sys.exit("token counts differ: run tools/tokenizer_reference.py check on this corpus")


if __name__ == "__main__":
    main()
