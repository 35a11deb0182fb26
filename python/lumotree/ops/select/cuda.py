"""Fused selection + device-resident acceptance: wrappers of ``torch.ops.lumotree.tree_select``
(csrc/select/tree_select.cu). One launch for the batch; outputs preallocated with static shapes,
so the call can be captured in a CUDA graph. Loaded lazily: importing lumotree never compiles or
loads the extension."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from lumotree.ops.commit.naive import CommitPlan
from lumotree.ops.gdn_tree.common import check_tree
from lumotree.tree import TreeDescriptor

__all__ = ["available", "tree_select_and_plan", "tree_select_greedy", "tree_select_sample"]


@functools.cache
def available() -> bool:
    """True when the CUDA extension is built and its ops are registered."""
    try:
        import lumotree._C  # noqa: F401  (registers torch.ops.lumotree.*)
    except ImportError:
        return False
    return hasattr(torch.ops.lumotree, "tree_select")


def _check(draft_tokens, target, tree, greedy):
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, N], got {tuple(draft_tokens.shape)}")
    B, N = draft_tokens.shape
    check_tree(tree, B, N)
    want = 2 if greedy else 3
    if target.dim() != want or tuple(target.shape[:2]) != (B, N):
        raise ValueError(f"{'target_tokens' if greedy else 'target_probs'} must be "
                         f"{'[B, N]' if greedy else '[B, N, vocab]'} with [B, N] = {(B, N)}, got {tuple(target.shape)}")


def tree_select_and_plan(draft_tokens, target, tree: TreeDescriptor, *, greedy: bool, coins=None, coins_final=None,
                         cache_slots: Optional[torch.Tensor] = None, conv_width: int = 1,
                         generator: Optional[torch.Generator] = None):
    """Acceptance and the whole commit plan in one launch. Returns ``(bonus, CommitPlan)``.

    ``target`` is the target's argmax `[B, N]` (greedy) or its distribution `[B, N, vocab]`
    (``probs_from_logits`` applies temperature / top-k / top-p). ``coins`` `[B, N]` and
    ``coins_final`` `[B]` are drawn on the device when not given."""
    _check(draft_tokens, target, tree, greedy)
    if not available():
        from lumotree.ops.select import fallback

        return fallback.tree_select_and_plan(draft_tokens, target, tree, greedy=greedy, coins=coins,
                                             coins_final=coins_final, cache_slots=cache_slots, conv_width=conv_width)
    B, N = draft_tokens.shape
    dev = draft_tokens.device
    long = dict(dtype=torch.long, device=dev)
    if cache_slots is None:
        cache_slots = torch.full((B, N), -1, **long)
    if greedy:
        coins = coins_final = torch.empty(B, 0, device=dev)
    else:
        coins = coins if coins is not None else torch.rand(B, N, device=dev, generator=generator)
        coins_final = coins_final if coins_final is not None else torch.rand(B, device=dev, generator=generator)
    accept_len, accept_nodes, bonus = torch.empty(B, **long), torch.empty(B, N, **long), torch.empty(B, **long)
    conv_src = torch.empty(B, max(conv_width - 1, 0), **long)
    kv_acc, kv_free, kv_num_free = torch.empty(B, N, **long), torch.empty(B, N, **long), torch.empty(B, **long)
    torch.ops.lumotree.tree_select(
        draft_tokens.long().contiguous(), (target.long() if greedy else target.float()).contiguous(),
        tree.first_child.contiguous(), tree.next_sibling.contiguous(), tree.num_nodes.long().contiguous(),
        coins.float().contiguous(), coins_final.float().contiguous(), cache_slots.long().contiguous(), greedy,
        accept_len, accept_nodes, bonus, conv_src, kv_acc, kv_free, kv_num_free)
    return bonus, CommitPlan(accept_len, accept_nodes, conv_src, kv_acc, kv_free, kv_num_free)


def tree_select_greedy(draft_tokens, target_tokens, tree: TreeDescriptor):
    bonus, plan = tree_select_and_plan(draft_tokens, target_tokens, tree, greedy=True)
    return plan.accept_len, plan.accept_nodes, bonus


def tree_select_sample(draft_tokens, target_probs, tree: TreeDescriptor, coins=None, coins_final=None, generator=None):
    bonus, plan = tree_select_and_plan(draft_tokens, target_probs, tree, greedy=False, coins=coins,
                                       coins_final=coins_final, generator=generator)
    return plan.accept_len, plan.accept_nodes, bonus
