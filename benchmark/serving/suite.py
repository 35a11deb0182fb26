"""One server per configuration, every tiny-model serving workload on it (GPU machine).

    python3 benchmark/serving/suite.py --model benchmark/models/tiny-hybrid --configs none,lumotree \\
        --out $OUT/suite-a.json --log-dir /tmp/logs [--port 30000]
    python3 benchmark/serving/suite.py --merge suite-a.json suite-b.json --out merged.json

Per configuration (``parity.CONFIGS``), on one ``sglang.launch_server`` process:

1. the parity workload (:func:`parity.workload`: greedy batches 1 / 7 / rest, a radix second
   turn, an abort beside greedy requests, sampled requests);
2. the coding-agent replay (:func:`replay_agent_sessions.workload`: per-turn cached tokens,
   accept length, tokens/s);
3. the agent loop over ``/v1/chat/completions`` with the ``openai`` client
   (:func:`agent_loop.workload`).

Server start-up (Triton JIT, CUDA graphs: 1-2 min each) dominates a GPU run, so this shares
one start-up between the three; runs on different GPUs (``CUDA_VISIBLE_DEVICES``, ``--port``) are
merged afterwards with ``--merge``, which computes every comparison against ``none``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))

import agent_loop  # noqa: E402
import parity  # noqa: E402
import replay_agent_sessions as replay  # noqa: E402
from sglang_server import log_health, sglang_server  # noqa: E402


def run(args):
    from transformers import AutoTokenizer

    from eval_tiny_hybrid_sglang import prompts

    P = prompts(args.prompts)
    tok = AutoTokenizer.from_pretrained(args.model)
    sessions = json.load(open(args.sessions_file))["sessions"][: args.sessions]
    res = dict(command="python3 " + " ".join(sys.argv), model=args.model, prompts=len(P),
               max_new_tokens=args.max_new_tokens, parity=dict(runs={}, texts={}), replay=dict(runs={}),
               agent=dict(runs={}))
    env = dict(kv.split("=", 1) for kv in args.env)
    for config in args.configs.split(","):
        name = config + args.tag
        log = os.path.join(args.log_dir, f"suite-{name}.log")
        p, rp, ag = dict(config=config, env=env, extra_args=args.extra), {}, {}
        t0 = time.time()
        try:
            with sglang_server(args.model, parity.CONFIGS[config] + ["--log-level", "info"] + args.extra, port=args.port,
                               log=log, timeout=300, env=env or None) as url:
                p["ready_s"] = round(time.time() - t0, 1)
                # the abort step runs last: a server that hangs after an abort (seen once, no
                # speculation) then costs only that step's measurement
                if not args.agent_only:
                    p.update(parity.workload(url, P, args.max_new_tokens, res["parity"]["texts"], name, abort=False))
                    json.dump(res, open(args.out, "w"), indent=1)
                    print(json.dumps({name: "parity done"}), flush=True)
                if args.agent_only:
                    ag["sessions"] = agent_loop.workload(url, args.agent_turns, args.agent_tokens, margins=True)
                elif not args.parity_only:
                    rows = []
                    try:
                        replay.workload(url, tok, sessions, args.max_turns, args.replay_new_tokens, rows)
                    except Exception as e:
                        rp["error"] = repr(e)[:2000]
                    rp.update(summary=replay.summarize(rows) if rows else None, turns=rows)
                    print(json.dumps({name: "replay done"}), flush=True)
                    try:
                        # every configuration sends the same requests (with the top-2 logprobs the comparison
                        # reads)
                        ag["sessions"] = agent_loop.workload(url, args.agent_turns, args.agent_tokens, margins=True)
                    except Exception as e:
                        ag["error"] = repr(e)[:2000]
                try:
                    if not args.agent_only:
                        p.update(parity.abort_and_sample(url, P, res["parity"]["texts"], name))
                except Exception as e:
                    p["abort_error"] = repr(e)[:2000]
        except Exception as e:  # keep what was measured; the log says the rest
            p["error"] = repr(e)[:2000]
        except KeyboardInterrupt:  # the lane's time limit (SIGINT): keep what was measured, then stop
            p["error"] = "interrupted by the time limit"
            res["parity"]["runs"][name], res["replay"]["runs"][name], res["agent"]["runs"][name] = p, rp, ag
            json.dump(res, open(args.out, "w"), indent=1)
            raise
        p.update(parity.memory_report(log), **log_health(log))
        res["parity"]["runs"][name], res["replay"]["runs"][name], res["agent"]["runs"][name] = p, rp, ag
        print(json.dumps({name: {k: v for k, v in p.items() if k != "memory_log"}})[:3000], flush=True)
        json.dump(res, open(args.out, "w"), indent=1)
    return res


def merge(files):
    res = dict(merged=files, parity=dict(runs={}, texts={}), replay=dict(runs={}), agent=dict(runs={}))
    for f in files:
        part = json.load(open(f))
        for key in ("command", "model", "prompts", "max_new_tokens"):
            res.setdefault(key, part.get(key))
        res.setdefault("commands", []).append(part.get("command"))
        for k in ("parity", "replay", "agent"):
            res[k]["runs"].update(part[k]["runs"])
        res["parity"]["texts"].update(part["parity"]["texts"])
    return res


def compare(res):
    if any(n.split("/")[0].startswith("none") for n in res["parity"]["texts"]):  # "none" or a tagged "none-det"
        res["parity"]["greedy_vs_no_spec"] = parity.compare(res["parity"]["texts"])
    replay.identical_turns(res["replay"])
    agent_loop.transcripts_identical(res["agent"])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--configs", default="none,lumotree")
    ap.add_argument("--out", required=True)
    ap.add_argument("--merge", nargs="+", help="combine suite JSONs (e.g. one per GPU) and compare")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--sessions-file", default=os.path.join(HERE, "..", "workloads", "agent_sessions.json"))
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--replay-new-tokens", type=int, default=64)
    ap.add_argument("--agent-turns", type=int, default=6)
    ap.add_argument("--agent-tokens", type=int, default=96)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--parity-only", action="store_true")
    ap.add_argument("--agent-only", action="store_true", help="only the agent loop (diagnostics)")
    ap.add_argument("--tag", default="", help="suffix of the run names (variants of one config)")
    ap.add_argument("--env", nargs="*", default=[], help="KEY=VALUE for the server process")
    ap.add_argument("--extra", nargs="*", action="extend", default=[],
                    help="extra server flags (write --extra=--flag; repeat for more)")
    args = ap.parse_args()
    if args.merge:
        res = compare(merge(args.merge))
    else:
        if not args.model:
            ap.error("--model is required unless --merge")
        res = compare(run(args))
    json.dump(res, open(args.out, "w"), indent=1)
    summary = dict(parity=res["parity"].get("greedy_vs_no_spec"),
                   replay={n: r.get("summary") and {k: v for k, v in r["summary"].items()}
                           for n, r in res["replay"]["runs"].items()},
                   agent=res["agent"].get("transcripts_identical_to_no_spec"))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
