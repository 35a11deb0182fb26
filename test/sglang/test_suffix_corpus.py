"""LUMOTREE_SUFFIX's draft source: SGLang's NgramCorpus interface over LumoTree's suffix drafter."""
import numpy as np
import pytest
import torch

from lumotree.sglang.suffix import SuffixCorpus, tree_arrays
from lumotree.tree import TreeDescriptor


def parents_from_mask(mask):
    """SGLang's reading of an NGRAM mask: a node's parent is its largest-index strict ancestor."""
    n = mask.shape[0]
    return [max((j for j in range(i) if mask[i, j]), default=-1) for i in range(n)]


def test_tree_arrays_layout_and_padding():
    toks, mask = tree_arrays([7, 8, 9, 3], [-1, 0, 1, 0], 6)
    assert toks.tolist() == [7, 8, 9, 3, 8, 8]  # padding: more children of the root (first candidate)
    assert parents_from_mask(mask) == [-1, 0, 1, 0, 0, 0]
    assert mask.diagonal().all() and mask[2, 0] and not mask[3, 1]
    with pytest.raises(ValueError, match="exceeds"):
        tree_arrays([1, 2, 3], [-1, 0, 1], 2)
    toks, mask = tree_arrays([5], [-1], 3)
    assert toks.tolist() == [5, 5, 5] and parents_from_mask(mask) == [-1, 0, 0]


def test_batch_tree_arrays_equal_each_tree_by_parent_walks():
    import random

    from lumotree.sglang.suffix import batch_tree_arrays

    rng = random.Random(3)
    n = 9
    trees = []
    for _ in range(40):
        m = rng.randrange(1, n + 1)
        trees.append(([rng.randrange(50) for _ in range(m)], [-1] + [rng.randrange(i) for i in range(1, m)]))
    toks, masks = batch_tree_arrays(trees, n)
    assert toks.shape == (40 * n,) and masks.shape == (40 * n * n,) and masks.dtype == bool
    for r, (t, p) in enumerate(trees):
        p = list(p) + [0] * (n - len(p))
        want = np.zeros((n, n), dtype=bool)
        for i in range(n):  # the node and every ancestor, by walking parent pointers
            j = i
            while j >= 0:
                want[i, j] = True
                j = p[j] if j else -1
        assert (masks[r * n * n:(r + 1) * n * n].reshape(n, n) == want).all()
        pad = t[1] if len(t) > 1 else t[0]
        assert toks[r * n:(r + 1) * n].tolist() == list(t) + [pad] * (n - len(t))
    # a child numbered before its parent (no drafter does this): the parent walk, same masks
    _, m = batch_tree_arrays([([1, 2, 3, 4], [-1, 2, 0, 1])], 5)
    assert m.reshape(5, 5).astype(int).tolist() == [[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 0, 0],
                                                     [1, 1, 1, 1, 0], [1, 0, 0, 0, 1]]
    with pytest.raises(ValueError, match="do not form a tree"):
        batch_tree_arrays([([1, 2, 3], [-1, 2, 1])], 3)
    with pytest.raises(ValueError, match="exceeds"):
        batch_tree_arrays([([1, 2], [-1, 0]), ([1, 2, 3], [-1, 0, 1])], 2)


def test_batch_get_format_and_copy_continuation():
    c = SuffixCorpus(draft_token_num=6)
    ctx_a = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    ctx_b = [9, 8, 7, 9, 8]
    toks, mask = c.batch_get(["a", "b"], [ctx_a, ctx_b], [10, 5])
    assert toks.shape == (12,) and mask.shape == (72,) and mask.dtype == bool
    ta, ma = toks[:6].tolist(), mask[:36].reshape(6, 6)
    tb = toks[6:].tolist()
    assert parents_from_mask(mask[36:].reshape(6, 6))[1] == 0
    assert ta[0] == 2 and tb[0] == 8  # the root is the last context token
    pa = parents_from_mask(ma)
    TreeDescriptor.from_parents(torch.tensor([pa]))  # a valid tree in SGLang's reading
    kids = sorted(ta[i] for i in range(6) if pa[i] == 0)
    assert 3 in kids  # "1 2" was followed by 3 (twice)
    assert tb[1] == 7  # "9 8" was followed by 7


