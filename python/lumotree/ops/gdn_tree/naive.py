"""Reference (definition) of the gated-delta-rule tree ops. fp32 state math, readable loops.

For node ``i`` with parent ``p`` (``p = -1`` means the committed state ``S``), per value head ``h``
reading q/k head ``h // (Hv // Hk)``::

    S' = exp(g_i) * S_p
    u  = beta_i * (v_i - S' k_i)
    S_i = S' + u k_i^T            # state layout [V, K], SGLang 0.5.17
    o_i = scale * S_i q_i

Three ops are defined here:

* :func:`gdn_tree_verify_per_node` -- the snapshot semantics: every node's state is materialised
  (what SGLang 0.5.17 does with ``intermediate_ssm``). Memory ``N`` states per request.
* :func:`gdn_tree_verify` -- the LumoTree algorithm: walk the path decomposition of the tree
  (``TreeDescriptor.order``); along a path the state is carried, and only boundary states (after a
  node with >= 2 children) are stored, in slot ``depth``. It must equal the per-node reference.
* :func:`gdn_tree_commit` -- accepted-path replay: run the accepted root path from the committed
  state and write the result into the state pool in place.
"""
from __future__ import annotations

from typing import Optional

import torch

from lumotree.ops.gdn_tree.common import (check_accept, check_accept_is_root_path, check_gdn_inputs,
                                          l2norm)
from lumotree.tree import TreeDescriptor

__all__ = ["gdn_tree_verify", "gdn_tree_verify_per_node", "gdn_tree_verify_chunk", "gdn_tree_commit",
           "gdn_tree_commit_layers", "gdn_step"]


