import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree import TreeDescriptor
from lumotree.ops.gdn_tree import naive
from utils import assert_close, forests, make_parents


def make_inputs(B, N, Hk, Hv, K, V, seed, dtype=torch.float32, pool=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, Hk, K, generator=g).to(dtype)
    k = torch.randn(B, N, Hk, K, generator=g).to(dtype)
    v = torch.randn(B, N, Hv, V, generator=g).to(dtype)
    gg = -torch.rand(B, N, Hv, generator=g) * 0.5
    beta = torch.rand(B, N, Hv, generator=g)
    P = pool or B
    state = torch.randn(P, Hv, V, K, generator=g) * 0.1
    return q, k, v, gg, beta, state


def sequential(q, k, v, g, beta, S0, path, scale, l2):
    """Plain recurrence along a list of nodes of one request: (outputs, final state)."""
    rep = v.shape[1] // k.shape[1]
    S, outs = S0.clone(), []
    for i in path:
        kk, qq = k[i].float(), q[i].float()
        if l2:
            kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
            qq = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
        kk, qq = kk.repeat_interleave(rep, 0), qq.repeat_interleave(rep, 0)
        for h in range(S.shape[0]):
            S[h] = torch.exp(g[i, h]) * S[h]
            u = beta[i, h] * (v[i, h].float() - S[h] @ kk[h])
            S[h] = S[h] + torch.outer(u, kk[h])
        outs.append(torch.stack([scale * S[h] @ qq[h] for h in range(S.shape[0])]))
    return outs, S


def test_chain_matches_sequential_recurrence():
    B, N, Hk, Hv, K, V = 1, 5, 2, 4, 8, 6
    q, k, v, g, beta, state = make_inputs(B, N, Hk, Hv, K, V, 0)
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 1, 2, 3]]))
    o = naive.gdn_tree_verify(q, k, v, g, beta, state, tree, use_qk_l2norm=True)
    outs, _ = sequential(q[0], k[0], v[0], g[0], beta[0], state[0], range(N), K ** -0.5, True)
    assert_close("o", torch.stack(outs), o[0])


def test_branch_outputs_equal_each_root_path():
    """Every node's output equals the sequential recurrence along its own root path."""
    parents = [-1, 0, 0, 1, 1, 2, 3, 0]
    B, N, Hk, Hv, K, V = 1, 8, 1, 2, 4, 4
    q, k, v, g, beta, state = make_inputs(B, N, Hk, Hv, K, V, 1)
    tree = TreeDescriptor.from_parents(torch.tensor([parents]))
    o = naive.gdn_tree_verify(q, k, v, g, beta, state, tree)
    for i in range(N):
        path = [x for x in tree.root_path(torch.tensor([i]))[0].tolist() if x >= 0]
        outs, _ = sequential(q[0], k[0], v[0], g[0], beta[0], state[0], path, K ** -0.5, False)
        assert_close(f"node {i}", outs[-1], o[0, i])


@settings(max_examples=40, deadline=None)
@given(forests(max_n=64), st.sampled_from([(1, 1), (2, 4), (2, 6)]), st.booleans(), st.integers(0, 99))
def test_path_parallel_equals_per_node(forest, heads, l2, seed):
    parents, num = forest
    B, N = parents.shape
    Hk, Hv = heads
    q, k, v, g, beta, state = make_inputs(B, N, Hk, Hv, 8, 4, seed)
    tree = TreeDescriptor.from_parents(parents, num)
    before = state.clone()
    ref = naive.gdn_tree_verify_per_node(q, k, v, g, beta, state, tree, use_qk_l2norm=l2)
    pp = naive.gdn_tree_verify(q, k, v, g, beta, state, tree, use_qk_l2norm=l2)
    assert torch.equal(state, before), "verify must not write the state"
    assert_close("o", ref, pp, 1e-6)
    assert (pp[~tree.valid] == 0).all()


@settings(max_examples=30, deadline=None)
@given(forests(max_n=48), st.sampled_from([(1, 1), (2, 4)]), st.booleans(), st.integers(0, 99))
def test_tree_masked_chunk_form_equals_per_node(forest, heads, l2, seed):
    """The math of the tensor-core kernel (one WY chunk, ancestor mask) is exact for trees."""
    parents, num = forest
    B, N = parents.shape
    Hk, Hv = heads
    q, k, v, g, beta, state = (t.double() for t in make_inputs(B, N, Hk, Hv, 8, 4, seed))
    tree = TreeDescriptor.from_parents(parents, num)
    ref = naive.gdn_tree_verify_per_node(q, k, v, g, beta, state, tree, use_qk_l2norm=l2)
    chunk = naive.gdn_tree_verify_chunk(q, k, v, g, beta, state, tree, use_qk_l2norm=l2)
    assert_close("chunk form", ref, chunk, 1e-10)