def test_requests_grow_and_finished_outputs_join_the_global_cache():
    c = SuffixCorpus(draft_token_num=4)
    c.batch_get(["a"], [[1, 2, 3]], [3])
    # overlap mode hands the last max_trie_depth tokens; only the new ones are appended
    c.batch_get(["a"], [[1, 2, 3, 10, 11, 12]], [6])
    assert c._outputs["a"] == [10, 11, 12] and c._seen["a"] == 6
    c.erase_match_state(["a"])
    assert "a" not in c._seen
    # a new request ending in "10 11" continues with 12, learnt from a's output via the global cache
    toks, mask = c.batch_get(["b"], [[5, 10, 11]], [3])
    assert toks[0] == 11 and toks[1] == 12
    c.reset()
    assert not c._seen and not c._outputs
    with pytest.raises(NotImplementedError):
        c.load_external_corpus_named("x", [[1, 2]])
    assert c.list_external_corpora() == {}


def test_gap_restarts_the_request():
    c = SuffixCorpus(draft_token_num=4)
    c.batch_get(["a"], [[1, 2, 3]], [3])
    c.batch_get(["a"], [[7, 8]], [20])  # 17 new tokens but only 2 given: restart from what we have
    assert c._seen["a"] == 20 and c._outputs["a"] == []
    assert isinstance(c.batch_get(["a"], [[7, 8, 9]], [21])[0], np.ndarray)


def test_overlap_duplicated_tail_keeps_the_root_and_the_context():
    """SGLang's NGRAM worker in overlap mode splices the last round's accepted tokens onto
    ``output_ids``; when a prefill batch ran in between, ``output_ids`` already holds them and they
    arrive twice (``total_len`` too high by as many), the next round they are gone. The root handed to
    the verify must still be the true last token (the model reads it at the next position)."""
    true = list(range(100, 120)) + [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5]
    c = SuffixCorpus(draft_token_num=4)
    roots = []
    for view in ("ok", "dup", "ok", "ok"):
        t = {0: 21, 1: 24, 2: 27, 3: 29}[len(roots)]
        tokens, total = true[:t], t
        if view == "dup":  # the round's 3 accepted tokens twice
            tokens, total = true[:t] + true[t - 3:t], t + 3
        toks, _ = c.batch_get(["a"], [tokens], [total])
        roots.append((int(toks[0]), tokens[-1]))
        if view == "ok":
            assert c.drafter.context("a") == true[:t]
            assert c._outputs["a"] == true[21:t]  # appended after the first sight
    # the third feed advanced by exactly the 3 duplicated tokens: total_len equals what was seen before
    assert [r for r, _ in roots] == [want for _, want in roots]
    assert c.stats["rewinds"] == 1 and c.stats["rewound_tokens"] == 3 and c.stats["restarts"] == 0


@pytest.mark.parametrize("seed", range(6))
def test_host_context_follows_any_view_of_the_server(seed):
    """Random views of a growing context: exact, the last round duplicated, only a short window,
    shrunk (a retraction). The root is always the server's last token, and after an exact view the
    drafter holds the true context (possibly without a head it never saw)."""
    import random

    rng = random.Random(seed)
    true = [rng.randrange(8) for _ in range(30)]
    c = SuffixCorpus(draft_token_num=5)
    t, last_adv = 30, 0
    for _ in range(60):
        kind = rng.choice(["ok", "ok", "dup", "window", "shrink"])
        if kind == "shrink":
            t = max(5, t - rng.randrange(1, 4))
            last_adv = 0
        else:
            adv = rng.randrange(1, 5)
            true[t:t + adv] = [rng.randrange(8) for _ in range(adv)]
            t, last_adv = t + adv, adv
        tokens, total = true[:t], t
        if kind == "dup":
            tokens, total = true[:t] + true[t - last_adv:t], t + last_adv
        elif kind == "window":
            tokens = true[t - 6:t]
        toks, mask = c.batch_get(["r"], [tokens], [total])
        assert int(toks[0]) == tokens[-1]
        if kind in ("ok", "shrink"):
            held = c.drafter.context("r")
            assert held == true[t - len(held):t]
        TreeDescriptor.from_parents(torch.tensor([parents_from_mask(mask.reshape(5, 5))]))


