import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree import TreeDescriptor
from lumotree.ops.conv_tree import naive
from utils import assert_close, forests


def sequential_conv(xs, conv_state, weight, bias):
    """Causal conv1d over the committed history followed by the inputs xs `[L, D]`."""
    full = torch.cat([conv_state, xs.T], -1)  # [D, W-1+L]
    y = F.conv1d(full[None], weight[:, None, :], bias, groups=weight.shape[0])[0]  # [D, L]
    return F.silu(y.T), full[:, -conv_state.shape[1]:]


def test_window_index_hand_built():
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 1, 0]]))
    idx = naive.conv_tree_window_index(tree, 4)
    # node 2's window: state col 2, then nodes 0, 1, 2; node 3: state cols 1, 2, nodes 0, 3
    assert idx[0, 2].tolist() == [-3, 0, 1, 2]
    assert idx[0, 3].tolist() == [-2, -3, 0, 3]
    assert idx[0, 0].tolist() == [-1, -2, -3, 0]


@settings(max_examples=40, deadline=None)
@given(forests(max_n=24), st.integers(2, 5), st.integers(0, 99))
def test_verify_and_commit_equal_sequential(forest, W, seed):
    parents, num = forest
    B, N = parents.shape
    D = 6
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, D, generator=gen)
    cs = torch.randn(B, D, W - 1, generator=gen)
    w = torch.randn(D, W, generator=gen)
    bias = torch.randn(D, generator=gen)
    tree = TreeDescriptor.from_parents(parents, num)
    y = naive.conv_tree_verify(x, cs, w, bias, tree)
    for b in range(B):
        for i in range(int(num[b])):
            path = [j for j in tree.root_path(torch.tensor([i] * B))[b].tolist() if j >= 0]
            ref, _ = sequential_conv(x[b, path], cs[b], w, bias)
            assert_close(f"y[{b},{i}]", ref[-1], y[b, i], 1e-6)
    ends = torch.tensor([int(n) - 1 for n in num])
    an = tree.root_path(ends)
    al = (an >= 0).sum(-1)
    got = cs.clone()
    naive.conv_tree_commit(x, got, tree, an, al)
    for b in range(B):
        path = an[b, : int(al[b])].tolist()
        _, new = sequential_conv(x[b, path], cs[b], w, bias)
        assert torch.equal(got[b], new)


def test_bad_weight_width():
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match="weight must be"):
        naive.conv_tree_verify(torch.zeros(1, 2, 3), torch.zeros(1, 3, 3), torch.zeros(3, 3), None, tree)
