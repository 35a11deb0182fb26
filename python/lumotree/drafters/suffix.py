"""Model-free suffix drafting (SuffixDecoding-style) for agent workloads, and the merge of several
candidate trees into one draft tree under a node budget.

``SuffixTrie`` indexes every substring of length <= ``depth`` of the sequences it is fed, with
occurrence counts, incrementally (O(depth) per appended token). ``SuffixDrafter`` keeps one trie per
request (prompt + output so far) and a bounded global trie over recent outputs of finished
requests; to draft, it finds the longest suffix of the context (<= ``max_match`` tokens) that
occurred before and expands the continuations best-first by empirical probability
``count(child) / sum of the node's children's counts`` (path score = product), up to the budget.

``merge_drafts`` unions candidate trees (a request's own trie's and the global cache's) by token path
from the root, scores a merged node by the best of its sources, and keeps the ``budget`` best nodes
(a node's score never exceeds its parent's, so the kept set is a tree). ``adaptive_budget`` gives
the node budget for a batch: large trees at small batch, small trees at large batch.
"""
from __future__ import annotations

import array
import collections
import dataclasses
import functools
import heapq
import operator
import os
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["SuffixTrie", "SuffixDrafter", "NativeSuffixDrafter", "make_suffix_drafter", "Draft", "merge_drafts",
           "adaptive_budget"]


@dataclasses.dataclass
class Draft:
    """A draft tree: ``tokens[0]`` is the root (the last context token), ``parents[0] == -1``,
    ``scores[i]`` the drafter's probability of the path root -> i (``scores[0] == 1``)."""

    tokens: List[int]
    parents: List[int]
    scores: List[float]

    def __len__(self):
        return len(self.tokens)


