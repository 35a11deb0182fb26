"""Host time per decode step of the merged tree's suffix side (LUMOTREE_SUFFIX_MERGE=1): indexing the
tokens each request accepted and drafting its suffix branch, as ``lumotree.sglang.merge.SuffixMerge``
does on the scheduler's thread. Contexts: the agent replay sessions (characters as token ids);
each step appends 3 tokens drawn from the request's recent context. CPU only, this machine.

Also the tensor ops one merge step dispatches (``ops``: counted with a dispatch counter, batch 8):
the torch path (what would launch one by one on the GPU) and the kernel path with the kernel's
launch stubbed out (what launches besides it); in both, ``host_tensor_ops`` of them build the
suffix batch on the CPU.

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


def count_ops(n, slots, depth, batch=8):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from lumotree import TreeDescriptor
    from lumotree.drafters import tree_merge_triton
    from lumotree.sglang import merge

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    par = torch.tensor([[-1] + [(i - 1) // 2 for i in range(1, n)]] * batch)  # a binary MTP tree
    tok = torch.arange(n)[None, :].repeat(batch, 1) + 100
    tok[:, 0] = 4
    ctx = [[9, 1, 2, 3, 4] * 3] * batch
    seq = torch.full((batch,), 15)
    rids = [str(i) for i in range(batch)]

    def verify_input():
        e = TreeDescriptor.from_parents(par).to_eagle(seq)
        return type("VI", (), dict(draft_token=tok.flatten().clone(), positions=e["positions"].clone(),
                                   retrieve_next_token=e["retrieve_next_token"].clone(),
                                   retrieve_next_sibling=e["retrieve_next_sibling"].clone(),
                                   custom_mask=e["custom_mask"].clone()))()

    out = {}
    for kernel in (False, True):
        m = merge.SuffixMerge(n, slots=slots, max_spec=depth, kernel=kernel)
        launch = tree_merge_triton.tree_merge_layout_fwd_kernel
        tree_merge_triton.tree_merge_layout_fwd_kernel = type("Stub", (), {"__getitem__": lambda s, g: lambda *a, **k: None})()
        try:
            m.merge(verify_input(), seq, merge.FULL_MASK, rids, ctx)  # the requests' tries exist
            vi = verify_input()
            with Count() as c:
                m.merge(vi, seq, merge.FULL_MASK, rids, ctx)
            with Count() as h:
                m.suffix_tensors(rids, "cpu")
        finally:
            tree_merge_triton.tree_merge_layout_fwd_kernel = launch
        out["kernel_path_besides_the_launch" if kernel else "torch_path"] = dict(tensor_ops=c.n, host_tensor_ops=h.n)
    return dict(batch=batch, **out)


def turn_start_cost(sessions, context=4096):
    """Host time to admit each turn of the replay sessions into the suffix drafter (what
    ``LUMOTREE_SUFFIX`` and the merged tree do when a request arrives): a turn's prompt is the
    session's messages before an assistant message (4-character chunks as token ids, about the
    served tokenizer's rate; the last ``context``), its output that message. With the finished turn's trie kept (``retired_tokens``,
    the default) vs indexing every prompt from scratch (``retired_tokens=0``)."""
    from lumotree.drafters.suffix import SuffixDrafter

    out = {}
    for name, kw in (("reuse_retired_trie", {}), ("index_every_prompt", dict(retired_tokens=0))):
        d = SuffixDrafter(max_match=16, max_spec=16, **kw)
        times, lengths = [], []
        for si, sess in enumerate(sessions):
            toks = []
            for t, msg in enumerate(sess["messages"]):
                text = msg["content"]  # ~4 characters per token, as the served BPE tokenizer
                content = [sum(map(ord, text[i:i + 4])) * 31 % 5000 for i in range(0, len(text), 4)]
                if msg["role"] == "assistant" and toks:
                    prompt = toks[-context:]
                    t0 = time.perf_counter()
                    d.start((si, t), prompt)
                    times.append(time.perf_counter() - t0)
                    lengths.append(len(prompt))
                    d.append((si, t), content)
                    d.finish((si, t), content)
                toks += content
        out[name] = dict(turns=len(times), mean_ms=1000 * sum(times) / len(times), max_ms=1000 * max(times),
                         mean_prompt_tokens=sum(lengths) / len(lengths))
    return out


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
    turns = turn_start_cost(sessions)
    print(json.dumps(turns), flush=True)
    ops = count_ops(args.draft_tokens, args.slots, args.depth)
    print(json.dumps(ops), flush=True)
    res = dict(command="python3 " + " ".join(sys.argv), ops=ops, turn_start=turns, machine=platform.processor() or platform.machine(),
               python=platform.python_version(), draft_tokens=args.draft_tokens, slots=args.slots, depth=args.depth,
               rows=rows)
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    return res


if __name__ == "__main__":
    main()
