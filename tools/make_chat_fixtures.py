#!/usr/bin/env python3
"""Generate chat-encoding and output-parser fixtures for tests/tokenizer/chat_encoding_test.cc.

References (none of their code is copied into the repository; only their outputs are committed):
  - V4 / V4.1: DeepSeek's `deepseek-recipe` PyPI package (DeepseekV4Encoding / DeepseekV41Encoding render,
    StreamProcessor parse), `pip install deepseek-recipe`.
  - V3: the chat_template of ../shared/data/tokenizers/deepseek_v3/tokenizer_config.json, run by jinja2 as
    transformers' apply_chat_template does.
  - V3.1: DeepSeek-V3.1's chat_template (tokenizer_config.json of deepseek-ai/DeepSeek-V3.1), given with
    --v31-template PATH; skipped when absent.

Usage: tools/make_chat_fixtures.py [--out tests/data/tokenizer/chat_expected.json] [--v31-template F] [--n 300]
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TEXTS = ["Hi", "Hello, world!", "你好，世界", "日本語のテキスト", "Привет", "emoji 😀👍🏽 ok", "  spaces  \n\nnewlines\n",
         "code: `x = 1`\n```py\nprint(1)\n```", "<b>html</b> & \"quotes\"", "tab\there", "数字 12345 and 3.14",
         "Ünïcödé ñ", "", "multi\nline\ntext", "a" * 50, "What is 2+2?", "</think> inside", "Résumé — naïve café"]
TOOLS = [
    {"name": "get_weather", "description": "Get the weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"]}},
    {"name": "search", "description": "Search the web 搜索",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "number"}}}},
    {"name": "run_code", "parameters": {"type": "object", "properties": {"code": {"type": "string"},
                                                                          "opts": {"type": "object"}}}},
    {"name": "noop"},
]
ARGS = ['{"city": "Paris", "days": 3}', '{"query": "天气 today", "top_k": 5}', '{}', '{"code": "print(\\"hi\\")\\n"}',
        '{"opts": {"a": [1, 2, {"b": null}], "c": true}, "code": "x"}', '{"city":"Tōkyō"}', '{"x": false, "y": -7}',
        '{"s": "line1\\nline2 <tag> & \\u00e9"}', 'not json', '[1, 2]', '{"nested": {"k": "v"}, "n": 0}']


def rand_text(r):
    return r.choice(TEXTS) + ("" if r.random() < 0.6 else " " + r.choice(TEXTS))


def make_conversation(r, i):
    conv = {"messages": [], "tools": [], "thinking": r.random() < 0.6,
            "reasoning_effort": r.choice([None, None, "low", "high", "xhigh", "max"])}
    if r.random() < 0.4:
        conv["tools"] = [{"type": "function", "function": t} for t in r.sample(TOOLS, r.randint(1, 3))]
    msgs = conv["messages"]
    if r.random() < 0.6:
        msgs.append({"role": "system", "content": rand_text(r)})
    ncall = 0
    for turn in range(r.randint(1, 4)):
        msgs.append({"role": "user", "content": rand_text(r)})
        if r.random() < 0.15 and turn > 0:
            msgs.append({"role": "user", "content": rand_text(r)})
        last_turn = r.random() < 0.3
        if last_turn and turn > 0:
            break
        # An assistant turn, possibly with tool calls and their results.
        for step in range(r.randint(1, 2)):
            m = {"role": "assistant", "content": rand_text(r)}
            if r.random() < 0.6:
                m["reasoning_content"] = rand_text(r)
            if r.random() < 0.4:
                calls = []
                for _ in range(r.randint(1, 2)):
                    name = r.choice(["get_weather", "search", "run_code", "noop"])
                    calls.append({"id": f"call_{ncall}", "type": "function",
                                  "function": {"name": name, "arguments": r.choice(ARGS)}})
                    ncall += 1
                m["tool_calls"] = calls
                if r.random() < 0.5:
                    m["content"] = ""
                msgs.append(m)
                results = [{"role": "tool", "tool_call_id": c["id"], "content": rand_text(r)} for c in calls]
                if r.random() < 0.3:
                    results.reverse()
                msgs.extend(results)
            else:
                msgs.append(m)
                break
    if r.random() < 0.1 and msgs[-1]["role"] == "user":
        msgs.append({"role": "assistant", "content": rand_text(r), "prefix": True,
                     **({"reasoning_content": rand_text(r)} if r.random() < 0.5 else {})})
    if r.random() < 0.08 and len(msgs) > 2 and msgs[1]["role"] != "system":
        msgs.insert(r.randint(1, len(msgs) - 1), {"role": "system", "content": rand_text(r)})
    return conv


def recipe_messages(conv):
    import deepseek_recipe as dr
    out = []
    for m in conv["messages"]:
        role = m["role"]
        if role == "system":
            out.append(dr.SystemMessage(m["content"]))
        elif role == "user":
            out.append(dr.UserMessage(m["content"]))
        elif role == "assistant":
            calls = [dr.ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                     for c in m.get("tool_calls", [])] or None
            out.append(dr.AssistantMessage(m.get("content") or "", m.get("reasoning_content"), calls,
                                           m.get("prefix", False)))
        elif role == "tool":
            out.append(dr.ToolMessage(m["content"], m.get("tool_call_id")))
    return out


def render_recipe(conv, version):
    import deepseek_recipe as dr
    enc = dr.DeepseekV4Encoding() if version == "v4" else dr.DeepseekV41Encoding()
    tools = [dr.ToolDefinition(t["function"]["name"], t["function"].get("description"),
                               t["function"].get("parameters")) for t in conv["tools"]]
    c = dr.Conversation(recipe_messages(conv), thinking_mode=conv["thinking"], tools=tools or None,
                        reasoning_effort=conv["reasoning_effort"])
    rendered = enc.render_conversation(c)
    text = rendered.prompt
    # special_ranges are code point offsets: convert to UTF-8 byte offsets for C++.
    ranges = [[len(text[:a].encode()), len(text[:b].encode())] for a, b in rendered.special_ranges]
    return {"text": text, "special_ranges": ranges}


def render_jinja(conv, template, thinking):
    import jinja2
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    msgs = []
    for m in conv["messages"]:
        m = dict(m)
        if m["role"] == "assistant" and m.get("tool_calls") and not m.get("content"):
            m["content"] = None
        msgs.append(m)
    return env.from_string(template).render(messages=msgs, add_generation_prompt=True, thinking=thinking,
                                            bos_token="<｜begin▁of▁sentence｜>")


def parse_recipe(version, output, thinking, tools):
    """Run deepseek-recipe's stream parser over `output` fed one code point at a time; return the totals."""
    import deepseek_recipe as dr
    model = "DeepSeek-V4-Pro" if version == "v4" else "DeepSeek-V4.1-Flash"
    body = {"model": model, "messages": [{"role": "user", "content": "q"}],
            "thinking": {"type": "enabled" if thinking else "disabled"}}
    if tools:
        body["tools"] = tools
    req = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
    sp = dr.StreamProcessor(dr.ChatCompletionRequest.chunk_generator(req, "id", model), req.parsing_options)
    chunks = sp.push(dr.InferenceChunk.ready())
    for ch in output:
        chunks += sp.push(dr.InferenceChunk.text(ch, 1))
    chunks += sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
    chunks += sp.finish()
    reasoning, content, calls, finish = "", "", [], None
    for c in chunks:
        choice = json.loads(c.to_json())["choices"][0]
        d = choice["delta"]
        reasoning += d.get("reasoning_content") or ""
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            if "id" in tc:
                calls.append({"name": tc["function"]["name"], "arguments": ""})
            calls[tc["index"]]["arguments"] += tc["function"].get("arguments", "")
        finish = choice.get("finish_reason") or finish
    return {"reasoning": reasoning, "content": content, "tool_calls": calls, "finish_reason": finish}


