"""How many tokens per verify step would tree speculation accept on the agent replay set, if the
target model produced exactly the recorded assistant turns? (CPU; no model, no GPU.)

This isolates the *drafter*: for every assistant turn, the context is the whole conversation so
far (as agent frameworks resend it) and the target continuation is the recorded turn. Each step
the drafter proposes a tree (node budget from ``adaptive_budget`` at the given batch size),
``tree_select_greedy`` accepts against the known continuation, and the accepted tokens plus the
bonus token are appended. Real models deviate from the record, so this is an upper bound of what
the drafter can give on these sessions, not a measured serving speedup. Tokens are a regex split
(words, numbers, runs of spaces, single symbols), mapped to ids per run.

    python3 benchmark/workloads/sim_draft_acceptance.py --out benchmark/results/agent_draft_acceptance_cpu.json
"""
import argparse
import json
import re
import sys
import time

import torch

from lumotree import TreeDescriptor
from lumotree.drafters.ngram import NgramDrafter
from lumotree.drafters.suffix import Draft, SuffixDrafter, adaptive_budget
from lumotree.ops import tree_select_greedy

TOKEN = re.compile(r"[A-Za-z_]+|\d+| +|\n|[^\sA-Za-z_\d]")


class Vocab:
    def __init__(self):
        self.ids = {}

    def __call__(self, text):
        return [self.ids.setdefault(t, len(self.ids)) for t in TOKEN.findall(text)]


def accept(draft: Draft, cont):
    """Greedy acceptance of a draft tree against the known continuation ``cont``."""
    tree = TreeDescriptor.from_parents(torch.tensor([draft.parents]))
    depth = tree.depth[0].tolist()
    target = torch.tensor([[cont[d] if d < len(cont) else -1 for d in depth]])
    al, an, _ = tree_select_greedy(torch.tensor([draft.tokens]), target, tree)
    return [draft.tokens[int(i)] for i in an[0, 1:int(al[0])]]


def run(sessions, drafter_name, batch, max_turn_tokens):
    vocab = Vocab()
    budget = adaptive_budget(batch)
    suffix = SuffixDrafter(max_match=16, max_spec=16, min_prob=0.0)
    ngram = NgramDrafter(max_match=4, depth=8, budget=budget)
    steps = tokens = 0
    per_session = []
    for s in sessions:
        ctx = []
        rid = s["id"]
        suffix.start(rid, [])
        s_steps = s_tokens = 0
        for m in s["messages"]:
            toks = vocab(f"<|{m['role']}|>\n" + m["content"] + "\n")
            if m["role"] != "assistant":
                ctx += toks
                suffix.append(rid, toks)
                continue
            head, body = toks[:2], toks[2:][:max_turn_tokens]  # role marker is the prompt's end
            ctx += head
            suffix.append(rid, head)
            pos = 0
            while pos < len(body):
                if drafter_name == "suffix":
                    d = suffix.draft(rid, budget)
                else:
                    tk, par = ngram.draft(ctx)
                    d = Draft(tk, par, [1.0] * len(tk))
                acc = accept(d, body[pos:])
                new = acc + body[pos + len(acc):pos + len(acc) + 1]  # + the bonus token (the target's)
                ctx += new
                suffix.append(rid, new)
                pos += len(new)
                s_steps += 1
                s_tokens += len(new)
        suffix.finish(rid, [])  # a session's own outputs stay in its context; nothing global here
        steps += s_steps
        tokens += s_tokens
        per_session.append(dict(id=rid, steps=s_steps, tokens=s_tokens, tokens_per_step=s_tokens / max(s_steps, 1)))
    return dict(drafter=drafter_name, batch=batch, budget=budget, steps=steps, tokens=tokens,
                tokens_per_step=tokens / max(steps, 1), per_session=per_session)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", default="benchmark/workloads/agent_sessions.json")
    ap.add_argument("--out", default="benchmark/results/agent_draft_acceptance_cpu.json")
    ap.add_argument("--limit", type=int, default=20, help="sessions to use")
    ap.add_argument("--max-turn-tokens", type=int, default=400)
    args = ap.parse_args()
    sessions = json.load(open(args.sessions))["sessions"][: args.limit]
    torch.set_num_threads(1)
    rows = []
    t0 = time.time()
    for drafter in ("suffix", "ngram"):
        for batch in (1, 16, 64):
            r = run(sessions, drafter, batch, args.max_turn_tokens)
            rows.append(r)
            print(f"{drafter:>6} batch {batch:>3} budget {r['budget']:>2}: {r['tokens_per_step']:.2f} tokens/step "
                  f"({r['tokens']} tokens, {r['steps']} steps)", flush=True)
    json.dump(dict(command="python3 " + " ".join(sys.argv), seconds=time.time() - t0, rows=rows),
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
