"""Benchmark-only controlled-acceptance drafting (``LUMOTREE_ORACLE`` / ``NGRAM_ORACLE``).

Registered only when ``LUMOTREE_BENCH_ORACLE_P`` is set (e.g. ``0.7``); never part of a normal
launch. Dummy-weight models accept almost nothing, so serving speed at realistic acceptance needs a
drafter whose acceptance is known: :class:`OracleCorpus` learns a prompt's greedy continuation
from a first request with that prompt (it sees every accepted token through SGLang's NGRAM loop)
and, for later requests with the same prompt, drafts a fixed-shape tree whose first-child chain
carries the true continuation token by token with probability ``p`` each (stopping at the first
miss) and wrong tokens elsewhere. The expected accept length is then ``1 + p + p^2 + ...`` (up to
the chain depth), the same for every server configuration.

``NGRAM_ORACLE`` runs it on SGLang's own hybrid path (per-node ``intermediate_ssm`` snapshots,
native tree verify and scatter); ``LUMOTREE_ORACLE`` on LumoTree's backend: the same loop, trees
and acceptance, so the two differ only in the GDN state path.
"""
from __future__ import annotations

import random
import zlib
from typing import Dict, List, Sequence, Tuple

from lumotree import tree_shapes
from lumotree.sglang.suffix import HostCorpus, ngram_worker

ENV_P = "LUMOTREE_BENCH_ORACLE_P"
KEY_TOKENS = 64


def first_child_chain(parents: Sequence[int]) -> List[int]:
    chain = [0]
    while True:
        kids = [i for i in range(1, len(parents)) if parents[i] == chain[-1]]
        if not kids:
            return chain
        chain.append(kids[0])


class OracleCorpus(HostCorpus):
    """:class:`~lumotree.sglang.suffix.HostCorpus` drafting from known continuations with
    acceptance ``p``."""

    def __init__(self, draft_token_num: int, p: float, topk: int, depth: int, vocab: int = 100000, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"acceptance probability must be in [0, 1], got {p}")
        super().__init__(draft_token_num)
        self.p, self.vocab, self.seed = p, vocab, seed
        self.parents = tree_shapes.eagle(max(topk, 1), max(depth, 1), draft_token_num, random.Random(seed))
        self.parents += [0] * (draft_token_num - len(self.parents))
        self.chain = first_child_chain(self.parents)
        self.depth = [0] * draft_token_num
        for i in range(1, draft_token_num):
            self.depth[i] = self.depth[self.parents[i]] + 1
        self._key: Dict[object, Tuple[int, ...]] = {}
        self.continuations: Dict[Tuple[int, ...], List[int]] = {}

    def _reset(self) -> None:
        self._key.clear()
        self.continuations.clear()

    def _start(self, rid, tokens):
        self._key[rid] = tuple(tokens[:KEY_TOKENS])

    def _finish(self, rid, output):
        key = self._key.pop(rid, None)
        if key is not None and len(output) > len(self.continuations.get(key, [])):
            self.continuations[key] = output

    def _draft(self, rid, root: int) -> Tuple[List[int], List[int]]:
        """Tokens for the fixed tree: the first-child chain carries the first ``k`` true tokens
        (``k`` = leading successes of Bernoulli(p) draws, capped by the chain and the known
        continuation); every other child of a true-prefix node is a wrong token, so greedy
        verification accepts exactly ``k`` drafts (+ the bonus token) when the target repeats its
        recorded greedy output."""
        out = self._outputs[rid]
        truth = self.continuations.get(self._key[rid], [])[len(out):]
        rng = random.Random(zlib.crc32(repr((self._key[rid], len(out), self.seed)).encode()))
        k = 0
        while k < len(self.chain) - 1 and k < len(truth) and rng.random() < self.p:
            k += 1
        toks = [root] + [rng.randrange(self.vocab) for _ in range(self.n - 1)]
        on_prefix = set(self.chain[: k + 1])
        for d in range(1, k + 1):
            toks[self.chain[d]] = truth[d - 1]
        for node in range(1, self.n):
            if node in on_prefix or self.parents[node] not in on_prefix:
                continue
            d = self.depth[node]
            while d - 1 < len(truth) and toks[node] == truth[d - 1]:  # would be accepted: make it wrong
                toks[node] = rng.randrange(self.vocab)
        return toks, [-1] + self.parents[1:]


def worker_class(p: float):
    return ngram_worker(lambda sa: OracleCorpus(sa.speculative_num_draft_tokens, p, sa.speculative_eagle_topk,
                                                sa.speculative_num_steps))
