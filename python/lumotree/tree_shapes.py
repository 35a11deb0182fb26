"""Draft-tree shapes used by tests, benchmarks and the demo: `parents` lists (node 0 = root).

``eagle`` mimics SGLang's EAGLE tree builder: ``steps`` rounds of top-``topk`` expansion with
random draft log-probabilities, then the ``num_draft_tokens - 1`` best nodes by path score (plus
the root), renumbered so parents precede children (BFS order, as SGLang lays them out).
"""
from __future__ import annotations

import random
from typing import List

__all__ = ["chain", "star", "caterpillar", "random_tree", "eagle", "SHAPES"]


def chain(n: int) -> List[int]:
    return [-1] + list(range(n - 1))


def star(n: int) -> List[int]:
    return [-1] + [0] * (n - 1)


def caterpillar(n: int, leg: int = 1) -> List[int]:
    """A spine with ``leg``-node legs hanging off every spine node."""
    parents, spine = [-1], 0
    while len(parents) < n:
        parents.append(spine)
        new_spine = len(parents) - 1
        for _ in range(leg):
            if len(parents) >= n:
                break
            parents.append(spine)
        spine = new_spine
    return parents[:n]


def random_tree(n: int, rng: random.Random) -> List[int]:
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def eagle(topk: int, steps: int, num_draft_tokens: int, rng: random.Random) -> List[int]:
    # candidates: (score, parent_candidate, depth); root is candidate 0
    cands = [(0.0, -1, 0)]
    frontier = [0]
    for _ in range(steps):
        expanded = []
        for c in frontier:
            for _ in range(topk):
                expanded.append((cands[c][0] + rng.uniform(-3.0, 0.0), c, cands[c][2] + 1))
        expanded.sort(key=lambda e: -e[0])
        frontier = []
        for e in expanded[:topk]:  # SGLang keeps the top-k of the k*k expansions per step
            cands.append(e)
            frontier.append(len(cands) - 1)
        # the other expansions are still candidates for the final selection
        for e in expanded[topk:]:
            cands.append(e)
    # keep the best nodes whose ancestors are kept (path scores decrease along a path)
    order = sorted(range(1, len(cands)), key=lambda i: -cands[i][0])
    keep = {0}
    for i in order:
        if len(keep) >= num_draft_tokens:
            break
        if cands[i][1] in keep:
            keep.add(i)
    kept = sorted(keep, key=lambda i: (cands[i][2], -cands[i][0]))  # BFS by depth, then score
    new = {old: j for j, old in enumerate(kept)}
    return [-1 if i == 0 else new[cands[i][1]] for i in kept]


SHAPES = ("chain", "star", "caterpillar", "random")
