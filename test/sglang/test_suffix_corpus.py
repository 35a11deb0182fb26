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
