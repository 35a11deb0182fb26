"""GPU tests of the tree verify attention's kernels (python3 -m pytest -q -m gpu test on the H200): the cases
of tree_attention_cases.py in bf16, and at Qwen3.5-27B's attention heads against the reference and
SGLang's prefill kernel (what SGLang's Triton backend runs for a verify) on the same chain."""
import pytest
import torch

from tree_attention_cases import compare_tree_attention, problem
from utils import assert_close

pytestmark = pytest.mark.gpu


def test_tree_attention_kernels_match_the_reference_on_cuda():
    compare_tree_attention("cuda", torch.bfloat16, tol=1e-2)


@pytest.mark.parametrize("bs,n,tree", [pytest.param(1, 4, None, id="B1-chain4"), pytest.param(32, 4, None, id="B32-chain4"),
                                       pytest.param(8, 8, "eagle", id="B8-eagle8"), pytest.param(4, 16, "tree", id="B4-tree16")])
def test_qwen35_heads_against_reference_and_sglang(bs, n, tree):
    from lumotree.ops.tree_attention import naive, triton as tri
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    prefixes = [257 + 37 * b for b in range(bs)]
    p = problem(bs, n, 24, 4, 256, 256, prefixes, torch.bfloat16, "cuda", tree)
    got = tri.tree_verify_attention(**p)
    ref = naive.tree_verify_attention(**p)
    assert_close(f"Qwen3.5 heads bs{bs} n{n} {tree}", ref.float(), got.float(), 1e-2)
    if tree is None:  # SGLang's verify path on the same causal chain
        sg = torch.empty_like(got)
        qo = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device="cuda")
        extend_attention_fwd(p["q"], p["k"], p["v"], sg, p["k_buffer"], p["v_buffer"], qo, p["kv_indptr"],
                             p["kv_indices"], None, True, None, n, 1.0, 1.0)
        assert_close(f"vs SGLang's prefill kernel bs{bs}", sg.float(), got.float(), 1e-2)
