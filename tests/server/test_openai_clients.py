"""The server driven by the official `openai` and `anthropic` Python clients (PyPI).

Starts `deepinfer serve` on an ephemeral loopback port with the V4.1 golden fixture model (its tokenizer given the
chat special tokens, as tests/server/server_test_util.cc does) and checks chat, completions, streaming, errors,
disconnect-abort and 32 concurrent requests. Each client's tests skip with a message when it is not installed
(`pip install openai anthropic`).

Run: DEEPINFER_CLI=build/bin/deepinfer python3 -m pytest -q tests/server/test_openai_clients.py
"""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden", "deepseek_v41")
CLI = os.environ.get("DEEPINFER_CLI", os.path.join(ROOT, "build", "bin", "deepinfer"))
MODEL = "test-model"
KEY = "test-key"

# Same renaming as server_test_util.cc: v-entries (id 511 - 4k) become the chat specials / DSML pieces.
CHAT_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜System｜>",
               "<｜latest_reminder｜>", "<think>", "</think>", "｜DSML｜", "<｜DSML｜ calls>", "</｜DSML｜ calls>",
               "<｜DSML｜ invoke name=\"get_weather\">", "</｜DSML｜ invoke>",
               "<｜DSML｜ parameter name=\"days\" string=\"false\">", "</｜DSML｜ parameter>"]


def make_fixture(d):
    shutil.copy(os.path.join(GOLDEN, "config.json"), d)
    os.symlink(os.path.join(GOLDEN, "model.safetensors"), os.path.join(d, "model.safetensors"))
    with open(os.path.join(GOLDEN, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    by_id = {511 - 4 * k: name for k, name in enumerate(CHAT_TOKENS)}
    tok["model"]["vocab"] = {by_id.get(i, t): i for t, i in tok["model"]["vocab"].items()}
    tok["added_tokens"] = [dict(id=i, content=n, single_word=False, lstrip=False, rstrip=False, normalized=False,
                                special=True) for i, n in sorted(by_id.items(), reverse=True)]
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(d):
    """`deepinfer serve` on the fixture in `d`; returns (process, base url) once /health answers."""
    port = free_port()
    proc = subprocess.Popen([CLI, "--log-level", "warn", "serve", "--model", d, "--served-model-name", MODEL,
                             "--port", str(port), "--api-key", KEY, "--threads", "1", "--kv-budget-mb", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except Exception:
            if proc.poll() is not None:
                raise RuntimeError("server exited: " + proc.stderr.read().decode())
            time.sleep(0.05)
    return proc, url


@pytest.fixture(scope="module")
def fixture_dir():
    if not os.path.exists(CLI):
        pytest.skip(f"{CLI} not built")
    d = tempfile.mkdtemp()
    make_fixture(d)
    yield d
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def server(fixture_dir):
    proc, url = start_server(fixture_dir)
    yield url
    proc.terminate()
    assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def oai(server):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def anth(server):
    anthropic = pytest.importorskip("anthropic", reason="the anthropic client is not installed (pip install anthropic)")
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0)


def test_models(oai):
    assert [m.id for m in oai.models.list().data] == [MODEL]


def test_chat_stream_matches_non_stream(oai):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "w1 w2"}], max_tokens=10, seed=3, temperature=0.9,
              extra_body={"ignore_eos": True})
    full = oai.chat.completions.create(**kw)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 10
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (full.choices[0].message.content or "")
    assert chunks[-1].usage.completion_tokens == 10 and not chunks[-1].choices


def test_completions_and_logprobs(oai):
    r = oai.completions.create(model=MODEL, prompt="w3 w4", max_tokens=5, temperature=0, logprobs=2,
                               extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and all(x <= 0 for x in lp.token_logprobs)
    assert "".join(lp.tokens[i] if i == 0 else " " + lp.tokens[i] for i in range(5)) == r.choices[0].text


def test_errors_are_typed(oai):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    bad = openai.OpenAI(base_url=oai.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_disconnect_aborts(oai, server):
    stream = oai.completions.create(model=MODEL, prompt="w1", max_tokens=1000, stream=True,
                                    extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        req = urllib.request.Request(server + "/metrics", headers={"Authorization": "Bearer " + KEY})
        m = urllib.request.urlopen(req).read().decode()
        if re.search(r'finished_reason="aborted"\} [1-9]', m) and "deepinfer_num_requests_running{" \
                'model_name="test-model"} 0' in m:
            return
        time.sleep(0.05)
    pytest.fail("the request was not aborted:\n" + m)


def test_32_concurrent(oai):
    def one(i):
        r = oai.completions.create(model=MODEL, prompt=f"w{i}", max_tokens=2 + i % 4, extra_body={"ignore_eos": True})
        return r.id, r.usage.completion_tokens, i
    with concurrent.futures.ThreadPoolExecutor(32) as ex:
        res = list(ex.map(one, range(32)))
    assert len({r[0] for r in res}) == 32
    assert all(n == 2 + i % 4 for _, n, i in res)


def test_responses(oai):
    r = oai.responses.create(model=MODEL, input="w1 w2", instructions="w3", max_output_tokens=4, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.status == "incomplete" and r.usage.output_tokens == 4
    events = list(oai.responses.create(model=MODEL, input="w1 w2", instructions="w3", max_output_tokens=4,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == r.output_text


def test_anthropic_messages(anth):
    kw = dict(model=MODEL, max_tokens=6, system="w9", extra_body={"temperature": 0},
              messages=[{"role": "user", "content": "w1 w2"}])
    m = anth.messages.create(**kw)
    assert m.role == "assistant" and m.stop_reason in ("max_tokens", "end_turn")
    text = "".join(b.text for b in m.content if b.type == "text")
    with anth.messages.stream(**kw) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.usage.output_tokens == m.usage.output_tokens
    n = anth.messages.count_tokens(model=MODEL, system="w9", messages=kw["messages"])
    assert n.input_tokens == m.usage.input_tokens


def test_anthropic_errors(anth):
    import anthropic
    with pytest.raises(anthropic.BadRequestError):
        anth.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        anth.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_sigterm_drains(fixture_dir):
    """SIGTERM: the request in flight runs to its end, a new one gets 503 (as does /health), and the process
    exits 0 once nothing is left."""
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    proc, url = start_server(fixture_dir)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        stream = client.completions.create(model=MODEL, prompt="w1", max_tokens=400, stream=True, temperature=0,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        it = iter(stream)
        first = next(it)
        proc.send_signal(signal.SIGTERM)
        # The server starts draining at once; ask until it says so (the signal is handled asynchronously).
        deadline = time.time() + 10
        status = None
        while time.time() < deadline and status != 503:
            try:
                client.completions.create(model=MODEL, prompt="w2", max_tokens=2)
                status = 200
            except openai.APIStatusError as e:
                status = e.status_code
            time.sleep(0.02)
        assert status == 503, "a request sent during the drain was not refused with 503"
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(url + "/health", timeout=5)
        assert health.value.code == 503
        chunks = [first] + list(it)
        assert chunks[-1].usage.completion_tokens == 400
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
