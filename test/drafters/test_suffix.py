import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree import TreeDescriptor
from lumotree.drafters.suffix import Draft, SuffixDrafter, SuffixTrie, adaptive_budget, merge_drafts


def test_trie_counts_substrings():
    t = SuffixTrie(depth=3)
    s = t.new_sequence()
    t.extend(s, [1, 2, 1, 2, 3])
    c = lambda p: t.count(t.find(p))  # noqa: E731
    assert c([1]) == 2 and c([2]) == 2 and c([3]) == 1
    assert c([1, 2]) == 2 and c([2, 1]) == 1 and c([1, 2, 3]) == 1
    assert t.find([1, 2, 1, 2]) is None and t.find([7]) is None  # longer than depth; never seen
    assert t.num_tokens == 5
    assert [tok for tok, _ in t.children(t.find([2]))] == [1, 3]  # in order of first occurrence
    with pytest.raises(ValueError, match="token ids"):
        t.append(s, -1)
    with pytest.raises(ValueError, match="token ids"):
        t.append(s, 1.5)
    import numpy as np

    t.append(s, np.int64(3))  # integer scalars of numpy / torch count as their value
    t.append(s, torch.tensor(3))
    assert c([3, 3]) == 2 and c([3, 3, 3]) == 1 and c([3]) == 3


def test_trie_nodes_are_not_tracked_by_the_garbage_collector():
    """Millions of trie nodes must not be objects the cyclic GC walks at every full collection."""
    import gc

    gc.collect()
    before = len(gc.get_objects())
    t = SuffixTrie(depth=8)
    rng = random.Random(0)
    t.extend(t.new_sequence(), [rng.randrange(50) for _ in range(3000)])  # ~20k nodes (node objects: ~36k)
    gc.collect()
    assert t.num_nodes > 10000
    assert len(gc.get_objects()) - before < 50  # a handful of containers, whatever the node count
    assert not any(gc.is_tracked(k) for k in t._kids[:100])


def test_draft_copies_a_repeated_span():
    d = SuffixDrafter(max_match=4, max_spec=6, min_prob=0.0)
    ctx = [5, 6, 7, 8, 9, 10, 11, 0, 0, 5, 6, 7]
    d.start("r", ctx)
    dr = d.draft("r", budget=8)
    TreeDescriptor.from_parents(torch.tensor([dr.parents]))
    assert dr.tokens[0] == 7
    chain, node = [], 0
    while True:
        kids = [i for i in range(1, len(dr)) if dr.parents[i] == node]
        if not kids:
            break
        node = max(kids, key=lambda i: dr.scores[i])
        chain.append(dr.tokens[node])
    assert chain[:4] == [8, 9, 10, 11]


def test_a_chain_at_the_trie_s_depth_goes_on_from_its_last_tokens():
    """A trie of depth 4 cannot hold a copy longer than 4 tokens below the match; with ``rematch`` a path whose node has
    no children goes on from the node of its longest suffix of at most ``rematch`` tokens that has children, so a
    repeated span is drafted whole -- and past the context's own end, where the span's first occurrence goes on --
    with scores the products of each step's own probabilities (here 1: every context continues one way)."""
    span = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    ctx = span + [0] + span[:2]
    short = SuffixDrafter(max_match=2, max_spec=2, min_prob=0.0)
    short.start("r", ctx)
    assert short.draft("r", budget=16).tokens == [6, 7, 8]  # two levels below the 2-token match
    deep = SuffixDrafter(max_match=2, max_spec=2, min_prob=0.0, rematch=2)
    deep.start("r", ctx)
    d = deep.draft("r", budget=16)
    assert d.tokens == [6] + span[2:] + [0] + span[:2] + span[2:6] and d.parents == list(range(-1, 15))
    assert d.scores == [1.0] * 16
    # where the last tokens continue two ways, the chain branches by their counts
    t = SuffixTrie(3)
    t.extend(t.new_sequence(), [1, 2, 3, 4, 9, 3, 4, 5, 3, 4, 5, 7, 3, 4])
    node = t.find([2, 3, 4])  # at the depth: no children
    assert not t.has_children(node) and t.rematch(node, 2) == t.find([3, 4])
    assert {tok: p for tok, _, p in t.continuations(t.rematch(node, 2))} == {9: 1 / 3, 5: 2 / 3}
    u = SuffixTrie(4)
    u.extend(u.new_sequence(), [1, 2, 3, 9, 8, 2, 3])
    end = u.find([8, 2, 3])  # above the depth, where the sequence ended: its last two tokens went on elsewhere
    assert not u.has_children(end) and u.rematch(end, 2) == u.find([2, 3])
    assert [tok for tok, _, _ in u.continuations(u.rematch(end, 2))] == [9]
    # where the last `rematch` tokens never went on either, a shorter suffix that did: [7, 2, 3] ended the sequence,
    # [2, 3] too, [3] went on with 9
    v = SuffixTrie(4)
    v.extend(v.new_sequence(), [3, 9, 7, 2, 3])
    stuck = v.find([7, 2, 3])
    assert not v.has_children(v.find([2, 3])) and v.rematch(stuck, 2) == v.find([3])
    w = SuffixTrie(4)
    w.extend(w.new_sequence(), [5, 6])
    assert w.rematch(w.find([5, 6]), 2) is None  # [6] never went on either: no suffix to continue from
    assert v.rematch(v.find([9]), 2) is None and t.rematch(node, 0) is None  # one token has no proper suffix


