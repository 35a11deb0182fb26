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