class SuffixTrie:
    """Counts of all substrings of length <= ``depth`` of the appended sequences.

    Nodes are integer ids (the root is 0): ``_count[node]`` (a flat array) and ``_kids[node]``, a
    ``{token: child}`` dict of ints -- no Python object per node that the cyclic garbage collector
    tracks (CPython does not track dicts holding only ints). A served drafter holds millions of
    nodes (one per token and depth); as objects, every full collection walked all of them
    (CPU: 0.1-0.9 s per request admission in the replay sessions)."""

    def __init__(self, depth: int):
        if not 1 <= depth <= 256:
            raise ValueError(f"depth must be in [1, 256], got {depth}")
        self.depth = depth
        self.num_tokens = 0
        self._count = array.array("q", [0])
        self._kids: List[Dict[int, int]] = [{}]
        self._up = array.array("q", [-1])  # a node's parent (removal unlinks it there)
        self._tok = array.array("q", [-1])  # a node's token
        self._free: List[int] = []  # ids of removed nodes, reused
        self._active: List[List[int]] = []  # per open sequence: nodes of its suffixes of length < depth

    @property
    def num_nodes(self) -> int:
        return len(self._count) - len(self._free)

    def new_sequence(self) -> int:
        self._active.append([])
        return len(self._active) - 1

    def close_sequences(self) -> None:
        """No more appends to any sequence: their cursors dropped (numbering starts over)."""
        self._active.clear()

    def append(self, seq: int, token: int) -> None:
        try:
            tok = operator.index(token)  # Python and numpy / torch integer scalars alike
        except TypeError:
            tok = -1
        if tok < 0:
            raise ValueError(f"token ids must be non-negative integers, got {token!r}")
        token = tok
        nxt = []
        count, kids = self._count, self._kids
        for node in [0] + self._active[seq]:
            k = kids[node]
            child = k.get(token)
            if child is None:
                if self._free:
                    child = self._free.pop()
                    count[child], self._up[child], self._tok[child] = 0, node, token
                else:
                    child = len(count)
                    count.append(0)
                    kids.append({})
                    self._up.append(node)
                    self._tok.append(token)
                k[token] = child
            count[child] += 1
            nxt.append(child)
        # a suffix of length `depth` cannot be extended: keep only the shorter ones
        self._active[seq] = nxt[: self.depth - 1]
        self.num_tokens += 1

    def set_cursor(self, seq: int, context: Sequence[int]) -> None:
        """Continue sequence ``seq`` after ``context`` (tokens already indexed): its cursor becomes the
        nodes of ``context``'s suffixes shorter than ``depth`` (those that occur)."""
        active = []
        for m in range(1, min(self.depth - 1, len(context)) + 1):
            node = self.find(context[len(context) - m:])
            if node is None:  # longer suffixes cannot occur either
                break
            active.append(node)
        self._active[seq] = active

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(seq, t)

    def find(self, pattern: Sequence[int]) -> Optional[int]:
        """The node of ``pattern`` (an id), or None if it does not occur."""
        node = 0
        for t in pattern:
            node = self._kids[node].get(t)
            if node is None:
                return None
        return node

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo ``extend(new_sequence(), tokens)`` of a closed sequence: the counts of all its substrings of length
        <= ``depth`` decremented (the walk of :meth:`append`) and the nodes left at zero -- whole subtrees: a
        substring occurs at most as often as its prefix -- unlinked and their ids reused, so the trie is the trie
        of the remaining sequences but for the order of siblings (a later occurrence adds a node at the end)."""
        count, kids = self._count, self._kids
        act: List[int] = []
        dead = []
        for t in tokens:
            nxt = []
            for node in [0] + act:
                child = kids[node][t]
                count[child] -= 1
                if count[child] == 0:
                    dead.append(child)
                nxt.append(child)
            act = nxt[: self.depth - 1]
        for c in dead:
            del kids[self._up[c]][self._tok[c]]
        for c in dead:
            kids[c] = {}
            self._free.append(c)
        self.num_tokens -= len(tokens)

    def count(self, node: int) -> int:
        return self._count[node]

    def children(self, node: int) -> List[Tuple[int, int]]:
        """``(token, child)`` of a node, in the order they first occurred."""
        return list(self._kids[node].items())

    def has_children(self, node: int) -> bool:
        return bool(self._kids[node])

    def continuations(self, node: int, unseen: float = 0.0):
        """(token, child, P(token | node)) with P estimated over the occurrences that continued, and ``unseen`` more
        occurrences of a continuation not seen yet (``count / (total + unseen)``: a continuation seen once reads 1/3
        with ``unseen`` 2, one seen 98 times of 98 reads 0.98)."""
        kids, count = self._kids[node], self._count
        total = sum(count[c] for c in kids.values()) + unseen
        return [(tok, c, count[c] / total) for tok, c in kids.items()]

    def rematch(self, node: int, length: int) -> Optional[int]:
        """For a node without children (at the trie's depth its substring cannot be continued; above it every
        occurrence ended its sequence): the node of the longest proper suffix of its substring, of at most ``length``
        tokens, that has children -- whose continuations go on where the node's stop. ``None`` where no such suffix
        has any, or ``length`` 0."""
        path = []  # the substring's last tokens, last first
        while node > 0 and len(path) <= length:
            path.append(self._tok[node])
            node = self._up[node]
        for m in range(min(length, len(path) - 1), 0, -1):
            found = self.find(path[m - 1::-1])
            if found is not None and self.has_children(found):
                return found
        return None


def _expand(trie: SuffixTrie, node: int, root_token: int, budget: int, min_prob: float, rematch: int = 0,
            unseen: float = 0.0) -> Draft:
    """Best-first expansion below ``node`` by path probability (each step's :meth:`SuffixTrie.continuations` with
    ``unseen``). ``rematch`` > 0: a path whose node has no children goes on from the node of its longest suffix of at
    most ``rematch`` tokens that has (:meth:`SuffixTrie.rematch`)."""
    tokens, parents, scores = [root_token], [-1], [1.0]
    heap = []  # (-score, tie, token, trie node, parent index)
    tie = 0
    for tok, ch, p in trie.continuations(node, unseen):
        heap.append((-p, tie, tok, ch, 0))
        tie += 1
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        neg, _, tok, ch, par = heapq.heappop(heap)
        if -neg < min_prob:
            break
        idx = len(tokens)
        tokens.append(tok)
        parents.append(par)
        scores.append(-neg)
        below = trie.continuations(ch, unseen)
        if not below and rematch:
            again = trie.rematch(ch, rematch)
            below = trie.continuations(again, unseen) if again is not None else ()
        for t2, c2, p in below:
            heapq.heappush(heap, (neg * p, tie, t2, c2, idx))
            tie += 1
    return Draft(tokens, parents, scores)


def _continued(ctx: Sequence[int], prompt: Sequence[int], overlap: int) -> Tuple[int, int]:
    """How a request whose context was ``ctx`` lines up with ``prompt``: ``(done, keep)``, ``prompt``'s first
    ``done`` tokens being ``ctx[keep - done:keep]``, so a trie of ``ctx`` continues into ``prompt`` from
    ``ctx[:keep]`` (``(0, 0)``: it does not). The alignment is ``prompt``'s start at ``ctx``'s start (a next turn)
    or anywhere in ``ctx`` (a next turn of a conversation longer than the window the server hands over: the
    window moved on), whichever runs longest; it counts when it covers all of ``ctx`` or at least ``overlap``
    tokens. Why not only where all of ``ctx`` runs into ``prompt``: a turn's output tokens as the model sampled
    them and as the next prompt renders the reply need not be the same tokens (re-tokenized text; 11 % of the
    agent benchmark's served replies did not even re-tokenize to their length), and such a turn then indexed its
    whole window again."""
    ctx, prompt = list(ctx), list(prompt)
    n, p = len(ctx), len(prompt)

    def run(j: int) -> int:
        m = min(n - j, p)
        if ctx[j:j + m] == prompt[:m]:
            return m
        return next(i for i in range(m) if ctx[j + i] != prompt[i])

    best, best_j = run(0), 0
    if best == n:
        return n, n
    if overlap >= 1 and p >= 1:
        for j in range(1, n - max(overlap, best + 1) + 1):
            if ctx[j] == prompt[0]:
                r = run(j)
                if r > best:
                    best, best_j = r, j
                    if j + r == n or r == p:
                        break
    if best < max(overlap, 1):
        return 0, 0
    return best, best_j + best


class SuffixDrafter:
    """Per-request suffix tries + a bounded global trie of recent outputs.

    Args:
        max_match: longest context suffix looked up.
        max_spec: deepest speculation below the match.
        global_tokens: size bound of the global cache (tokens of recent outputs kept).
        min_prob: drop branches whose path probability falls below this.
        retired_tokens: size bound (tokens indexed) of the finished requests' tries kept for a next turn
            whose prompt continues one of their contexts (0: none kept), and of one request's trie.
    """

    # a retired context continues into a prompt where its last ADOPT_OVERLAP (or more) tokens are the prompt's
    # first: the prompt is a window of the conversation (the server hands over its last tokens) that moved on
    ADOPT_OVERLAP = 256

    def __init__(self, max_match: int = 16, max_spec: int = 16, global_tokens: int = 1 << 16,
                 min_prob: float = 0.05, retired_tokens: int = 1 << 15, rematch: int = 0, unseen: float = 0.0,
                 global_unseen: Optional[float] = None):
        if max_match < 1 or max_spec < 1:
            raise ValueError("max_match and max_spec must be >= 1")
        if retired_tokens < 0:
            raise ValueError(f"retired_tokens must be >= 0, got {retired_tokens}")
        if not 0 <= rematch <= max_match + max_spec:
            raise ValueError(f"rematch must be in [0, max_match + max_spec], got {rematch}")
        global_unseen = unseen if global_unseen is None else global_unseen
        if not (unseen >= 0 and global_unseen >= 0):
            raise ValueError(f"unseen must be >= 0, got {unseen} (global cache: {global_unseen})")
        self.max_match, self.max_spec, self.min_prob, self.rematch = max_match, max_spec, min_prob, rematch
        self.unseen, self.global_unseen = float(unseen), float(global_unseen)
        self.depth = max_match + max_spec
        self.global_tokens = global_tokens
        self.retired_tokens = retired_tokens
        self._requests: Dict[object, Tuple[SuffixTrie, int, List[int]]] = {}
        self._recent: collections.deque = collections.deque()
        self._recent_tokens = 0
        self._global = SuffixTrie(self.depth)
        # tries of finished requests, newest last, bounded by their contexts' tokens: the next turn
        # of a multi-turn session (its prompt = the previous context + new messages) extends one
        # instead of indexing the whole context again (O(context x depth) per turn otherwise)
        self._retired: "collections.OrderedDict[int, Tuple[SuffixTrie, int, List[int]]]" = collections.OrderedDict()
        self._retired_total = 0
        self._retired_serial = 0
        # admissions (start), those that adopted a finished turn's trie, prompt tokens indexed by them
        self.stats = dict(starts=0, adopted=0, indexed_tokens=0)

    # ------------------------------------------------------------------ request lifecycle
    def start(self, rid, prompt: Sequence[int]) -> None:
        prompt = list(prompt)
        adopted = self._adopt(prompt)
        if adopted is None:
            trie = SuffixTrie(self.depth)
            seq, done = trie.new_sequence(), 0
        else:
            (trie, seq, ctx), done, keep = adopted
            if keep < len(ctx):  # the old context parts from the prompt after ctx[:keep]: continue from there
                trie.set_cursor(seq, prompt[:done])
        trie.extend(seq, prompt[done:])
        self._requests[rid] = (trie, seq, prompt)
        self.stats["starts"] += 1
        self.stats["adopted"] += adopted is not None
        self.stats["indexed_tokens"] += len(prompt) - done

    def start_batch(self, rids: Sequence, prompts: Sequence[Sequence[int]]) -> None:
        """:meth:`start` for a batch of new requests, one after the other (the reference of
        :meth:`NativeSuffixDrafter.start_batch`); bad input fails before any request starts."""
        if len(prompts) != len(rids):
            raise ValueError(f"start_batch: {len(prompts)} prompts for {len(rids)} requests")
        if len(set(rids)) < len(rids):
            raise ValueError("start_batch: a request twice in a batch")
        for prompt in prompts:
            for t in prompt:
                if t < 0:
                    raise ValueError(f"token ids must be non-negative integers, got {t!r}")
        for rid, prompt in zip(rids, prompts):
            self.start(rid, prompt)

    def _adopt(self, prompt: List[int]):
        """``(retired request, tokens of prompt it holds, tokens of its context kept)`` for the retired request
        whose context lines up with the most of ``prompt``'s start (:func:`_continued`), taken out of the store
        (a trie is extended by one request only); None when none does or the trie would index more than
        ``retired_tokens``."""
        best, best_done, best_keep = None, 0, 0
        for key, entry in self._retired.items():
            done, keep = _continued(entry[2], prompt, self.ADOPT_OVERLAP)
            if done > best_done and entry[0].num_tokens + len(prompt) - done <= self.retired_tokens:
                best, best_done, best_keep = key, done, keep
        if best is None:
            return None
        entry = self._retired.pop(best)
        self._retired_total -= entry[0].num_tokens
        return entry, best_done, best_keep

    def _retire(self, req) -> None:
        size = req[0].num_tokens
        if self.retired_tokens == 0 or not req[2] or size > self.retired_tokens:
            return
        self._retired[self._retired_serial] = req
        self._retired_serial += 1
        self._retired_total += size
        while self._retired_total > self.retired_tokens:
            _, old = self._retired.popitem(last=False)
            self._retired_total -= old[0].num_tokens

    def append(self, rid, tokens: Sequence[int]) -> None:
        trie, seq, ctx = self._request(rid)
        trie.extend(seq, tokens)
        ctx.extend(tokens)

    def rewind(self, rid, drop: int) -> None:
        """Forget the last ``drop`` tokens of request ``rid``'s context (they were not its tokens:
        the server's view of the context moved under the drafter, see
        :class:`lumotree.sglang.suffix.HostCorpus`). The trie keeps their counts (they only weigh
        drafts, never decide them); the request's cursor -- the trie nodes of its context's
        suffixes -- is rebuilt from the remaining context, so what is appended next is indexed after
        the right tokens."""
        trie, seq, ctx = self._request(rid)
        if drop < 0 or drop > len(ctx):
            raise ValueError(f"cannot rewind {drop} of the {len(ctx)} context tokens of request {rid!r}")
        if drop == 0:
            return
        del ctx[len(ctx) - drop:]
        trie.set_cursor(seq, ctx)

    def finish(self, rid, output: Sequence[int]) -> None:
        """Retire a request; its output joins the global cache (oldest outputs evicted), and its
        own trie waits (bounded) for a next turn that extends its context."""
        req = self._requests.pop(rid, None)
        if req is not None:
            self._retire(req)
        out = list(output)
        if not out:
            return
        self._recent.append(out)
        self._recent_tokens += len(out)
        self._global.extend(self._global.new_sequence(), out)
        while self._recent_tokens > self.global_tokens and len(self._recent) > 1:
            old = self._recent.popleft()
            self._recent_tokens -= len(old)
            self._global.remove(old)  # as long as inserting it: no rebuild of the window
        self._global.close_sequences()

    def context(self, rid) -> List[int]:
        """The tokens of request ``rid`` seen so far ([] for an unknown request)."""
        req = self._requests.get(rid)
        return list(req[2]) if req else []

    def _request(self, rid):
        try:
            return self._requests[rid]
        except KeyError:
            raise KeyError(f"unknown request {rid!r}: call start() first") from None

    # ------------------------------------------------------------------ drafting
    def _match(self, trie: SuffixTrie, ctx: List[int]) -> Tuple[Optional[int], int]:
        for m in range(min(self.max_match, len(ctx)), 0, -1):
            node = trie.find(ctx[len(ctx) - m:])
            if node is not None and trie.has_children(node):
                return node, m
        return None, 0

    def draft(self, rid, budget: int) -> Draft:
        """The best draft tree of at most ``budget`` nodes (root included) for request ``rid``:
        from its own history, or from the global cache when that matches a longer suffix."""
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        trie, _, ctx = self._request(rid)
        if not ctx:
            raise ValueError(f"request {rid!r} has no context: the root token is missing")
        local, m_local = self._match(trie, ctx)
        glob, m_glob = self._match(self._global, ctx)
        drafts = []
        if local is not None:
            drafts.append(_expand(trie, local, ctx[-1], budget, self.min_prob, self.rematch, self.unseen))
        if glob is not None and m_glob >= m_local:
            drafts.append(_expand(self._global, glob, ctx[-1], budget, self.min_prob, self.rematch,
                                  self.global_unseen))
        if not drafts:
            return Draft([ctx[-1]], [-1], [1.0])
        return merge_drafts(drafts, budget)

    def step_batch(self, rids: Sequence, appends: Sequence[Sequence[int]], budget: int
                   ) -> List[Tuple[List[int], List[int]]]:
        """One decode step for a batch: request ``rids[i]``'s context grows by ``appends[i]`` (may be empty), then
        it drafts; ``(tokens, parents)`` per request. The reference of :meth:`NativeSuffixDrafter.step_batch`."""
        if appends and len(appends) != len(rids):
            raise ValueError(f"step_batch: {len(appends)} appends for {len(rids)} requests")
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        for rid in rids:
            self._request(rid)  # unknown requests fail before any change
        if appends and len(set(rids)) < len(rids):
            raise ValueError("step_batch: a request twice in a batch")
        out = []
        for i, rid in enumerate(rids):
            if appends and len(appends[i]):
                self.append(rid, appends[i])
            d = self.draft(rid, budget)
            out.append((d.tokens, d.parents))
        return out


def drafter_threads() -> int:
    """Host threads a served C++ drafter spreads a step's requests over (the scheduler's own thread is one of
    them): up to 4, at most half the CPUs this process may run on -- the rest stay with the server's other threads
    and processes."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 2))