def test_drafter_rewind_continues_after_the_right_tokens():
    from lumotree.drafters.suffix import SuffixDrafter, SuffixTrie

    d = SuffixDrafter(max_match=4, max_spec=4, min_prob=0.0)
    d.start("a", [1, 2, 3, 9, 9])
    d.rewind("a", 2)
    d.append("a", [4, 1, 2, 3])
    assert d.context("a") == [1, 2, 3, 4, 1, 2, 3]
    # every substring of the true context counts as in a drafter fed only the true context
    ref = SuffixTrie(8)
    ref.extend(ref.new_sequence(), [1, 2, 3, 4, 1, 2, 3])
    trie = d._requests["a"][0]
    ctx = [1, 2, 3, 4, 1, 2, 3]
    for i in range(len(ctx)):
        for j in range(i + 1, min(len(ctx), i + 8) + 1):
            assert trie.count(trie.find(ctx[i:j])) == ref.count(ref.find(ctx[i:j])), ctx[i:j]
    assert d.draft("a", 3).tokens[:2] == [3, 4]  # "1 2 3" was followed by 4
    with pytest.raises(ValueError, match="rewind"):
        d.rewind("a", 8)


def test_last_tokens_is_the_tail_of_the_concatenation():
    import random

    from lumotree.sglang.suffix import last_tokens

    rng = random.Random(0)
    for _ in range(500):
        a, b, c = ([rng.randrange(9) for _ in range(rng.randrange(6))] for _ in range(3))
        n = rng.randrange(0, 20)
        whole = a + b + c
        assert last_tokens(a, b, c, n) == (whole[max(0, len(whole) - n):] if n else [])


class _Req:
    def __init__(self, rid, prompt):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []


def _views(seed, depth, longest=None):
    """A random server's views of a few requests over time, as SGLang's NGRAM worker sees them: the
    overlap scheduler's output_ids lag one round behind (the round's accepted tokens come spliced from
    spec_info), or already hold them (then they arrive twice), or the batch is synced (no splice);
    retractions shrink an output; requests leave (their output joins the corpus) and new ones come
    with prompts of up to ``longest`` tokens (default: longer than ``depth``). Yields ``("prefill",
    batch of the new requests)`` and ``("decode", batch, finished rids)``."""
    import random
    from types import SimpleNamespace

    rng = random.Random(seed)
    stride, reqs, true, nxt = 4, [], {}, 0
    for step in range(80):
        new = []
        while len(reqs) < 3:
            r = _Req(f"r{nxt}", [rng.randrange(6) for _ in range(rng.randrange(1, longest or 3 * depth))])
            nxt += 1
            true[r.rid] = []  # the request's true output
            reqs.append(r)
            new.append(r)
        if new:
            yield "prefill", SimpleNamespace(reqs=new)
        acc, sync, dup = [], rng.random() < 0.2, set()
        for r in reqs:
            kind = rng.choice(["lag", "lag", "lag", "dup", "shrink"])
            if kind == "shrink" and true[r.rid]:
                del true[r.rid][len(true[r.rid]) - rng.randrange(1, 4):]
            n = rng.randrange(1, stride + 1)
            rnd = [rng.randrange(6) for _ in range(n)]
            true[r.rid] += rnd
            if sync:  # results processed before the draft: output_ids complete, no splice
                r.output_ids = list(true[r.rid])
            else:
                r.output_ids = list(true[r.rid]) if kind == "dup" else true[r.rid][:len(true[r.rid]) - n]
                if kind == "dup":
                    dup.add(r.rid)
            acc.append((rnd + [0] * stride)[:stride] + [n])
        tokens = torch.tensor([a[:stride] for a in acc]).reshape(-1)
        lens = torch.tensor([a[stride] for a in acc])
        batch = SimpleNamespace(reqs=list(reqs), spec_info=SimpleNamespace(accept_tokens=tokens, accept_lens=lens),
                                grammar_needs_sync=lambda sync=sync: sync, dup=dup)
        done = [r.rid for r in reqs if rng.random() < 0.08]
        yield "decode", batch, done
        reqs = [r for r in reqs if r.rid not in done]


