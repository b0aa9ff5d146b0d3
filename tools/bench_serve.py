#!/usr/bin/env python3
"""Serving benchmark: TTFT, inter-token latency and throughput of `deepinfer serve`, driven by the official
`openai` client (pip install openai) over loopback, at a fixed number of requests in flight.

  bench_serve.py --cli build/bin/deepinfer [--model DIR] [--threads N]   # starts the server, stops it at the end
  bench_serve.py --url http://127.0.0.1:8000 [--api-key K]               # an already running server

Each request is a streamed /v1/completions call (or /v1/chat/completions with --endpoint chat) with a random
prompt of --input-words words (uniform in [input_words * (1 - range_ratio), input_words]) and exactly --output-len
generated tokens (`ignore_eos`), so runs are comparable. --max-concurrency requests are kept in flight (closed
loop); --request-rate R instead starts requests as a Poisson process of R per second (still capped by
--max-concurrency). Bounded: --num-prompts requests, and --time-limit seconds in total.

Definitions (those of vLLM's `bench serve`): TTFT = request sent → first streamed token; ITL = gap between two
consecutive streamed chunks of one request; TPOT = (end-to-end - TTFT) / (output tokens - 1) per request;
output throughput = all generated tokens / wall time of the run. Token counts come from the server's usage chunk
(`stream_options.include_usage`). Prints one JSON object.
"""
import argparse
import concurrent.futures
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

WORDS = ("the of and to in is was for on that with as by at from his an are were which be this had not but "
         "first one their also new after who its time two can only may more all other been years she most over "
         "city school world during under high would state life made through group since river against film part "
         "war three water line later family known however team people season national between used number where "
         "well early before another second such then local work system music game four while place").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args):
    port = free_port()
    cmd = [args.cli, "--log-level", "warn", "serve", "--port", str(port), "--served-model-name", "bench",
           "--max-num-seqs", str(max(args.max_concurrency, 1))]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except Exception:
            if proc.poll() is not None:
                sys.exit("server exited: " + proc.stderr.read().decode())
            time.sleep(0.1)
    proc.kill()
    sys.exit("server did not become healthy within 120 s")


def percentiles(xs, scale=1000.0):
    """mean / median / p99 in milliseconds."""
    if not xs:
        return {"mean": None, "median": None, "p99": None}
    s = sorted(xs)
    p99 = s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]
    return {"mean": round(statistics.fmean(s) * scale, 3), "median": round(statistics.median(s) * scale, 3),
            "p99": round(p99 * scale, 3)}


def one_request(client, args, model, prompt):
    t0 = time.perf_counter()
    ttft = None
    chunk_times = []
    usage = None
    common = dict(model=model, max_tokens=args.output_len, temperature=0, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    if args.endpoint == "chat":
        stream = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
    else:
        stream = client.completions.create(prompt=prompt, **common)
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        text = c.delta.content if args.endpoint == "chat" else c.text
        if text:
            if ttft is None:
                ttft = now - t0
            chunk_times.append(now)
    end = time.perf_counter()
    out_tokens = usage.completion_tokens if usage else None
    return {"ttft": ttft, "e2e": end - t0, "itl": [b - a for a, b in zip(chunk_times, chunk_times[1:])],
            "output_tokens": out_tokens, "prompt_tokens": usage.prompt_tokens if usage else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--cli", help="deepinfer binary: start `deepinfer serve` on a free loopback port")
    src.add_argument("--url", help="base URL of a running server")
    ap.add_argument("--model", help="--cli: checkpoint directory (default: the embedded tiny model)")
    ap.add_argument("--threads", type=int, default=0, help="--cli: the server's CPU threads (0: all cores)")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests per second (Poisson)")
    ap.add_argument("--input-words", type=int, default=64)
    ap.add_argument("--range-ratio", type=float, default=0.5)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=600)
    args = ap.parse_args()
    if not (1 <= args.num_prompts <= 10000 and 1 <= args.max_concurrency <= 1024 and 1 <= args.output_len <= 4096):
        sys.exit("--num-prompts must be in [1, 10000], --max-concurrency in [1, 1024], --output-len in [1, 4096]")
    try:
        import openai
    except ImportError:
        sys.exit("the openai client is not installed (pip install openai)")

    proc = None
    url = args.url
    if args.cli:
        proc, url = start_server(args)
    try:
        client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0,
                               timeout=args.time_limit)
        model = client.models.list().data[0].id
        rng = random.Random(args.seed)
        lo = max(1, int(args.input_words * (1 - args.range_ratio)))
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, args.input_words)))
                   for _ in range(args.num_prompts)]
        gaps = [0.0 if args.request_rate == float("inf") else rng.expovariate(args.request_rate)
                for _ in prompts]
        one_request(client, args, model, "warm up")  # not counted
        results, errors = [], []
        lock = threading.Lock()
        slots = threading.Semaphore(args.max_concurrency)
        deadline = time.perf_counter() + args.time_limit

        def run(p):
            try:
                r = one_request(client, args, model, p)
                with lock:
                    results.append(r)
            except Exception as e:  # counted, reported
                with lock:
                    errors.append(repr(e))
            finally:
                slots.release()

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.max_concurrency) as ex:
            for p, gap in zip(prompts, gaps):
                if gap:
                    time.sleep(gap)
                if time.perf_counter() > deadline:
                    break
                slots.acquire()
                ex.submit(run, p)
        wall = time.perf_counter() - t0
    finally:
        if proc:
            proc.terminate()
            rc = proc.wait(timeout=60)
            if rc != 0:
                print(f"warning: the server exited with {rc}", file=sys.stderr)

    out_tokens = sum(r["output_tokens"] or 0 for r in results)
    in_tokens = sum(r["prompt_tokens"] or 0 for r in results)
    tpot = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in results
            if r["ttft"] is not None and (r["output_tokens"] or 0) > 1]
    report = {
        "endpoint": args.endpoint, "num_prompts": args.num_prompts, "completed": len(results), "failed": len(errors),
        "max_concurrency": args.max_concurrency, "request_rate": args.request_rate,
        "mean_input_tokens": round(in_tokens / max(1, len(results)), 1), "output_len": args.output_len,
        "wall_s": round(wall, 3),
        "request_throughput_per_s": round(len(results) / wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 2),
        "total_tokens_per_s": round((in_tokens + out_tokens) / wall, 2),
        "ttft_ms": percentiles([r["ttft"] for r in results if r["ttft"] is not None]),
        "tpot_ms": percentiles(tpot),
        "itl_ms": percentiles([x for r in results for x in r["itl"]]),
        "e2e_ms": percentiles([r["e2e"] for r in results]),
        "wrong_output_lengths": sum(1 for r in results if r["output_tokens"] != args.output_len),
        "load_average": os.getloadavg()[0],
    }
    if errors:
        report["first_error"] = errors[0]
    print(json.dumps(report, indent=1))
    if errors or report["wrong_output_lengths"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
