"""Cases of the tree verify attention shared by the interpreter run (interpret_kernels.py, CPU) and the GPU
test (test_tree_attention_gpu.py): the Triton kernels of lumotree.ops.tree_attention against its reference."""
import torch

from utils import assert_close, make_parents


def problem(bs, n, hq, hkv, d, dv, prefixes, dtype, device, tree=None, seed=0, pool=None):
    """A verify of ``bs`` requests with ``n`` nodes each after prefixes of the given lengths, at scattered
    pool slots (slot 0 unused); ``tree``: a ``make_parents`` kind for an ancestor mask, ``None``: a chain."""
    from lumotree.tree import ancestor_mask

    g = torch.Generator().manual_seed(seed)
    pool = pool or 2 * sum(prefixes) + 8

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    kb, vb = rnd(pool, hkv, d), rnd(pool, hkv, dv)
    perm = torch.randperm(pool - 1, generator=g) + 1
    starts = torch.tensor([0] + list(prefixes)).cumsum(0)
    kv_indices = torch.cat([perm[int(starts[i]):int(starts[i + 1])] for i in range(bs)] + [torch.zeros(3, dtype=torch.long)])
    anc = None
    if tree is not None:
        par = torch.tensor([make_parents(tree, n, s + seed) for s in range(bs)])
        anc = ancestor_mask(par).to(torch.int8).to(device)
    return dict(q=rnd(bs * n, hq, d), k=rnd(bs * n, hkv, d), v=rnd(bs * n, hkv, dv), k_buffer=kb, v_buffer=vb,
                kv_indptr=starts.to(device=device, dtype=torch.int32), kv_indices=kv_indices.to(device), anc=anc)


CASES = [  # bs, n, Hq, Hkv, D, Dv, prefixes, tree kind
    (3, 4, 4, 2, 32, 32, (5, 37, 90), None),  # chains, GQA 2
    (4, 4, 6, 1, 32, 32, (1, 64, 200, 7), None),  # GQA 6 (Qwen3.5-27B's group): 24 rows a KV head
    (2, 7, 4, 2, 16, 32, (33, 130), "tree"),  # a tree, Dv != D
    (3, 16, 2, 1, 32, 16, (0, 12, 70), "tree"),  # an empty prefix; 16 nodes
    (2, 5, 8, 2, 64, 64, (300, 17), "chain"),  # a chain given as a mask
]


def compare_tree_attention(device, dtype=torch.float32, tol=2e-5):
    """The split prefix + tree merge kernels vs the reference over chains and trees, GQA groups, an empty
    prefix, prefixes shorter than a split, forced split counts, and a strided output view."""
    from lumotree.ops.tree_attention import naive, triton as tri

    for bs, n, hq, hkv, d, dv, prefixes, tree in CASES:
        p = problem(bs, n, hq, hkv, d, dv, prefixes, dtype, device, tree)
        ref = naive.tree_verify_attention(**{k: (t.cpu() if torch.is_tensor(t) else t) for k, t in p.items()})
        for splits in (None, 1, 3, 16):
            got = tri.tree_verify_attention(**p, splits=splits)
            assert_close(f"tree attention bs{bs} n{n} G{hq // hkv} {tree or 'causal'} S={splits}", ref.float(),
                         got.float().cpu(), tol)
        wide = torch.full((bs * n, hq, dv + 8), float("nan"), dtype=dtype, device=device)
        tri.tree_verify_attention(**p, out=wide[..., :dv])
        assert_close("tree attention into a strided view", ref.float(), wide[..., :dv].float().cpu(), tol)
        assert torch.isnan(wide[..., dv:]).all()
    # a chain given as its mask equals the causal form
    p = problem(2, 4, 4, 2, 32, 32, (40, 9), dtype, device, "chain")
    with_mask = tri.tree_verify_attention(**p)
    p["anc"] = None
    assert_close("chain mask == causal", with_mask.float().cpu(), tri.tree_verify_attention(**p).float().cpu(), tol)