def _lagged(batch, seen):
    """``batch`` as the overlap scheduler hands it over without a prefill in between: the requests whose output
    already held the spliced round (``batch.dup``) with that round taken off their output -- the same context once --
    where the corpus has ``seen`` them before (at first sight it cannot tell)."""
    from types import SimpleNamespace

    reqs = []
    for i, r in enumerate(batch.reqs):
        if r.rid in batch.dup and r.rid in seen:
            n = int(batch.spec_info.accept_lens[i])
            r = SimpleNamespace(rid=r.rid, origin_input_ids=r.origin_input_ids, output_ids=r.output_ids[:-n])
        reqs.append(r)
    return SimpleNamespace(reqs=reqs, spec_info=batch.spec_info, grammar_needs_sync=batch.grammar_needs_sync, dup=set())


def _sglang_ngram_methods(*names):
    """SGLang's ``NGRAMWorker`` methods compiled from its installed source (benchmark/drafters/suffix_host_cost.py:
    the module itself imports C++ n-gram ops this CPU machine does not build)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "drafters"))
    from suffix_host_cost import sglang_ngram_methods

    return sglang_ngram_methods(*names)


@pytest.mark.parametrize("seed", range(8))
def test_worker_hands_over_only_what_the_corpus_lacks_and_drafts_the_same(seed):
    """LumoTree's NGRAM-loop worker hands each request only its window (plus the full view on demand);
    driven through SGLang's own draft preparation (the whole prompt and ``max_trie_depth`` tokens per
    request) on the same views, the corpus drafts the same trees step by step and holds the same contexts -- where
    the round spliced on is already in the output (a prefill ran in between), SGLang's takes it twice (given here the
    view without the doubling, :func:`_lagged`), LumoTree's once (:meth:`HostCorpus._spliced_twice`)."""
    from lumotree.sglang.suffix import prepare_draft_tokens

    sglang_prepare, concat_last_n = _sglang_ngram_methods("_prepare_draft_tokens", "_efficient_concat_last_n")
    depth, stride = 24, 4

    class Corpus(SuffixCorpus):
        TAIL = 6  # below depth, as in a server (64 against 4,096)

    class Worker:
        _efficient_concat_last_n = concat_last_n

        def __init__(self):
            self.draft_token_num, self.max_trie_depth, self.enable_overlap = stride, depth, True
            self.ngram_corpus = Corpus(stride)

    theirs, ours = Worker(), Worker()
    handed = {"theirs": 0, "ours": 0}
    # requests whose context the corpus holds as the server's: seen, and not left doubled at first sight (where it
    # cannot tell; the next step without a doubling rewinds it)
    synced = set()
    for kind, batch, *done in _views(seed, depth):
        if kind == "prefill":
            continue
        done = done[0]
        for i, r in enumerate(batch.reqs):  # roughly (the splice adds a few): what each side hands over
            total = len(r.origin_input_ids) + len(r.output_ids) + int(batch.spec_info.accept_lens[i])
            handed["theirs"] += min(depth, total)
            handed["ours"] += ours.ngram_corpus.window(r.rid, total, depth)
        a = sglang_prepare(theirs, _lagged(batch, synced))
        b = prepare_draft_tokens(ours, batch)
        synced = {r.rid for r in batch.reqs if r.rid in synced or r.rid not in batch.dup}
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
        for r in batch.reqs:
            assert ours.ngram_corpus.drafter.context(r.rid) == theirs.ngram_corpus.drafter.context(r.rid)
        assert {k: v for k, v in ours.ngram_corpus.stats.items() if k != "spliced_twice"} == \
            {k: v for k, v in theirs.ngram_corpus.stats.items() if k != "spliced_twice"}
        theirs.ngram_corpus.erase_match_state(done)
        ours.ngram_corpus.erase_match_state(done)
    assert handed["ours"] < handed["theirs"] / 2  # the point: most steps hand over a few tokens, not depth
    assert ours.ngram_corpus.stats["spliced_twice"] > 0 and theirs.ngram_corpus.stats["spliced_twice"] == 0


