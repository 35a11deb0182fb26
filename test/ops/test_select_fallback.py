"""The sync-free torch fallback of the CUDA selection op equals the references (CPU)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree import TreeDescriptor
from lumotree.ops import commit_plan
from lumotree.ops.select import fallback, naive
from utils import forests


def _check_plan(tree, plan, ref_len, ref_nodes, slots, W):
    assert torch.equal(plan.accept_len, ref_len)
    assert torch.equal(plan.accept_nodes, ref_nodes)
    ref = commit_plan(tree, ref_nodes, ref_len, slots, W)
    assert torch.equal(plan.conv_src, ref.conv_src)
    assert torch.equal(plan.kv_accept_slots, ref.kv_accept_slots)
    assert torch.equal(plan.kv_free_slots, ref.kv_free_slots)
    assert torch.equal(plan.kv_num_free, ref.kv_num_free)


@settings(max_examples=50, deadline=None)
@given(forests(max_n=40), st.integers(0, 9999), st.integers(1, 5))
def test_greedy_fallback_equals_naive(forest, seed, W):
    parents, num = forest
    B, N = parents.shape
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randint(0, 3, (B, N), generator=gen)
    target = torch.randint(0, 3, (B, N), generator=gen)
    slots = torch.randperm(1000, generator=gen)[: B * N].view(B, N)
    tree = TreeDescriptor.from_parents(parents, num)
    al, an, bo = naive.tree_select_greedy(draft, target, tree)
    bonus, plan = fallback.tree_select_and_plan(draft, target, tree, greedy=True, cache_slots=slots, conv_width=W)
    assert torch.equal(bonus, bo)
    _check_plan(tree, plan, al, an, slots, W)


@settings(max_examples=50, deadline=None)
@given(forests(max_n=24), st.integers(0, 9999))
def test_sampling_fallback_equals_naive(forest, seed):
    parents, num = forest
    B, N = parents.shape
    gen = torch.Generator().manual_seed(seed)
    vocab = 5
    draft = torch.randint(0, vocab, (B, N), generator=gen)
    probs = torch.softmax(torch.randn(B, N, vocab, generator=gen) * 2, -1)
    probs[:, :, 4] = 0  # a zero-probability token
    probs = probs / probs.sum(-1, keepdim=True)
    coins = torch.rand(B, N, generator=gen)
    final = torch.rand(B, generator=gen)
    slots = torch.arange(B * N).view(B, N)
    tree = TreeDescriptor.from_parents(parents, num)
    al, an, bo = naive.tree_select_sample(draft, probs, tree, coins, final)
    bonus, plan = fallback.tree_select_and_plan(draft, probs, tree, greedy=False, coins=coins, coins_final=final,
                                                cache_slots=slots, conv_width=4)
    assert torch.equal(bonus, bo)
    _check_plan(tree, plan, al, an, slots, 4)


def test_malformed_eagle_links_end_the_walk():
    """SGLang's tree builder can emit malformed first-child / next-sibling links ("invalid eagle tree"):
    the fallback behind LumoTree's served greedy verification reads them as the CUDA op does (forward
    links only; a node no link reaches is never accepted) and ends with the CUDA op's paths, where it
    used to gather from unset entries (``test_select_gpu.py`` has the CUDA op's form)."""
    from lumotree.sglang.select import _accept

    N = 6
    cand = torch.zeros(4, N, dtype=torch.long)
    cand[3, 1] = 5
    nt = torch.tensor([[1, 2, 1, -1, -1, -1], [1, 0, -1, -1, -1, -1], [1, 2, 3, 4, 5, -1], [1, -1, -1, -1, -1, -1]])
    ns = torch.tensor([[-1, 1, -1, -1, -1, -1], [-1] * 6, [-1] * 6, [-1, 1, -1, -1, -1, -1]])
    accept_len, nodes = _accept(cand, torch.zeros(4, N, dtype=torch.long), nt, ns)
    for b in range(4):
        path = nodes[b, : int(accept_len[b])].tolist()
        assert path[0] == 0 and all(q > p for p, q in zip(path, path[1:])), path
        assert all(x == -1 for x in nodes[b, int(accept_len[b]):].tolist())
    assert accept_len.tolist() == [3, 2, 6, 1]  # as the CUDA op walks the same links (test_select_gpu.py)
