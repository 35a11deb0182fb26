"""Reference of the tree causal conv1d (Qwen3.5 / Qwen3-Next short convolution before the GDN).

A depthwise causal conv of width ``W`` over channels ``D``. SGLang 0.5.17 keeps the conv state as
``[pool, D, W-1]``: the last ``W-1`` inputs of the committed sequence, oldest first.

Verify: node ``i``'s window is, newest last, ``[..., x_grandparent, x_parent, x_i]`` -- its root path
in the tree -- completed on the left by the newest columns of the committed conv state::

    y_i[d] = act(bias[d] + sum_w weight[d, w] * window_i[d, w])

Commit: after accepting the root path ``a_0..a_{L-1}``, the conv state becomes the last ``W-1``
columns of ``[conv_state, x_{a_0}, ..., x_{a_{L-1}}]`` (a gather along the accepted path).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from lumotree.ops.gdn_tree.common import check_accept, check_accept_is_root_path, check_tree
from lumotree.tree import TreeDescriptor

__all__ = ["conv_tree_verify", "conv_tree_commit", "conv_tree_window_index"]


def _check(x, conv_state, tree, state_indices, weight=None):
    if x.dim() != 3:
        raise ValueError(f"x must be [B, N, D], got {tuple(x.shape)}")
    B, N, D = x.shape
    check_tree(tree, B, N)
    if conv_state.dim() != 3 or conv_state.shape[1] != D:
        raise ValueError(f"conv_state must be [pool, D, W-1] with D={D}, got {tuple(conv_state.shape)}")
    if state_indices is None and conv_state.shape[0] != B:
        raise ValueError(f"conv_state has {conv_state.shape[0]} rows for a batch of {B}; pass state_indices")
    if state_indices is not None and tuple(state_indices.shape) != (B,):
        raise ValueError(f"state_indices must be [B] = [{B}], got {tuple(state_indices.shape)}")
    if weight is not None and (weight.dim() != 2 or weight.shape[0] != D or weight.shape[1] != conv_state.shape[2] + 1):
        raise ValueError(f"weight must be [D, W] = [{D}, {conv_state.shape[2] + 1}] to match conv_state "
                         f"{tuple(conv_state.shape)}, got {tuple(weight.shape)}")
    return B, N, D


def conv_tree_window_index(tree: TreeDescriptor, W: int) -> torch.Tensor:
    """`[B, N, W]` source of each window column: ``>= 0`` a node id, ``-1-c`` conv-state column ``c``
    (counted from the oldest, ``0..W-2``). Static-shaped tensor ops; no host sync."""
    B, N = tree.parents.shape
    cols = []
    cur = torch.arange(N, device=tree.device)[None, :].expand(B, N)
    back = torch.zeros(B, N, dtype=torch.long, device=tree.device)  # steps already taken past the root
    for _ in range(W):
        cols.append(torch.where(cur >= 0, cur, -1 - (W - 2 - back)))
        back = back + (cur < 0).long()
        cur = torch.where(cur >= 0, tree.parents.gather(1, cur.clamp(min=0)), cur)
    return torch.stack(cols[::-1], -1)


def conv_tree_verify(x, conv_state, weight, bias, tree: TreeDescriptor, activation: Optional[str] = "silu",
                     state_indices: Optional[torch.Tensor] = None):
    """Tree causal conv1d.

    Args:
        x (torch.Tensor): `[B, N, D]` the nodes' conv inputs
        conv_state (torch.Tensor): `[B, D, W-1]` or a pool with ``state_indices``; not written
        weight (torch.Tensor): `[D, W]`
        bias (torch.Tensor): `[D]` or None
        tree (TreeDescriptor): `[B, N]`
        activation (str): ``"silu"`` or None

    Returns:
        y (torch.Tensor): `[B, N, D]` in x's dtype, computed in fp32 (or fp64 for fp64 inputs).
    """
    B, N, D = _check(x, conv_state, tree, state_indices, weight)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    W = weight.shape[1]
    dt = torch.promote_types(x.dtype, torch.float32)
    rows = torch.arange(B, device=x.device) if state_indices is None else state_indices.long()
    cs = conv_state[rows].to(dt)  # [B, D, W-1]
    y = torch.zeros(B, N, D, dtype=dt, device=x.device)
    parents, num_nodes = tree.parents.tolist(), tree.num_nodes.tolist()
    for b in range(B):
        for i in range(num_nodes[b]):
            window = []  # newest first
            node = i
            while node >= 0 and len(window) < W:
                window.append(x[b, node].to(dt))
                node = parents[b][node]
            c = W - 2
            while len(window) < W:
                window.append(cs[b, :, c])
                c -= 1
            win = torch.stack(window[::-1], -1)  # [D, W], oldest first
            acc = (win * weight.to(dt)).sum(-1)
            if bias is not None:
                acc = acc + bias.to(dt)
            y[b, i] = F.silu(acc) if activation is not None else acc
    return y.to(x.dtype)


def conv_tree_commit(x, conv_state, tree: TreeDescriptor, accept_nodes, accept_len,
                     state_indices: Optional[torch.Tensor] = None):
    """Gather the accepted path's last ``W-1`` inputs into ``conv_state`` in place."""
    B, N, D = _check(x, conv_state, tree, state_indices)
    check_accept(accept_nodes, accept_len, B, N)
    check_accept_is_root_path(tree, accept_nodes, accept_len)
    rows = torch.arange(B, device=x.device) if state_indices is None else state_indices.long()
    an, al = accept_nodes.tolist(), accept_len.tolist()
    for b in range(B):
        if al[b] == 0:
            continue
        seq = [conv_state[rows[b]]] + [x[b, an[b][j]].to(conv_state.dtype)[:, None] for j in range(al[b])]
        full = torch.cat(seq, -1)
        conv_state[rows[b]] = full[:, -conv_state.shape[2]:]
    return conv_state