@pytest.mark.parametrize("seed", range(6))
def test_prompts_admitted_with_their_prefill_draft_the_same(seed):
    """Admitting a request's prompt right after its prefill is launched (LumoTree's worker: the indexing
    overlaps the prefill's GPU time) leaves the first decode step only the new tokens to take: the same
    contexts and roots step by step as without it (prompts within the depth). The trees may differ later: a
    request admitted early counts its first decode step's tokens as output, which joins the global cache when
    it leaves (without it they were taken as prompt)."""
    from types import SimpleNamespace

    from lumotree.sglang.suffix import admit_prefilled, prepare_draft_tokens

    depth, stride = 40, 4

    def worker():
        return SimpleNamespace(draft_token_num=stride, max_trie_depth=depth, enable_overlap=True,
                               ngram_corpus=SuffixCorpus(stride))

    plain, early = worker(), worker()
    starts_at_decode = 0
    for kind, batch, *done in _views(seed, depth, longest=depth - 3 * stride):
        if kind == "prefill":
            admit_prefilled(early, batch)
            early.ngram_corpus.wait_admissions()  # indexed in the background: as in line once done (test_suffix_native)
            assert all(r.rid in early.ngram_corpus._seen for r in batch.reqs)
            continue
        starts = early.ngram_corpus.stats["starts"]
        # the plain one without the doubled rounds, the early one (which has seen each request) takes them once
        a, b = prepare_draft_tokens(plain, _lagged(batch, set(early.ngram_corpus._seen))), prepare_draft_tokens(early, batch)
        starts_at_decode += early.ngram_corpus.stats["starts"] - starts
        assert a[0].reshape(-1, stride)[:, 0].tolist() == b[0].reshape(-1, stride)[:, 0].tolist()  # the roots
        for i, r in enumerate(batch.reqs):
            assert early.ngram_corpus.drafter.context(r.rid) == plain.ngram_corpus.drafter.context(r.rid)
            mask = b[1].reshape(-1, stride, stride)[i]
            TreeDescriptor.from_parents(torch.tensor([parents_from_mask(mask)]))
        for w in (plain, early):
            w.ngram_corpus.erase_match_state(done[0])
    assert starts_at_decode == 0  # every request was indexed with its prefill


def test_admitted_requests_without_a_decode_step_leave_and_middle_chunks_wait():
    from types import SimpleNamespace

    from lumotree.sglang.suffix import admit_prefilled, prepare_draft_tokens

    w = SimpleNamespace(draft_token_num=4, max_trie_depth=64, enable_overlap=False, ngram_corpus=SuffixCorpus(4))
    a, b, c = _Req("a", [1, 2, 3, 1, 2]), _Req("b", [7, 8, 9]), _Req("c", [5, 6, 5, 6])
    c.inflight_middle_chunks = 1  # its prompt is still being prefilled chunk by chunk
    admit_prefilled(w, SimpleNamespace(reqs=[a, b, c]))
    w.ngram_corpus.wait_admissions()
    assert set(w.ngram_corpus._seen) == {"a", "b"}
    a.output_ids = [3]  # "b" finished with its prefill (one token) and never decodes
    batch = SimpleNamespace(reqs=[a], grammar_needs_sync=lambda: False,
                            spec_info=SimpleNamespace(accept_tokens=torch.zeros(4, dtype=torch.int64),
                                                      accept_lens=torch.tensor([0])))
    toks, _ = prepare_draft_tokens(w, batch)
    assert set(w.ngram_corpus._seen) == {"a"} and toks[0] == 3 and toks[1] == 1  # "3" was followed by "1"
    assert w.ngram_corpus.drafter.context("a") == [1, 2, 3, 1, 2, 3]


def test_prompts_admitted_without_decode_steps_are_bounded():
    """A server that only prefills (one-token requests) takes no decode step to clear its admitted prompts: the
    corpus keeps at most ``MAX_UNDECODED`` of them, the oldest leaving first."""

    class Corpus(SuffixCorpus):
        MAX_UNDECODED = 2

    c = Corpus(4)
    for rid in "abc":
        c.admit(rid, [1, 2, 3], 3)
    assert set(c._seen) == {"b", "c"} and list(c._undecoded) == ["b", "c"]
    c.erase_match_state(["b"])
    assert list(c._undecoded) == ["c"]