def test_unseen_continuations_discount_what_was_seen_rarely():
    """With ``unseen`` a step's probability is count / (total + unseen): a chain seen once no longer outranks a branch
    point seen often. Here one occurrence goes 1 -> 2 -> 3 -> 4 and the token after 1 is 2 in 1 of 1; after 5 it is 6
    in 9 of 10 and 7 in 1 of 10. Plain frequencies score the single chain's nodes 1.0; with unseen 2 they read 1/3,
    1/9, ..., below 6's 9/12."""
    t = SuffixTrie(4)
    t.extend(t.new_sequence(), [1, 2, 3, 4] + [5, 6] * 9 + [5, 7])
    assert {tok: p for tok, _, p in t.continuations(t.find([1]))} == {2: 1.0}
    assert {tok: p for tok, _, p in t.continuations(t.find([1]), 2.0)} == {2: pytest.approx(1 / 3)}
    six = {tok: p for tok, _, p in t.continuations(t.find([5]), 2.0)}
    assert six == {6: pytest.approx(9 / 12), 7: pytest.approx(1 / 12)}
    d = SuffixDrafter(max_match=1, max_spec=3, min_prob=0.0, unseen=2.0)
    d.start("r", [1, 2, 3, 4, 1])
    assert d.draft("r", budget=3).scores == pytest.approx([1.0, 1 / 3, 1 / 9])


def test_the_global_cache_s_drafts_count_their_own_unseen_continuations():
    """Other requests' finished outputs are weaker evidence for a request than its own context: ``global_unseen``
    discounts the global cache's drafts apart from ``unseen`` (the request's own trie's)."""
    d = SuffixDrafter(max_match=2, max_spec=2, min_prob=0.0, unseen=0.0, global_unseen=2.0)
    d.finish("x", [1, 2, 3])  # a finished output: [1, 2] went on with 3 once
    d.start("r", [7, 1, 2])  # the request's own context never continued [1, 2]
    assert d.draft("r", budget=2).scores == pytest.approx([1.0, 1 / 3])
    assert SuffixDrafter(max_match=2, max_spec=2, unseen=1.0).global_unseen == 1.0  # default: the same as unseen


def test_branching_scores_follow_counts():
    d = SuffixDrafter(max_match=2, max_spec=2, min_prob=0.0)
    d.start(0, [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2])
    dr = d.draft(0, budget=4)
    kids = {dr.tokens[i]: dr.scores[i] for i in range(1, len(dr)) if dr.parents[i] == 0}
    assert set(kids) == {3, 4} and kids[3] == pytest.approx(2 / 3) and kids[4] == pytest.approx(1 / 3)


def _substrings(seqs, depth):
    return {tuple(q[i:j]) for q in seqs for i in range(len(q)) for j in range(i + 1, min(len(q), i + depth) + 1)}


