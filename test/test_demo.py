import subprocess
import sys

import torch

from lumotree.drafters.ngram import NgramDrafter
from lumotree.models.generate import generate_plain, generate_tree
from lumotree.models.tiny_hybrid import TinyHybridLM
from lumotree.tree import TreeDescriptor


def test_drafter_tree_is_valid_and_branches():
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]
    toks, parents = NgramDrafter(max_match=3, depth=3, budget=8).draft(ctx)
    TreeDescriptor.from_parents(torch.tensor([parents]))  # validates
    assert toks[0] == 2 and len(toks) <= 8
    kids = [toks[i] for i in range(1, len(toks)) if parents[i] == 0]
    assert sorted(kids) == [3, 4]  # after "1 2" the context continued with 3 and with 4
    assert NgramDrafter(budget=5).draft(ctx) == NgramDrafter(budget=5).draft(ctx)  # deterministic


def test_tree_speculation_is_lossless_and_accepts():
    model = TinyHybridLM()
    prompt = list(range(20)) * 2
    plain = generate_plain(model, prompt, 64)
    spec, st = generate_tree(model, prompt, 64, NgramDrafter(budget=12))
    assert spec == plain
    assert st.steps < 64 and st.tokens >= 64
    assert st.boundary_bytes <= st.snapshot_bytes


def test_demo_cli_prints_identical_yes():
    out = subprocess.run([sys.executable, "-m", "lumotree", "demo", "--tokens", "128"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "identical: yes" in out.stdout
    assert "tokens per verify step" in out.stdout
