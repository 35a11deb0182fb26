"""``patches/draft_tree_whole.py``: SGLang's draft-tree selection on tie-breaking keys keeps every
selected node's parent, and is SGLang's own selection wherever no scores tie (CPU, SGLang's functions)."""
import pytest
import torch

pytest.importorskip("sglang")
from draft_trees import orphans, select, softmaxes  # noqa: E402
from sglang.srt.speculative.eagle_utils import organize_draft_results  # noqa: E402

from lumotree.sglang.patches.draft_tree_whole import organize_whole, tie_break_keys  # noqa: E402


def whole(*args, **kwargs):
    return organize_whole(organize_draft_results, *args, **kwargs)


def first_level(bs, topk, seed):
    g = torch.Generator().manual_seed(seed)
    p, idx = torch.softmax(3 * torch.randn(bs, 64, generator=g), -1).topk(topk, -1)
    return p, idx


@pytest.mark.parametrize("topk, steps, nodes", [(2, 3, 6), (4, 3, 8), (2, 5, 10), (4, 4, 16)])
def test_same_tree_as_sglang_without_ties(topk, steps, nodes):
    bs = 16
    for seed in range(3):
        p, idx = first_level(bs, topk, seed)
        ref = select(p, idx, steps, nodes, softmaxes(bs, topk, seed=seed))
        ours = select(p, idx, steps, nodes, softmaxes(bs, topk, seed=seed), organize=whole)
        assert torch.equal(ref[0], ours[0]) and torch.equal(ref[1], ours[1])


def confident(bs, topk, seed):
    """A confident draft model: its best token's probability is exactly 1.0 in fp32, the others 0."""
    g = torch.Generator().manual_seed(seed)

    def probs(i):
        logits = torch.randn(bs * topk, 64, generator=g)
        logits[torch.arange(bs * topk), torch.randint(0, 64, (bs * topk,), generator=g)] = 200.0
        return torch.softmax(logits, -1)

    return probs


@pytest.mark.parametrize("zero_first", [False, True], ids=["confident", "zero-stub"])
def test_ties_keep_the_tree_whole(zero_first):
    bs, topk, steps, nodes = 32, 2, 3, 6
    found = 0
    for seed in range(4):
        p, idx = first_level(bs, topk, seed)
        if zero_first:
            p = torch.zeros_like(p)
        ref = select(p, idx, steps, nodes, confident(bs, topk, seed))
        found += sum(orphans(*ref, topk))
        ours = select(p, idx, steps, nodes, confident(bs, topk, seed), organize=whole)
        assert orphans(*ours, topk) == [0] * bs
    if zero_first:  # SGLang's own selection kept orphans on these ties (on the confident ones torch.topk's
        assert found > 0  # tie order on CPU happened to favour the parents; on the GPU it is another order)


def test_keys_order_children_below_parents_and_keep_score_order():
    s0 = torch.tensor([[[0.5, 0.0]]])
    s1 = torch.tensor([[[0.5, 0.25], [0.0, 0.0]]])  # children of 0.5 (one with probability 1) and of 0.0
    k0, k1 = tie_break_keys([s0, s1])
    assert k1[0, 0, 0] < k0[0, 0, 0] and k1[0, 1, 0] < k0[0, 0, 1] and k1[0, 1, 1] < k0[0, 0, 1]
    a = torch.tensor([1.0, 1.0 - 2 ** -24, 1e-38, 1e-45, 0.0])  # fp32 neighbours, a normal and a denormal
    keys = torch.cat([tie_break_keys([a.view(1, 1, -1)])[0].flatten(),
                      tie_break_keys([a.view(1, 1, -1)] * 64)[63].flatten()])
    assert torch.all(keys[:5][:-1] > keys[:5][1:]) and torch.all(keys[5:][:-1] > keys[5:][1:])
    assert torch.isfinite(tie_break_keys([torch.tensor([[[float("nan"), 1.0]]])])[0]).all()


HOOKED = r"""
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.plugins.hook_registry import HookRegistry
HookRegistry.apply_hooks()
import torch
import sglang.srt.speculative.eagle_utils as eu
import sglang.srt.speculative.eagle_worker_v2 as ew
assert ew.organize_draft_results is eu.organize_draft_results and hasattr(eu.organize_draft_results, "__wrapped__")
bs, topk = 64, 2
z = [torch.zeros(bs, 1, topk), torch.zeros(bs, topk, topk), torch.zeros(bs, topk, topk)]
t = [torch.zeros(bs, topk, dtype=torch.long), torch.zeros(bs, topk * topk, dtype=torch.long),
     torch.zeros(bs, topk * topk, dtype=torch.long)]
p = [torch.arange(-1, topk).expand(bs, -1), torch.tensor([[2, 3]] * bs), torch.tensor([[6, 7]] * bs)]
parent_list, sel, _ = eu.organize_draft_results(z, t, p, 6)
orphans = sum(1 for b in range(bs) for s in sel[b].tolist() if s >= topk and int(parent_list[b, s // topk]) not in set(sel[b].tolist()))
print("ORPHANS", orphans)
"""


def test_a_lumotree_server_process_selects_through_the_hook():
    """In a LUMOTREE server's process (the plugin loaded, SGLang's hooks applied) SGLang's own
    ``organize_draft_results`` -- in ``eagle_utils`` and where the V2 worker imported it -- is the
    tie-breaking one: all-zero scores give whole trees."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", HOOKED], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, LUMOTREE_SGLANG_ACTIVE="1"))
    assert "ORPHANS 0" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
