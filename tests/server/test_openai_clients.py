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


def start_server(d, *extra):
    """`deepinfer serve` on the fixture in `d`; returns (process, base url) once /health answers."""
    port = free_port()
    proc = subprocess.Popen([CLI, "--log-level", "warn", "serve", "--model", d, "--served-model-name", MODEL,
                             "--port", str(port), "--api-key", KEY, "--threads", "1", "--kv-budget-mb", "64",
                             *extra],
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


def test_sigterm_drain_timeout_aborts(fixture_dir):
    """SIGTERM with a short --drain-timeout: a request that would run much longer is aborted (finish_reason
    "abort", its stream still closed properly) and the process exits 0 soon after."""
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    proc, url = start_server(fixture_dir, "--drain-timeout", "0.3")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        stream = client.completions.create(model=MODEL, prompt="w1", max_tokens=1000, stream=True, temperature=0,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        it = iter(stream)
        first = next(it)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        chunks = [first] + list(it)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["abort"]
        assert chunks[-1].usage.completion_tokens < 1000
        assert proc.wait(timeout=30) == 0
        assert time.time() - t0 < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

# Tool calls through HTTP on a real model: the embedded tiny V3 model (byte-level BPE, so structured output works)
# is forced by a `regex` constraint to write DeepSeek-V3 tool-call markup; greedy decoding makes the arguments the
# same with and without streaming, so the streamed pieces, put together by each client's streaming helper, must
# equal the non-streaming reply's call.
TINY = os.path.join(ROOT, "models", "default")
TOOL_REGEX = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
              '\\{"city": "[a-z]{3,12}", "days": [1-9]\\}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather forecast",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer"}}}}}


def make_tiny_chat_fixture(d):
    """The tiny model with a tokenizer that has V3's chat special tokens: its tokenizer only has BOS / EOS / pad,
    so the results of the last BPE merges (unused by other merges) are renamed to `<｜User｜>` / `<｜Assistant｜>`
    and their merges dropped. Weights are the model's; the text those two ids stood for just encodes longer."""
    for f in os.listdir(TINY):
        if f.endswith(".safetensors") or f.endswith(".json") and f != "tokenizer.json":
            os.symlink(os.path.join(TINY, f), os.path.join(d, f))
    with open(os.path.join(TINY, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    merges = tok["model"]["merges"]
    vocab = tok["model"]["vocab"]
    parts = {p for m in merges for p in (m if isinstance(m, list) else m.split(" "))}
    added = []
    for name in ["<｜User｜>", "<｜Assistant｜>"]:
        while True:
            m = merges.pop()
            a, b = m if isinstance(m, list) else m.split(" ")
            if a + b not in parts:
                break
        tid = vocab.pop(a + b)
        vocab[name] = tid
        added.append(dict(id=tid, content=name, single_word=False, lstrip=False, rstrip=False, normalized=False,
                          special=True))
    tok["added_tokens"] += added
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


@pytest.fixture(scope="module")
def tiny_server():
    if not os.path.exists(CLI):
        pytest.skip(f"{CLI} not built")
    if not os.path.exists(os.path.join(TINY, "config.json")):
        pytest.skip(f"{TINY} is missing")
    d = tempfile.mkdtemp()
    make_tiny_chat_fixture(d)
    proc, url = start_server(d)
    yield url
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    shutil.rmtree(d)


def test_chat_tool_call_streams_incrementally(tiny_server):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    client = openai.OpenAI(base_url=tiny_server + "/v1", api_key=KEY, max_retries=0)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=[WEATHER], max_tokens=400, temperature=0, extra_body={"regex": TOOL_REGEX})
    full = client.chat.completions.create(**kw)
    assert full.choices[0].finish_reason == "tool_calls"
    call = full.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    want = json.loads(call.function.arguments)
    assert set(want) == {"city", "days"}
    # Raw chunks: id / type / name once, then the arguments in several pieces.
    chunks = list(client.chat.completions.create(stream=True, **kw))
    pieces = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert len(pieces) >= 3, pieces
    assert pieces[0].id and pieces[0].type == "function" and pieces[0].function.name == "get_weather"
    assert all(p.index == 0 and p.id is None for p in pieces[1:])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # The client's streaming helper reassembles them.
    with client.chat.completions.stream(**kw) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    got = final.choices[0].message.tool_calls[0]
    assert got.function.name == "get_weather"
    assert got.function.arguments == call.function.arguments
    assert json.loads(got.function.arguments) == want


def test_responses_function_call_streams_incrementally(tiny_server):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    client = openai.OpenAI(base_url=tiny_server + "/v1", api_key=KEY, max_retries=0)
    kw = dict(model=MODEL, input="What is the weather in Paris?", max_output_tokens=400, temperature=0,
              tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}],
              extra_body={"regex": TOOL_REGEX})
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    events = list(client.responses.create(stream=True, **kw))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) >= 2, [e.type for e in events]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == "".join(deltas) == calls[0].arguments
    final = events[-1].response
    assert [o.arguments for o in final.output if o.type == "function_call"] == [calls[0].arguments]


def test_anthropic_tool_use_streams_incrementally(tiny_server):
    anthropic = pytest.importorskip("anthropic", reason="the anthropic client is not installed (pip install anthropic)")
    client = anthropic.Anthropic(base_url=tiny_server, api_key=KEY, max_retries=0)
    kw = dict(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=[{"name": "get_weather", "description": "weather forecast",
                      "input_schema": WEATHER["function"]["parameters"]}],
              extra_body={"temperature": 0, "regex": TOOL_REGEX})
    m = client.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    with client.messages.stream(**kw) as s:
        partial = [e.partial_json for e in s if e.type == "input_json"]
        final = s.get_final_message()
    assert len(partial) >= 2
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert len(streamed) == 1 and streamed[0].input == uses[0].input
    assert json.loads("".join(partial)) == uses[0].input
    assert final.stop_reason == "tool_use"


def test_default_bind_is_loopback(server):
    """`deepinfer serve` without --host listens on 127.0.0.1 only (Linux: read from /proc/net/tcp{,6})."""
    port = int(server.rsplit(":", 1)[1])
    listening = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(path):
            pytest.skip("no /proc/net/tcp")
        with open(path) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, p = local.split(":")
                if state == "0A" and int(p, 16) == port:
                    listening.append(addr)
    assert listening == ["0100007F"], listening


def test_chat_n_and_seed(oai):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "w1 w2"}], max_tokens=6, n=2, seed=11,
              temperature=1.0, extra_body={"ignore_eos": True})
    a = oai.chat.completions.create(**kw)
    b = oai.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == 12


def test_json_schema_through_clients(tiny_server):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    client = openai.OpenAI(base_url=tiny_server + "/v1", api_key=KEY, max_retries=0)
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
              "additionalProperties": False}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Pick a color."}],
                                       max_tokens=60, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "c", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content)["color"] in ("red", "green", "blue")
    resp = client.responses.create(model=MODEL, input="Pick a color.", max_output_tokens=60, temperature=0,
                                   text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    assert json.loads(resp.output_text)["color"] in ("red", "green", "blue")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", text={"format": {"type": "json_schema", "name": "c",
                                                                         "schema": {"type": "nonsense"}}})
    assert e.value.body["param"] == "text.format"