@functools.cache
def _host_extension():
    """``lumotree._host`` (csrc/host/suffix_drafter.cc) when it was built, else None; never compiles."""
    try:
        from lumotree import _host
    except ImportError:
        return None
    return _host


class NativeSuffixDrafter:
    """:class:`SuffixDrafter` in C++ (``csrc/host/suffix_drafter.cc``): the same drafts, node for node
    and score for score, with the GIL released while it indexes and drafts; :meth:`step_batch`
    appends to and drafts a whole batch in one call. The same constructor arguments and methods, and ``threads``
    and :meth:`step_layout`."""

    def __init__(self, max_match: int = 16, max_spec: int = 16, global_tokens: int = 1 << 16,
                 min_prob: float = 0.05, retired_tokens: int = 1 << 15, threads: int = 1, rematch: int = 0,
                 unseen: float = 0.0, global_unseen: Optional[float] = None):
        ext = _host_extension()
        if ext is None:
            raise RuntimeError("lumotree._host is not built (reinstall without LUMOTREE_NO_EXTENSION)")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        global_unseen = unseen if global_unseen is None else global_unseen
        self._d = ext.SuffixDrafter(max_match, max_spec, global_tokens, min_prob, retired_tokens, threads, rematch,
                                    float(unseen), float(global_unseen))
        self.max_match, self.max_spec, self.min_prob, self.rematch = max_match, max_spec, min_prob, rematch
        self.unseen, self.global_unseen = float(unseen), float(global_unseen)

    def start(self, rid, prompt: Sequence[int]) -> None:
        self._d.start(str(rid), [operator.index(t) for t in prompt])

    def start_batch(self, rids: Sequence, prompts: Sequence[Sequence[int]]) -> None:
        """:meth:`start` for a batch of new requests, one call: the adoptions one after the other, the prompts
        indexed on the drafter's ``threads`` (the GIL released). The same as the starts one by one."""
        self._d.start_batch([str(r) for r in rids], [[operator.index(t) for t in p] for p in prompts])

    def stage_batch(self, rids: Sequence, prompts: Sequence[Sequence[int]]):
        """A prefill batch's admissions, first part (on the caller's thread): the checks and the adoptions of finished
        turns' tries; then :meth:`index_async` (the drafter's own thread) or :meth:`index_staged` (any thread: it
        touches only the staged requests, so the drafter serves the others meanwhile) and :meth:`commit_staged` (the
        requests join). The same as :meth:`start_batch`."""
        # the token lists straight to pybind11 (its C-level conversion rejects non-integers too): a prefill batch's
        # prompts are converted on the scheduler's thread, 32 x 3k tokens ~3 ms on this project's CPU, a Python
        # comprehension first cost as much again
        return self._d.stage_batch([str(r) for r in rids], prompts)

    def index_staged(self, staged) -> None:
        """Index :meth:`stage_batch`'s prompts into their requests' own tries (the GIL released, the drafter's
        admission threads)."""
        self._d.index_staged(staged)

    def index_async(self, staged) -> None:
        """:meth:`index_staged` on the drafter's own background thread (a C++ one: nothing of it waits for the GIL),
        batches in the order handed over; the caller goes on and polls ``staged.ready``, then :meth:`wait_staged`."""
        self._d.index_async(staged)

    def wait_staged(self, staged) -> None:
        """Wait until :meth:`index_async`'s (or :meth:`index_staged`'s) indexing of ``staged`` has run (the GIL
        released); raises what it raised."""
        self._d.wait_staged(staged)

    def drain(self) -> None:
        """Wait until every batch handed to :meth:`index_async` has been indexed (before a fork)."""
        self._d.drain()

    def commit_staged(self, staged) -> None:
        """The indexed requests of :meth:`stage_batch` join the drafter."""
        self._d.commit_staged(staged)

    def append(self, rid, tokens: Sequence[int]) -> None:
        _unknown_as_key_error(self._d.append, str(rid), [operator.index(t) for t in tokens])

    def rewind(self, rid, drop: int) -> None:
        _unknown_as_key_error(self._d.rewind, str(rid), drop)

    def finish(self, rid, output: Sequence[int]) -> None:
        self._d.finish(str(rid), [operator.index(t) for t in output])

    def context(self, rid) -> List[int]:
        return self._d.context(str(rid))

    @property
    def stats(self) -> dict:
        """As :attr:`SuffixDrafter.stats`: admissions, adoptions of a finished turn's trie, tokens indexed."""
        starts, adopted, indexed = self._d.stats()
        return dict(starts=starts, adopted=adopted, indexed_tokens=indexed)

    def draft(self, rid, budget: int) -> Draft:
        return Draft(*map(list, _unknown_as_key_error(self._d.draft, str(rid), budget)))

    def step_batch(self, rids: Sequence, appends: Sequence[Sequence[int]], budget: int
                   ) -> List[Tuple[List[int], List[int]]]:
        """One decode step for a batch, one call: request ``rids[i]``'s context grows by ``appends[i]`` (may be
        empty), then it drafts; the requests are indexed and drafted on the drafter's ``threads`` (the GIL
        released). The same drafts as :meth:`append` + :meth:`draft` request by request."""
        return _unknown_as_key_error(self._d.step_batch, [str(r) for r in rids],
                                     [[operator.index(t) for t in a] for a in appends], budget)

    def step_layout(self, rids: Sequence, appends: Sequence[Sequence[int]], n: int):
        """:meth:`step_batch` with ``n``-node drafts laid out as SGLang's NGRAM worker takes them, in C++ on the
        drafter's threads: tokens ``int64 [B * n]`` and ancestor-or-self masks ``bool [B * n * n]``, what
        :func:`lumotree.sglang.suffix.batch_tree_arrays` makes of the drafts."""
        return _unknown_as_key_error(self._d.step_layout, [str(r) for r in rids],
                                     [[operator.index(t) for t in a] for a in appends], n)

    @property
    def threads(self) -> int:
        return self._d.threads


