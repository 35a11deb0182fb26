"""The commit plan with static-shaped tensor ops (no host sync, no Python loop over requests):
the fallback of the CUDA op on GPUs without the extension, and the helper the kernels share."""
from __future__ import annotations

import torch

from lumotree.ops.commit.naive import CommitPlan
from lumotree.tree import TreeDescriptor

__all__ = ["conv_commit_src", "commit_plan_from_path"]


def conv_commit_src(accept_nodes: torch.Tensor, accept_len: torch.Tensor, Wm1: int) -> torch.Tensor:
    """`[B, W-1]` sources of the new conv state (node id, or ``-1-c`` old column c)."""
    B, L = accept_nodes.shape
    j = torch.arange(Wm1, device=accept_nodes.device)[None, :]
    pos = accept_len.long()[:, None] - Wm1 + j  # index into the accepted path; < 0 -> old state
    node = accept_nodes.long().gather(1, pos.clamp(0, max(L - 1, 0)))
    return torch.where(pos >= 0, node, -1 - (Wm1 + pos))


def commit_plan_from_path(tree: TreeDescriptor, accept_nodes, accept_len, cache_slots, conv_width: int) -> CommitPlan:
    B, N = tree.parents.shape
    an = accept_nodes.long()
    on = an >= 0
    acc_slots = torch.where(on, cache_slots.long().gather(1, an.clamp(min=0)), -1)
    on_path = torch.zeros(B, N + 1, dtype=torch.bool, device=an.device)
    on_path.scatter_(1, torch.where(on, an, N), True)
    rejected = tree.valid & ~on_path[:, :N]
    order = torch.argsort((~rejected).to(torch.int8), dim=1, stable=True)
    num_free = rejected.sum(1)
    free = cache_slots.long().gather(1, order)
    free = torch.where(torch.arange(N, device=an.device)[None, :] < num_free[:, None], free, -1)
    return CommitPlan(accept_len.long(), an, conv_commit_src(an, accept_len, conv_width - 1), acc_slots, free, num_free)
