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

import collections
import functools
import logging
import os
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from lumotree.drafters.suffix import drafter_threads, make_suffix_drafter
from lumotree.sglang import draft_timing

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 4096


def tree_arrays(tokens: Sequence[int], parents: Sequence[int], n: int) -> Tuple[np.ndarray, np.ndarray]:
    """A draft tree padded to ``n`` nodes in SGLang's NGRAM layout: tokens `[n]` (root first) and
    the ancestor-or-self mask `[n, n]` (``mask[i, j]``: j is i or an ancestor of i). Padding nodes
    are extra children of the root repeating the root's first candidate (or the root token), which
    verification treats as ordinary candidates, so outputs stay exact."""
    toks, mask = batch_tree_arrays([(tokens, parents)], n)
    return toks, mask.reshape(n, n)


def batch_tree_arrays(trees: Sequence[Tuple[Sequence[int], Sequence[int]]], n: int) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`tree_arrays` of a batch of ``(tokens, parents)`` trees, concatenated as SGLang's NGRAM worker
    takes them (tokens `[B * n]`, masks `[B * n * n]`). Each node's ancestors-or-self as one integer's bits
    (its parent's bits and its own, parents numbered before their children as the drafters number them;
    otherwise by walking parent pointers), expanded to the masks in one numpy call for the batch."""
    toks, bits = [], []
    for t, p in trees:
        m = len(t)
        if m > n:
            raise ValueError(f"draft of {m} nodes exceeds the {n}-node budget")
        toks.extend(t)
        toks.extend([t[1] if m > 1 else t[0]] * (n - m))
        anc = [1] * n
        for i in range(1, m):
            q = p[i]
            if not 0 <= q < i:
                anc = _walk_ancestors(p, m, n)
                break
            anc[i] = anc[q] | (1 << i)
        else:
            for i in range(m, n):
                anc[i] = 1 | (1 << i)
        bits.extend(anc)
    if n <= 63:
        b = np.asarray(bits, dtype=np.int64)
        mask = ((b[:, None] >> np.arange(n, dtype=np.int64)) & 1).astype(bool)
    else:
        mask = np.array([[(a >> j) & 1 for j in range(n)] for a in bits], dtype=bool).reshape(-1, n)
    return np.asarray(toks, dtype=np.int64), mask.reshape(-1)


def _walk_ancestors(parents: Sequence[int], m: int, n: int) -> List[int]:
    """Ancestors-or-self bits of a tree of ``m`` nodes numbered in any order (padding: children of the root)."""
    par = list(parents[:m]) + [0] * (n - m)
    par[0] = -1
    anc = []
    for i in range(n):
        a, j, hops = 0, i, 0
        while j >= 0:
            a |= 1 << j
            j = par[j]
            hops += 1
            if hops > n:
                raise ValueError("draft parents do not form a tree rooted at node 0")
        anc.append(a)
    return anc


def last_tokens(prompt: Sequence[int], output: Sequence[int], extra: Sequence[int], n: int) -> List[int]:
    """The last ``n`` tokens of ``prompt + output + extra``, copying only those (SGLang's NGRAM worker copies
    the whole prompt and ``max_trie_depth`` tokens per request, twice per step)."""
    if n <= 0:
        return []
    k = n - len(extra)
    if k <= 0:
        return list(extra[len(extra) - n:])
    if len(output) >= k:
        return list(output[len(output) - k:]) + list(extra)
    k -= len(output)
    return list(prompt[max(0, len(prompt) - k):]) + list(output) + list(extra)


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
    MAX_UNDECODED = 1024  # requests admitted with their prefill the corpus holds before a decode step takes them

    def __init__(self, draft_token_num: int):
        self.n = draft_token_num
        self._seen: Dict[object, int] = {}  # tokens of the request's context already observed
        self._outputs: Dict[object, List[int]] = {}  # tokens appended after admission (its output)
        self._tail: Dict[object, List[int]] = {}  # the last <= TAIL of those context tokens
        self._undecoded: Dict[object, None] = {}  # admitted with their prefill (admit), not yet in a decode step
        self.stats = dict(starts=0, rewinds=0, rewound_tokens=0, restarts=0, spliced_twice=0)

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
        for d in (self._seen, self._outputs, self._tail, self._undecoded):
            d.clear()
        self._reset()

    def admit(self, rid, tokens: Sequence[int], total_len: int) -> None:
        """Index a request's context at its prefill (its last ``len(tokens)`` tokens, ending at ``total_len``):
        what its first decode step's :meth:`batch_get` would otherwise index on the scheduler's thread while the
        GPU waits; LumoTree's worker calls this right after launching the prefill, so it runs while the GPU
        computes. A request admitted here that the next decode step does not hold (it finished or was aborted
        with its prefill) leaves at that step."""
        if rid in self._seen:
            return
        self._observe(rid, tokens, total_len)
        self._undecoded[rid] = None
        if len(self._undecoded) > self.MAX_UNDECODED:  # no decode step for long (one-token requests): bounded
            self.erase_match_state([next(iter(self._undecoded))])  # a request that still decodes starts over then

    def admit_batch(self, items: Sequence[Tuple[object, Sequence[int], int]]) -> None:
        """:meth:`admit` for each ``(rid, tokens, total_len)`` of a prefill batch."""
        for rid, tokens, total_len in items:
            self.admit(rid, tokens, total_len)

    def window(self, rid, total_len: int, depth: int) -> int:
        """How many of request ``rid``'s last tokens (its context ends at ``total_len``) :meth:`batch_get`
        needs, at most ``depth``: all ``depth`` at first sight, else the tokens from the start of the
        tail it checks (:meth:`_observe`) on -- what it would compare and append from a longer view too."""
        seen = self._seen.get(rid)
        if seen is None:
            return depth
        n = total_len - (seen - len(self._tail[rid]))
        return min(n, depth) if n >= 1 else depth

    def _observe(self, rid, tokens: Sequence[int], total_len: int, full=None) -> int:
        """Bring request ``rid``'s context up to ``tokens`` (its last ``len(tokens)`` tokens, ending
        at absolute position ``total_len``); where they part from the known context before their
        first token and ``full`` is given, the request starts over from ``full()`` (its last
        ``max_trie_depth`` tokens, what a view of :meth:`window` tokens leaves out). Returns the last token."""
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
            restart |= hi <= lo and total_len < seen  # shrunk to before the tail: nothing left to check against
        if restart and seen is not None and full is not None:  # at first sight the view is already full
            tokens = full()
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
        return int(tokens[-1])

    def _draft_batch(self, req_ids, roots) -> List[Tuple[List[int], List[int]]]:
        return [self._draft(rid, root) for rid, root in zip(req_ids, roots)]

    def batch_get(self, req_ids: List[str], batch_tokens: List[List[int]],
                  total_lens: List[int], full=None) -> Tuple[np.ndarray, np.ndarray]:
        """SGLang's call: each request's last tokens and context length; ``full`` (LumoTree's worker, which
        hands over only :meth:`window` tokens): per request, its last ``max_trie_depth`` tokens on demand."""
        self._leave_undecoded(req_ids)
        roots = [self._observe(rid, ctx, total, full[i] if full is not None else None)
                 for i, (rid, ctx, total) in enumerate(zip(req_ids, batch_tokens, total_lens))]
        return self._drafts_from(req_ids, roots)

    def step_get(self, req_ids: List[str], parts: Sequence[Tuple[Sequence[int], Sequence[int], Sequence[int]]],
                 depth: int) -> Tuple[np.ndarray, np.ndarray]:
        """:meth:`batch_get` from each request's context in its parts -- ``(prompt, output, extra)``, the context
        ``prompt + output + extra`` (LumoTree's worker: the request's ids and the last round's accepted tokens) --,
        its ``depth`` last tokens at most: the same drafts and bookkeeping, the common request in one pass
        (:meth:`_step_one`) instead of :meth:`window`, :func:`last_tokens` and :meth:`_observe` apart. Why: at 32
        requests that Python was 1.3 ms of a 1.8-ms draft preparation around a 0.5-ms C++ drafter call (H200
        host, 32 concurrent agents)."""
        self._leave_undecoded(req_ids)
        roots = [self._step_one(rid, prompt, out, extra, depth) for rid, (prompt, out, extra) in zip(req_ids, parts)]
        return self._drafts_from(req_ids, roots)

    def _step_one(self, rid, prompt, out, extra, depth: int) -> int:
        """:meth:`_observe` of request ``rid``'s context ``prompt + out + extra`` as :meth:`step_get` hands it over.
        The common case -- the tail it checks is still the context's at the same positions, and the context did not
        shrink -- appends the new tokens here; any other (first sight, a rewind, a restart) goes through
        :meth:`window`, :func:`last_tokens` and :meth:`_observe` as before.

        A splice the output already holds is taken once (:meth:`_spliced_twice`)."""
        seen = self._seen.get(rid)
        if extra and seen is not None and self._spliced_twice(prompt, out, extra, seen):
            extra = ()
            self.stats["spliced_twice"] += 1
        total = len(prompt) + len(out) + len(extra)
        if seen is not None and total >= seen:
            tail = self._tail[rid]
            n = total - seen + len(tail)  # the view from the tail's first token on (window())
            if tail and n <= depth:
                view = last_tokens(prompt, out, extra, n)
                if view[:len(tail)] == tail:
                    if n > len(tail):
                        new = view[len(tail):]
                        self._append(rid, new)
                        self._outputs[rid].extend(new)
                        self._tail[rid] = view[-self.TAIL:]
                    self._seen[rid] = total
                    return int(view[-1])
        view = last_tokens(prompt, out, extra, self.window(rid, total, depth))
        return self._observe(rid, view, total, lambda: last_tokens(prompt, out, extra, depth))

    @staticmethod
    def _spliced_twice(prompt, out, extra, seen: int) -> bool:
        """Whether the last round's tokens (``extra``) are in ``out`` already: exactly they follow the ``seen`` tokens
        observed at the request's last drafted step. SGLang's overlap scheduler processes a round's results while it
        launches the next round, so a drafted step normally finds ``out`` ending where the corpus's view ended and the
        round after it spliced on; when a prefill batch ran between two decode steps, the round's results were
        processed during it, and the round arrives twice (its NGRAM worker splices it regardless).

        Why: taken twice, the doubled round was indexed into the request's trie and drafted from (a context that
        repeats itself), and the next step rewound it -- the C++ drafter's cursor rebuilt and the Python's slow path,
        for every request running across each prefill: at 32 concurrent agents, a prefill every second or third
        decode step, about 8 rewinds per drafted step and a third of the drafter's time (the preparation replayed
        on the CPU, ``benchmark/drafters/prepare_replay.py --background``). A coincidence (tokens of steps the corpus
        did not see -- no-draft steps -- equal to the round's) takes the context one round short for a step, its last
        token still the server's (the tokens compared equal), and the next step appends the rest."""
        past = len(prompt) + len(out) - seen
        return 0 < past == len(extra) and past <= len(out) and out[len(out) - past:] == list(extra)

    def _leave_undecoded(self, req_ids) -> None:
        if self._undecoded:  # admitted with a prefill: decoding now, or gone without a decode step
            gone = set(self._undecoded).difference(req_ids)
            self._undecoded.clear()
            if gone:
                self.erase_match_state(list(gone))

    def _drafts_from(self, req_ids, roots) -> Tuple[np.ndarray, np.ndarray]:
        """The batch's drafts from its roots, each draft checked to start at its request's root."""
        tokens, mask = self._draft_arrays(req_ids, roots)
        firsts = tokens[::self.n]
        if len(roots) and not np.array_equal(firsts, roots):  # never with the tail check above; a draft is a guess,
            i = int(np.flatnonzero(firsts != np.asarray(roots, dtype=firsts.dtype))[0])  # the root is not
            raise RuntimeError(f"LumoTree host drafter: the draft of request {req_ids[i]!r} starts at token "
                               f"{firsts[i]}, the server's last token is {roots[i]}")
        return tokens, mask

    def _draft_arrays(self, req_ids, roots) -> Tuple[np.ndarray, np.ndarray]:
        """The batch's drafts in SGLang's layout (:func:`batch_tree_arrays`)."""
        return batch_tree_arrays(self._draft_batch(req_ids, roots), self.n)

    def batch_put(self, batch_tokens: List[List[int]]) -> None:
        pass  # contexts are observed in batch_get, outputs handed over in erase_match_state

    def erase_match_state(self, req_ids: List[str]) -> None:
        for rid in req_ids:
            self._undecoded.pop(rid, None)
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

    def __init__(self, draft_token_num: int, max_match: int = 8, max_spec: int = 8,
                 global_tokens: int = 1 << 18, min_prob: float = 0.0, retired_tokens: int = 1 << 18,
                 background: bool = True, rematch: Optional[int] = None, unseen: float = 2.0,
                 global_unseen: float = 16.0):
        super().__init__(draft_token_num)
        # background: a prefill batch's admissions indexed on the C++ drafter's thread (admit_batch). Off where several
        # ranks draft the same batch (--tp-size > 1): SGLang's NGRAM loop drafts on every rank and feeds each rank's
        # drafts to its shard of the verify, so the drafts must be equal on all ranks -- and whether an admission is
        # still indexing when a step drafts (it then drafts nothing for that request) depends on each rank's threads
        self.background = background
        # max_match / max_spec / rematch: a draft continues a match of at most 8 context tokens through tries 16 tokens
        # deep, and a path whose node has no children (the tries' depth, or where every occurrence ended) goes on from
        # the node of its longest suffix of at most 8 tokens that has children, as far as the node budget lets a chain
        # go: copies run past any fixed depth, and a path's last tokens pool all the places they occurred. unseen /
        # global_unseen: a step's probability is count / (total + 2) in the request's own trie -- a continuation seen
        # once reads 1/3, not 1, so a draft does not stake its budget on a long chain seen once over branches seen
        # often -- and count / (total + 16) in the global cache of other requests' outputs, weaker evidence for this
        # request. On the agent benchmark's served token streams (benchmark/drafters/acceptance_replay.py,
        # benchmark/results/suffix_depth_cpu.json, 32-node trees): 10.07 / 9.19 / 6.40 tokens per step at 1 / 8 / 32
        # concurrent agents, against 8.97 / 8.29 / 5.84 for tries 32 deep with none of it (what was last served), 9.38
        # / 8.60 / 5.98 for tries 39 deep, 9.78 / 8.94 / 6.18 with the re-match and plain frequencies, 10.00 / 9.07 /
        # 6.26 with 2 unseen in both tries (the weights chosen on the 1-agent streams and the 8-agent streams' first
        # half; the second half and 32 agents agree). The indexing follows the depth: on this project's 2-core CPU a
        # fresh 3,000-token prompt's background indexing took 2.7 ms against 6.6 (32 deep; same file, host_cost), and
        # a turn's first step finds its prompt indexed sooner; tries 12 deep drafted 0.3 % fewer tokens
        # retired_tokens: finished turns' tries kept for their sessions' next turns -- 32 concurrent agent
        # sessions of 4-8k-token contexts (the default 32k tokens kept about 5, so most next turns indexed
        # their 4,096-token window again, ~10 ms each on the scheduler's thread)
        # threads: a step's requests are indexed and drafted on up to 4 host threads (drafter_threads), one call
        # for the batch (_draft_arrays); at 32 concurrent agents that work was ~2.5-4 ms of a drafted step's host time
        if rematch is None:
            rematch = max_match
        self.kw = dict(max_match=max_match, max_spec=max_spec, global_tokens=global_tokens, min_prob=min_prob,
                       retired_tokens=retired_tokens, rematch=rematch, unseen=unseen, global_unseen=global_unseen)
        self.threads = drafter_threads()
        # a prefill batch's admissions indexed in the background, oldest first: [staged starts, their rids]
        self._staged: collections.deque = collections.deque()
        self._admitting: Dict[object, None] = {}  # requests staged and not yet committed (drafting nothing meanwhile)
        self._finishes: List[Tuple[object, List[int]]] = []  # admitting requests that left before their commit
        self.undrafted: List[int] = []  # rows of the last batch_get that drafted nothing: their admission was indexing
        # benchmark only (draft_timing on): when a step first found each request still indexing (time.monotonic_ns)
        self._blocked_at: Dict[object, int] = {}
        self.drafter = make_suffix_drafter(threads=self.threads, **self.kw)
        self._pending: Dict[object, List[int]] = {}  # a step's appends, handed over with its drafts
        self._starts: Optional[List[Tuple[object, List[int]]]] = None  # a prefill batch's admissions (admit_batch)
        _CORPORA.add(self)

    def _native(self) -> bool:
        """The C++ drafter (its calls release the GIL; its admissions are indexed on its own background thread)."""
        return all(hasattr(self._drafter, a) for a in ("stage_batch", "index_async", "wait_staged", "commit_staged",
                                                       "step_layout"))

    @property
    def drafter(self):
        """The drafter, with the admissions the background has indexed since the last call committed (an error one
        met is raised here). It may be indexing others meanwhile: those touch only their own requests, which the
        corpus keeps away from it until their commit (:meth:`_wait_for`)."""
        self._settle(block=False)
        return self._drafter

    @drafter.setter
    def drafter(self, drafter) -> None:
        self.wait_admissions()
        self._drafter = drafter

    def wait_admissions(self) -> None:
        """Wait for every admission :meth:`admit_batch` left indexing and commit it (an error one met is raised here)."""
        self._settle(block=True)

    def _wait_for(self, rid) -> None:
        """Request ``rid`` is about to be touched (appended, rewound, restarted, drafted in line): if its admission is
        still indexing, wait for it -- and for the admissions staged before it, which commit first --, not for those
        staged after it (a later prefill batch's: 32 agents' turns indexing together held the scheduler's thread for
        all of them)."""
        if rid in self._admitting:
            t0 = time.perf_counter()
            self._settle(block=True, until=rid)
            draft_timing.add_held(time.perf_counter() - t0)

    def _settle(self, block: bool, until=None) -> None:
        """Commit the background admissions that are done, oldest first (``block``: all of them, waiting; with
        ``until``: only until request ``until`` is committed), then hand over their requests that left meanwhile, in
        the order they left (:meth:`_finish`)."""
        while self._staged:
            staged, rids = self._staged[0]
            if until is not None and until not in self._admitting:
                break
            if not block and not staged.ready:
                break
            self._staged.popleft()
            try:
                self._drafter.wait_staged(staged)  # raises what the indexing raised
                self._drafter.commit_staged(staged)
            finally:  # committed or failed: the requests are no longer admitting either way
                for rid in rids:
                    self._admitting.pop(rid, None)
                if self._blocked_at:
                    self._time_left(staged, rids)
                left = [f for f in self._finishes if f[0] not in self._admitting]
                self._finishes = [f for f in self._finishes if f[0] in self._admitting]
                for rid, output in left:
                    self._finish(rid, output)
            self._log_starts(len(rids))

    def _note_blocked(self, rids) -> None:
        """Benchmark only: a step found ``rids`` still indexing (the first such step of each is what :meth:`_time_left`
        measures from)."""
        if draft_timing.enabled_now():
            now = time.monotonic_ns()
            for rid in rids:
                self._blocked_at.setdefault(rid, now)

    def _time_left(self, staged, rids) -> None:
        """Benchmark only: an admission batch committed; from the first step that found one of its requests still
        indexing to the indexing's end (:data:`lumotree.sglang.draft_timing.LEFT`)."""
        seen = [self._blocked_at.pop(rid) for rid in rids if rid in self._blocked_at]
        ready_ns = getattr(staged, "ready_ns", 0)
        if seen and ready_ns:
            draft_timing.LEFT.add(len(rids), max(0, ready_ns - min(seen)) / 1e9)

    def _reset(self) -> None:
        self._blocked_at.clear()
        self.drafter = make_suffix_drafter(threads=self.threads, **self.kw)
        self._pending.clear()
        self._starts = None

    LOG_EVERY = 256  # admissions between two log lines of the drafter's admission stats

    def admit_batch(self, items) -> None:
        """A prefill batch's admissions in one call. With the C++ drafter their prompts are indexed in the background
        (``stage_batch`` here -- the checks and the adoptions of finished turns' tries --, ``index_async`` on the
        drafter's own C++ thread, without the GIL, ``commit_staged`` at the first drafter call after it is done): the
        scheduler's thread goes on -- the prefill's results, the next batch -- and a decode step that drafts before
        a request's commit drafts nothing for that request (its root alone, :attr:`undrafted`) instead of waiting.
        Why: a prompt's indexing takes milliseconds -- 32 new 3k-token prompts 105-240 ms on this project's 2-CPU
        machine (``benchmark/drafters/suffix_host_cost.py --worker``), a 4k-token context whose finished turn's trie
        could not be adopted (its history collapsed) ~14 ms on one thread --, and a drafted step that waited for it
        held the GPU idle: with every drafter call waiting for the background, LUMOTREE_SUFFIX's draft preparation at
        32 agents took 13 ms at its 95th percentile (1.6 ms median; H200 machine)."""
        self._starts = []
        try:
            super().admit_batch(items)
        except BaseException:
            self._flush_starts(stop=True)
            raise
        starts, self._starts = self._starts, None
        if not starts:
            return
        if not self._native() or not self.background:
            self._start_now(starts)  # the Python reference holds the GIL: nothing to overlap; or ranks must agree
            return
        rids = [rid for rid, _ in starts]
        self._settle(block=any(rid in self._admitting for rid in rids))  # a request admitted again: its first commit
        staged = self._drafter.stage_batch(rids, [tokens for _, tokens in starts])
        self._drafter.index_async(staged)
        self._staged.append((staged, rids))
        self._admitting.update(dict.fromkeys(rids))

    # how long a decode step whose requests are all still being admitted waits for their indexing before it serves no
    # draft (wait_admitting). Why: a turn's first decode step is chosen right after its prefill's admission is staged,
    # so at one agent 384 of 469 turns' first steps drafted nothing (H200, run 1-agent-flags-alone), while a turn's
    # admission -- its trie adopted, its new tokens indexed -- took 0.23 ms median, 2.3 ms at its 95th percentile on
    # this project's 2-core CPU (benchmark/drafters/admission_replay.py --agents 1, the run's replies); and a drafted
    # first step saves ~0.76 steps of a turn, worth a wait of up to ~1.4 ms at that run's step times (CPU replay of its
    # streams). A drafted step waits for the step before it on the GPU anyway (its accepted tokens), so the prefill's
    # GPU time hides part of the wait. Served (one H100, the next run at 1 agent): 99 of 468 turns' first steps still
    # drafted nothing after the wait (176 found their admission indexing, 1.33 ms median of it left)
    ADMISSION_WAIT_S = 0.001
    ADMISSION_POLL_S = 0.0001  # the indexing runs without the GIL on the drafter's thread: the wait sleeps between polls

    def wait_admitting(self, req_ids, timeout: Optional[float] = None) -> bool:
        """:meth:`admitting`, after waiting up to ``timeout`` seconds (``ADMISSION_WAIT_S``) for the requests'
        indexing: whether every one of ``req_ids`` is still being admitted then. Nothing indexing (most steps): no
        copy of ``req_ids``, no clock read."""
        if not self._admitting:
            return False
        req_ids = list(req_ids)
        deadline = time.perf_counter() + (self.ADMISSION_WAIT_S if timeout is None else timeout)
        while self.admitting(req_ids):
            if time.perf_counter() >= deadline:
                return True
            time.sleep(self.ADMISSION_POLL_S)
        return False

    def admitting(self, req_ids) -> bool:
        """Whether every one of ``req_ids`` (any iterable, read only while admissions are indexing) is still being
        admitted: a drafted step would draft nothing for any of them."""
        if not self._admitting:
            return False
        self._settle(block=False)
        seen = []
        for rid in req_ids:
            if rid not in self._admitting:
                return False
            seen.append(rid)
        if seen:
            self._note_blocked(seen)
        return bool(seen)

    def _flush_starts(self, stop: bool) -> None:
        """Start the admissions deferred by :meth:`admit_batch` so far; ``stop``: and defer no more."""
        starts, self._starts = self._starts, (None if stop else [])
        if starts:
            self._start_now(starts)

    def _start_now(self, starts: List[Tuple[object, List[int]]]) -> None:
        """Admit ``starts`` into the drafter in line."""
        drafter = self.drafter
        for rid, _ in starts:
            self._wait_for(rid)
        if len(starts) == 1:
            drafter.start(*starts[0])
        else:
            drafter.start_batch([rid for rid, _ in starts], [tokens for _, tokens in starts])
        self._log_starts(len(starts))

    def _log_starts(self, n: int) -> None:
        st = self._drafter.stats
        if st["starts"] // self.LOG_EVERY > (st["starts"] - n) // self.LOG_EVERY:
            logger.info("LumoTree suffix drafter: %d admissions, %d continued a finished turn's trie, %.0f prompt "
                        "tokens indexed per admission", st["starts"], st["adopted"],
                        st["indexed_tokens"] / max(1, st["starts"]))

    def _flush(self, rid) -> None:
        if self._starts:  # every other call sees the deferred admissions started
            self._flush_starts(stop=False)
        self._wait_for(rid)
        tokens = self._pending.pop(rid, None)
        if tokens:
            self.drafter.append(rid, tokens)

    def _start(self, rid, tokens):
        self._pending.pop(rid, None)  # a restart: the tokens of the old context are gone with it
        if self._starts is not None:  # inside admit_batch: started with the batch's others
            self._starts.append((rid, tokens))
        else:
            self._start_now([(rid, tokens)])

    def _append(self, rid, tokens):
        self._pending.setdefault(rid, []).extend(tokens)  # indexed with the step's drafts (_step_appends)

    def _rewind(self, rid, drop):
        pending = self._pending.get(rid)
        if pending and drop <= len(pending):  # only tokens not yet handed to the drafter: they are not handed over
            del pending[len(pending) - drop:]  # (no wait for an admission still indexing, no call)
            return
        self._flush(rid)
        self.drafter.rewind(rid, drop)

    def _finish(self, rid, output):
        if rid in self._admitting:  # its admission is indexing: it leaves at the commit, without waiting here
            self._finishes.append((rid, list(output)))  # (a no-draft step, which does not draft, never waits for it)
            return
        self._flush(rid)
        self.drafter.finish(rid, output)

    def _draft(self, rid, root):
        self._flush(rid)
        d = self.drafter.draft(rid, self.n)
        return d.tokens, d.parents

    def _step_appends(self, req_ids) -> List[List[int]]:
        """The step's appends, taken for the drafter's batch call (any other pending first handed over alone; those
        of requests still admitting stay until their commit)."""
        if self._starts:
            self._flush_starts(stop=False)
        appends = [self._pending.pop(rid, []) for rid in req_ids]
        for rid in list(self._pending):  # appended outside this batch: never with batch_get, kept in order anyway
            if rid not in self._admitting:
                self._flush(rid)
        return appends

    def _draft_batch(self, req_ids, roots):
        """The step's appends and drafts in one call for the batch (``step_batch``)."""
        for rid in req_ids:
            self._wait_for(rid)
        return self.drafter.step_batch(req_ids, self._step_appends(req_ids), self.n)

    def _draft_arrays(self, req_ids, roots):
        """The step's appends, drafts and SGLang's layout in one C++ call (``step_layout``: the requests spread
        over the drafter's threads); the Python drafter through :func:`batch_tree_arrays`. A request whose admission
        is still indexing drafts nothing this step (its root and padding, as :func:`batch_tree_arrays` lays out a
        one-node draft; its row in :attr:`undrafted`) and keeps its appends for after the commit."""
        drafter = self.drafter  # commits what the background has indexed
        self.undrafted = []
        if not hasattr(drafter, "step_layout"):
            return super()._draft_arrays(req_ids, roots)
        skip = [i for i, rid in enumerate(req_ids) if rid in self._admitting]
        if not skip:
            return draft_timing.timed(draft_timing.NATIVE, len(req_ids), drafter.step_layout, req_ids,
                                      self._step_appends(req_ids), self.n)
        self._note_blocked([req_ids[i] for i in skip])
        n, b, skipped = self.n, len(req_ids), set(skip)
        ready = [i for i in range(b) if i not in skipped]
        tokens = np.empty((b, n), dtype=np.int64)
        mask = np.zeros((b, n, n), dtype=bool)
        if ready:
            rids = [req_ids[i] for i in ready]
            t, m = draft_timing.timed(draft_timing.NATIVE, b, drafter.step_layout, rids, self._step_appends(rids), n)
            tokens[ready] = np.asarray(t).reshape(len(ready), n)
            mask[ready] = np.asarray(m).reshape(len(ready), n, n)
        tokens[skip] = np.asarray([roots[i] for i in skip], dtype=np.int64)[:, None]
        diag = np.arange(n)
        mask[skip, :, 0] = True  # each node sees the root and itself: a one-node draft's layout
        mask[np.asarray(skip)[:, None], diag, diag] = True
        self.undrafted = skip
        return tokens.reshape(-1), mask.reshape(-1)


_CORPORA: "weakref.WeakSet[SuffixCorpus]" = weakref.WeakSet()


def _wait_all_admissions() -> None:
    """Before a fork: no admission is left running in the background (the child would not have its thread). The
    staged batches stay as they are: an error one met is raised at the next drafter call, in the parent and in the
    child."""
    for c in list(_CORPORA):
        if c._staged:
            c._drafter.drain()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_wait_all_admissions)


