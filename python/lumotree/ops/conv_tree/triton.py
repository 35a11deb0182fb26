"""Triton kernels for the tree causal conv1d; same signatures as ``naive.py``.

Verify: one program per (node, channel block). The window of node ``i`` is precomputed by
``conv_tree_window_index`` (static-shaped tensor ops over the descriptor): each column is a node
(its input row) or a column of the committed conv state (read in place from the pool row).
Commit: one program per (request, channel block) gathers the ``W-1`` sources of the new conv
state -- accepted nodes' inputs or older state columns -- into registers, then writes the row.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from lumotree.ops.commit.fallback import conv_commit_src
from lumotree.ops.conv_tree.naive import _check, conv_tree_window_index
from lumotree.ops.gdn_tree.common import check_accept
from lumotree.tree import TreeDescriptor

__all__ = ["conv_tree_verify", "conv_tree_commit", "conv_commit_src"]


@triton.jit
def conv_tree_verify_fwd_kernel(x, conv_state, weight, bias, win, y, state_indices, stride_state, num_nodes,
                                N: tl.constexpr, D: tl.constexpr, W: tl.constexpr, BD: tl.constexpr,
                                HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_STATE_INDICES: tl.constexpr):
    i_d, i_t = tl.program_id(0), tl.program_id(1)
    i_b = i_t // N
    i = i_t % N
    if i < tl.load(num_nodes + i_b):
        o_d = i_d * BD + tl.arange(0, BD)
        m_d = o_d < D
        if HAS_STATE_INDICES:
            row = tl.load(state_indices + i_b).to(tl.int64)
        else:
            row = i_b.to(tl.int64)
        acc = tl.zeros([BD], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
        for w in tl.static_range(W):
            src = tl.load(win + i_t * W + w)
            if src >= 0:
                col = tl.load(x + (i_b * N + src) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
            else:
                col = tl.load(conv_state + row * stride_state + o_d * (W - 1) + (-1 - src), mask=m_d,
                              other=0.0).to(tl.float32)
            acc += col * tl.load(weight + o_d * W + w, mask=m_d, other=0.0).to(tl.float32)
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        tl.store(y + i_t * D + o_d, acc.to(y.dtype.element_ty), mask=m_d)


@triton.jit
def conv_tree_commit_fwd_kernel(x, conv_state, src, accept_len, state_indices, stride_state,
                                N: tl.constexpr, D: tl.constexpr, WM1: tl.constexpr, WP: tl.constexpr,
                                BD: tl.constexpr, HAS_STATE_INDICES: tl.constexpr):
    i_d, i_b = tl.program_id(0), tl.program_id(1)
    if tl.load(accept_len + i_b) > 0:
        o_d = i_d * BD + tl.arange(0, BD)
        o_w = tl.arange(0, WP)
        m_w = o_w < WM1
        m = (o_d < D)[:, None] & m_w[None, :]
        if HAS_STATE_INDICES:
            row = tl.load(state_indices + i_b).to(tl.int64)
        else:
            row = i_b.to(tl.int64)
        s = tl.load(src + i_b * WM1 + o_w, mask=m_w, other=0)  # [WP]
        from_node = s >= 0
        p_x = x + (i_b * N + tl.where(from_node, s, 0))[None, :] * D + o_d[:, None]
        p_c = conv_state + row * stride_state + o_d[:, None] * WM1 + tl.where(from_node, 0, -1 - s)[None, :]
        b_x = tl.load(p_x, mask=m & from_node[None, :], other=0.0)
        b_c = tl.load(p_c, mask=m & (~from_node)[None, :], other=0.0)
        val = tl.where(from_node[None, :], b_x.to(tl.float32), b_c.to(tl.float32))
        tl.debug_barrier()  # every read of the old row happens before any write
        tl.store(conv_state + row * stride_state + o_d[:, None] * WM1 + o_w[None, :],
                 val.to(conv_state.dtype.element_ty), mask=m)


def conv_tree_verify(x, conv_state, weight, bias, tree: TreeDescriptor, activation: Optional[str] = "silu",
                     state_indices: Optional[torch.Tensor] = None, window_index: Optional[torch.Tensor] = None):
    B, N, D = _check(x, conv_state, tree, state_indices, weight)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    W = weight.shape[1]
    win = window_index if window_index is not None else conv_tree_window_index(tree, W).int()
    y = torch.zeros_like(x)
    BD = min(triton.next_power_of_2(D), 256)
    conv_tree_verify_fwd_kernel[(triton.cdiv(D, BD), B * N)](
        x.contiguous(), conv_state, weight.contiguous(), bias if bias is not None else weight, win.contiguous(), y,
        state_indices if state_indices is not None else win, conv_state.stride(0), tree.num_nodes,
        N=N, D=D, W=W, BD=BD, HAS_BIAS=bias is not None, SILU=activation is not None,
        HAS_STATE_INDICES=state_indices is not None)
    return y


def conv_tree_commit(x, conv_state, tree: TreeDescriptor, accept_nodes, accept_len,
                     state_indices: Optional[torch.Tensor] = None):
    B, N, D = _check(x, conv_state, tree, state_indices)
    check_accept(accept_nodes, accept_len, B, N)
    Wm1 = conv_state.shape[2]
    if Wm1 == 0:
        return conv_state
    src = conv_commit_src(accept_nodes, accept_len, Wm1).int().contiguous()
    BD = min(triton.next_power_of_2(D), 128)
    conv_tree_commit_fwd_kernel[(triton.cdiv(D, BD), B)](
        x.contiguous(), conv_state, src, accept_len.contiguous(),
        state_indices if state_indices is not None else src, conv_state.stride(0),
        N=N, D=D, WM1=Wm1, WP=triton.next_power_of_2(Wm1), BD=BD, HAS_STATE_INDICES=state_indices is not None)
    return conv_state
