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

import numpy as np

from lumotree import tree_shapes
from lumotree.sglang.suffix import tree_arrays

ENV_P = "LUMOTREE_BENCH_ORACLE_P"
KEY_TOKENS = 64


def first_child_chain(parents: Sequence[int]) -> List[int]:
    chain = [0]
    while True:
        kids = [i for i in range(1, len(parents)) if parents[i] == chain[-1]]
        if not kids:
            return chain
        chain.append(kids[0])


class OracleCorpus:
    """SGLang ``NgramCorpus`` interface; drafts from known continuations with acceptance ``p``."""

    def __init__(self, draft_token_num: int, p: float, topk: int, depth: int, vocab: int = 100000, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"acceptance probability must be in [0, 1], got {p}")
        self.n, self.p, self.vocab, self.seed = draft_token_num, p, vocab, seed
        self.parents = tree_shapes.eagle(max(topk, 1), max(depth, 1), draft_token_num, random.Random(seed))
        self.parents += [0] * (draft_token_num - len(self.parents))
        self.chain = first_child_chain(self.parents)
        self.depth = [0] * draft_token_num
        for i in range(1, draft_token_num):
            self.depth[i] = self.depth[self.parents[i]] + 1
        self._key: Dict[object, Tuple[int, ...]] = {}
        self._seen: Dict[object, int] = {}
        self._out: Dict[object, List[int]] = {}
        self.continuations: Dict[Tuple[int, ...], List[int]] = {}

    def synchronize(self) -> None:
        pass

    def reset(self) -> None:
        self._key.clear()
        self._seen.clear()
        self._out.clear()
        self.continuations.clear()

    def _observe(self, rid, tokens: Sequence[int], total_len: int) -> None:
        if rid not in self._seen:
            self._key[rid] = tuple(tokens[:KEY_TOKENS])
            self._out[rid] = []
        elif total_len > self._seen[rid]:
            k = total_len - self._seen[rid]
            self._out[rid].extend(tokens[len(tokens) - k:] if k <= len(tokens) else tokens)
        self._seen[rid] = total_len

    def draft(self, rid, root: int) -> List[int]:
        """Tokens for the fixed tree: the first-child chain carries the first ``k`` true tokens
        (``k`` = leading successes of Bernoulli(p) draws, capped by the chain and the known
        continuation); every other child of a true-prefix node is a wrong token, so greedy
        verification accepts exactly ``k`` drafts (+ the bonus token) when the target repeats its
        recorded greedy output."""
        out = self._out[rid]
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
        return toks

    def batch_get(self, req_ids, batch_tokens, total_lens) -> Tuple[np.ndarray, np.ndarray]:
        toks, masks = [], []
        for rid, ctx, total in zip(req_ids, batch_tokens, total_lens):
            self._observe(rid, ctx, total)
            t, m = tree_arrays(self.draft(rid, ctx[-1]), [-1] + self.parents[1:], self.n)
            toks.append(t)
            masks.append(m.reshape(-1))
        return np.concatenate(toks), np.concatenate(masks)

    def batch_put(self, batch_tokens) -> None:
        pass

    def erase_match_state(self, req_ids) -> None:
        for rid in req_ids:
            out = self._out.pop(rid, None)
            key = self._key.pop(rid, None)
            self._seen.pop(rid, None)
            if key is not None and out and len(out) > len(self.continuations.get(key, [])):
                self.continuations[key] = out

    def _no_external(self, *a, **k):
        raise NotImplementedError("the oracle drafter has no external corpus")

    load_external_corpus_named = commit_external_corpus_load = remove_external_corpus = _no_external

    def list_external_corpora(self) -> dict:
        return {}


def worker_class(p: float):
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    class OracleWorker(NGRAMWorker):
        def __init__(self, server_args, *args, **kwargs):
            super().__init__(server_args, *args, **kwargs)
            self.ngram_corpus = OracleCorpus(server_args.speculative_num_draft_tokens, p,
                                             server_args.speculative_eagle_topk, server_args.speculative_num_steps)

    return OracleWorker
