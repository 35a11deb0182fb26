"""A real (tiny) coding-agent loop over the server's OpenAI API (GPU machine).

    python3 benchmark/workloads/agent_loop.py --model benchmark/models/tiny-hybrid \\
        --configs none,lumotree,lumotree-suffix --out benchmark/results/agent_loop_h200.json

The agent talks to ``/v1/chat/completions`` with the ``openai`` client (temperature 0). Its system
prompt documents three tools over this machine's Python standard library: ``cat PATH`` (the first
60 lines of a file), ``grep WORD PATH`` (matching lines) and ``submit``. Each reply's first line
is parsed as a command; the tool output (or an error) is sent back as the next user message; a
session ends on ``submit`` or after ``--turns`` turns. With temperature 0 the transcripts of the
servers with and without speculation are compared.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serving"))

from parity import CONFIGS, is_compared, reference_for  # noqa: E402
from sglang_server import sglang_server  # noqa: E402

SYSTEM = ("You are a coding agent working in the Python standard library ({root}). Reply with exactly one "
          "command on the first line:\n  cat PATH        show the first 60 lines of a file\n"
          "  grep WORD PATH  show the lines of a file containing WORD\n  submit          finish\n")
TASKS = ["Find where textwrap.dedent is defined and explain what it does.",
         "Which function in shlex splits a command line? Show its signature.",
         "How does copy.deepcopy handle recursive structures?",
         "Find the default indent of json.dumps.",
         "What does functools.lru_cache use as a cache key?"]


def tool(command: str, root: str) -> str:
    parts = command.strip().split()
    if not parts:
        return "error: empty command"
    if parts[0] == "submit":
        return "SUBMIT"
    if parts[0] not in ("cat", "grep") or len(parts) < 2:
        return f"error: unknown command {parts[0]!r}; use cat, grep or submit"
    path = os.path.normpath(os.path.join(root, parts[-1]))
    if not path.startswith(root) or not os.path.isfile(path):
        return f"error: no such file {parts[-1]!r}"
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    if parts[0] == "cat":
        return "\n".join(lines[:60])
    if len(parts) < 3:
        return "error: grep needs WORD PATH"
    return "\n".join(f"{i + 1}: {ln}" for i, ln in enumerate(lines) if parts[1] in ln)[:4000] or "(no match)"


def reply_margins(choice):
    """``[[token text, top-1 minus top-2 logprob], ...]`` of one reply (``logprobs`` requested with
    ``top_logprobs=2``), ``None`` when the server sent none."""
    lp = getattr(choice, "logprobs", None)
    content = getattr(lp, "content", None) if lp is not None else None
    if not content:
        return None
    return [[t.token, (t.top_logprobs[0].logprob - t.top_logprobs[1].logprob) if len(t.top_logprobs or []) > 1
             else None] for t in content]


def run_session(client, task: str, turns: int, max_tokens: int, root: str, margins: bool = False):
    """One agent session. ``margins``: also ask for the top-2 logprobs of every reply (the
    no-speculation reference does, so that a speculative transcript that parts from it can be
    told apart from a near-tie of the reference's own logits)."""
    msgs = [{"role": "system", "content": SYSTEM.format(root=root)}, {"role": "user", "content": task}]
    stats = []
    extra = dict(logprobs=True, top_logprobs=2) if margins else {}
    for _ in range(turns):
        r = client.chat.completions.create(model="default", messages=msgs, temperature=0, max_tokens=max_tokens,
                                           **extra)
        reply = r.choices[0].message.content or ""
        msgs.append({"role": "assistant", "content": reply})
        details = getattr(r.usage, "prompt_tokens_details", None)
        stats.append(dict(prompt_tokens=r.usage.prompt_tokens, completion_tokens=r.usage.completion_tokens,
                          cached_tokens=getattr(details, "cached_tokens", None) if details is not None else None))
        if margins:
            stats[-1]["margins"] = reply_margins(r.choices[0])
        out = tool(reply.splitlines()[0] if reply.strip() else "", root)
        if out == "SUBMIT":
            break
        msgs.append({"role": "user", "content": out})
    return msgs, stats


def workload(url, turns, max_tokens, margins=False):
    """Every task's agent session against a running server through the openai client
    (``margins``: with the replies' top-2 logprob margins, for the no-speculation reference)."""
    import openai

    root = sysconfig.get_paths()["stdlib"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    out = []
    for t in TASKS:
        msgs, stats = run_session(client, t, turns, max_tokens, root, margins=margins)
        out.append(dict(task=t, messages=msgs, stats=stats))
    return out


def first_difference(session, ref):
    """Where a transcript first parts from the reference's: ``(message index, character)`` in the
    first differing message, plus the reference's top-2 margin at that character when it recorded
    margins for that reply; ``None`` when identical."""
    for i, (a, b) in enumerate(zip(session["messages"], ref["messages"])):
        if a != b:
            x, y = a.get("content") or "", b.get("content") or ""
            c = next((j for j, (u, w) in enumerate(zip(x, y)) if u != w), min(len(x), len(y)))
            d = dict(message=i, role=b.get("role"), char=c)
            replies = [j for j, m in enumerate(ref["messages"]) if m.get("role") == "assistant"]
            stats = ref.get("stats") or []
            if b.get("role") == "assistant" and i in replies and replies.index(i) < len(stats):
                pos = 0
                for text, m in stats[replies.index(i)].get("margins") or []:
                    pos += len(text or "")
                    if pos > c:
                        d["reference_margin"] = m
                        break
            return d
    if len(session["messages"]) != len(ref["messages"]):
        return dict(message=min(len(session["messages"]), len(ref["messages"])), role=None, char=0)
    return None


def transcripts_identical(res):
    """Per speculative run: sessions whose transcript equals its no-spec reference's (``none``, or
    ``none`` + the run's tag), and where the others part from it."""
    runs, out = res["runs"], {}
    for name, r in runs.items():
        ref = reference_for(name, runs)
        base = (runs.get(ref) or {}).get("sessions")
        if not is_compared(name, runs) or not base or not r.get("sessions"):
            continue
        out[name] = dict(reference=ref, identical=sum(a["messages"] == b["messages"] for a, b in zip(r["sessions"], base)),
                         of=len(base),
                         first_differences=[d for d in (first_difference(a, b) for a, b in zip(r["sessions"], base)) if d])
    if out:
        res["transcripts_identical_to_no_spec"] = out
        print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", default="none,lumotree,lumotree-suffix")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir", default=".")
    args = ap.parse_args()
    res = dict(command="python3 " + " ".join(sys.argv), model=args.model, runs={})
    for name in args.configs.split(","):
        r = {}
        try:
            with sglang_server(args.model, CONFIGS[name], log=os.path.join(args.log_dir, f"agent-{name}.log"),
                               timeout=300) as url:
                r["sessions"] = workload(url, args.turns, args.max_tokens, margins=name == "none")
        except Exception as e:
            r["error"] = repr(e)[:2000]
        res["runs"][name] = r
        print(json.dumps({name: dict(error=r.get("error"), sessions=len(r.get("sessions", [])))}), flush=True)
        json.dump(res, open(args.out, "w"), indent=1)
    transcripts_identical(res)
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
