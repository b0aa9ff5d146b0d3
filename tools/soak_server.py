#!/usr/bin/env python3
"""Soak test of `deepinfer serve`: N mixed requests over loopback, bounded in time, checked one by one.

  soak_server.py --cli build/bin/deepinfer --requests 10000 [--model DIR] [--concurrency 8] [--time-limit 1200]

Starts the server (the embedded default model unless --model; CPU backend) on a free loopback port, then keeps
--concurrency clients busy with a reproducible (--seed) mix of: OpenAI completions and chat completions, Anthropic
messages and OpenAI responses, streamed or not; random prompt lengths, max_tokens in [1, --max-tokens], sampling
parameters (greedy, temperature/top_p/top_k/min_p, seeds, penalties, n = 1..3, stop strings, logprobs); regex,
JSON-object and JSON-Schema constraints; requests the server must refuse (malformed JSON, out-of-range fields,
an unknown route); and aborts (a streamed request whose client closes the socket after a random number of bytes).

Checked for every request: exactly one complete response, valid for its protocol (status code, object shape,
one finish reason per choice, the SSE event order, `[DONE]` / `message_stop` / `response.completed` last, token
counts within max_tokens, a constrained output that matches its regex or parses as JSON when it finished by
itself), and a response id never seen before (no duplicated or crossed answers). At the end: the server has no
request in flight and no KV block in use (/metrics), its RSS after warm-up (the first 10% of requests) grew by at
most --rss-slack-mb, and its open file descriptors, idle, are what they were before the first request. The server's RSS and fd count
are sampled every --sample-every requests. Prints one JSON object (the summary, with the RSS curve); exits 1 on
any failure, 2 when the time limit stopped the run before --requests were sent (everything sent was still checked).
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

WORDS = ("the of and to in is was for on that with as by at from his an are were which be this had not but first "
         "one their also new after who its time two can only may more all other been years she most over city school "
         "world during under high would state life made through group since river against film part war three water "
         "line later family known however team people season national between used number where well early").split()

MODEL = "soak"  # --served-model-name
REGEXES = [r"[a-z]{1,6}", r"(yes|no)", r"[0-9]{1,3}(\.[0-9])?", r"[A-Z][a-z]{0,4} [a-z]{1,4}"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


# The chat special tokens of the V3 format (tokenizer/chat_encoding.cc). The embedded default model's tokenizer has
# only BOS/EOS/pad, so the chat routes would all be 400s; make_chat_model renames the last vocabulary entries.
CHAT_TOKENS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
               "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
               "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]


def make_chat_model(src, dst):
    """A copy of the checkpoint in `src` (weights symlinked) whose tokenizer's last vocabulary entries are renamed
    to the V3 chat special tokens (added tokens); merges that make or use a renamed entry are dropped. The weights
    are unchanged, so the model's text is as good as before except for those rare tokens."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "tokenizer.json" and not os.path.exists(os.path.join(dst, f)):
            os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(dst, f))
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    special_ids = {a["id"] for a in tok["added_tokens"]}
    ids = [i for i in sorted(by_id, reverse=True) if i not in special_ids][:len(CHAT_TOKENS)]
    gone = {by_id[i] for i in ids}
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if (m if isinstance(m, list) else m.split(" "))[0] not in gone
                              and (m if isinstance(m, list) else m.split(" "))[1] not in gone
                              and "".join(m if isinstance(m, list) else m.split(" ")) not in gone]
    for i, name in zip(ids, CHAT_TOKENS):
        del vocab[by_id[i]]
        vocab[name] = i
        tok["added_tokens"].append({"id": i, "content": name, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    return dst


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


# ---- request generation ----------------------------------------------------------------------------------------

def make_request(rng, i, max_tokens_cap):
    """One request: (route, body or raw bytes, expectation dict)."""
    kind = rng.choices(["completions", "chat", "messages", "responses", "bad", "abort"],
                       weights=[30, 30, 18, 8, 7, 7])[0]
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
    max_tokens = rng.randint(1, max_tokens_cap)
    exp = {"kind": kind, "stream": rng.random() < 0.5, "max_tokens": max_tokens, "n": 1, "constraint": None}
    if kind == "bad":
        case = rng.randrange(5)
        if case == 0:
            return "/v1/completions", b'{"model": MODEL, "prompt": "x", ', dict(exp, status=400, stream=False)
        if case == 1:
            body = {"model": MODEL, "prompt": words, "max_tokens": max_tokens, "temperature": 5.0}
        elif case == 2:
            body = {"model": MODEL, "messages": [{"role": "user", "content": words}], "n": 1000}
        elif case == 3:
            body = {"model": MODEL, "messages": "not a list", "max_tokens": 2}
        else:
            return "/v1/nonexistent", b"{}", dict(exp, status=404, stream=False)
        route = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        return route, json.dumps(body).encode(), dict(exp, status=400, stream=False)

    sampling = {}
    r = rng.random()
    if r < 0.3:
        sampling["temperature"] = 0
    else:
        sampling["temperature"] = round(rng.uniform(0.2, 1.5), 2)
        if rng.random() < 0.5:
            sampling["top_p"] = round(rng.uniform(0.5, 1.0), 2)
        if rng.random() < 0.3:
            sampling["top_k"] = rng.randint(1, 50)
        if rng.random() < 0.5:
            sampling["seed"] = rng.randint(0, 2**31)
    if kind in ("completions", "chat") and rng.random() < 0.2:
        sampling["frequency_penalty"] = round(rng.uniform(-1, 1), 2)
    if kind in ("completions", "chat") and rng.random() < 0.2:
        exp["n"] = rng.randint(2, 3)
        sampling["n"] = exp["n"]
    if kind in ("completions", "chat") and rng.random() < 0.15:
        sampling["stop"] = [rng.choice(WORDS)]
    if kind in ("completions", "chat") and "stop" not in sampling and rng.random() < 0.15:
        # Not with stop strings: a stop string cuts a constrained output short with finish_reason "stop".
        exp["constraint"] = ("regex", rng.choice(REGEXES))
        sampling["regex"] = exp["constraint"][1]
    elif kind == "chat" and "stop" not in sampling and rng.random() < 0.1:
        exp["constraint"] = ("json", None)
        sampling["response_format"] = rng.choice(
            [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}])
    if kind == "abort":
        exp["stream"] = True
        exp["abort_after"] = rng.randint(0, 400)
        body = {"model": MODEL, "prompt": words, "max_tokens": 200, "ignore_eos": True, "stream": True}
        return "/v1/completions", json.dumps(body).encode(), exp
    if kind == "completions":
        body = {"model": MODEL, "prompt": words, "max_tokens": max_tokens, **sampling}
        if rng.random() < 0.2:
            body["logprobs"] = rng.randint(0, 3)
        route = "/v1/completions"
    elif kind == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": max_tokens, **sampling}
        if rng.random() < 0.2:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randint(0, 3)
        route = "/v1/chat/completions"
    elif kind == "messages":
        body = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": max_tokens}
        for k in ("temperature", "top_p", "top_k"):
            if k in sampling:
                body[k] = min(sampling[k], 1.0) if k == "temperature" else sampling[k]
        route = "/v1/messages"
    else:
        body = {"model": MODEL, "input": words, "max_output_tokens": max_tokens}
        route = "/v1/responses"
    if exp["stream"]:
        body["stream"] = True
        if kind in ("completions", "chat"):
            body["stream_options"] = {"include_usage": True}
    exp["status"] = 200
    return route, json.dumps(body).encode(), exp


# ---- response validation ---------------------------------------------------------------------------------------

def sse_events(raw):
    """(event name or None, data string) pairs of an SSE body."""
    out = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((name, "\n".join(data)))
    return out


def check_constraint(exp, text, finish):
    if exp["constraint"] is None or finish not in ("stop",):
        return
    kind, pattern = exp["constraint"]
    if kind == "regex":
        check(re.fullmatch(pattern, text) is not None, f"output {text!r} does not match /{pattern}/")
    else:
        try:
            v = json.loads(text)
        except ValueError:
            raise Failure(f"constrained output is not JSON: {text!r}")
        check(isinstance(v, dict), f"constrained output is not an object: {text!r}")


def validate_openai(exp, status, raw, chat):
    check(status == 200, f"status {status}: {raw[:300]}")
    n, cap = exp["n"], exp["max_tokens"]
    if not exp["stream"]:
        j = json.loads(raw)
        check(j["object"] == ("chat.completion" if chat else "text_completion"), f"object {j.get('object')}")
        check(sorted(c["index"] for c in j["choices"]) == list(range(n)), "choice indices")
        for c in j["choices"]:
            check(c["finish_reason"] in ("stop", "length"), f"finish_reason {c['finish_reason']}")
            text = c["message"]["content"] if chat else c["text"]
            check(isinstance(text, str), "text is not a string")
            check_constraint(exp, text, c["finish_reason"])
        u = j["usage"]
        check(0 <= u["completion_tokens"] <= n * cap, f"completion_tokens {u['completion_tokens']} > {n} * {cap}")
        check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage totals")
        return j["id"]
    events = sse_events(raw)
    check(events and events[-1][1] == "[DONE]", "stream does not end with [DONE]")
    ids, finishes, texts, usage = set(), {}, {}, None
    for _, data in events[:-1]:
        c = json.loads(data)
        ids.add(c["id"])
        if c.get("usage"):
            usage = c["usage"]
        for ch in c["choices"]:
            k = ch["index"]
            piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
            texts[k] = texts.get(k, "") + (piece or "")
            if ch.get("finish_reason") is not None:
                check(k not in finishes, f"choice {k} finished twice")
                finishes[k] = ch["finish_reason"]
    check(len(ids) == 1, f"chunks carry {len(ids)} ids")
    check(sorted(finishes) == list(range(n)), f"finish reasons for {sorted(finishes)} of {n} choices")
    for k, f in finishes.items():
        check(f in ("stop", "length"), f"finish_reason {f}")
        check_constraint(exp, texts.get(k, ""), f)
    check(usage is not None and 0 <= usage["completion_tokens"] <= n * cap, f"usage {usage}")
    return ids.pop()


def validate_messages(exp, status, raw):
    check(status == 200, f"status {status}: {raw[:300]}")
    cap = exp["max_tokens"]
    if not exp["stream"]:
        j = json.loads(raw)
        check(j["type"] == "message" and j["role"] == "assistant", "message shape")
        check(all(b["type"] in ("text", "thinking", "tool_use") for b in j["content"]), "content blocks")
        check(j["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), f"{j['stop_reason']}")
        check(0 <= j["usage"]["output_tokens"] <= cap, "output_tokens over max_tokens")
        return j["id"]
    events = sse_events(raw)
    names = [e for e, _ in events]
    check(names and names[0] == "message_start" and names[-1] == "message_stop", f"event order {names[:3]}..")
    deltas = [json.loads(d) for e, d in events if e == "message_delta"]
    check(len(deltas) == 1, f"{len(deltas)} message_delta events")
    check(deltas[0]["delta"]["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), "stop_reason")
    opened = sum(1 for e in names if e == "content_block_start")
    check(opened == sum(1 for e in names if e == "content_block_stop"), "unbalanced content blocks")
    return json.loads(events[0][1])["message"]["id"]


def validate_responses(exp, status, raw):
    check(status == 200, f"status {status}: {raw[:300]}")
    if not exp["stream"]:
        j = json.loads(raw)
        check(j["object"] == "response" and j["status"] in ("completed", "incomplete"), f"status {j.get('status')}")
        check(isinstance(j["output"], list), "output list")
        return j["id"]
    events = sse_events(raw)
    names = [e for e, _ in events]
    check(names and names[0] == "response.created" and names[-1] == "response.completed", f"events {names[:2]}")
    seqs = [json.loads(d)["sequence_number"] for _, d in events]
    check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "sequence numbers out of order")
    return json.loads(events[-1][1])["response"]["id"]


def validate_error(exp, status, raw):
    check(status == exp["status"], f"expected {exp['status']}, got {status}: {raw[:200]}")
    j = json.loads(raw)
    check(isinstance(j.get("error"), dict) and j["error"].get("message"), "error body")
    return None


# ---- transport -------------------------------------------------------------------------------------------------

def send(port, route, body, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8")
    finally:
        conn.close()


def send_and_abort(port, route, body, after_bytes, timeout):
    """Streams a request and closes the socket after `after_bytes` bytes of the response (0: before any)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        head = (f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        s.sendall(head + body)
        got = b""
        while len(got) < after_bytes and b"data: [DONE]" not in got:
            chunk = s.recv(after_bytes - len(got))
            if not chunk:
                break
            got += chunk
        ok = got.startswith(b"HTTP/1.1 200") or b"HTTP/1.1 200".startswith(got)  # cut inside the status line
        check(ok, f"abort: unexpected reply {got[:80]!r}")


# ---- the run ---------------------------------------------------------------------------------------------------

def proc_memory(pid):
    """VmRSS and its anonymous part (the heap; the rest is the mapped weights and libraries), in MB."""
    kb = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon"):
                kb[key] = int(line.split()[1])
    return kb.get("VmRSS", 0) / 1024.0, kb.get("RssAnon", 0) / 1024.0


def proc_sample(pid):
    return proc_memory(pid)[0], len(os.listdir(f"/proc/{pid}/fd"))


def metrics(port):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for name in ("deepinfer_num_requests_running", "deepinfer_num_requests_waiting", "deepinfer_kv_cache_usage_perc"):
        m = re.search(name + r"\{[^}]*\} ([0-9.e+-]+)", body)
        out[name] = float(m.group(1)) if m else None
    out["aborted"] = sum(int(x) for x in re.findall(r'finished_reason="abort(?:ed)?"\} (\d+)', body))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True, help="the deepinfer binary")
    ap.add_argument("--model", help="checkpoint directory (default: the repository's models/default)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8, help="largest max_tokens of a request")
    ap.add_argument("--threads", type=int, default=0, help="the server's CPU threads (0: its default)")
    ap.add_argument("--kv-budget-mb", type=int, default=32,
                    help="the server's KV cache (prefix cache included): the CPU pool grows by doubling up to this "
                         "as the prefix cache fills it, so RSS flattens once it is reached")
    ap.add_argument("--time-limit", type=float, default=1200, help="stop sending after this many seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample-every", type=int, default=0, help="RSS/fd sample period (default: requests / 50)")
    ap.add_argument("--rss-slack-mb", type=float, default=32, help="allowed RSS growth after warm-up")
    ap.add_argument("--fd-slack", type=int, default=2, help="allowed open-fd difference, idle before vs after")
    args = ap.parse_args()

    import tempfile
    workdir = tempfile.mkdtemp(prefix="deepinfer-soak-")
    src = args.model or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "default")
    model_dir = make_chat_model(src, os.path.join(workdir, "model"))
    port = free_port()
    cmd = [args.cli, "--log-level", "error", "serve", "--port", str(port), "--device", "cpu", "--served-model-name", MODEL,
           "--max-num-seqs", str(max(4, args.concurrency)), "--kv-budget-mb", str(args.kv_budget_mb)]
    cmd += ["--model", model_dir]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except Exception:
            if server.poll() is not None or time.time() > deadline:
                sys.stderr.write(server.stderr.read().decode(errors="replace"))
                sys.exit("the server did not start")
            time.sleep(0.2)

    _, idle_fds_before = proc_sample(server.pid)
    rng = random.Random(args.seed)
    plan = [make_request(rng, i, args.max_tokens) for i in range(args.requests)]
    sample_every = args.sample_every or max(1, args.requests // 50)
    warmup = max(1, args.requests // 10)
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "ok": 0, "refused": 0, "aborted": 0, "timed_out": False}
    answered = [0] * args.requests  # responses received per request: must end up exactly 1 for each sent one
    failures, seen_ids, samples = [], {}, []
    start = time.time()

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= args.requests:
                    return
                if time.time() - start > args.time_limit:
                    state["timed_out"] = True
                    return
                state["next"] += 1
            route, body, exp = plan[i]
            rid = None
            try:
                if exp["kind"] == "abort":
                    send_and_abort(port, route, body, exp["abort_after"], timeout=120)
                else:
                    status, raw = send(port, route, body, timeout=300)
                    if exp["status"] != 200:
                        rid = validate_error(exp, status, raw)
                    elif exp["kind"] in ("completions", "chat"):
                        rid = validate_openai(exp, status, raw, chat=exp["kind"] == "chat")
                    elif exp["kind"] == "messages":
                        rid = validate_messages(exp, status, raw)
                    else:
                        rid = validate_responses(exp, status, raw)
                err = None
            except Exception as e:  # a Failure, a JSON error or a transport error: all count
                err = f"request {i} ({exp['kind']}, stream={exp['stream']}): {type(e).__name__}: {e}"
            with lock:
                answered[i] += 1
                state["done"] += 1
                if err:
                    failures.append(err)
                elif exp["kind"] == "abort":
                    state["aborted"] += 1
                elif exp["status"] != 200:
                    state["refused"] += 1
                else:
                    state["ok"] += 1
                if rid is not None:
                    if rid in seen_ids:
                        failures.append(f"request {i}: response id {rid} already answered request {seen_ids[rid]}")
                    seen_ids[rid] = i
                if state["done"] % sample_every == 0 or state["done"] == warmup:
                    rss, fds = proc_sample(server.pid)
                    samples.append({"requests": state["done"], "seconds": round(time.time() - start, 1),
                                    "rss_mb": round(rss, 1), "anon_mb": round(proc_memory(server.pid)[1], 1),
                                    "fds": fds})

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - start
    sent = state["next"]

    # The aborted requests may still be winding down: give the server a moment to become idle.
    m = {}
    for _ in range(100):
        m = metrics(port)
        if m["deepinfer_num_requests_running"] == 0 and m["deepinfer_num_requests_waiting"] == 0:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # closed abort sockets: let the server's side of them close too
    rss, fds = proc_sample(server.pid)
    samples.append({"requests": state["done"], "seconds": round(time.time() - start, 1), "rss_mb": round(rss, 1),
                    "anon_mb": round(proc_memory(server.pid)[1], 1), "fds": fds, "final": True})

    lost = [i for i in range(sent) if answered[i] != 1]
    if lost:
        failures.append(f"{len(lost)} requests without exactly one answer, e.g. {lost[:5]}")
    if m.get("deepinfer_num_requests_running") != 0 or m.get("deepinfer_num_requests_waiting") != 0:
        failures.append(f"server not idle at the end: {m}")
    if m.get("deepinfer_kv_cache_usage_perc") != 0:
        failures.append(f"KV blocks still in use at the end: {m}")
    after = [s for s in samples if s["requests"] >= warmup]
    rss_growth = (after[-1]["rss_mb"] - after[0]["rss_mb"]) if after else 0.0
    # Open fds are compared idle to idle (before the first request, after the last): during the run they count the
    # connections in flight.
    fd_diff = fds - idle_fds_before
    max_fds = max(s["fds"] for s in samples)
    if max_fds > idle_fds_before + 2 * args.concurrency + args.fd_slack:
        failures.append(f"{max_fds} open fds during the run, idle {idle_fds_before}, concurrency {args.concurrency}")
    if rss_growth > args.rss_slack_mb:
        failures.append(f"RSS grew by {rss_growth:.1f} MB after warm-up (allowed {args.rss_slack_mb})")
    if abs(fd_diff) > args.fd_slack:
        failures.append(f"open fds: {idle_fds_before} idle before the run, {fds} idle after (allowed +-{args.fd_slack})")

    server.terminate()
    try:
        rc = server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        rc = "killed after 60 s"
    if rc != 0:
        failures.append(f"server exit status after SIGTERM: {rc}")

    summary = {
        "requests_planned": args.requests, "requests_sent": sent, "completed_ok": state["ok"],
        "refused_as_expected": state["refused"], "aborted_by_client": state["aborted"],
        "kinds": {k: sum(1 for _, _, e in plan[:sent] if e["kind"] == k)
                  for k in ("completions", "chat", "messages", "responses", "bad", "abort")},
        "streamed": sum(1 for _, _, e in plan[:sent] if e["stream"]),
        "constrained": sum(1 for _, _, e in plan[:sent] if e["constraint"]),
        "unique_response_ids": len(seen_ids), "seconds": round(elapsed, 1),
        "requests_per_second": round(sent / elapsed, 1) if elapsed else 0, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "seed": args.seed, "server_aborted_metric": m.get("aborted"),
        "rss_growth_after_warmup_mb": round(rss_growth, 1), "idle_fds_before": idle_fds_before, "idle_fds_after": fds,
        "time_limited": state["timed_out"], "failures": failures[:50], "num_failures": len(failures),
        "samples": samples,
    }
    print(json.dumps(summary, indent=1))
    import shutil
    shutil.rmtree(workdir, ignore_errors=True)
    if failures:
        sys.exit(1)
    if state["timed_out"]:
        sys.exit(2)


if __name__ == "__main__":
    main()
