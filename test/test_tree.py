import pytest
import torch
from hypothesis import given, settings

from lumotree import TreeDescriptor
from utils import forests

# node:     0  1  2  3  4  5  6  7
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 0]


def test_hand_built_tree_exact():
    t = TreeDescriptor.from_parents(torch.tensor([PARENTS]))
    assert t.depth.tolist() == [[0, 1, 1, 2, 2, 2, 3, 1]]
    assert t.first_child.tolist() == [[1, 3, 5, 6, -1, -1, -1, -1]]
    assert t.next_sibling.tolist() == [[-1, 2, 7, 4, -1, -1, -1, -1]]
    assert t.num_children.tolist() == [[3, 2, 1, 1, 0, 0, 0, 0]]
    assert t.is_boundary.tolist() == [[True, True, False, False, False, False, False, False]]
    assert t.is_head.tolist() == [[True, False, True, False, True, False, False, True]]
    # preorder, first child first: paths [0 1 3 6] [4] [2 5] [7]
    assert t.order.tolist() == [[0, 1, 3, 6, 4, 2, 5, 7]]
    assert t.path_id.tolist() == [[0, 0, 2, 0, 1, 2, 0, 3]]
    assert t.num_paths.tolist() == [4] and t.num_boundaries.tolist() == [2]
    assert t.num_slots() == 2
    assert t.root_path(torch.tensor([6])).tolist() == [[0, 1, 3, 6, -1, -1, -1, -1]]
    expect_mask = [[j in {6: [0, 1, 3, 6], 5: [0, 2, 5]}.get(i, []) for j in range(8)] for i in (6, 5)]
    assert t.mask[0, 6].tolist() == expect_mask[0] and t.mask[0, 5].tolist() == expect_mask[1]
    assert t.positions(torch.tensor([10])).tolist() == [[10, 11, 11, 12, 12, 12, 13, 11]]


def test_ragged_padding():
    t = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 1, 1], [-1, 0, 9, 9]]), num_nodes=torch.tensor([4, 2]))
    assert t.valid.tolist() == [[True] * 4, [True, True, False, False]]
    assert t.order[1].tolist() == [0, 1, 2, 3]
    assert t.path_id[1].tolist() == [0, 0, -1, -1]
    assert t.mask[1, 2].tolist() == [False, False, True, False]  # padding sees only itself


@pytest.mark.parametrize("parents, msg", [
    ([[-1, 0, 2]], r"parents\[0, 2\] = 2"),
    ([[-1, 0, 5]], r"parents\[0, 2\] = 5"),
    ([[-1, -1, 0]], r"second root"),
    ([[0, 0, 0]], r"node 0 must be the root"),
    ([[-1, -3]], r"parents\[0, 1\] = -3"),
])
def test_bad_trees_raise(parents, msg):
    with pytest.raises(ValueError, match=msg):
        TreeDescriptor.from_parents(torch.tensor(parents))


def test_bad_num_nodes():
    with pytest.raises(ValueError, match="num_nodes"):
        TreeDescriptor.from_parents(torch.tensor([[-1, 0]]), num_nodes=torch.tensor([3]))
    with pytest.raises(ValueError, match="integer"):
        TreeDescriptor.from_parents(torch.tensor([[-1.0, 0.0]]))


def _walk_reference(parents, n):
    """Independent construction of the preorder (first child first) by recursion."""
    children = {i: [] for i in range(n)}
    for i in range(1, n):
        children[parents[i]].append(i)
    out = []

    def visit(i):
        out.append(i)
        for c in children[i]:
            visit(c)

    visit(0)
    return out, children


@settings(max_examples=60, deadline=None)
@given(forests())
def test_descriptor_properties(forest):
    parents, num = forest
    t = TreeDescriptor.from_parents(parents, num)
    for b in range(parents.shape[0]):
        n = int(num[b])
        p = parents[b].tolist()
        order, children = _walk_reference(p, n)
        assert t.order[b, :n].tolist() == order
        for i in range(n):
            d, a = 0, i
            anc = {i}
            while p[a] >= 0:
                a = p[a]
                anc.add(a)
                d += 1
            assert int(t.depth[b, i]) == d
            assert {j for j in range(n) if t.mask[b, i, j]} == anc
            assert bool(t.is_boundary[b, i]) == (len(children[i]) >= 2)
        assert int(t.num_paths[b]) == sum(1 for i in range(n) if not children[i])
        # paths are contiguous runs of the preorder starting at their head
        heads = [i for i in order if t.is_head[b, i]]
        assert [int(t.path_id[b, h]) for h in heads] == list(range(len(heads)))
        # slot = depth never overwrites a boundary state that a later path still needs
        live = {}
        for i in order:
            if t.is_head[b, i] and i != 0:
                bnd = p[i]
                assert live.get(int(t.depth[b, bnd])) == bnd
            if t.is_boundary[b, i]:
                live[int(t.depth[b, i])] = i


