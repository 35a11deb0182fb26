"""Greedy generation with the tiny hybrid model: plain (1-node trees) and tree-speculative."""
from __future__ import annotations

import dataclasses
from typing import List

import torch

from lumotree import ops
from lumotree.tree import TreeDescriptor

__all__ = ["generate_plain", "generate_tree", "SpecStats"]


@dataclasses.dataclass
class SpecStats:
    steps: int = 0
    tokens: int = 0
    accepted_drafts: int = 0
    nodes: int = 0
    paths: int = 0
    boundaries: int = 0
    slots: int = 0
    snapshot_bytes: int = 0  # what per-node fp32 snapshots would hold, summed over steps' trees (max)
    boundary_bytes: int = 0  # what LumoTree's boundary-state scratch holds (max over steps)

    @property
    def tokens_per_step(self):
        return self.tokens / max(self.steps, 1)

    @property
    def mean_accept_len(self):
        """Accepted draft tokens per verify step (excluding the root and the bonus token)."""
        return self.accepted_drafts / max(self.steps, 1)


def generate_plain(model, prompt: List[int], max_new_tokens: int) -> List[int]:
    model.reset()
    model.prefill(torch.tensor(prompt[:-1]))
    out, last = [], prompt[-1]
    root = TreeDescriptor.from_parents(torch.tensor([[-1]]))
    while len(out) < max_new_tokens:
        logits = model.verify(torch.tensor([[last]]), root)
        model.commit(torch.tensor([[0]]), torch.tensor([1]))
        last = int(logits[0, 0].argmax())
        out.append(last)
    return out


def generate_tree(model, prompt: List[int], max_new_tokens: int, drafter):
    model.reset()
    model.prefill(torch.tensor(prompt[:-1]))
    ctx, out, stats = list(prompt), [], SpecStats()
    state_bytes = model.gdn_state_bytes()
    while len(out) < max_new_tokens:
        toks, parents = drafter.draft(ctx)
        tree = TreeDescriptor.from_parents(torch.tensor([parents]))
        draft = torch.tensor([toks])
        logits = model.verify(draft, tree)
        target = logits.argmax(-1)
        # acceptance and the commit plan in one sync-free call (the CUDA op's semantics)
        bonus, plan = ops.tree_select_and_plan(draft, target, tree, greedy=True)
        accept_len, accept_nodes = plan.accept_len, plan.accept_nodes
        model.commit(accept_nodes, accept_len)
        L = int(accept_len[0])
        new = [toks[int(n)] for n in accept_nodes[0, 1:L]] + [int(bonus[0])]
        out.extend(new)
        ctx.extend(new)
        n = len(toks)
        stats.steps += 1
        stats.tokens += len(new)
        stats.accepted_drafts += L - 1
        stats.nodes += n
        stats.paths += int(tree.num_paths[0])
        stats.boundaries += int(tree.num_boundaries[0])
        slots = tree.num_slots() if int(tree.num_boundaries[0]) else 0
        stats.slots += slots
        stats.snapshot_bytes = max(stats.snapshot_bytes, n * state_bytes)
        stats.boundary_bytes = max(stats.boundary_bytes, slots * state_bytes)
    return out[:max_new_tokens], stats