@pytest.mark.parametrize("seed", range(8))
def test_removed_sequences_leave_the_counts_of_the_rest(seed):
    """``remove`` undoes ``extend``: every substring counts as in a trie of the remaining sequences only, the
    removed-only ones are gone (find, has_children, continuations, the node count), and their ids are reused."""
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5])
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    t = SuffixTrie(depth)
    for q in seqs:
        t.extend(t.new_sequence(), q)
    gone = rng.sample(range(6), 3)
    for i in gone:
        t.remove(seqs[i])
    kept = [q for i, q in enumerate(seqs) if i not in gone]
    ref = SuffixTrie(depth)
    for q in kept:
        ref.extend(ref.new_sequence(), q)
    for sub in _substrings(seqs, depth):
        a, b = t.find(list(sub)), ref.find(list(sub))
        assert (a is None) == (b is None), sub
        if a is not None:
            assert t.count(a) == ref.count(b)
            assert t.has_children(a) == ref.has_children(b)
            assert sorted((tok, p) for tok, _, p in t.continuations(a)) == \
                sorted((tok, p) for tok, _, p in ref.continuations(b))
    assert t.num_tokens == ref.num_tokens and t.num_nodes == ref.num_nodes
    ids = len(t._count)
    t.extend(t.new_sequence(), seqs[gone[0]])  # back: in the removed nodes' ids
    ref.extend(ref.new_sequence(), seqs[gone[0]])
    assert t.num_nodes == ref.num_nodes and len(t._count) == ids
    for sub in _substrings(seqs, depth):
        a, b = t.find(list(sub)), ref.find(list(sub))
        assert (a is None) == (b is None) and (a is None or t.count(a) == ref.count(b)), sub


def test_a_full_global_window_evicts_without_rebuilding():
    """Past ``global_tokens`` each finish removes the oldest outputs from the global trie instead of rebuilding the
    window (a rebuild per finish made a full 262k-token window cost seconds per finished request): it holds
    exactly the outputs in the window, in as many nodes as a trie built of them."""
    d = SuffixDrafter(max_match=3, max_spec=3, global_tokens=40, min_prob=0.0)
    rng = random.Random(1)
    glob = d._global
    for i in range(60):
        d.finish(f"x{i}", [rng.randrange(50) for _ in range(rng.randrange(3, 12))])
        assert d._global is glob and d._recent_tokens <= 40
        ref = SuffixTrie(d.depth)
        for o in d._recent:
            ref.extend(ref.new_sequence(), o)
        assert glob.num_nodes == ref.num_nodes and glob.num_tokens == ref.num_tokens
        for sub in _substrings(list(d._recent), d.depth):
            assert glob.count(glob.find(list(sub))) == ref.count(ref.find(list(sub)))


def test_global_cache_serves_other_requests_and_is_bounded():
    d = SuffixDrafter(max_match=3, max_spec=4, global_tokens=12, min_prob=0.0)
    d.start("a", [1, 2])
    d.finish("a", [40, 41, 42, 43, 44])
    d.start("b", [7, 40, 41])
    dr = d.draft("b", budget=4)
    assert dr.tokens[:4] == [41, 42, 43, 44]
    for i in range(5):  # push the first output out of the 12-token cache
        d.finish(f"x{i}", [100 + i] * 5)
    assert d._recent_tokens <= 12
    d.start("c", [40, 41])
    assert len(d.draft("c", budget=4)) == 1  # forgotten: root only
    with pytest.raises(KeyError, match="unknown request"):
        d.draft("nope", 4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=120), st.integers(1, 40), st.integers(0, 99))
def test_draft_is_a_valid_tree_within_budget_and_deterministic(ctx, budget, seed):
    d1, d2 = SuffixDrafter(max_match=5, max_spec=5, min_prob=0.0), SuffixDrafter(max_match=5, max_spec=5, min_prob=0.0)
    d1.start(0, ctx)
    d2.start(0, ctx)
    a, b = d1.draft(0, budget), d2.draft(0, budget)
    assert a == b
    assert 1 <= len(a) <= budget and a.tokens[0] == ctx[-1]
    TreeDescriptor.from_parents(torch.tensor([a.parents]))
    for i in range(1, len(a)):
        assert a.scores[i] <= a.scores[a.parents[i]] + 1e-12
    sib = {}
    for i in range(1, len(a)):
        assert (a.parents[i], a.tokens[i]) not in sib, "siblings must carry distinct tokens"
        sib[(a.parents[i], a.tokens[i])] = i


