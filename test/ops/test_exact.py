import os
import subprocess
import sys

import torch

from lumotree.ops.exact import naive


def test_exact_kernels_in_interpreter_match_references():
    """CPU coverage of the decode-exact kernels' logic: the path walk, padding rows, the ring the
    commit reads, the replay commit, the conv states, the per-node KV lists."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "interpret_exact.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "exact kernels == references" in out.stdout


def test_naive_exact_verify_is_the_sequential_decode():
    """The reference's node output = a chain of one-token decode steps along the root path."""
    g = torch.Generator().manual_seed(0)
    H, HV, K, V = 1, 2, 8, 8
    parents = torch.tensor([[-1, 0, 0, 2]])
    x = torch.randn(1, 4, 2 * H * K + HV * V, generator=g)
    a, b = torch.randn(1, 4, HV, generator=g), torch.randn(1, 4, HV, generator=g)
    A_log, dt_bias = torch.rand(HV, generator=g), torch.rand(HV, generator=g)
    pool = torch.randn(2, HV, V, K, generator=g)
    o = naive.gdn_tree_exact_verify(x, a, b, A_log, dt_bias, pool, torch.tensor([1]), parents, H, 0.5)
    # node 3's path is 0 -> 2 -> 3: feed those tokens as a chain
    chain = [0, 2, 3]
    oc = naive.gdn_tree_exact_verify(x[:, chain], a[:, chain], b[:, chain], A_log, dt_bias, pool,
                                     torch.tensor([1]), None, H, 0.5)
    assert torch.equal(o[0, 3], oc[0, 2]) and torch.equal(o[0, 2], oc[0, 1])
    assert not torch.equal(o[0, 1], oc[0, 1])  # node 1 is a sibling branch: a different path
