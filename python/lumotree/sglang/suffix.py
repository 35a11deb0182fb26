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

import logging
from typing import Dict, List, Sequence, Tuple

import numpy as np

from lumotree.drafters.suffix import make_suffix_drafter

logger = logging.getLogger(__name__)

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
    gap, ``_append`` of the new tokens, ``_rewind`` of tokens that turn out not to be the request's,
    ``_finish`` with the request's output when it leaves) and lays the drafts out as SGLang expects.
    Subclasses supply those hooks and ``_draft``.

    The draft's root is always the last token SGLang hands over: the verify feeds it to the model at
    the request's next position, so a wrong root is a wrong output, not a missed draft. The context
    SGLang hands over can move under us: in overlap mode its NGRAM worker splices the last round's
    accepted tokens onto ``req.output_ids``, and when a prefill batch ran in between, those tokens
    are already in ``output_ids`` -- they appear twice, and the next round they are gone again.
    ``_observe`` therefore checks the last ``TAIL`` tokens it believes against the tokens handed over
    (same absolute positions), rewinds to where they part and appends from there; a context that
    parts before that window starts over."""

    TAIL = 64

    def __init__(self, draft_token_num: int):
        self.n = draft_token_num
        self._seen: Dict[object, int] = {}  # tokens of the request's context already observed
        self._outputs: Dict[object, List[int]] = {}  # tokens appended after admission (its output)
        self._tail: Dict[object, List[int]] = {}  # the last <= TAIL of those context tokens
        self.stats = dict(starts=0, rewinds=0, rewound_tokens=0, restarts=0)

    def _start(self, rid, tokens: List[int]) -> None:
        pass

    def _append(self, rid, tokens: List[int]) -> None:
        pass

    def _rewind(self, rid, drop: int) -> None:
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
        for d in (self._seen, self._outputs, self._tail):
            d.clear()
        self._reset()

    def _observe(self, rid, tokens: Sequence[int], total_len: int) -> None:
        """Bring request ``rid``'s context up to ``tokens`` (its last ``len(tokens)`` tokens, ending
        at absolute position ``total_len``)."""
        seen = self._seen.get(rid)
        off = total_len - len(tokens)  # absolute position of tokens[0]
        restart = seen is None or off > seen  # first sight, or new tokens we are not given
        if not restart:
            tail = self._tail[rid]
            start = seen - len(tail)  # absolute position of tail[0]
            lo, hi = max(start, off), min(seen, total_len)
            cut = hi
            if tail[lo - start:hi - start] != list(tokens[lo - off:hi - off]):  # one C-level compare, commonly
                cut = next(p for p in range(lo, hi) if tail[p - start] != tokens[p - off])
            restart = cut == lo < hi  # they part at the first position both hold: maybe earlier
        if restart:
            self.stats["starts" if seen is None else "restarts"] += 1
            tokens = list(tokens)
            self._start(rid, tokens)
            self._outputs[rid] = []
            self._tail[rid] = tokens[-self.TAIL:]
        else:
            drop = seen - cut
            if drop:
                self.stats["rewinds"] += 1
                self.stats["rewound_tokens"] += drop
                if self.stats["rewinds"] <= 3:
                    logger.info("LumoTree host drafter: request %r's context moved under it (%d of its last tokens "
                                "are not the server's); rewound (%s)", rid, drop, self.stats)
                self._rewind(rid, drop)
                out = self._outputs[rid]
                del out[max(0, len(out) - drop):]
            new = list(tokens[cut - off:])
            if new:
                self._append(rid, new)
                self._outputs[rid].extend(new)
            self._tail[rid] = (tail[:cut - start] + new)[-self.TAIL:]
        self._seen[rid] = total_len

    def _draft_batch(self, req_ids, roots) -> List[Tuple[List[int], List[int]]]:
        return [self._draft(rid, root) for rid, root in zip(req_ids, roots)]

    def batch_get(self, req_ids: List[str], batch_tokens: List[List[int]],
                  total_lens: List[int]) -> Tuple[np.ndarray, np.ndarray]:
        roots = []
        for rid, ctx, total in zip(req_ids, batch_tokens, total_lens):
            self._observe(rid, ctx, total)
            roots.append(int(ctx[-1]))
        toks, masks = [], []
        for rid, root, (tokens, parents) in zip(req_ids, roots, self._draft_batch(req_ids, roots)):
            if int(tokens[0]) != root:  # never with the tail check above; a draft is only a guess, the root is not
                raise RuntimeError(f"LumoTree host drafter: the draft of request {rid!r} starts at token {tokens[0]}, "
                                   f"the server's last token is {root}")
            t, m = tree_arrays(tokens, parents, self.n)
            toks.append(t)
            masks.append(m.reshape(-1))
        return np.concatenate(toks), np.concatenate(masks)

    def batch_put(self, batch_tokens: List[List[int]]) -> None:
        pass  # contexts are observed in batch_get, outputs handed over in erase_match_state

    def erase_match_state(self, req_ids: List[str]) -> None:
        for rid in req_ids:
            out = self._outputs.pop(rid, None)
            self._tail.pop(rid, None)
            if self._seen.pop(rid, None) is not None:
                self._finish(rid, out or [])

    def _no_external(self, *a, **k):
        raise NotImplementedError(f"{type(self).__name__} has no external corpus")

    load_external_corpus_named = commit_external_corpus_load = remove_external_corpus = _no_external

    def list_external_corpora(self) -> dict:
        return {}


class SuffixCorpus(HostCorpus):
    """:class:`HostCorpus` over the suffix drafter (per-request tries + global cache): the C++ one
    (:class:`~lumotree.drafters.suffix.NativeSuffixDrafter`, the batch drafted in one call without the
    GIL) when built, else the Python reference (:func:`~lumotree.drafters.suffix.make_suffix_drafter`)."""

    def __init__(self, draft_token_num: int, max_match: int = 16, max_spec: int = 16,
                 global_tokens: int = 1 << 18, min_prob: float = 0.0):
        super().__init__(draft_token_num)
        self.kw = dict(max_match=max_match, max_spec=max_spec, global_tokens=global_tokens, min_prob=min_prob)
        self.drafter = make_suffix_drafter(**self.kw)

    def _reset(self) -> None:
        self.drafter = make_suffix_drafter(**self.kw)

    def _start(self, rid, tokens):
        self.drafter.start(rid, tokens)

    def _append(self, rid, tokens):
        self.drafter.append(rid, tokens)

    def _rewind(self, rid, drop):
        self.drafter.rewind(rid, drop)

    def _finish(self, rid, output):
        self.drafter.finish(rid, output)

    def _draft(self, rid, root):
        d = self.drafter.draft(rid, self.n)
        return d.tokens, d.parents

    def _draft_batch(self, req_ids, roots):
        if hasattr(self.drafter, "draft_batch"):
            return self.drafter.draft_batch(req_ids, self.n)
        return super()._draft_batch(req_ids, roots)


def ngram_worker(make_corpus):
    """SGLang's NGRAM worker with ``make_corpus(server_args)`` as its draft source."""
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    from lumotree.sglang.finish import forward_marked, keep_out_of_cache
    from lumotree.sglang.scheduling import overlap_consistent

    class HostCorpusWorker(NGRAMWorker):
        def __init__(self, server_args, *args, **kwargs):
            super().__init__(server_args, *args, **kwargs)
            self.ngram_corpus = make_corpus(server_args)
            self._overlap_consistent = overlap_consistent(server_args)

        def forward_batch_generation(self, batch, *args, **kwargs):
            # where each request ends: the run clamp; the overlap scheduler's finished rows (lumotree.sglang.finish)
            return forward_marked(getattr(self, "_overlap_consistent", False), batch,
                                  lambda: super(HostCorpusWorker, self).forward_batch_generation(batch, *args, **kwargs))

        def prepare_for_kv_cache_release(self, req) -> None:
            keep_out_of_cache(getattr(self, "_overlap_consistent", False), req)

    return HostCorpusWorker


def worker_class():
    """SGLang's NGRAM worker with :class:`SuffixCorpus` as its draft source."""
    return ngram_worker(lambda sa: SuffixCorpus(sa.speculative_num_draft_tokens))