def test_merge_unions_by_token_path_and_respects_budget():
    mtp = Draft([9, 1, 2, 3], [-1, 0, 0, 1], [1.0, 0.6, 0.3, 0.5])     # 9 -> {1 -> 3, 2}
    suffix = Draft([9, 1, 4, 5], [-1, 0, 1, 0], [1.0, 0.9, 0.8, 0.2])  # 9 -> {1 -> 4, 5}
    m = merge_drafts([mtp, suffix], budget=10)
    paths = set()
    for i in range(len(m)):
        p, node = [], i
        while node >= 0:
            p.append(m.tokens[node])
            node = m.parents[node]
        paths.add(tuple(p[::-1]))
    assert paths == {(9,), (9, 1), (9, 2), (9, 1, 3), (9, 1, 4), (9, 5)}
    assert m.scores[m.tokens.index(1)] == 0.9  # best of its sources
    small = merge_drafts([mtp, suffix], budget=3)
    assert small.tokens == [9, 1, 4]  # best-first: 1 (0.9), then 4 (0.8)
    with pytest.raises(ValueError, match="share the root"):
        merge_drafts([mtp, Draft([8], [-1], [1.0])], 4)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 64))
def test_merge_of_random_drafts_is_valid(seed, budget):
    rng = random.Random(seed)
    drafts = []
    for _ in range(rng.randint(1, 3)):
        n = rng.randint(1, 20)
        parents, tokens, scores = [-1], [7], [1.0]
        for i in range(1, n):
            p = rng.randrange(i)
            parents.append(p)
            tokens.append(rng.randrange(4))
            scores.append(scores[p] * rng.random())
        drafts.append(Draft(tokens, parents, scores))
    m = merge_drafts(drafts, budget)
    assert len(m) <= budget
    TreeDescriptor.from_parents(torch.tensor([m.parents]))
    assert merge_drafts(drafts, budget) == m


def test_adaptive_budget():
    assert [adaptive_budget(b) for b in (1, 8, 16, 64, 256)] == [64, 64, 32, 8, 4]
    assert adaptive_budget(3, tokens_per_step=100) == 32
    with pytest.raises(ValueError):
        adaptive_budget(0)


def _turns(seed, turns=5):
    """An agent-like session: each prompt = the previous context (prompt + output) + a new message."""
    rng = random.Random(seed)
    prompt, out = [], []
    for _ in range(turns):
        prompt = prompt + out + [rng.randrange(12) for _ in range(rng.randint(5, 40))]
        out = [rng.randrange(12) for _ in range(rng.randint(3, 20))]
        yield prompt, out


@pytest.mark.parametrize("seed", range(4))
def test_next_turn_extends_the_retired_trie_with_the_same_drafts(seed, monkeypatch):
    """A session's next turn adopts the finished turn's trie and indexes only its new tokens;
    its drafts equal those of a drafter that indexes the whole prompt again."""
    indexed = []
    real_extend = SuffixTrie.extend
    monkeypatch.setattr(SuffixTrie, "extend", lambda self, seq, toks: (indexed.append(len(toks)),
                                                                       real_extend(self, seq, toks))[1])
    fresh = SuffixDrafter(max_match=3, max_spec=4, min_prob=0.0, retired_tokens=0)
    reuse = SuffixDrafter(max_match=3, max_spec=4, min_prob=0.0)

    def run(d, rid, prompt, out):
        indexed.clear()
        d.start(rid, prompt)
        n_indexed = indexed[0]
        drafts = [d.draft(rid, 6)]
        for tok in out:
            d.append(rid, [tok])
            drafts.append(d.draft(rid, 6))
        d.finish(rid, out)
        return n_indexed, drafts

    prev_ctx = 0
    for t, (prompt, out) in enumerate(_turns(seed)):
        n_fresh, d_fresh = run(fresh, f"turn{t}", prompt, out)
        n_reuse, d_reuse = run(reuse, f"turn{t}", prompt, out)
        assert d_reuse == d_fresh
        assert n_fresh == len(prompt) and n_reuse == len(prompt) - prev_ctx
        prev_ctx = len(prompt) + len(out)
    assert len(reuse._retired) == 1 and not fresh._retired