def _unknown_as_key_error(fn, *args):
    try:
        return fn(*args)
    except IndexError as e:  # std::out_of_range: an unknown request, as SuffixDrafter raises KeyError
        raise KeyError(str(e)) from None


def make_suffix_drafter(threads: int = 1, **kw):
    """The suffix drafter LumoTree serves with: :class:`NativeSuffixDrafter` (its batch steps on ``threads`` host
    threads) when ``lumotree._host`` is built, else the Python :class:`SuffixDrafter` (also with
    ``LUMOTREE_OPS=naive``; one thread). The one place that chooses."""
    if os.environ.get("LUMOTREE_OPS", "").strip().lower() != "naive" and _host_extension() is not None:
        return NativeSuffixDrafter(threads=threads, **kw)
    return SuffixDrafter(**kw)


def merge_drafts(drafts: Sequence[Draft], budget: int, weights: Optional[Sequence[float]] = None) -> Draft:
    """Union of draft trees sharing a root token, by token path; a node's score is the best
    ``weight * score`` among its sources; keeps the ``budget`` best nodes best-first.

    Nodes are numbered in the order they are kept, so parents precede children."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if not drafts:
        raise ValueError("nothing to merge")
    root = drafts[0].tokens[0]
    for d in drafts:
        if d.tokens[0] != root or d.parents[0] != -1:
            raise ValueError("all drafts must share the root token (node 0, parent -1)")
    weights = list(weights) if weights is not None else [1.0] * len(drafts)
    # union trie: path tuple -> best score
    best: Dict[Tuple[int, ...], float] = {(): 1.0}
    children: Dict[Tuple[int, ...], List[Tuple[int, ...]]] = collections.defaultdict(list)
    for d, w in zip(drafts, weights):
        paths = [()]
        for i in range(1, len(d.tokens)):
            p = d.parents[i]
            if not 0 <= p < i:
                raise ValueError(f"draft parents[{i}] = {p} does not precede node {i}")
            path = paths[p] + (d.tokens[i],)
            paths.append(path)
            sc = w * d.scores[i]
            if path not in best:
                children[paths[p]].append(path)
                best[path] = sc
            else:
                best[path] = max(best[path], sc)
    tokens, parents, scores = [root], [-1], [1.0]
    heap = [(-best[c], c, 0) for c in children[()]]
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        neg, path, par = heapq.heappop(heap)
        idx = len(tokens)
        tokens.append(path[-1])
        parents.append(par)
        scores.append(-neg)
        for c in children[path]:
            heapq.heappush(heap, (-min(best[c], -neg), c, idx))  # a child never outranks its parent
    return Draft(tokens, parents, scores)


def adaptive_budget(batch_size: int, tokens_per_step: int = 512, max_nodes: int = 64, min_nodes: int = 4) -> int:
    """Draft nodes per request for a batch: ``tokens_per_step / batch`` clamped to
    ``[min_nodes, max_nodes]`` and rounded down to a power of two (a small set of static tree
    sizes, one CUDA graph each)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = max(min_nodes, min(max_nodes, tokens_per_step // batch_size))
    p = 1
    while p * 2 <= n:
        p *= 2
    return max(min_nodes, p)
