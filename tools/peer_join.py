#!/usr/bin/env python3
"""Joins `deepinfer bench` rows (its printed table) with the peer's JSON Lines (tools/peer_transformers_v4.py) into
one table with the speed-up per row: ours tokens/s / peer tokens/s, for the eager step and for the step replayed
as a CUDA graph (decode rows that have one).

Our tokens/s is recomputed from the printed step time (3 decimals) rather than read from the rounded tokens/s
column: prefill = context / step, decode = batch / step, as the peer counts it.

  python3 tools/peer_join.py --ours bench_v4.log --peer peer.jsonl [--model V4-Flash] [--json]
"""

import argparse
import json
import re
import sys

ROW = re.compile(r"^(?P<model>\S+)\s+(?P<phase>prefill|decode)\s+(?P<batch>\d+)\s+(?P<context>\d+)\s+"
                 r"(?P<tps>[0-9.e+]+)\s*[KMGTP]?\s+(?P<ms>\d+\.\d+)\s")
GRAPH = re.compile(r"^(?P<model>\S+)\s+batch\s+(?P<batch>\d+)\s+context\s+(?P<context>\d+)\s+eager\s+"
                   r"(?P<eager>[0-9.]+)\s+graph\s+(?P<graph>[0-9.]+)")


def tokens_of(phase, batch, context):
    return context if phase == "prefill" else batch


def parse_ours(text, model):
    """{(phase, batch, context): {"step_ms", "tokens_per_s", "graph_ms"?, "graph_tokens_per_s"?}} of one slice.
    Rows come from the table that follows a header line naming tokens/s (the breakdown table has the same
    leading columns, so only the main table's section is read)."""
    rows, in_table = {}, False
    for line in text.splitlines():
        if line.startswith("model ") and "tokens/s" in line:
            in_table = True
            continue
        m = ROW.match(line)
        if in_table and m:
            if m["model"] == model:
                phase, batch, context = m["phase"], int(m["batch"]), int(m["context"])
                ms = float(m["ms"])
                rows[(phase, batch, context)] = {
                    "step_ms": ms,
                    "tokens_per_s": tokens_of(phase, batch, context) / (ms / 1000.0) if ms > 0 else 0.0,
                }
            continue
        in_table = False
        g = GRAPH.match(line)
        if g and g["model"] == model:
            key = ("decode", int(g["batch"]), int(g["context"]))
            graph_ms = float(g["graph"])
            if key in rows and graph_ms > 0:
                rows[key]["graph_ms"] = graph_ms
                rows[key]["graph_tokens_per_s"] = key[1] / (graph_ms / 1000.0)
    return rows


def parse_peer(text):
    """(config line or None, {(phase, batch, context): row}) from the peer's JSON Lines (other lines ignored)."""
    config, rows = None, {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        if obj.get("kind") == "config":
            config = obj
        elif obj.get("kind") == "row":
            rows[(obj["phase"], int(obj["batch"]), int(obj["context"]))] = obj
    return config, rows


def join(ours, peer):
    """One dict per shape either side has, ours' order first (prefill, then decode by batch and context)."""
    keys = sorted(set(ours) | set(peer), key=lambda k: (k[0] != "prefill", k[1], k[2]))
    out = []
    for k in keys:
        o, p = ours.get(k), peer.get(k)
        r = {"phase": k[0], "batch": k[1], "context": k[2]}
        if o:
            r.update({"ours_step_ms": o["step_ms"], "ours_tokens_per_s": o["tokens_per_s"]})
            if "graph_ms" in o:
                r.update({"ours_graph_ms": o["graph_ms"], "ours_graph_tokens_per_s": o["graph_tokens_per_s"]})
        if p and "error" in p:
            r["peer_error"] = p["error"]
        elif p:
            r.update({"peer_step_ms": p["step_ms"], "peer_tokens_per_s": p["tokens_per_s"]})
            if o and p["tokens_per_s"] > 0:
                r["speedup"] = o["tokens_per_s"] / p["tokens_per_s"]
                if "graph_tokens_per_s" in o:
                    r["speedup_graph"] = o["graph_tokens_per_s"] / p["tokens_per_s"]
        out.append(r)
    return out


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def markdown(rows, config):
    lines = []
    if config:
        lines.append(f"peer: transformers {config.get('transformers')} (torch {config.get('torch')}) on "
                     f"{config.get('device')}, attention {config.get('attn_implementation')}, experts "
                     f"{config.get('experts_implementation')}, {config.get('dtype')}; timed: {config.get('timed')}")
    lines.append("| phase | batch | context | ours step ms | ours tokens/s | ours graph tokens/s | peer step ms | "
                 "peer tokens/s | speed-up (ours/peer) | speed-up, graph |")
    lines.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        peer_ms = fmt(r.get("peer_step_ms"), ".3f")
        peer_tps = fmt(r.get("peer_tokens_per_s"), ",.1f")
        speed = fmt(r.get("speedup"), ".2f") + ("x" if "speedup" in r else "")
        if "peer_error" in r:
            peer_ms, peer_tps, speed = "-", "-", "peer failed: " + r["peer_error"].replace("|", "/")[:160]
        lines.append(
            f"| {r['phase']} | {r['batch']} | {r['context']} | {fmt(r.get('ours_step_ms'), '.3f')} | "
            f"{fmt(r.get('ours_tokens_per_s'), ',.1f')} | {fmt(r.get('ours_graph_tokens_per_s'), ',.1f')} | "
            f"{peer_ms} | {peer_tps} | {speed} | "
            f"{fmt(r.get('speedup_graph'), '.2f') + ('x' if 'speedup_graph' in r else '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", required=True, help="`deepinfer bench` output")
    p.add_argument("--peer", required=True, help="tools/peer_transformers_v4.py output (JSON Lines)")
    p.add_argument("--model", default="V4-Flash", help="our slice's name in the bench table")
    p.add_argument("--json", action="store_true", help="JSON Lines instead of a markdown table")
    a = p.parse_args(argv)
    with open(a.ours, encoding="utf-8", errors="replace") as f:
        ours = parse_ours(f.read(), a.model)
    with open(a.peer, encoding="utf-8", errors="replace") as f:
        config, peer = parse_peer(f.read())
    if not ours and not peer:
        print(f"peer_join: no {a.model} rows in {a.ours} and no rows in {a.peer}", file=sys.stderr)
        return 1
    rows = join(ours, peer)
    if a.json:
        for r in rows:
            print(json.dumps(r))
    else:
        sys.stdout.write(markdown(rows, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
