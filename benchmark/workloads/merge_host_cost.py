"""Host time per decode step of the merged tree's suffix side (LUMOTREE_SUFFIX_MERGE=1): indexing the
tokens each request accepted and drafting its suffix branch, as ``lumotree.sglang.merge.SuffixMerge``
does on the scheduler's thread. Contexts: the agent replay sessions (characters as token ids);
each step appends 3 tokens drawn from the request's recent context. CPU only, this machine.

    python3 benchmark/workloads/merge_host_cost.py --out benchmark/results/merge_host_cost_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

from lumotree.sglang.merge import SuffixMerge

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--draft-tokens", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--depth", type=int, default=3)
    args = ap.parse_args(argv)
    sessions = json.load(open(os.path.join(HERE, "agent_sessions.json")))["sessions"]
    texts = ["".join(m["content"] for m in s["messages"]) for s in sessions]
    rng = random.Random(0)
    rows = []
    for bs in (1, 8, 32):
        m = SuffixMerge(args.draft_tokens, slots=args.slots, max_spec=args.depth)
        ctxs = [[ord(c) % 5000 for c in texts[i % len(texts)][:4000]] for i in range(bs)]
        rids = [f"r{i}" for i in range(bs)]
        for r, c in zip(rids, ctxs):
            m.observe(r, c)
        t_obs = t_draft = 0.0
        nodes = 0
        for _ in range(args.steps):
            for c in ctxs:
                c.extend(rng.choice(c[-200:]) for _ in range(3))
            t0 = time.perf_counter()
            for r, c in zip(rids, ctxs):
                m.observe(r, c)
            t1 = time.perf_counter()
            _, num = m.suffix_tensors(rids, "cpu")
            t2 = time.perf_counter()
            t_obs, t_draft = t_obs + t1 - t0, t_draft + t2 - t1
            nodes += int((num - 1).sum())
        rows.append(dict(batch=bs, observe_ms=1000 * t_obs / args.steps, draft_ms=1000 * t_draft / args.steps,
                         suffix_nodes_per_request=nodes / (args.steps * bs)))
        print(json.dumps(rows[-1]), flush=True)
    res = dict(command="python3 " + " ".join(sys.argv), machine=platform.processor() or platform.machine(),
               python=platform.python_version(), draft_tokens=args.draft_tokens, slots=args.slots, depth=args.depth,
               rows=rows)
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    return res


if __name__ == "__main__":
    main()