def _depths(parents):
    """Each node's depth in a draft tree given as parent indices (the root, node 0, at 0)."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def test_served_drafts_continue_a_match_past_the_tries_depth():
    """LUMOTREE_SUFFIX's drafter settings: a match of at most 8 context tokens, tries 16 tokens deep, and a path whose
    node has no children goes on from the node of its last 8 tokens: a 32-node tree over a repeated block drafts a
    31-token chain, the block's continuation, although the tries hold only 8 levels below an 8-token match (on the
    agent benchmark's served token streams this drafted 2-7 % more tokens per step than 32- and 39-deep tries without
    it, with less than half their indexing: benchmark/results/suffix_depth_cpu.json). Without the re-match the same
    draft stops at the tries' depth."""
    corpus = SuffixCorpus(32)
    assert (corpus.kw["max_match"], corpus.kw["max_spec"], corpus.kw["rematch"]) == (8, 8, 8)
    assert (corpus.kw["unseen"], corpus.kw["global_unseen"]) == (2.0, 16.0)
    assert SuffixCorpus(16).kw == corpus.kw  # the tree size does not set the tries
    block = list(range(100, 160))  # 60 distinct tokens
    corpus.drafter.start("r", block + block[:10])
    d = corpus.drafter.draft("r", 32)
    depth = _depths(d.parents)
    assert max(depth) == 31
    chain = [t for t, k in sorted(zip(d.tokens, depth), key=lambda x: x[1]) if k > 0]
    assert chain == block[10:41]  # the block's continuation after the context's last token
    once = SuffixCorpus(32, rematch=0)
    once.drafter.start("r", block + block[:10])
    assert max(_depths(once.drafter.draft("r", 32).parents)) == 8


def test_step_get_takes_one_pass_while_the_context_grows_and_observes_otherwise():
    """:meth:`HostCorpus.step_get` appends a growing context's new tokens in one pass (no :meth:`_observe`) and hands
    first sights, duplicated splices and shrunk contexts to :meth:`_observe`; its drafts and contexts equal
    :meth:`batch_get`'s on the same views."""
    calls = []

    class Counting(SuffixCorpus):
        def _observe(self, rid, tokens, total_len, full=None):
            calls.append(rid)
            return super()._observe(rid, tokens, total_len, full)

    fast, ref = Counting(draft_token_num=4), SuffixCorpus(draft_token_num=4)
    prompt, out = list(range(100, 140)), []
    steps = [[5, 6], [7], [5, 6, 7], [], [8, 9]]
    for k, new in enumerate(steps):
        extra = new
        a = fast.step_get(["a"], [(prompt, out, extra)], depth=64)
        ctx = prompt + out + extra
        b = ref.batch_get(["a"], [ctx], [len(ctx)])
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
        assert fast.drafter.context("a") == ref.drafter.context("a")
        out = out + new  # the next step finds this step's tokens in the output
    assert calls == ["a"]  # first sight only
    dup = out[-2:]  # the last round spliced on although the output holds it already (overlap after a prefill): it
    a = fast.step_get(["a"], [(prompt, out, dup)], depth=64)
    b = ref.batch_get(["a"], [prompt + out + dup], [len(prompt + out + dup)])  # reads as growth to either path
    assert a[0].tolist() == b[0].tolist() and fast.drafter.context("a") == ref.drafter.context("a")
    assert calls == ["a"]
    shrunk = out[:-3]
    a = fast.step_get(["a"], [(prompt, shrunk, ())], depth=64)
    b = ref.batch_get(["a"], [prompt + shrunk], [len(prompt + shrunk)])
    assert a[0].tolist() == b[0].tolist() and fast.drafter.context("a") == ref.drafter.context("a")
    assert calls == ["a", "a"] and fast.stats == ref.stats and fast.stats["rewinds"] == 1  # shrunk: rewound
