"""``patches/draft_tree_whole.py``: SGLang's draft-tree selection on tie-breaking keys keeps every
selected node's parent, and is SGLang's own selection wherever no scores tie (CPU, SGLang's functions)."""
import pytest
import torch

pytest.importorskip("sglang")
from draft_trees import orphans, select, softmaxes  # noqa: E402
from sglang.srt.speculative.eagle_utils import organize_draft_results  # noqa: E402

from lumotree.sglang.patches.draft_tree_whole import organize_whole, tie_break_keys  # noqa: E402


def whole(*args, **kwargs):
    return organize_whole(organize_draft_results, *args, **kwargs)


def first_level(bs, topk, seed):
    g = torch.Generator().manual_seed(seed)
    p, idx = torch.softmax(3 * torch.randn(bs, 64, generator=g), -1).topk(topk, -1)
    return p, idx


@pytest.mark.parametrize("topk, steps, nodes", [(2, 3, 6), (4, 3, 8), (2, 5, 10), (4, 4, 16)])
def test_same_tree_as_sglang_without_ties(topk, steps, nodes):
    bs = 16
    for seed in range(3):
        p, idx = first_level(bs, topk, seed)
        ref = select(p, idx, steps, nodes, softmaxes(bs, topk, seed=seed))
        ours = select(p, idx, steps, nodes, softmaxes(bs, topk, seed=seed), organize=whole)
        assert torch.equal(ref[0], ours[0]) and torch.equal(ref[1], ours[1])


def confident(bs, topk, seed):
    """A confident draft model: its best token's probability is exactly 1.0 in fp32, the others 0."""
    g = torch.Generator().manual_seed(seed)

    def probs(i):
        logits = torch.randn(bs * topk, 64, generator=g)
        logits[torch.arange(bs * topk), torch.randint(0, 64, (bs * topk,), generator=g)] = 200.0
        return torch.softmax(logits, -1)

    return probs


@pytest.mark.parametrize("zero_first", [False, True], ids=["confident", "zero-stub"])
def test_ties_keep_the_tree_whole(zero_first):
    bs, topk, steps, nodes = 32, 2, 3, 6
    found = 0
    for seed in range(4):
        p, idx = first_level(bs, topk, seed)
        if zero_first:
            p = torch.zeros_like(p)
        ref = select(p, idx, steps, nodes, confident(bs, topk, seed))
        found += sum(orphans(*ref, topk))
        ours = select(p, idx, steps, nodes, confident(bs, topk, seed), organize=whole)
        assert orphans(*ours, topk) == [0] * bs
    if zero_first:  # SGLang's own selection kept orphans on these ties (on the confident ones torch.topk's
        assert found > 0  # tie order on CPU happened to favour the parents; on the GPU it is another order)


def test_keys_order_children_below_parents_and_keep_score_order():
    s0 = torch.tensor([[[0.5, 0.0]]])
    s1 = torch.tensor([[[0.5, 0.25], [0.0, 0.0]]])  # children of 0.5 (one with probability 1) and of 0.0
    k0, k1 = tie_break_keys([s0, s1])
    assert k1[0, 0, 0] < k0[0, 0, 0] and k1[0, 1, 0] < k0[0, 0, 1] and k1[0, 1, 1] < k0[0, 0, 1]
    a = torch.tensor([1.0, 1.0 - 2 ** -24, 1e-38, 1e-45, 0.0])  # fp32 neighbours, a normal and a denormal
    keys = torch.cat([tie_break_keys([a.view(1, 1, -1)])[0].flatten(),
                      tie_break_keys([a.view(1, 1, -1)] * 64)[63].flatten()])
    assert torch.all(keys[:5][:-1] > keys[:5][1:]) and torch.all(keys[5:][:-1] > keys[5:][1:])
    assert torch.isfinite(tie_break_keys([torch.tensor([[[float("nan"), 1.0]]])])[0]).all()