def test_retired_tries_are_bounded_and_taken_once():
    d = SuffixDrafter(max_match=2, max_spec=2, min_prob=0.0, retired_tokens=10)
    d.start("a", [1, 2, 3, 4])
    d.finish("a", [])
    d.start("b", [5, 6, 7, 8, 9, 10])
    d.finish("b", [])
    assert d._retired_total == 10 and len(d._retired) == 2
    d.start("c", [11, 12])
    d.finish("c", [])  # 12 tokens > 10: the oldest ("a") leaves
    assert [e[2] for e in d._retired.values()] == [[5, 6, 7, 8, 9, 10], [11, 12]]
    d.start("d", [5, 6, 7, 8, 9, 10, 1])  # extends "b": adopted, removed from the store
    assert d._retired_total == 2 and [e[2] for e in d._retired.values()] == [[11, 12]]
    d.start("e", [5, 6, 7, 8, 9, 10, 2])  # "b" is taken: a fresh trie, the same counts
    assert d._requests["e"][0] is not d._requests["d"][0]
    te, td = d._requests["e"][0], d._requests["d"][0]
    assert te.count(te.find([10, 2])) == 1 and td.find([10, 2]) is None
    d.start("f", [99] * 11)
    d.finish("f", [])  # longer than the whole bound: not kept
    assert [e[2] for e in d._retired.values()] == [[11, 12]]
    with pytest.raises(ValueError, match="retired_tokens"):
        SuffixDrafter(retired_tokens=-1)


def test_continued_counts_the_prompt_tokens_a_retired_context_holds():
    from lumotree.drafters.suffix import _continued

    ctx = list(range(10))
    assert _continued(ctx, ctx + [42], 3) == (10, 10)  # a next turn: the context is a prefix
    assert _continued(ctx, list(range(4, 14)), 3) == (6, 10)  # the window moved on: ctx's last 6 are the prompt's first
    assert _continued(ctx, list(range(4, 14)), 7) == (0, 0)  # an overlap shorter than asked for: not continued
    assert _continued(ctx, [3, 4, 5], 3) == (3, 6)  # the prompt lies inside ctx: continued from ctx[:6]
    assert _continued(ctx, list(range(20, 30)), 3) == (0, 0)
    assert _continued([7, 7, 7, 7], [7, 7, 7, 7, 7], 2) == (4, 4)  # the prefix first, whatever overlaps
    # the output as sampled and as the next prompt renders it part: continued up to where they part
    assert _continued(ctx, list(range(7)) + [99, 98], 3) == (7, 7)
    assert _continued(ctx, list(range(7)) + [99, 98], 8) == (0, 0)
    assert _continued(ctx, list(range(3, 8)) + [99], 4) == (5, 8)  # the window moved on, then they part
    assert _continued(ctx, list(range(3, 8)) + [99], 6) == (0, 0)
    assert _continued([1, 2, 1, 2, 3], [1, 2, 3, 9], 2) == (3, 5)  # the longest run, not the first


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("moved", [False, True], ids=["same-window", "window-moved-on"])
def test_a_next_turn_whose_output_was_re_tokenized_adopts_the_retired_trie(native, moved):
    """A turn's output tokens as sampled and the next prompt's rendering of the reply part some tokens before the
    reply's end: the next turn adopts the trie anyway, continues it from where they part (the trie keeps the
    parted tokens' counts, as a rewind does) and indexes only the rest -- drafting as a drafter that rewound to
    that point and appended the rest; the stats count it."""
    from lumotree.drafters import suffix as S

    if native and S._host_extension() is None:
        pytest.skip("lumotree._host not built")
    make = S.NativeSuffixDrafter if native else S.SuffixDrafter
    rng = random.Random(5)
    vocab = 30
    ctx = [rng.randrange(vocab) for _ in range(600)]
    out = [rng.randrange(vocab) for _ in range(80)]
    rendered = out[:50] + [rng.randrange(vocab) for _ in range(35)]  # the reply re-tokenized: parts at token 50
    new = [rng.randrange(vocab) for _ in range(70)]
    conv = ctx + rendered + new
    prompt = conv[-450:] if moved else conv
    kw = dict(max_match=4, max_spec=4, min_prob=0.0, global_tokens=1 << 12)
    d, ref = make(**kw), make(**kw, retired_tokens=0)
    for x in (d, ref):
        x.start("t0", ctx)
        x.append("t0", out)
    d.finish("t0", out)
    keep = len(ctx) + 50  # the old context up to where the renderings part
    done = keep - (len(conv) - len(prompt))  # the prompt's tokens it holds
    ref.rewind("t0", len(ctx) + len(out) - keep)
    ref.append("t0", prompt[done:])
    ref.finish("other", out)  # the same global cache
    d.start("t1", prompt)
    assert d.context("t1") == prompt
    assert d.stats == dict(starts=2, adopted=1, indexed_tokens=len(ctx) + len(prompt) - done)
    for _ in range(5):
        a, b = d.draft("t1", 12), ref.draft("t0", 12)
        assert a.tokens == b.tokens and a.parents == b.parents and a.scores == b.scores
        tok = [rng.randrange(vocab)]
        d.append("t1", tok)
        ref.append("t0", tok)