def gdn_step(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """One gated delta rule update. `S: [Hv, V, K]`, `k: [Hv, K]`, `v: [Hv, V]`, `g, beta: [Hv]`."""
    S = torch.exp(g)[:, None, None] * S
    u = beta[:, None] * (v - torch.einsum("hvk,hk->hv", S, k))
    return S + u[:, :, None] * k[:, None, :]


def _prepare(q, k, v, g, beta, state, use_qk_l2norm):
    """Upcast to the state's math dtype, L2-normalise, and expand k/q heads to value heads (GQA)."""
    dt = torch.promote_types(state.dtype, torch.float32)
    Hk, Hv = k.shape[2], v.shape[2]
    rep = Hv // Hk
    k = k.to(dt)
    q = q.to(dt) if q is not None else None
    if use_qk_l2norm:
        k = l2norm(k)
        q = l2norm(q) if q is not None else None
    k = k.repeat_interleave(rep, dim=2)
    q = q.repeat_interleave(rep, dim=2) if q is not None else None
    return q, k, v.to(dt), g.to(dt), beta.to(dt), dt


def _rows(state_indices, B, device):
    return torch.arange(B, device=device) if state_indices is None else state_indices.long()


def gdn_tree_verify_per_node(q, k, v, g, beta, state, tree: TreeDescriptor, scale: Optional[float] = None,
                             use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None):
    """Per-node snapshot reference. Args as :func:`gdn_tree_verify`. Returns `o: [B, N, Hv, V]`."""
    B, N, Hk, Hv, K, V = check_gdn_inputs(q, k, v, g, beta, state, tree, state_indices)
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta, dt = _prepare(q, k, v, g, beta, state, use_qk_l2norm)
    rows = _rows(state_indices, B, state.device)
    o = torch.zeros(B, N, Hv, V, dtype=dt, device=state.device)
    parents, num_nodes = tree.parents.tolist(), tree.num_nodes.tolist()
    for b in range(B):
        S0 = state[rows[b]].to(dt)
        snaps = []
        for i in range(num_nodes[b]):
            p = parents[b][i]
            S = gdn_step(S0 if p < 0 else snaps[p], k[b, i], v[b, i], g[b, i], beta[b, i])
            snaps.append(S)
            o[b, i] = scale * torch.einsum("hvk,hk->hv", S, q[b, i])
    return o


def gdn_tree_verify(q, k, v, g, beta, state, tree: TreeDescriptor, scale: Optional[float] = None,
                    use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None):
    """Path-parallel tree verify (LumoTree). Never writes ``state``.

    Args:
        q (torch.Tensor): `[B, N, Hk, K]`
        k (torch.Tensor): `[B, N, Hk, K]`
        v (torch.Tensor): `[B, N, Hv, V]`
        g (torch.Tensor): `[B, N, Hv]` log decay (<= 0)
        beta (torch.Tensor): `[B, N, Hv]`
        state (torch.Tensor): `[B, Hv, V, K]` fp32, or a pool `[P, Hv, V, K]` with ``state_indices``
        tree (TreeDescriptor): `[B, N]` trees
        scale (float): defaults to ``K ** -0.5``
        use_qk_l2norm (bool): L2-normalise q and k over K first
        state_indices (torch.Tensor): `[B]` pool rows of the committed states

    Returns:
        o (torch.Tensor): `[B, N, Hv, V]` in the state's math dtype; padding nodes are zero.
    """
    B, N, Hk, Hv, K, V = check_gdn_inputs(q, k, v, g, beta, state, tree, state_indices)
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta, dt = _prepare(q, k, v, g, beta, state, use_qk_l2norm)
    rows = _rows(state_indices, B, state.device)
    o = torch.zeros(B, N, Hv, V, dtype=dt, device=state.device)
    order, parents = tree.order.tolist(), tree.parents.tolist()
    is_head, is_boundary = tree.is_head.tolist(), tree.is_boundary.tolist()
    depth, num_nodes = tree.depth.tolist(), tree.num_nodes.tolist()
    for b in range(B):
        slots = {}  # boundary states, keyed by depth (see TreeDescriptor: collision-free)
        S = state[rows[b]].to(dt)  # the root path starts from the committed state
        for t in range(num_nodes[b]):
            i = order[b][t]
            if is_head[b][i] and i != 0:  # a dependent path starts from its boundary state
                S = slots[depth[b][parents[b][i]]]
            S = gdn_step(S, k[b, i], v[b, i], g[b, i], beta[b, i])
            o[b, i] = scale * torch.einsum("hvk,hk->hv", S, q[b, i])
            if is_boundary[b][i]:
                slots[depth[b][i]] = S
    return o


def gdn_tree_verify_chunk(q, k, v, g, beta, state, tree: TreeDescriptor, scale: Optional[float] = None,
                          use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None):
    """Reference of the tensor-core kernel's math: the whole tree as one chunk of the chunked (WY)
    gated delta rule, the causal mask replaced by the ancestor mask (docs/design.md)::

        G = M g (log decay summed along the root path), A_ij = beta_i (k_i.k_j) e^(G_i - G_j), j strict ancestor
        T = (I + A)^-1,  u = T (beta v) - T (beta e^G k) S0^T
        o_i = scale (e^(G_i) S0 q_i + sum_{j anc-or-self} (q_i.k_j) e^(G_i - G_j) u_j)

    Same arguments and result as :func:`gdn_tree_verify`."""
    B, N, Hk, Hv, K, V = check_gdn_inputs(q, k, v, g, beta, state, tree, state_indices)
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta, dt = _prepare(q, k, v, g, beta, state, use_qk_l2norm)
    rows = _rows(state_indices, B, state.device)
    M = tree.mask.to(dt) * tree.valid[:, None, :] * tree.valid[:, :, None]  # [B, N, N]
    strict = M * (1 - torch.eye(N, dtype=dt, device=M.device))
    G = torch.einsum("bij,bjh->bih", M, g)  # [B, N, Hv]
    D = torch.exp((G[:, :, None, :] - G[:, None, :, :]).clamp(max=0)) * M[..., None]  # [B, i, j, Hv]
    kk = torch.einsum("bihk,bjhk->bijh", k, k)
    A = beta[:, :, None, :] * kk * D * (strict[..., None])
    eye = torch.eye(N, dtype=dt, device=M.device)[None, :, :, None]
    T = torch.linalg.inv((eye + A).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # [B, i, j, Hv]
    S0 = state[rows].to(dt)  # [B, Hv, V, K]
    W = torch.einsum("bijh,bjhk->bihk", T, (beta * torch.exp(G))[..., None] * k)
    U = torch.einsum("bijh,bjhv->bihv", T, beta[..., None] * v)
    u = U - torch.einsum("bihk,bhvk->bihv", W, S0)
    qk = torch.einsum("bihk,bjhk->bijh", q, k) * D
    o = torch.exp(G)[..., None] * torch.einsum("bihk,bhvk->bihv", q, S0) + torch.einsum("bijh,bjhv->bihv", qk, u)
    return scale * o * tree.valid[:, :, None, None]


def gdn_tree_commit(k, v, g, beta, state, tree: TreeDescriptor, accept_nodes, accept_len,
                    use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None,
                    track_rows: Optional[torch.Tensor] = None, track_len: Optional[torch.Tensor] = None):
    """Replay the accepted root path ``accept_nodes[b, :accept_len[b]]`` into ``state`` in place.

    Args:
        k, v, g, beta: as in :func:`gdn_tree_verify` (the verify step's inputs).
        state (torch.Tensor): `[B, Hv, V, K]` or a pool with ``state_indices``; updated in place.
        accept_nodes (torch.Tensor): `[B, L]` node ids, root first, padded with -1.
        accept_len (torch.Tensor): `[B]`; 0 leaves the row untouched.
        track_rows (torch.Tensor): `[B]` optional pool rows (``-1``: none) that receive the state
            after the first ``track_len[b]`` accepted nodes (SGLang's prefix-cache snapshot).
        track_len (torch.Tensor): `[B]`, ``0 <= track_len[b] <= accept_len[b]``.
    """
    B, N, Hk, Hv, K, V = check_gdn_inputs(None, k, v, g, beta, state, tree, state_indices)
    check_accept(accept_nodes, accept_len, B, N)
    check_accept_is_root_path(tree, accept_nodes, accept_len)
    _, k, v, g, beta, dt = _prepare(None, k, v, g, beta, state, use_qk_l2norm)
    rows = _rows(state_indices, B, state.device)
    an, al = accept_nodes.tolist(), accept_len.tolist()
    if (track_rows is None) != (track_len is None):
        raise ValueError("track_rows and track_len go together")
    tr = track_rows.tolist() if track_rows is not None else [-1] * B
    tl_ = track_len.tolist() if track_len is not None else [0] * B
    for b in range(B):
        if al[b] == 0 or rows[b] < 0:
            continue
        if tr[b] >= 0 and not 0 <= tl_[b] <= al[b]:
            raise ValueError(f"track_len[{b}] = {tl_[b]} is outside [0, accept_len[{b}] = {al[b]}]")
        S = state[rows[b]].to(dt)
        if tr[b] >= 0 and tl_[b] == 0:
            state[tr[b]] = S.to(state.dtype)
        for j in range(al[b]):
            i = an[b][j]
            S = gdn_step(S, k[b, i], v[b, i], g[b, i], beta[b, i])
            if tr[b] >= 0 and tl_[b] == j + 1:
                state[tr[b]] = S.to(state.dtype)
        state[rows[b]] = S.to(state.dtype)
    return state


def gdn_tree_commit_layers(k, v, g, beta, state, rows, last, parents=None, track_rows=None, track_steps=None,
                           use_qk_l2norm: bool = True, ring_rows=None):
    """Reference of the all-layer replay commit on the verify's k/v/g/beta buffers (the SGLang backend's form).

    Args:
        k (torch.Tensor): `[L, R, NR, Hk, K]` the verify's k per layer, ring row and node.
        v (torch.Tensor): `[L, R, NR, Hv, V]`.
        g, beta (torch.Tensor): `[L, R, NR, Hv]`.
        state (torch.Tensor): `[L, S, Hv, V, K]`, updated in place at ``rows``.
        rows, last (torch.Tensor): `[B]` state slot and last accepted node (``-1`` in either: skip).
        ring_rows (torch.Tensor): `[B]` the row of k/v/g/beta of each request (default ``rows``).
        parents (torch.Tensor): `[B, NP]` the verify tree in SGLang's numbering (entry 0 ignored), or
            None for chains (the accepted path is ``0 .. last``).
        track_rows, track_steps (torch.Tensor): `[B]` optional rows that receive the state right after
            path node ``track_steps[b]`` (``-1``: none).
    """
    L, Hk, Hv = k.shape[0], k.shape[3], v.shape[3]
    rep = Hv // Hk
    rl, ll = rows.tolist(), last.tolist()
    rr = ring_rows.tolist() if ring_rows is not None else rl
    tr = track_rows.tolist() if track_rows is not None else [-1] * len(rl)
    ts = track_steps.tolist() if track_steps is not None else [-1] * len(rl)
    par = parents.tolist() if parents is not None else None
    dt = torch.float64 if state.dtype == torch.float64 else torch.float32
    for b, (row, last_node) in enumerate(zip(rl, ll)):
        r = rr[b]
        if row < 0 or r < 0 or last_node < 0:
            continue
        path = [last_node]
        while par is not None and path[-1] > 0:
            path.append(par[b][path[-1]])
        path = path[::-1] if par is not None else list(range(last_node + 1))
        for li in range(L):
            S = state[li, row].to(dt)
            for i in path:
                kk = k[li, r, i].to(dt)
                if use_qk_l2norm:
                    kk = l2norm(kk)
                S = gdn_step(S, kk.repeat_interleave(rep, 0), v[li, r, i].to(dt), g[li, r, i].to(dt),
                             beta[li, r, i].to(dt))
                if tr[b] >= 0 and ts[b] == i:
                    state[li, tr[b]] = S.to(state.dtype)
            state[li, row] = S.to(state.dtype)
    return state
