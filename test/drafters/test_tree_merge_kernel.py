import os
import subprocess
import sys

import pytest


def test_fused_merge_layout_kernel_in_interpreter():
    """The one-launch merge + layout of the served merged tree == its torch reference (see the script)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "interpret_tree_merge.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "tree merge kernel == torch path" in out.stdout


@pytest.mark.gpu
def test_fused_merge_layout_kernel_on_gpu():
    """The same comparison with the compiled kernel on CUDA tensors (GPU machine)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import random

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sglang"))
    from test_merge import fake_verify_input

    from lumotree.drafters.suffix import Draft
    from lumotree.sglang import merge

    rng = random.Random(3)
    for N, slots in ((6, 3), (8, 4), (16, 7), (64, 31)):
        B = 5
        par = torch.tensor([[-1] + [rng.randrange(i) for i in range(1, N)] for _ in range(B)])
        tok = torch.arange(N)[None, :].repeat(B, 1) + 100  # distinct tokens
        tok[:, 0] = 7
        seq = torch.tensor([rng.randint(1, 50) for _ in range(B)])
        drafts = [Draft([7] + [100 + rng.randrange(N) for _ in range(k)], [-1] + list(range(k)),
                        [1.0] + [0.9 ** (i + 1) for i in range(k)]) for k in (0, 1, 2, min(3, slots), slots)]
        outs = []
        for dev, kernel in (("cpu", False), ("cuda", True)):
            vi = fake_verify_input(par, tok, seq)
            for name in ("draft_token", "positions", "retrieve_next_token", "retrieve_next_sibling", "custom_mask"):
                setattr(vi, name, getattr(vi, name).to(dev))
            m = merge.SuffixMerge(N, slots=slots, max_spec=N, kernel=kernel)
            m.drafter.draft = lambda rid, budget: drafts[int(rid)]
            m.observe = lambda rid, toks: None
            m.forget = lambda rids: None
            m.merge(vi, seq.to(dev), merge.FULL_MASK, [str(b) for b in range(B)], [[0]] * B)
            outs.append(vi)
        for name in ("draft_token", "positions", "retrieve_next_token", "retrieve_next_sibling", "custom_mask"):
            assert torch.equal(getattr(outs[0], name), getattr(outs[1], name).cpu()), (N, name)