@pytest.mark.parametrize("native", [False, True])
def test_a_next_turn_whose_window_moved_on_adopts_the_retired_trie(native):
    """The server hands a drafter a request's last tokens (a window): once a session outgrows it, a next turn's
    prompt no longer starts with the finished turn's context but continues its tail. It adopts that trie when the
    overlap is ADOPT_OVERLAP tokens or more, indexing only the tokens after it, and drafts as a drafter that indexed
    the whole conversation as one sequence; a shorter overlap starts a fresh trie."""
    from lumotree.drafters import suffix as S

    if native and S._host_extension() is None:
        pytest.skip("lumotree._host not built")
    make = S.NativeSuffixDrafter if native else S.SuffixDrafter
    rng = random.Random(3)
    vocab = 40
    ctx = [rng.randrange(vocab) for _ in range(700)]
    out = [rng.randrange(vocab) for _ in range(60)]
    new = [rng.randrange(vocab) for _ in range(90)]
    conv = ctx + out + new
    kw = dict(max_match=4, max_spec=4, min_prob=0.0, global_tokens=1 << 12)
    d, whole = make(**kw), make(**kw, retired_tokens=0)
    d.start("t0", ctx)
    d.append("t0", out)
    d.finish("t0", out)
    whole.start("w", conv)  # the conversation as one sequence
    whole.finish("other", out)  # the same global cache
    window = conv[-500:]  # overlap with t0's context: 500 - 90 = 410 tokens
    d.start("t1", window)
    assert d.context("t1") == window
    if not native:  # adopted: the trie indexed the conversation once, no window re-indexed
        assert d._requests["t1"][0].num_tokens == len(conv) and not d._retired
    for step in range(5):
        same_draft = d.draft("t1", 12), whole.draft("w", 12)
        assert same_draft[0].tokens == same_draft[1].tokens and same_draft[0].parents == same_draft[1].parents
        tok = [rng.randrange(vocab)]
        d.append("t1", tok)
        whole.append("w", tok)
    # an overlap shorter than ADOPT_OVERLAP: a fresh trie (drafts as a drafter that saw only the window)
    d2, fresh = make(**kw), make(**kw, retired_tokens=0)
    d2.start("t0", ctx)
    d2.append("t0", out)
    d2.finish("t0", out)
    fresh.finish("other", out)
    short = (ctx + out + [rng.randrange(vocab) for _ in range(400)])[-(S.SuffixDrafter.ADOPT_OVERLAP - 10 + 400):]
    d2.start("t1", short)
    fresh.start("f", short)
    a, b = d2.draft("t1", 12), fresh.draft("f", 12)
    assert a.tokens == b.tokens and a.parents == b.parents


def test_an_adopted_trie_stays_within_retired_tokens():
    """A trie that would index more than retired_tokens by adopting a next turn starts over instead; the store
    counts what its tries indexed."""
    d = SuffixDrafter(max_match=2, max_spec=2, min_prob=0.0, retired_tokens=1000)
    ctx = list(range(600))
    d.start("a", ctx)
    d.finish("a", [])
    assert d._retired_total == 600
    d.start("b", ctx[300:] + list(range(1000, 1300)))  # overlap 300, 300 new: 900 indexed -- adopted
    assert d._requests["b"][0].num_tokens == 900 and not d._retired
    d.finish("b", [])
    assert d._retired_total == 900
    d.start("c", ctx[300:] + list(range(1000, 1300)) + list(range(2000, 2200)))  # 900 + 200 > 1000: fresh
    assert d._requests["c"][0].num_tokens == 800 and d._retired_total == 900
