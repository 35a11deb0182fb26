"""A model-free n-gram / suffix-match drafter that yields real branching trees.

For the longest suffix of the context (up to ``max_match`` tokens) that occurred before, every
earlier occurrence proposes its continuation (up to ``depth`` tokens); shorter matches add more
candidates with less weight. Continuations are merged into a trie (shared prefixes share nodes)
and the ``budget`` best nodes are kept, best-first by accumulated weight -- so the tree branches
wherever the context continued in different ways.
"""
from __future__ import annotations

import heapq
from typing import List, Sequence, Tuple

__all__ = ["NgramDrafter"]


class NgramDrafter:
    def __init__(self, max_match: int = 4, depth: int = 6, budget: int = 16, max_candidates: int = 32):
        if budget < 1 or depth < 1 or max_match < 1:
            raise ValueError("budget, depth and max_match must be >= 1")
        self.max_match, self.depth, self.budget, self.max_candidates = max_match, depth, budget, max_candidates

    def draft(self, context: Sequence[int]) -> Tuple[List[int], List[int]]:
        """Return ``(tokens, parents)`` of a tree whose root (node 0) is ``context[-1]``."""
        if len(context) == 0:
            raise ValueError("the context must hold at least the root token")
        ctx = list(context)
        L = len(ctx)
        trie = [dict(children={}, weight=0.0, token=ctx[-1])]
        seen = 0
        for m in range(min(self.max_match, L - 1), 0, -1):
            suffix = ctx[L - m:]
            for p in range(L - 2, m - 2, -1):  # most recent occurrence first
                if ctx[p - m + 1: p + 1] != suffix:
                    continue
                cont = ctx[p + 1: p + 1 + self.depth]
                node = 0
                for tok in cont:
                    nxt = trie[node]["children"].get(tok)
                    if nxt is None:
                        nxt = len(trie)
                        trie.append(dict(children={}, weight=0.0, token=tok))
                        trie[node]["children"][tok] = nxt
                    trie[nxt]["weight"] += m
                    node = nxt
                seen += 1
                if seen >= self.max_candidates:
                    break
            if seen >= self.max_candidates:
                break
        tokens, parents = [trie[0]["token"]], [-1]
        heap = [(-trie[c]["weight"], c, 0) for c in trie[0]["children"].values()]
        heapq.heapify(heap)
        while heap and len(tokens) < self.budget:
            _, t, parent = heapq.heappop(heap)
            idx = len(tokens)
            tokens.append(trie[t]["token"])
            parents.append(parent)
            for c in trie[t]["children"].values():
                heapq.heappush(heap, (-trie[c]["weight"], c, idx))
        return tokens, parents
