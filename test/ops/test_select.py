import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree import TreeDescriptor
from lumotree.ops.select import naive
from utils import forests

#          0   1  2  3  4  5  6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
DRAFT = [9, 5, 7, 2, 4, 4, 8]


@pytest.mark.parametrize("target, acc_len, nodes, bonus", [
    ([5, 4, 1, 8, 0, 0, 3], 3, [0, 1, 4], 0),  # node 4 is a leaf: bonus = its target 0
    ([5, 2, 1, 8, 0, 0, 3], 4, [0, 1, 3, 6], 3),
    ([7, 0, 4, 0, 0, 6, 0], 3, [0, 2, 5], 6),
    ([1, 0, 0, 0, 0, 0, 0], 1, [0], 1),
])
def test_greedy_hand_built(target, acc_len, nodes, bonus):
    tree = TreeDescriptor.from_parents(torch.tensor([PARENTS]))
    al, an, bo = naive.tree_select_greedy(torch.tensor([DRAFT]), torch.tensor([target]), tree)
    assert an[0, : int(al[0])].tolist() == nodes
    assert int(al[0]) == acc_len == len(nodes)
    assert (an[0, int(al[0]):] == -1).all()
    assert int(bo[0]) == bonus


def test_greedy_duplicate_children_take_lowest_index():
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0]]))
    al, an, bo = naive.tree_select_greedy(torch.tensor([[1, 3, 3]]), torch.tensor([[3, 6, 7]]), tree)
    assert an[0].tolist() == [0, 1, -1] and int(bo[0]) == 6


@settings(max_examples=40, deadline=None)
@given(forests(max_n=32), st.integers(0, 999))
def test_greedy_accepts_a_root_path_that_matches(forest, seed):
    parents, num = forest
    B, N = parents.shape
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randint(0, 3, (B, N), generator=gen)
    target = torch.randint(0, 3, (B, N), generator=gen)
    tree = TreeDescriptor.from_parents(parents, num)
    al, an, bo = naive.tree_select_greedy(draft, target, tree)
    for b in range(B):
        path = an[b, : int(al[b])].tolist()
        assert path[0] == 0
        for a, c in zip(path, path[1:]):
            assert int(parents[b, c]) == a and int(draft[b, c]) == int(target[b, a])
        last = path[-1]
        kids = [c for c in range(int(num[b])) if int(parents[b, c]) == last and c > 0]
        assert all(int(draft[b, c]) != int(target[b, last]) for c in kids)
        assert int(bo[b]) == int(target[b, last])


def _target_dist(prefix, vocab):
    """A fixed, prefix-dependent target distribution (sharp enough to make acceptance likely)."""
    g = torch.Generator().manual_seed(hash(tuple(prefix)) % (2 ** 31))
    logits = torch.randn(vocab, generator=g, dtype=torch.float64) * 1.5
    return torch.softmax(logits, 0)


def test_sampling_is_lossless():
    """The first two emitted tokens follow the target's joint distribution (chi-square)."""
    vocab = 4
    parents = [-1, 0, 0, 0, 1, 1, 2]
    draft = [0, 1, 2, 1, 3, 0, 2]  # node 3 duplicates node 1's token (never accepted)
    probs = torch.zeros(1, 7, vocab, dtype=torch.float64)
    paths = {}
    for i in range(7):
        p, node = [], i
        while node >= 0:
            p.append(draft[node])
            node = parents[node]
        paths[i] = p[::-1]
        probs[0, i] = _target_dist(paths[i], vocab)
    trials = 6000
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab, vocab)
    coins = torch.rand(trials, 7, generator=gen, dtype=torch.float64)
    finals = torch.rand(trials, generator=gen, dtype=torch.float64)
    B = 200
    for s in range(0, trials, B):
        n = min(B, trials - s)
        t = TreeDescriptor.from_parents(torch.tensor([parents] * n))
        al, an, bo = naive.tree_select_sample(torch.tensor([draft] * n), probs.expand(n, -1, -1), t,
                                              coins[s:s + n], finals[s:s + n])
        for b in range(n):
            toks = [draft[x] for x in an[b, 1:int(al[b])].tolist()] + [int(bo[b])]
            if len(toks) >= 2:
                counts[toks[0], toks[1]] += 1
            else:  # only the bonus: draw the second token from the exact target after it
                p2 = _target_dist([draft[0], toks[0]], vocab)
                counts[toks[0], int(torch.multinomial(p2.float(), 1, generator=gen))] += 1
    expected = torch.zeros(vocab, vocab, dtype=torch.float64)
    for a, c in itertools.product(range(vocab), range(vocab)):
        expected[a, c] = _target_dist([draft[0]], vocab)[a] * _target_dist([draft[0], a], vocab)[c] * trials
    chi2 = float(((counts.double() - expected) ** 2 / expected).sum())
    # 15 degrees of freedom: the 0.999 quantile is 37.7
    assert chi2 < 37.7, f"chi2 = {chi2:.1f}\n{counts}\n{expected}"


def test_sampling_never_emits_zero_probability_bonus():
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0]]))
    probs = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    for u in (0.0, 0.5, 0.9999):
        al, an, bo = naive.tree_select_sample(torch.tensor([[0, 2]]), probs, tree, torch.tensor([[0.0, u]]),
                                              torch.tensor([u]))
        assert int(al[0]) == 1 and int(bo[0]) == 1  # token 2 has p=0 at the root: rejected, bonus 1


def test_probs_from_logits_topk_topp():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])
    p = naive.probs_from_logits(logits, 1.0, top_k=2)
    assert (p[0, 0, 2:] == 0).all() and abs(float(p.sum()) - 1) < 1e-6
    p = naive.probs_from_logits(logits, 1.0, top_p=0.5)
    assert p[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    p = naive.probs_from_logits(logits, torch.tensor([0.5]))
    assert float(p[0, 0, 0]) > float(torch.softmax(logits, -1)[0, 0, 0])