@settings(max_examples=40, deadline=None)
@given(forests(max_n=32), st.booleans(), st.integers(0, 99))
def test_commit_equals_sequential(forest, l2, seed):
    parents, num = forest
    B, N = parents.shape
    Hk, Hv, K, V = 2, 4, 8, 4
    q, k, v, g, beta, _ = make_inputs(B, N, Hk, Hv, K, V, seed)
    pool = torch.randn(B + 3, Hv, V, K, generator=torch.Generator().manual_seed(seed))
    rows = torch.randperm(B + 3, generator=torch.Generator().manual_seed(seed))[:B]
    tree = TreeDescriptor.from_parents(parents, num)
    # accept the root path to a random node of each tree (length 0 for one request if B > 1)
    gen = torch.Generator().manual_seed(seed + 1)
    ends = torch.stack([torch.randint(0, int(n), (1,), generator=gen)[0] for n in num])
    accept_nodes = tree.root_path(ends)
    accept_len = (accept_nodes >= 0).sum(-1)
    if B > 1:
        accept_len[0] = 0
        accept_nodes[0] = -1
    expected = pool.clone()
    for b in range(B):
        path = accept_nodes[b, : int(accept_len[b])].tolist()
        if path:
            _, S = sequential(q[b], k[b], v[b], g[b], beta[b], pool[rows[b]], path, K ** -0.5, l2)
            expected[rows[b]] = S
        # the verify output of the accepted node is the committed state applied to q (snapshot check)
    got = pool.clone()
    naive.gdn_tree_commit(k, v, g, beta, got, tree, accept_nodes, accept_len, use_qk_l2norm=l2, state_indices=rows)
    # both fp32, in different orders, over up to 32 steps: a few ulps per step (1.4e-6 seen at 1e-6)
    assert_close("state", expected, got, 1e-5)
    untouched = torch.ones(B + 3, dtype=torch.bool)
    untouched[rows[accept_len > 0]] = False
    assert torch.equal(got[untouched], pool[untouched])


def test_gqa_head_mapping():
    """Value head h reads q/k head h // (Hv // Hk): permuting k heads permutes value-head groups."""
    B, N, Hk, Hv, K, V = 1, 3, 2, 4, 4, 4
    q, k, v, g, beta, state = make_inputs(B, N, Hk, Hv, K, V, 3)
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0]]))
    o = naive.gdn_tree_verify(q, k, v, g, beta, state, tree)
    perm = torch.tensor([2, 3, 0, 1])
    o2 = naive.gdn_tree_verify(q.flip(2), k.flip(2), v[:, :, perm], g[:, :, perm], beta[:, :, perm],
                               state[:, perm], tree)
    assert_close("gqa", o[:, :, perm], o2, 1e-6)


@pytest.mark.parametrize("bad, msg", [
    (dict(q=torch.zeros(1, 3, 2, 5)), "q must match"),
    (dict(v=torch.zeros(1, 3, 3, 4)), "Hv % Hk"),
    (dict(g=torch.zeros(1, 3, 5)), "g must be"),
    (dict(state=torch.zeros(1, 4, 4, 5)), "state must be"),
    (dict(state=torch.zeros(2, 4, 4, 4)), "pass state_indices"),
    (dict(state=torch.zeros(1, 4, 4, 4, dtype=torch.bfloat16)), "float32"),
])
def test_bad_inputs_raise(bad, msg):
    args = dict(zip("q k v g beta state".split(), make_inputs(1, 3, 2, 4, 4, 4, 0)))
    args.update(bad)
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0]]))
    with pytest.raises(ValueError, match=msg):
        naive.gdn_tree_verify(args["q"], args["k"], args["v"], args["g"], args["beta"], args["state"], tree)


def test_commit_rejects_non_path():
    q, k, v, g, beta, state = make_inputs(1, 3, 1, 1, 4, 4, 0)
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0]]))
    with pytest.raises(ValueError, match="path from the root"):
        naive.gdn_tree_commit(k, v, g, beta, state, tree, torch.tensor([[0, 1, 2]]), torch.tensor([3]))


def test_bf16_inputs_promote_to_fp32():
    q, k, v, g, beta, state = make_inputs(1, 4, 1, 2, 8, 8, 5, dtype=torch.bfloat16)
    tree = TreeDescriptor.from_parents(torch.tensor([make_parents("random", 4, 1)]))
    o = naive.gdn_tree_verify(q, k, v, g, beta, state, tree)
    assert o.dtype == torch.float32
    ref = naive.gdn_tree_verify(q.float(), k.float(), v.float(), g, beta, state, tree)
    assert_close("bf16", ref, o, 1e-6)


def test_mix_verify_configs():
    """The mix verify's tilings: pass 2's transposed dot needs BV >= 16 warps; pass 1 drops to 2 warps
    only for <= 32-node trees with >= 2 programs per SM; precisions are checked."""
    from lumotree.ops.gdn_tree import tiles, verify

    cpu = torch.device("cpu")  # (2 "SMs" off the GPU)
    for BT in (16, 32, 64):
        BV, warps, _ = verify.mix_config(BT, 128, 8, 16, cpu)
        assert BV == 64 and BV >= 16 * warps
    assert verify.mix_config(16, 128, 1, 1, cpu)[2] == 4 and verify.mix_config(16, 128, 8, 16, cpu)[2] == 2
    assert verify.mix_config(64, 128, 8, 16, cpu)[2] == 4
    assert verify.mix_config(16, 16, 1, 1, cpu)[:2] == (16, 1)
    with pytest.raises(ValueError, match="precision must be one of"):
        tiles.check_precision("fp16")
