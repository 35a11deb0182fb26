"""LumoTree's selection in SGLang's verify_tree_greedy format == SGLang's own greedy tree
verification (its Triton kernel, run in Triton's interpreter), on random EAGLE-style trees."""
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import os, random, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from sglang.srt.speculative.eagle_utils import verify_tree_greedy_triton
from lumotree import tree_shapes
from lumotree.sglang.select import verify_tree_greedy
from lumotree.tree import TreeDescriptor

rng = random.Random(0)
for trial in range(12):
    B, N, depth = 3, 8, 5
    rows = [tree_shapes.eagle(2, 4, N, rng) for _ in range(B)]
    tree = TreeDescriptor.from_parents(torch.tensor(rows), validate=False)
    e = tree.to_eagle(torch.full((B,), 7))
    cand = torch.randint(0, 3, (B, N))  # few distinct tokens: long accepted paths and sibling choices
    target = torch.randint(0, 3, (B, N))
    outs = []
    for fn in (verify_tree_greedy_triton, verify_tree_greedy):
        pred = torch.zeros(B * N, dtype=torch.int32)
        acc = torch.full((B, depth), -1, dtype=torch.int32)
        num = torch.empty(B, dtype=torch.int32)
        fn(pred, acc, num, cand, e["retrieve_index"], e["retrieve_next_token"], e["retrieve_next_sibling"], target)
        outs.append((pred, acc, num))
    for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), outs[0], outs[1]):
        assert torch.equal(a, b), (trial, name, a, b)
print("selection adapter == SGLang")
'''


def test_selection_adapter_matches_sglang_verify_tree_greedy():
    pytest.importorskip("sglang")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "selection adapter == SGLang" in out.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,topk,steps", [(1, 8, 2, 4), (16, 16, 4, 5), (64, 32, 4, 6)])
def test_selection_adapter_matches_sgl_kernel_on_gpu(B, N, topk, steps):
    """On the GPU: the adapter with the CUDA extension == sgl_kernel.verify_tree_greedy (what
    SGLang's EAGLE worker calls), on EAGLE-style trees with few distinct tokens."""
    import random

    import torch
    from sglang.srt.speculative.eagle_utils import verify_tree_greedy_func

    from lumotree import tree_shapes
    from lumotree.ops.select import cuda
    from lumotree.sglang.select import verify_tree_greedy
    from lumotree.tree import TreeDescriptor

    if not cuda.available():
        pytest.skip("CUDA extension not built")
    rng = random.Random(B * N)
    for _ in range(5):
        rows = [tree_shapes.eagle(topk, steps, N, rng) for _ in range(B)]
        tree = TreeDescriptor.from_parents(torch.tensor(rows), validate=False).to("cuda")
        e = tree.to_eagle(torch.full((B,), 7, device="cuda"))
        cand = torch.randint(0, 3, (B, N), device="cuda")
        target = torch.randint(0, 3, (B, N), device="cuda")
        outs = []
        for fn in (verify_tree_greedy_func, verify_tree_greedy):
            pred = torch.zeros(B * N, dtype=torch.int32, device="cuda")
            acc = torch.full((B, steps + 1), -1, dtype=torch.int32, device="cuda")
            num = torch.empty(B, dtype=torch.int32, device="cuda")
            fn(predicts=pred, accept_index=acc, accept_token_num=num, candidates=cand,
               retrieve_index=e["retrieve_index"], retrieve_next_token=e["retrieve_next_token"],
               retrieve_next_sibling=e["retrieve_next_sibling"], target_predict=target, topk=topk)
            outs.append((pred, acc, num))
        for a, b in zip(outs[0], outs[1]):
            assert torch.equal(a, b)
