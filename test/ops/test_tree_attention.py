"""The tree verify attention's reference (lumotree.ops.tree_attention.naive) against attention written
out densely, and the public op's input checks. Kernels: test_kernels_interpret.py (CPU interpreter),
test_tree_attention_gpu.py."""
import pytest
import torch

from tree_attention_cases import problem
from utils import assert_close


def dense(p, n):
    """Softmax attention over [prefix ; verify tokens] with the visibility matrix built explicitly."""
    q, k, v, kb, vb, ptr, idx, anc = (p[x] for x in ("q", "k", "v", "k_buffer", "v_buffer", "kv_indptr",
                                                     "kv_indices", "anc"))
    bs, hq, hkv = ptr.numel() - 1, q.shape[1], k.shape[1]
    outs = []
    for b in range(bs):
        slots = idx[ptr[b]:ptr[b + 1]]
        for i in range(n):
            for h in range(hq):
                kk = torch.cat([kb[slots, h * hkv // hq], k[b * n:(b + 1) * n, h * hkv // hq]])
                vv = torch.cat([vb[slots, h * hkv // hq], v[b * n:(b + 1) * n, h * hkv // hq]])
                vis = [True] * len(slots) + [bool(anc[b, i, j]) if anc is not None else j <= i for j in range(n)]
                s = (kk @ q[b * n + i, h]) / q.shape[-1] ** 0.5
                s[~torch.tensor(vis)] = float("-inf")
                outs.append(torch.softmax(s, 0) @ vv)
    return torch.stack(outs).view(bs * n, hq, -1)


@pytest.mark.parametrize("tree", [None, "tree", "star"])
def test_reference_is_attention_over_prefix_and_ancestors(tree):
    from lumotree.ops.tree_attention.naive import tree_verify_attention

    p = problem(3, 6, 4, 2, 16, 8, (4, 0, 19), torch.float64, "cpu", tree)
    assert_close(f"reference ({tree})", dense(p, 6), tree_verify_attention(**p), 1e-6)  # fp32 math


def test_a_root_without_prefix_sees_only_itself():
    from lumotree.ops.tree_attention.naive import tree_verify_attention

    p = problem(1, 4, 2, 1, 8, 8, (0,), torch.float64, "cpu", None)
    o = tree_verify_attention(**p)
    assert torch.allclose(o[0], p["v"][0].expand(2, 8))  # node 0: its own value, both query heads


@pytest.mark.parametrize("change,needle", [
    pytest.param(dict(q=torch.zeros(10, 4, 16)), "do not split evenly", id="tokens-vs-requests"),
    pytest.param(dict(q=torch.zeros(12, 3, 16)), "multiple of KV heads", id="gqa"),
    pytest.param(dict(anc=torch.zeros(3, 4, 5, dtype=torch.int8)), "anc must be [3, 4, 4]", id="anc-shape"),
    pytest.param(dict(k_buffer=torch.zeros(40, 2, 8)), "KV pool", id="pool-heads"),
    pytest.param(dict(out=torch.zeros(12, 4, 8)), "out must be [12, 4, 16]", id="out-shape"),
    pytest.param(dict(out=torch.zeros(12, 4, 32)[..., ::2]), "contiguous last dimension", id="out-strided"),
])
def test_public_op_rejects_inconsistent_shapes(change, needle):
    from lumotree.ops.tree_attention.triton import tree_verify_attention

    p = problem(3, 4, 4, 2, 16, 16, (3, 4, 5), torch.float32, "cpu", None)
    p.update(change)
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        tree_verify_attention(**p)


def test_public_op_on_cpu_is_the_reference():
    from lumotree import ops
    from lumotree.ops.tree_attention import naive

    p = problem(2, 5, 4, 2, 16, 16, (7, 3), torch.float32, "cpu", "tree")
    assert torch.equal(ops.tree_verify_attention(**p), naive.tree_verify_attention(**p))


def test_the_split_count_is_one_kernel_variant_at_every_batch_size():
    """The split count takes values 1, 16 and others across a server's verify graph sizes (4-token chains, 132
    SMs); each kernel takes it unspecialized, so a start-up compiles one variant of each, not three."""
    import triton as _triton  # noqa: F401  (the kernels' module needs Triton; CPU builds have it)
    from lumotree.ops.tree_attention import triton as ta

    splits = {ta.tree_attention_config(bs, 4, 24, 4, 132)[2] for bs in (1, 4, 8, 32, 64, 128)}
    assert 1 in splits and 16 in splits and len(splits) > 2
    for kernel in (ta.tree_attention_prefix_fwd_kernel, ta.tree_attention_merge_fwd_kernel):
        assert [p.name for p in kernel.params if p.do_not_specialize] == ["S"]