def prepare_draft_tokens(worker, batch) -> Tuple[np.ndarray, np.ndarray]:
    """SGLang's ``NGRAMWorker._prepare_draft_tokens`` for a :class:`HostCorpus`: the same view of each
    request (its prompt + output, the last round's accepted tokens spliced on in overlap mode, the same
    context length), but handed over as its parts (:meth:`HostCorpus.step_get`), of which the corpus copies only
    the tokens it lacks, instead of copying the whole prompt and ``max_trie_depth`` tokens -- at LUMOTREE_SUFFIX's
    depth of 4,096 and agent prompts of thousands of tokens, per request per step, on the scheduler's thread."""
    stride, depth, corpus = worker.draft_token_num, worker.max_trie_depth, worker.ngram_corpus
    # the last step's tokens are in rows of the server's stride (lumotree.sglang.suffix_sizes), this step drafts
    # ``stride`` nodes per request
    prev_stride = getattr(batch.spec_info, "draft_token_num", None) or stride
    prev_ids, prev_lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
    if not prev_ids.is_cpu:
        prev_ids, prev_lens = prev_ids.cpu(), prev_lens.cpu()
    worker.prev_token_ids, worker.prev_accept_lens = prev_ids.tolist(), prev_lens.tolist()
    corpus.synchronize()
    assert len(batch.reqs) == len(worker.prev_accept_lens)
    # overlap mode processes results one iteration behind: the last round's accepted tokens are spliced on
    use_prev = worker.enable_overlap and not batch.grammar_needs_sync()
    ids, lens = worker.prev_token_ids, worker.prev_accept_lens
    req_ids = [req.rid for req in batch.reqs]
    parts = [(req.origin_input_ids, req.output_ids,
              ids[i * prev_stride:i * prev_stride + lens[i]] if use_prev else ()) for i, req in enumerate(batch.reqs)]
    drafts, mask = corpus.step_get(req_ids, parts, depth)
    assert len(drafts) == len(batch.reqs) * stride, f"{len(drafts)=}, {len(batch.reqs)=}, {stride=}"
    return drafts, mask