@settings(max_examples=30, deadline=None)
@given(forests())
def test_eagle_roundtrip(forest):
    parents, num = forest
    t = TreeDescriptor.from_parents(parents, num)
    e = t.to_eagle(torch.full((parents.shape[0],), 5))
    t2 = TreeDescriptor.from_eagle(e["retrieve_next_token"], e["retrieve_next_sibling"], num)
    assert torch.equal(t2.parents, t.parents)
    B, N = parents.shape
    assert e["custom_mask"].numel() == B * N * (5 + N)
    assert e["positions"].view(B, N).tolist() == (t.depth + 5).tolist()


def _parents_from_eagle_loop(nt, ns):
    """The sibling-walk definition (the previous implementation): first children get their parent,
    then parents propagate along sibling chains, N - 1 hops."""
    B, N = nt.shape
    par = torch.full((B, N), -1, dtype=torch.long)
    for b in range(B):
        for p in range(N):
            c = int(nt[b, p])
            while 0 <= c < N:
                par[b, c] = p
                c = int(ns[b, c])
    return par


def test_parents_from_eagle_by_pointer_jumping_equals_the_sibling_walk():
    import random

    from lumotree.tree import parents_from_eagle

    rng = random.Random(4)
    for N in (1, 2, 5, 16, 33, 64):
        B = 6
        rows, nums = [], []
        for b in range(B):
            n = rng.randint(1, N)
            rows.append([-1] + [rng.randrange(i) for i in range(1, n)] + [-1] * (N - n))
            nums.append(n)
        tree = TreeDescriptor.from_parents(torch.tensor(rows), torch.tensor(nums))
        nt, ns = tree.first_child, tree.next_sibling
        got = parents_from_eagle(nt, ns)
        assert torch.equal(got, _parents_from_eagle_loop(nt, ns)), N
        assert torch.equal(torch.where(tree.valid, got, -1), torch.where(tree.valid, tree.parents, -1))


def _sglang_full_mask_loop(mask, seq_lens_cpu, n):
    """SGLang 0.5.17's per-request loop (``NGRAMWorker._prepare_for_speculative_decoding``, ``USE_FULL_MASK``),
    verbatim but for the device: the definition :func:`full_verify_mask` must reproduce."""
    mask = mask.reshape(len(seq_lens_cpu), n, n)
    tree_mask = []
    for i in range(len(seq_lens_cpu)):
        seq_len = seq_lens_cpu[i]
        req_mask = torch.ones((n, seq_len))
        req_mask = torch.cat((req_mask, mask[i]), dim=1).to(torch.bool)
        tree_mask.append(req_mask.flatten())
    return torch.cat(tree_mask, dim=0)


@pytest.mark.parametrize("B,n", [(1, 1), (1, 8), (3, 4), (32, 16), (7, 32)], ids=lambda v: str(v))
def test_full_verify_mask_equals_sglang_loop(B, n):
    from lumotree.tree import full_verify_mask

    g = torch.Generator().manual_seed(B * 100 + n)
    lens = torch.randint(0, 300, (B,), generator=g)
    lens[0] = 0 if B > 2 else lens[0]  # an empty prefix
    mask = torch.rand(B * n * n, generator=g) > 0.5  # the compact [B * n * n] bool mask SGLang keeps
    got = full_verify_mask(mask, lens, n)
    ref = _sglang_full_mask_loop(mask, [int(x) for x in lens], n)
    assert got.dtype == torch.bool and torch.equal(got, ref)
    assert torch.equal(full_verify_mask(mask.view(B, n, n).to(torch.uint8), lens.numpy(), n), ref)  # other forms


def test_full_verify_mask_bad_input():
    from lumotree.tree import full_verify_mask

    with pytest.raises(ValueError, match="cells"):
        full_verify_mask(torch.ones(2 * 4 * 4, dtype=torch.bool), [3], 4)
    with pytest.raises(ValueError, match="negative"):
        full_verify_mask(torch.ones(4 * 4, dtype=torch.bool), [-1], 4)


def test_to_eagle_custom_mask_rows():
    d = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]))
    out = d.to_eagle(torch.tensor([5, 2]))
    ref = _sglang_full_mask_loop(d.mask.reshape(-1), [5, 2], 4)
    assert torch.equal(out["custom_mask"], ref)


@pytest.mark.gpu
def test_full_verify_mask_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from lumotree.tree import full_verify_mask

    g = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 7000, (32,), generator=g)
    mask = torch.rand(32 * 16 * 16, generator=g) > 0.5
    got = full_verify_mask(mask.cuda(), lens, 16)
    assert got.is_cuda and torch.equal(got.cpu(), _sglang_full_mask_loop(mask, [int(x) for x in lens], 16))
