"""Model-free suffix drafting inside SGLang (``--speculative-algorithm LUMOTREE_SUFFIX``).

SGLang's NGRAM worker already runs the draft-free loop (draft on the host -> tree verify -> greedy
/ sampled acceptance -> KV and, for hybrid models, the state commit). :class:`SuffixCorpus` gives it
LumoTree's suffix drafter (:class:`lumotree.drafters.suffix.SuffixDrafter`: per-request suffix tries
over prompt + output, a bounded global cache of finished outputs, best-first branches by empirical
continuation probability) behind the same interface as SGLang's ``NgramCorpus``; the GDN layers are
verified and committed by LumoTree's backend as for ``LUMOTREE``. No MTP head is needed.

A request's trie starts from the last ``--speculative-ngram-max-trie-depth`` tokens of its context
when it is first drafted (LUMOTREE_SUFFIX raises SGLang's default of 18 to 4096) and then grows
with every accepted token; when the request leaves the batch its output joins the global cache.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from lumotree.drafters.suffix import SuffixDrafter

DEFAULT_CONTEXT = 4096


def tree_arrays(tokens: Sequence[int], parents: Sequence[int], n: int) -> Tuple[np.ndarray, np.ndarray]:
    """A draft tree padded to ``n`` nodes in SGLang's NGRAM layout: tokens `[n]` (root first) and
    the ancestor-or-self mask `[n, n]` (``mask[i, j]``: j is i or an ancestor of i). Padding nodes
    are extra children of the root repeating the root's first candidate (or the root token), which
    verification treats as ordinary candidates, so outputs stay exact."""
    if len(tokens) > n:
        raise ValueError(f"draft of {len(tokens)} nodes exceeds the {n}-node budget")
    toks = list(tokens)
    par = list(parents)
    filler = toks[1] if len(toks) > 1 else toks[0]
    while len(toks) < n:
        toks.append(filler)
        par.append(0)
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = par[j]
    return np.asarray(toks, dtype=np.int64), mask


class HostCorpus:
    """SGLang's ``NgramCorpus`` interface (``batch_get``, ``batch_put``, ``synchronize``,
    ``erase_match_state``, ``reset``, the external-corpus calls) for host-side drafters: tracks each
    request's context from what the NGRAM worker hands over (``_start`` at first sight or after a
    gap, ``_append`` of the new tokens, ``_finish`` with the request's output when it leaves) and
    lays the drafts out as SGLang expects. Subclasses supply those hooks and ``_draft``."""

    def __init__(self, draft_token_num: int):
        self.n = draft_token_num
        self._seen: Dict[object, int] = {}  # tokens of the request's context already observed
        self._outputs: Dict[object, List[int]] = {}  # tokens appended after admission (its output)

    def _start(self, rid, tokens: List[int]) -> None:
        pass

    def _append(self, rid, tokens: List[int]) -> None:
        pass

    def _finish(self, rid, output: List[int]) -> None:
        pass

    def _reset(self) -> None:
        pass

    def _draft(self, rid, root: int) -> Tuple[List[int], List[int]]:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def reset(self) -> None:
        self._seen.clear()
        self._outputs.clear()
        self._reset()

    def _observe(self, rid, tokens: Sequence[int], total_len: int) -> None:
        seen = self._seen.get(rid)
        if seen is None or total_len - seen > len(tokens) or total_len < seen:
            # first sight (or a gap we cannot fill): start from the context we are given
            self._start(rid, list(tokens))
            self._outputs[rid] = []
        elif total_len > seen:
            new = list(tokens[len(tokens) - (total_len - seen):])
            self._append(rid, new)
            self._outputs[rid].extend(new)
        self._seen[rid] = total_len

    def batch_get(self, req_ids: List[str], batch_tokens: List[List[int]],
                  total_lens: List[int]) -> Tuple[np.ndarray, np.ndarray]:
        toks, masks = [], []
        for rid, ctx, total in zip(req_ids, batch_tokens, total_lens):
            self._observe(rid, ctx, total)
            t, m = tree_arrays(*self._draft(rid, ctx[-1]), self.n)
            toks.append(t)
            masks.append(m.reshape(-1))
        return np.concatenate(toks), np.concatenate(masks)

    def batch_put(self, batch_tokens: List[List[int]]) -> None:
        pass  # contexts are observed in batch_get, outputs handed over in erase_match_state

    def erase_match_state(self, req_ids: List[str]) -> None:
        for rid in req_ids:
            out = self._outputs.pop(rid, None)
            if self._seen.pop(rid, None) is not None:
                self._finish(rid, out or [])

    def _no_external(self, *a, **k):
        raise NotImplementedError(f"{type(self).__name__} has no external corpus")

    load_external_corpus_named = commit_external_corpus_load = remove_external_corpus = _no_external

    def list_external_corpora(self) -> dict:
        return {}


class SuffixCorpus(HostCorpus):
    """:class:`HostCorpus` over :class:`SuffixDrafter` (per-request tries + global cache)."""

    def __init__(self, draft_token_num: int, max_match: int = 16, max_spec: int = 16,
                 global_tokens: int = 1 << 18, min_prob: float = 0.0):
        super().__init__(draft_token_num)
        self.kw = dict(max_match=max_match, max_spec=max_spec, global_tokens=global_tokens, min_prob=min_prob)
        self.drafter = SuffixDrafter(**self.kw)

    def _reset(self) -> None:
        self.drafter = SuffixDrafter(**self.kw)

    def _start(self, rid, tokens):
        self.drafter.start(rid, tokens)

    def _append(self, rid, tokens):
        self.drafter.append(rid, tokens)

    def _finish(self, rid, output):
        self.drafter.finish(rid, output)

    def _draft(self, rid, root):
        d = self.drafter.draft(rid, self.n)
        return d.tokens, d.parents


def ngram_worker(make_corpus):
    """SGLang's NGRAM worker with ``make_corpus(server_args)`` as its draft source."""
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    class HostCorpusWorker(NGRAMWorker):
        def __init__(self, server_args, *args, **kwargs):
            super().__init__(server_args, *args, **kwargs)
            self.ngram_corpus = make_corpus(server_args)

    return HostCorpusWorker


def worker_class():
    """SGLang's NGRAM worker with :class:`SuffixCorpus` as its draft source."""
    return ngram_worker(lambda sa: SuffixCorpus(sa.speculative_num_draft_tokens))
