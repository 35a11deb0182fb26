"""Helpers shared by the tests: one comparison, one set of tree strategies."""
import contextlib
import random

import torch
from hypothesis import strategies as st

from lumotree import tree_shapes


def assert_close(name, ref, tri, ratio=1e-5):
    """Relative error ||ref - tri|| / ||ref|| <= ratio; fails on NaN/Inf."""
    ref, tri = ref.detach().double().cpu(), tri.detach().double().cpu()
    assert ref.shape == tri.shape, f"{name}: shape {tuple(tri.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(tri).all(), f"{name}: non-finite values"
    err = (ref - tri).norm() / ref.norm().clamp(min=1e-30)
    assert err <= ratio, f"{name}: relative error {err:.3e} > {ratio:.1e}"


def make_parents(kind, n, seed):
    rng = random.Random(seed)
    if kind == "chain":
        return tree_shapes.chain(n)
    if kind == "star":
        return tree_shapes.star(n)
    if kind == "caterpillar":
        return tree_shapes.caterpillar(n, leg=1 + seed % 3)
    if kind == "eagle":
        return tree_shapes.eagle(4, max(1, n // 4), n, rng)
    return tree_shapes.random_tree(n, rng)


@st.composite
def forests(draw, max_n=64, max_b=3):
    """A ragged batch of trees: returns (parents [B, N] padded with -1, num_nodes [B])."""
    B = draw(st.integers(1, max_b))
    N = draw(st.integers(1, max_n))
    rows, nums = [], []
    for _ in range(B):
        kind = draw(st.sampled_from(["chain", "star", "caterpillar", "random", "eagle"]))
        n = draw(st.integers(1, N))
        p = make_parents(kind, n, draw(st.integers(0, 10_000)))
        n = len(p)
        rows.append(p + [-1] * (N - n))
        nums.append(n)
    return torch.tensor(rows), torch.tensor(nums)


def load_script(folder, name):
    """Import ``benchmark/<folder>/<name>.py`` (the benchmark scripts are not a package)."""
    import importlib.util
    import os
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "benchmark")
    for sub in ("serving", "models", folder):
        path = os.path.join(root, sub)
        if path not in sys.path:
            sys.path.insert(0, path)
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, folder, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def fresh_hook(hook_module):
    """A LumoTree patch module's hook target with SGLang's ``HookRegistry`` entries and LumoTree's
    installed-once mark saved, cleared for the test, and restored after it; yields the registry's hooks."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from lumotree.sglang import patches

    target = hook_module.TARGET
    saved = list(HookRegistry._hooks.get(target, []))
    try:
        patches.forget(target)
        yield HookRegistry._hooks
    finally:
        HookRegistry._hooks[target] = saved
        patches.forget(target)
