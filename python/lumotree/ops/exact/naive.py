"""Reference of the decode-exact tree verify (fp32, loop-clear; the definition of the ops).

A node ``i`` of request ``b``'s draft tree, at depth ``d``, stands where a one-token decode would
stand after the committed prefix and the node's ancestors ``anc[0] (root) .. anc[d] = i``. The
decode-exact verify computes, per node, exactly that decode step:

* GDN (:func:`gdn_tree_exact_verify`): the gated delta rule applied token by token along the root
  path from the committed state -- the packed decode kernel's recurrence, with its gating
  (``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)`` rounded to ``b``'s dtype) and
  its in-kernel L2 norms (``x / sqrt(sum x^2 + 1e-6)``);
* conv (:func:`conv_tree_exact_states`): the decode conv's state before the node -- the committed
  window for the root, the parent's window otherwise;
* attention (:func:`tree_decode_kv`): the KV slots a decode at that position reads -- the
  committed prefix, then the path's slots root first.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def root_path(parents: Optional[torch.Tensor], b: int, i: int):
    """Node ``i``'s root path in request ``b``, root first (``parents`` `[B, N]`, entry 0 ignored;
    None: a chain)."""
    if parents is None:
        return list(range(i + 1))
    path = [i]
    while path[-1] > 0:
        path.append(int(parents[b, path[-1]]))
    return path[::-1]


def decode_gates(a, b, A_log, dt_bias, softplus_threshold: float = 20.0):
    """``(g, beta)`` fp32 as the packed decode kernel computes them (``beta`` rounded to ``b``'s dtype)."""
    x = a.float() + dt_bias.float()
    sp = torch.where(x <= softplus_threshold, torch.log(1.0 + torch.exp(x)), x)
    g = -torch.exp(A_log.float()) * sp
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    return g, beta


def _l2(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gdn_tree_exact_verify(x, a, b, A_log, dt_bias, state, state_indices, parents, H: int, scale: float):
    """Every node's GDN output by the decode recurrence along its root path; the pool is not written.

    Args:
        x (torch.Tensor): `[B, N, H*K + H*K + HV*V]` the conv output (q, k, v packed, as decode reads it).
        a, b (torch.Tensor): `[B, N, HV]` gate inputs.
        A_log, dt_bias (torch.Tensor): `[HV]`.
        state (torch.Tensor): `[S, HV, V, K]` the state pool (read at ``state_indices``).
        state_indices (torch.Tensor): `[B]` pool rows (``-1``: padding, output 0).
        parents (torch.Tensor): `[B, N]` (entry 0 ignored) or None (chains).
    Returns:
        `[B, N, HV, V]` fp32.
    """
    B, N, _ = x.shape
    HV, V, K = state.shape[1:]
    g, beta = decode_gates(a, b, A_log, dt_bias)
    q, k, v = x.float().split([H * K, H * K, HV * V], dim=-1)
    q = q.reshape(B, N, H, K).repeat_interleave(HV // H, dim=2)
    k = k.reshape(B, N, H, K).repeat_interleave(HV // H, dim=2)
    v = v.reshape(B, N, HV, V)
    o = torch.zeros(B, N, HV, V)
    for bi in range(B):
        row = int(state_indices[bi])
        if row < 0:
            continue
        for i in range(N):
            h = state[row].float().clone()
            for j in root_path(parents, bi, i):
                kj = _l2(k[bi, j])
                h = h * torch.exp(g[bi, j])[:, None, None]
                u = (v[bi, j] - torch.einsum("hvk,hk->hv", h, kj)) * beta[bi, j][:, None]
                h = h + u[:, :, None] * kj[:, None, :]
            o[bi, i] = torch.einsum("hvk,hk->hv", h, _l2(q[bi, i]) * scale)
    return o


def conv_tree_exact_states(root_state, windows, parents):
    """The decode conv's state before every node: ``root_state[b]`` for the root, the parent's
    window (the last ``W-1`` inputs ending at the parent) otherwise.

    Args:
        root_state (torch.Tensor): `[B, dim, W-1]` the committed conv states.
        windows (torch.Tensor): `[B, N, dim, W-1]` every node's window (after the node).
        parents (torch.Tensor): `[B, N]` (entry 0 ignored).
    Returns:
        `[B, N, dim, W-1]`.
    """
    B, N = parents.shape
    out = windows.new_empty(windows.shape)
    for bi in range(B):
        out[bi, 0] = root_state[bi]
        for i in range(1, N):
            out[bi, i] = windows[bi, int(parents[bi, i])]
    return out


def conv_decode_step(state, x, weight, bias, silu: bool = True):
    """One decode conv step: ``state`` `[dim, W-1]`, ``x`` `[dim]` -> `[dim]` (fp32)."""
    win = torch.cat([state.float(), x.float()[:, None]], dim=1)
    y = (win * weight.float()).sum(-1) + (bias.float() if bias is not None else 0.0)
    return F.silu(y) if silu else y


def tree_decode_kv(req_to_token, req_pool_indices, seq_lens, parents, out_cache_loc, N: int):
    """Per node (``b * N + i``) the KV slots a decode at its position reads: the committed prefix
    ``req_to_token[req, :seq_len]`` then the root path's ``out_cache_loc``, root first.
    Returns ``(kv_indptr [B*N + 1], kv_indices)`` int32."""
    B = seq_lens.shape[0]
    lists = []
    for bi in range(B):
        pre = req_to_token[int(req_pool_indices[bi]), : int(seq_lens[bi])].tolist()
        for i in range(N):
            lists.append(pre + [int(out_cache_loc[bi * N + j]) for j in root_path(parents, bi, i)])
    indptr = torch.tensor([0] + [len(x) for x in lists]).cumsum(0).to(torch.int32)
    return indptr, torch.tensor([t for x in lists for t in x], dtype=torch.int32)
