"""The CPU precision emulation (benchmark/kernels/precision_emulation.py) computes what the verify
computes: its exact path == the reference tree verify; its tf32 rounding keeps 10 mantissa bits."""
import random

import torch
from utils import load_script

from lumotree import TreeDescriptor
from lumotree.ops.gdn_tree import naive


def test_tf32_rounding():
    pe = load_script("kernels", "precision_emulation")
    x = torch.tensor([1 + 2.0 ** -10, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, -3.0], dtype=torch.float64)
    assert pe.tf32(x).tolist() == [1 + 2.0 ** -10, 1.0, 1 + 2 * 2.0 ** -10, -3.0]  # ties to even


def test_exact_emulation_equals_the_reference_verify():
    pe = load_script("kernels", "precision_emulation")
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    q, k, v, g, beta, M, h = pe.case(6, rng, gen, K=16, V=16, prefix=20)
    o = pe.chunk_verify(q, k, v, g, beta, M, h, 0.25, {d: "exact" for d in pe.DOTS})
    # the same tree for the reference: parents from the ancestor mask (the nearest strict ancestor)
    depth = M.sum(1)
    parents = [-1] + [max((j for j in range(6) if M[i, j] and j != i), key=lambda j: depth[j]) for i in range(1, 6)]
    tree = TreeDescriptor.from_parents(torch.tensor([parents]))
    ref = naive.gdn_tree_verify(q[None, :, None], k[None, :, None], v[None, :, None], g[None, :, None],
                                beta[None, :, None], h[None, None], tree, scale=0.25, use_qk_l2norm=True)
    assert torch.allclose(o, ref[0, :, 0], rtol=1e-9, atol=1e-12)
    o32 = pe.chunk_verify(q, k, v, g, beta, M, h, 0.25, {d: "tf32" for d in pe.DOTS})
    assert 1e-6 < float((o32 - o).norm() / o.norm()) < 1e-2  # tf32 really rounds
