"""GPU tests of the CUDA selection extension (python3 -m pytest -q -m gpu test on the H200)."""
import random

import pytest
import torch

from lumotree import TreeDescriptor, tree_shapes
from lumotree.ops import commit_plan
from lumotree.ops.select import naive
from utils import make_parents

pytestmark = pytest.mark.gpu


def batch(B, N, seed):
    rows = [make_parents(("eagle", "random", "caterpillar", "chain", "star")[b % 5],
                         N if b == 0 else random.Random(seed + b).randint(1, N), seed + b) for b in range(B)]
    N = max(len(r) for r in rows)
    parents = torch.tensor([r + [-1] * (N - len(r)) for r in rows])
    return TreeDescriptor.from_parents(parents, torch.tensor([len(r) for r in rows])), N


def test_extension_is_built():
    from lumotree.ops.select import cuda

    assert cuda.available(), "lumotree._C did not load: the CUDA extension was not built"


@pytest.mark.parametrize("B, N", [(1, 8), (7, 16), (64, 64), (256, 33)])
@pytest.mark.parametrize("greedy", [True, False])
def test_extension_equals_reference(B, N, greedy):
    from lumotree.ops.select import cuda

    tree, N = batch(B, N, B + N)
    g = torch.Generator().manual_seed(B * N)
    vocab = 6
    draft = torch.randint(0, vocab, (B, N), generator=g)
    slots = torch.randperm(100000, generator=g)[: B * N].view(B, N)
    if greedy:
        target = torch.randint(0, vocab, (B, N), generator=g)
        al, an, bo = naive.tree_select_greedy(draft, target, tree)
        coins = final = None
    else:
        target = torch.softmax(torch.randn(B, N, vocab, generator=g) * 2, -1)
        target[..., 5] = 0
        target = target / target.sum(-1, keepdim=True)
        coins, final = torch.rand(B, N, generator=g), torch.rand(B, generator=g)
        al, an, bo = naive.tree_select_sample(draft, target, tree, coins, final)
    ref = commit_plan(tree, an, al, slots, 4)
    cu = lambda t: None if t is None else t.cuda()  # noqa: E731
    bonus, plan = cuda.tree_select_and_plan(draft.cuda(), target.cuda(), tree.to("cuda"), greedy=greedy,
                                            coins=cu(coins), coins_final=cu(final), cache_slots=slots.cuda(),
                                            conv_width=4)
    assert torch.equal(bonus.cpu(), bo)
    assert torch.equal(plan.accept_len.cpu(), al) and torch.equal(plan.accept_nodes.cpu(), an)
    for f in ("conv_src", "kv_accept_slots", "kv_free_slots", "kv_num_free"):
        assert torch.equal(getattr(plan, f).cpu(), getattr(ref, f)), f


def test_sampling_distribution_on_gpu():
    """Device-drawn coins: the first emitted token follows the root's target distribution."""
    from lumotree.ops.select import cuda

    B, vocab = 20000, 5
    parents = [-1, 0, 0, 1]
    draft = torch.tensor([[0, 1, 2, 3]] * B, device="cuda")
    tree = TreeDescriptor.from_parents(torch.tensor([parents] * B, device="cuda"))
    p = torch.tensor([0.1, 0.3, 0.25, 0.15, 0.2], device="cuda")
    probs = p.expand(B, 4, vocab).contiguous()
    bonus, plan = cuda.tree_select_and_plan(draft, probs, tree, greedy=False)
    first = torch.where(plan.accept_len > 1, draft.gather(1, plan.accept_nodes[:, 1:2].clamp(min=0))[:, 0], bonus)
    freq = torch.bincount(first, minlength=vocab).float() / B
    chi2 = float((((freq - p) ** 2) / p).sum() * B)
    assert chi2 < 18.5, (chi2, freq)  # 4 dof, p = 0.001


def test_capture_in_cuda_graph():
    """Descriptor build + selection + plan captured once (no host sync), replayed on new inputs."""
    from lumotree.ops.select import cuda

    B, N = 32, 16
    p0 = torch.tensor([tree_shapes.eagle(4, 5, N, random.Random(0))] * B, device="cuda")
    s_par, s_num = p0.clone(), torch.full((B,), N, device="cuda")
    s_draft = torch.zeros(B, N, dtype=torch.long, device="cuda")
    s_target = torch.zeros(B, N, dtype=torch.long, device="cuda")
    s_slots = torch.arange(B * N, device="cuda").view(B, N)
    outs = {}

    def step():
        tree = TreeDescriptor.from_parents(s_par, s_num, validate=False)
        outs["bonus"], outs["plan"] = cuda.tree_select_and_plan(s_draft, s_target, tree, greedy=True,
                                                                cache_slots=s_slots, conv_width=4)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for trial in range(3):
        tree, _ = batch(B, N, 50 + trial)
        g = torch.Generator().manual_seed(trial)
        draft, target = torch.randint(0, 3, (B, N), generator=g), torch.randint(0, 3, (B, N), generator=g)
        s_par.copy_(tree.parents)
        s_num.copy_(tree.num_nodes)
        s_draft.copy_(draft)
        s_target.copy_(target)
        graph.replay()
        al, an, bo = naive.tree_select_greedy(draft, target, tree)
        assert torch.equal(outs["bonus"].cpu(), bo)
        assert torch.equal(outs["plan"].accept_nodes.cpu(), an)
        ref = commit_plan(tree, an, al, s_slots.cpu(), 4)
        assert torch.equal(outs["plan"].kv_free_slots.cpu(), ref.kv_free_slots)


def test_malformed_links_end_the_walk():
    """SGLang's tree builder can emit malformed first-child / next-sibling links (its "invalid eagle
    tree" warning: a draft token whose parent was not selected). The walk follows forward links only, so
    a backward or cyclic link ends it instead of looping on the GPU: the served step must not hang."""
    from lumotree.sglang.select import _accept

    N = 6
    cand = torch.zeros(4, N, dtype=torch.long, device="cuda")  # every draft token equal: every link matches
    cand[3, 1] = 5  # ... but in the last row, whose only child, a sibling of itself, does not match
    target = torch.zeros(4, N, dtype=torch.long, device="cuda")
    nt = torch.tensor([[1, 2, 1, -1, -1, -1],  # 2 -> 1: a child link pointing back (a cycle 1 -> 2 -> 1)
                       [1, 0, -1, -1, -1, -1],  # 1 -> 0: back to the root
                       [1, 2, 3, 4, 5, -1],  # a valid chain
                       [1, -1, -1, -1, -1, -1]], device="cuda")
    ns = torch.tensor([[-1, 1, -1, -1, -1, -1],
                       [-1, -1, -1, -1, -1, -1],
                       [-1, -1, -1, -1, -1, -1],
                       [-1, 1, -1, -1, -1, -1]], device="cuda")  # node 1's next sibling is itself
    accept_len, nodes = _accept(cand, target, nt, ns)
    torch.cuda.synchronize()
    assert accept_len.tolist() == [3, 2, 6, 1]
    assert nodes[0, :3].tolist() == [0, 1, 2] and nodes[1, :2].tolist() == [0, 1]
    assert nodes[2].tolist() == list(range(N))
