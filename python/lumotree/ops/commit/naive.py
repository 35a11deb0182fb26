"""Reference of the commit plan: everything a commit needs after acceptance, as index tensors.

Given the accepted root path ``accept_nodes[b, :accept_len[b]]``:

* ``conv_src`` `[B, W-1]`: where each column of the new conv state comes from, oldest first:
  ``>= 0`` a node id (its conv input), ``-1-c`` column ``c`` of the old conv state.
* ``kv_accept_slots`` `[B, N]`: the KV-cache slots of the accepted nodes, in path order (-1 padded).
  Slot ``j`` goes to the request's token map at position ``seq_len + j`` (node at depth ``j``).
* ``kv_free_slots`` `[B, N]`: the slots of rejected (valid, not accepted) nodes, compacted in node
  order (-1 padded), and ``kv_num_free`` `[B]` -- what goes back to the allocator.
"""
from __future__ import annotations

import dataclasses

import torch

from lumotree.ops.gdn_tree.common import check_accept, check_tree
from lumotree.tree import TreeDescriptor

__all__ = ["CommitPlan", "commit_plan"]


@dataclasses.dataclass
class CommitPlan:
    accept_len: torch.Tensor
    accept_nodes: torch.Tensor
    conv_src: torch.Tensor
    kv_accept_slots: torch.Tensor
    kv_free_slots: torch.Tensor
    kv_num_free: torch.Tensor


def commit_plan(tree: TreeDescriptor, accept_nodes, accept_len, cache_slots, conv_width: int) -> CommitPlan:
    """Build the commit plan (reference; loops over requests).

    Args:
        tree (TreeDescriptor): `[B, N]`
        accept_nodes (torch.Tensor): `[B, N]` root path, -1 padded
        accept_len (torch.Tensor): `[B]`
        cache_slots (torch.Tensor): `[B, N]` KV slot each node was written to during verify
        conv_width (int): W, the conv kernel width (the conv state keeps W-1 columns)
    """
    B, N = tree.parents.shape
    check_accept(accept_nodes, accept_len, B, N)
    if tuple(cache_slots.shape) != (B, N):
        raise ValueError(f"cache_slots must be [B, N] = {(B, N)}, got {tuple(cache_slots.shape)}")
    if conv_width < 1:
        raise ValueError(f"conv_width must be >= 1, got {conv_width}")
    check_tree(tree, B, N)
    Wm1 = conv_width - 1
    an, al, cs = accept_nodes.cpu(), accept_len.cpu(), cache_slots.cpu()
    nn = tree.num_nodes.cpu()
    conv_src = torch.empty(B, Wm1, dtype=torch.long)
    acc_slots = torch.full((B, N), -1, dtype=torch.long)
    free_slots = torch.full((B, N), -1, dtype=torch.long)
    num_free = torch.zeros(B, dtype=torch.long)
    for b in range(B):
        L = int(al[b])
        path = [int(an[b, j]) for j in range(L)]
        seq = [-1 - c for c in range(Wm1)] + path
        conv_src[b] = torch.tensor(seq[len(seq) - Wm1:] if Wm1 else [], dtype=torch.long)
        for j, node in enumerate(path):
            acc_slots[b, j] = cs[b, node]
        rejected = [int(cs[b, i]) for i in range(int(nn[b])) if i not in set(path)]
        free_slots[b, : len(rejected)] = torch.tensor(rejected, dtype=torch.long)
        num_free[b] = len(rejected)
    dev = tree.device
    return CommitPlan(accept_len.to(dev), accept_nodes.to(dev), conv_src.to(dev), acc_slots.to(dev),
                      free_slots.to(dev), num_free.to(dev))