def dsml_block(version, calls):
    if version == "v4":
        o, inv, par, end = "tool_calls", "invoke", "parameter", ""
    else:
        o, inv, par = " calls", " invoke", " parameter"
    s = f"<｜DSML｜{o}>\n"
    for name, params in calls:
        s += f'<｜DSML｜{inv} name="{name}">\n'
        for k, v, is_str in params:
            s += f'<｜DSML｜{par} name="{k}" string="{"true" if is_str else "false"}">{v}</｜DSML｜{par}>\n'
        s += f"</｜DSML｜{inv}>\n"
    return s + f"</｜DSML｜{o}>"


def make_output(r, version, thinking):
    s = ""
    if thinking:
        s += r.choice(["", "\n", "\n\n"]) + rand_text(r) + r.choice(["", "\n"]) + "</think>"
    s += rand_text(r)
    if r.random() < 0.5:
        calls = []
        for _ in range(r.randint(1, 2)):
            calls.append((r.choice(["get_weather", "search"]),
                          r.sample([("city", "Paris", True), ("days", "3", False), ("query", "天气 <x>", True),
                                    ("top_k", "2.5", False), ("opts", '{"a": [1, true]}', False),
                                    ("flag", "false", False)], r.randint(0, 3))))
        s += r.choice(["", "\n\n"]) + dsml_block(version, calls)
    return s + "<｜end▁of▁sentence｜>"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/tokenizer/chat_expected.json"))
    ap.add_argument("--v31-template", default=None)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    r = random.Random(a.seed)
    cfg = json.load(open(os.path.join(ROOT, "../shared/data/tokenizers/deepseek_v3/tokenizer_config.json")))
    v3_template = cfg["chat_template"]
    v31_template = open(a.v31_template).read() if a.v31_template else None
    cases = []
    for i in range(a.n):
        conv = make_conversation(r, i)
        case = {"conversation": conv}
        for version in ("v4", "v41"):
            case[version] = render_recipe(conv, version)
        case["v3"] = {"text": render_jinja(conv, v3_template, False)}
        if v31_template:
            case["v31"] = {"text": render_jinja(conv, v31_template, conv["thinking"])}
        cases.append(case)
    parses = []
    for i in range(a.n // 2):
        version = r.choice(["v4", "v41"])
        thinking = r.random() < 0.6
        tools = [{"type": "function", "function": t} for t in TOOLS[:2]]
        out = make_output(r, version, thinking)
        parses.append({"version": version, "thinking": thinking, "output": out,
                       "expected": parse_recipe(version, out, thinking, tools)})
    import deepseek_recipe
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/make_chat_fixtures.py", "deepseek_recipe": deepseek_recipe.__version__,
                   "cases": cases, "parses": parses}, f, ensure_ascii=False, separators=(",", ":"))
    print(f"{len(cases)} conversations, {len(parses)} parses -> {a.out}")


if __name__ == "__main__":
    main()
