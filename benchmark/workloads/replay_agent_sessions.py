"""Replay the offline SWE-agent-style sessions against a served model, turn by turn (GPU machine).

    python3 benchmark/workloads/replay_agent_sessions.py --model benchmark/models/tiny-hybrid \\
        --configs none,nextn-tree,lumotree,lumotree-suffix --out benchmark/results/agent_replay_h200.json

Each session's context grows as an agent framework resends it: for every assistant turn, the
messages before it (system prompt with tool docs, file views, diffs, test logs, earlier answers)
are rendered with the model's chat template and sent greedily; the recorded assistant turn is then
appended (so every configuration sees the same contexts). Per turn it records the radix-cache hit
(``cached_tokens``), the accept length (completion tokens / verify steps) and the time; per
configuration the totals. Sessions run one after another, as one agent would.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serving"))

from parity import CONFIGS, is_compared, reference_for  # noqa: E402
from sglang_server import post, sglang_server  # noqa: E402


def turns(session, max_turns):
    """(prompt messages, recorded answer) for each assistant turn of a session."""
    msgs = session["messages"]
    out = []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            out.append((msgs[:i], m["content"]))
            if len(out) == max_turns:
                break
    return out


def workload(url, tok, sessions, max_turns, max_new_tokens, rows):
    """Replay each session's turns in order against a running server (greedy); appends per-turn rows."""
    for s in sessions:
        for t, (msgs, _) in enumerate(turns(s, max_turns)):
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            t0 = time.time()
            o = post(url + "/generate", {"text": text, "sampling_params": dict(
                temperature=0.0, max_new_tokens=max_new_tokens)})
            mi = o["meta_info"]
            rows.append(dict(session=s["id"], turn=t, seconds=time.time() - t0,
                             prompt_tokens=mi["prompt_tokens"], cached_tokens=mi.get("cached_tokens", 0),
                             completion_tokens=mi["completion_tokens"],
                             verify_steps=mi.get("spec_verify_ct", 0), text=o["text"]))
    return rows


def identical_turns(res):
    """Per speculative run: turns whose greedy text equals its no-spec reference's (``none``, or
    ``none`` + the run's tag, e.g. ``none-det`` for ``lumotree-det``)."""
    runs = res["runs"]
    for name, r in runs.items():
        base = (runs.get(reference_for(name, runs)) or {}).get("turns")
        if is_compared(name, runs) and base and r.get("turns") and r.get("summary"):
            r["summary"]["greedy_identical_turns"] = sum(a["text"] == b["text"] for a, b in zip(r["turns"], base))
            r["summary"]["turns_compared"] = min(len(base), len(r["turns"]))


def summarize(rows):
    toks = sum(r["completion_tokens"] for r in rows)
    steps = sum(r["verify_steps"] for r in rows)
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    secs = sum(r["seconds"] for r in rows)
    return dict(turns=len(rows), completion_tokens=toks, accept_length=toks / steps if steps else None,
                tokens_per_s=toks / secs if secs else None, cached_fraction=cached / prompt if prompt else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--sessions-file", default=os.path.join(HERE, "agent_sessions.json"))
    ap.add_argument("--configs", default="none,lumotree,lumotree-suffix")
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir", default=".")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    sessions = json.load(open(args.sessions_file))["sessions"][: args.sessions]
    res = dict(command="python3 " + " ".join(sys.argv), model=args.model, runs={})
    for name in args.configs.split(","):
        rows, r = [], {}
        try:
            with sglang_server(args.model, CONFIGS[name], log=os.path.join(args.log_dir, f"replay-{name}.log"),
                               timeout=300) as url:
                workload(url, tok, sessions, args.max_turns, args.max_new_tokens, rows)
        except Exception as e:
            r["error"] = repr(e)[:2000]
        r.update(summary=summarize(rows) if rows else None, turns=rows)
        res["runs"][name] = r
        print(json.dumps({name: r.get("summary"), "error": r.get("error")}), flush=True)
        json.dump(res, open(args.out, "w"), indent=1)
    identical_turns(res)
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