def admit_prefilled(worker, batch) -> None:
    """After a prefill batch is launched: each of its requests whose prompt is complete (not a middle chunk)
    is admitted into the host corpus (:meth:`HostCorpus.admit`) with the view its first decode step would hand
    over, so that its indexing overlaps the prefill's GPU time instead of preceding the first verify."""
    corpus = getattr(worker, "ngram_corpus", None)
    if not isinstance(corpus, HostCorpus):
        return
    depth, items = worker.max_trie_depth, []
    for req in batch.reqs:
        if getattr(req, "inflight_middle_chunks", 0) > 0:
            continue
        prompt, out = req.origin_input_ids, req.output_ids
        items.append((req.rid, last_tokens(prompt, out, [], depth), len(prompt) + len(out)))
    corpus.admit_batch(items)


# LumoTree's own NGRAM-loop algorithms: their verify mask is laid out in one pass
# (lumotree.sglang.patches.ngram_full_mask); the benchmark's NGRAM_ORACLE, SGLang's own path, keeps SGLang's loop
ONE_PASS_MASK_ALGORITHMS = ("LUMOTREE_SUFFIX", "LUMOTREE_ORACLE")


def ngram_worker(make_corpus):
    """SGLang's NGRAM worker with ``make_corpus(server_args)`` as its draft source; for
    ``ONE_PASS_MASK_ALGORITHMS`` the verify's full mask is laid out in one pass; a LUMOTREE_SUFFIX server
    chooses per decode step between its suffix tree and no draft (below)."""
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    import torch

    from lumotree.sglang import (adaptive, compile_watch, draft_timing, post_verify, request_choice, shared_times,
                                 step_timing, suffix_sizes)
    from lumotree.sglang.backend import one_token_decode
    from lumotree.sglang.decode_step import DecodeStep
    from lumotree.sglang.finish import forward_marked, keep_out_of_cache
    from lumotree.sglang.scheduling import overlap_consistent, publish_prefill_early
    from lumotree.sglang.worker import StepLedger

    class HostCorpusWorker(NGRAMWorker):
        """SGLang's NGRAM worker over a :class:`HostCorpus`. **Adaptive** (LUMOTREE_SUFFIX, by default where
        :func:`~lumotree.sglang.adaptive.adaptive_tree_size` allows it): each decode step is the suffix tree
        (candidate 1) or no draft (0): the :class:`~lumotree.sglang.adaptive.TreeSizePolicy` times both on the
        device (:class:`~lumotree.sglang.worker.StepLedger`), and once both are timed the per-request choice
        (:class:`~lumotree.sglang.request_choice.RequestQuantile`) decides from the running requests' own
        acceptance. A no-draft step is the target's decode forward through decode CUDA graphs of its own
        (:meth:`lumotree.sglang.decode_step.DecodeStep.run_ngram`): no host drafting, no copy of the last step's
        tokens to the host (so the overlap scheduler overlaps it), no tree verify. Why: a drafted step of the
        NGRAM loop waits for the previous step's tokens on the host, drafts, and verifies ``bs x nodes`` tokens;
        at 32 concurrent agents (tiny model, H200) it cost ~5x a decode step, and a fixed tree served 0.93x no
        speculation. The corpus skips no-draft steps: the next drafted step hands over the tokens they made
        (:meth:`HostCorpus.window`)."""

        def __init__(self, server_args, *args, **kwargs):
            super().__init__(server_args, *args, **kwargs)
            self.ngram_corpus = make_corpus(server_args)
            self._overlap_consistent = overlap_consistent(server_args)
            self._one_pass_mask = (server_args.speculative_algorithm or "").upper() in ONE_PASS_MASK_ALGORITHMS
            self.tree_policy = self._ledger = self._decode_step = self._post_verify = None
            # per batch bucket the draft-tree size (lumotree.sglang.suffix_sizes); a VerifySize per smaller one
            self._sizes = suffix_sizes.sizes_of(server_args) if adaptive.is_suffix(server_args) else None
            self._verify_sizes = {}
            if (adaptive.is_suffix(server_args) and adaptive.adaptive_tree_size(server_args)
                    and one_token_decode(server_args)):
                steps = adaptive.candidate_steps(server_args)
                if steps != [adaptive.SUFFIX_TREE]:
                    self.tree_policy = adaptive.TreeSizePolicy(
                        steps, tree_name=("suffix tree (its bucket's size)" if self._sizes else
                                          f"{self.draft_token_num}-node suffix tree"),
                        settings=adaptive.policy_settings(server_args))
                    by_requests = request_choice.settings_of(server_args)
                    self._ledger = StepLedger(self.tree_policy, self._overlap_consistent, adaptive.SUFFIX_TREE,
                                              chooser=None if by_requests is None else
                                              request_choice.RequestQuantile(by_requests),
                                              shared=shared_times.for_server(server_args), steady=True,
                                              compiles=compile_watch.install())

        def init_cuda_graphs(self):
            super().init_cuda_graphs()
            import sglang.srt.speculative.eagle_worker_v2 as ew

            from lumotree.sglang import warmup
            from lumotree.sglang.worker import configured_graph_bs, decode_step_graph_bs

            warmup.warm_spec_decode_slots(getattr(self, "req_to_token_pool", None))  # every bucket, before serving
            warmup.warm_slot_copies(getattr(getattr(self, "req_to_token_pool", None), "mamba_pool", None))

            mr = self._target_worker.model_runner
            cuda_graph_bs = (None if ew.check_cuda_graph_backend(ew.Phase.DECODE, ew.Backend.DISABLED)
                             else configured_graph_bs(mr.server_args, ew.get_exec().graph.cuda_graph_bs_decode))
            if cuda_graph_bs and getattr(self, "_one_pass_mask", False) and torch.cuda.is_available():
                # LumoTree's own NGRAM-loop algorithms: the work after each verify forward as CUDA graphs
                self._post_verify = post_verify.PostVerifyGraphs(self.device)
            if getattr(self, "_sizes", None):
                for nodes in sorted(set(self._sizes.values()), reverse=True):
                    if nodes < self.draft_token_num:
                        self._verify_sizes[nodes] = suffix_sizes.VerifySize.build(
                            self, nodes, suffix_sizes.graph_bs_for(self._sizes, nodes, cuda_graph_bs))
            if self.tree_policy is None or 0 not in self.tree_policy.candidates:
                return
            self._decode_step = DecodeStep.build_target(self._target_worker,
                                                        decode_step_graph_bs(self.server_args, cuda_graph_bs))
            logger.info("LUMOTREE_SUFFIX adaptive: candidates %s (0 = no draft, 1 = the suffix tree, %s), chosen "
                        "per decode step from measured step times and acceptance", self.tree_policy.candidates,
                        f"nodes by batch bucket {self._sizes}" if self._sizes else f"{self.draft_token_num} nodes")

        def _prepare_for_speculative_decoding(self, batch):
            prepare = super(HostCorpusWorker, self)._prepare_for_speculative_decoding
            if not getattr(self, "_one_pass_mask", False):
                return prepare(batch)
            from lumotree.sglang.patches.ngram_full_mask import prepare_with_full_mask
            from lumotree.sglang.verify_attention import full_mask_unused

            # the model runner's backend: under a smaller tree size's VerifySize.active, that size's
            unused = full_mask_unused(self._target_worker.model_runner.attn_backend)
            if unused and not getattr(self, "_said_no_full_mask", False):
                self._said_no_full_mask = True
                logger.info("LUMOTREE_SUFFIX: every full-attention layer verifies on LumoTree's kernel: SGLang's full "
                            "verify mask is not laid out")
            prepare_with_full_mask(prepare, batch, self.draft_token_num, full=not unused)

        def forward_batch_generation(self, batch, *args, **kwargs):
            return step_timing.measure("worker", batch, self._forward_marked, batch, *args, **kwargs)

        def _forward_marked(self, batch, *args, **kwargs):
            prefill = batch.forward_mode.is_extend()
            ledger = getattr(self, "_ledger", None) if batch.forward_mode.is_decode() else None
            rows = batch.req_pool_indices[:batch.seq_lens.shape[0]] if ledger is not None else None
            # where each request ends: the run clamp; the overlap scheduler's finished rows (lumotree.sglang.finish)
            out = forward_marked(getattr(self, "_overlap_consistent", False), batch,
                                 lambda: self._forward(batch, *args, **kwargs))
            if prefill:  # launched: index the new prompts while the GPU computes (timed only in the benchmark)
                draft_timing.measure(admit_prefilled, self, batch, timer=draft_timing.ADMISSIONS)
            if ledger is not None:  # the step's finished rows are marked now: its acceptance leaves them out
                step_timing.measure("dv_live", batch, ledger.note_live_rows, batch.req_to_token_pool, rows)
            return out

        def _forward(self, batch, *args, **kwargs):
            ledger = getattr(self, "_ledger", None)
            if ledger is not None:
                if batch.forward_mode.is_decode():
                    bs = batch.seq_lens.shape[0]
                    t = step_timing.lap(None, None, 0.0)  # timed only in the benchmark
                    rids = [req.rid for req in batch.reqs] if ledger.chooser is not None else None
                    steps = ledger.choose(bs, rids, ending=ledger.ends_after_step(
                        getattr(batch, "reqs", None), getattr(batch, "enable_overlap", False)))
                    # no draft: chosen, or every request's admission still indexing (the tree would draft nothing)
                    admitting = steps != 0 and self.ngram_corpus_admitting(batch)
                    step_timing.lap("dv_choose", batch, t)
                    if ((steps == 0 or admitting) and self._decode_step is not None
                            and self._decode_step.serves_ngram(batch, self.draft_token_num)):
                        ledger.launched(bs, 0, rids=rids)
                        on_publish = kwargs.get("on_publish", args[0] if args else None)
                        if admitting:  # not the policy's choice: timed apart as well (benchmark only)
                            return step_timing.measure("nodraft_admitting", batch, step_timing.measure, "nodraft",
                                                       batch, self._no_draft_decode, batch, on_publish)
                        return step_timing.measure("nodraft", batch, self._no_draft_decode, batch, on_publish)
                    # also where a no-draft step cannot decode the batch
                    ledger.launched(bs, adaptive.SUFFIX_TREE, rids=rids)
                    out = step_timing.measure("drafted", batch, self._drafted, batch, *args, **kwargs)
                    ledger.note_undrafted(getattr(self.ngram_corpus, "undrafted", ()))
                    return out
                elif batch.forward_mode.is_idle():
                    ledger.choose(0)
                else:  # a prefill between two decode steps: the one before it has no step time of its own
                    ledger.interrupt()
            if batch.forward_mode.is_decode():
                return self._drafted(batch, *args, **kwargs)
            args, kwargs = publish_prefill_early(batch, args, kwargs)  # its lengths are known: publish, then launch
            return super(HostCorpusWorker, self).forward_batch_generation(batch, *args, **kwargs)

        def _drafted(self, batch, *args, **kwargs):
            """A drafted step: SGLang's NGRAM verify at the tree size of the batch's bucket
            (:mod:`lumotree.sglang.suffix_sizes`), its result at the server's stride."""
            forward = super(HostCorpusWorker, self).forward_batch_generation
            graphs = getattr(self, "_post_verify", None)
            if graphs is not None and graphs.serves(batch):  # the same step, its post-verify work as CUDA graphs
                forward = functools.partial(post_verify.ngram_verify_step, self, graphs)
            vs = self._verify_size(batch)
            if vs is None:
                return forward(batch, *args, **kwargs)
            bs = batch.seq_lens.shape[0]
            with vs.active(self):
                out = forward(batch, *args, **kwargs)
            return step_timing.measure_size("dv_widen", bs, suffix_sizes.widen_result, out, bs, vs.nodes,
                                            self.draft_token_num)

        def _verify_size(self, batch):
            """The smaller tree's verify state a drafted step of ``batch`` takes, ``None`` for the server's tree:
            plain batches only (:meth:`~lumotree.sglang.decode_step.DecodeStep._plain`; the others' logprobs,
            grammars and penalties are SGLang's to lay out, at its one size)."""
            sizes = getattr(self, "_verify_sizes", None)
            if not sizes:
                return None
            nodes = suffix_sizes.size_for(self._sizes, batch.seq_lens.shape[0], self.draft_token_num)
            vs = sizes.get(nodes)
            return vs if vs is not None and DecodeStep._plain(batch) else None

        def ngram_corpus_admitting(self, batch) -> bool:
            """Whether every request of ``batch`` is still being admitted by the corpus, after the corpus's bounded
            wait for their indexing (:meth:`SuffixCorpus.wait_admitting`; a corpus without it: at once)."""
            corpus = self.ngram_corpus
            wait = getattr(corpus, "wait_admitting", None) or getattr(corpus, "admitting", None)
            return wait is not None and wait(req.rid for req in batch.reqs)

        def _no_draft_decode(self, batch, on_publish):
            """The no-draft step as a decode forward (its lengths published before it, :meth:`DecodeStep._decode`);
            the requests that left the batch since the last step leave the corpus as after a verify."""
            out = self._decode_step.run_ngram(batch, self.draft_token_num, on_publish)
            current = {req.rid for req in batch.reqs}
            gone = self._prev_decode_rids - current
            if gone:
                self.ngram_corpus.erase_match_state(list(gone))
            self._prev_decode_rids = current
            return out

        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
            if getattr(self, "_ledger", None) is not None:
                self._ledger.accepted(num_correct_drafts_per_req, adaptive.SUFFIX_TREE)

        def prepare_for_kv_cache_release(self, req) -> None:
            keep_out_of_cache(getattr(self, "_overlap_consistent", False), req)

        def _prepare_draft_tokens(self, batch):
            return draft_timing.measure(prepare_draft_tokens, self, batch)  # timed only in the benchmark

        def _update_ngram_corpus(self, batch) -> None:
            pass  # a host corpus observes contexts in batch_get and outputs as requests leave: nothing to build

    return HostCorpusWorker


def worker_class():
    """SGLang's NGRAM worker with :class:`SuffixCorpus` as its draft source."""
    return ngram_worker(lambda sa: SuffixCorpus(sa.speculative_num_draft_tokens, background=drafts_alone(sa)))


def drafts_alone(server_args) -> bool:
    """Whether this server's scheduler is the only one that drafts its batches (``--tp-size`` 1): then admissions may
    be indexed in the background (:class:`SuffixCorpus`); with tensor parallelism every rank drafts the same batch
    and must draft the same trees."""
    return (getattr(server_args, "tp_size", 1) or 1) == 1
