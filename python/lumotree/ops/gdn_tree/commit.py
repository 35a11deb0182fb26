"""GDN tree commit kernels: the accepted root path replayed from the committed state into the same
pool row, one rank-1 gated delta rule step per accepted node, the tile in registers throughout. No
per-node snapshots anywhere; the prefix cache's interval snapshot (SGLang's ``mamba_track``) is
written by the same replay when the path crosses it.

* :func:`gdn_tree_commit_layers_fwd` -- what the SGLang backend calls after acceptance: every GDN
  layer in one launch, reading the raw k, v and gates the verify kept per running request, the
  accepted path found in the kernel by walking the verify tree's parents up from the last
  accepted node.
* :func:`gdn_tree_commit_fwd` -- the public op's form: one layer, the accepted nodes listed
  (``accept_nodes``/``accept_len``), gates given or fused.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from lumotree.ops.gdn_tree.tiles import _delta_rule_step, _gdn_gate, _layer_tile, _replay_node, _root_path, \
    _track_pos, as_int32

__all__ = ["gdn_tree_commit_layers_fwd", "gdn_tree_commit_fwd", "commit_bv"]


@triton.jit
def gdn_tree_commit_layers_fwd_kernel(
    k, v, g, beta, rnorm, state, rows, ring_rows, parents, last, track_rows, track_steps,
    stride_kl, stride_ks, stride_vl, stride_vs, stride_gl, stride_gs, stride_rl, stride_rs, stride_sl, stride_ss, NP,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_PARENTS: tl.constexpr,
    HAS_TRACK: tl.constexpr, HAS_RNORM: tl.constexpr,
):
    """Replay commit of every GDN layer in one launch (grid: V-blocks x requests x value heads x
    layers), reading the verify's buffers in place: ``k[l, r, node]`` `[Hk, K]`, ``v[l, r, node]``
    `[Hv, V]`, ``g/beta[l, r, node]`` `[Hv]` with ``r = ring_rows[b]`` (``HAS_RNORM``: and each key's inverse L2
    norm ``rnorm[l, r, node]`` `[Hk]`); the state is read and written at pool row ``rows[b]``."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    # 64-bit layer offsets: a served pool is [L, slots, Hv, V, K] with ~10^5 slots, so layer
    # i_l * stride_sl passes 2^31 elements from the third layer on (int32 would wrap)
    i_l = tl.program_id(2).to(tl.int64)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    row = tl.load(rows + i_b).to(tl.int64)
    r_row = tl.load(ring_rows + i_b).to(tl.int64)  # where the verify kept this request's k, v, g, beta
    lst = tl.load(last + i_b).to(tl.int32)
    if (row >= 0) & (r_row >= 0) & (lst >= 0):
        o_n = tl.arange(0, BN)
        anc, d = _root_path(parents, lst, i_b, NP, BN, HAS_PARENTS)
        t_row, t_pos = _track_pos(track_rows, track_steps, i_b, anc, o_n, d, HAS_TRACK)
        o_k, o_v, mask_k, mask_v, mask_h, p_h, b_h = _layer_tile(state + i_l * stride_sl, row, stride_ss, i_hv, i_v,
                                                                 K, V, BK, BV)
        kr, vr, gr, br = k + i_l * stride_kl + r_row * stride_ks, v + i_l * stride_vl + r_row * stride_vs, \
            g + i_l * stride_gl + r_row * stride_gs, beta + i_l * stride_gl + r_row * stride_gs  # the request's row
        rr = rnorm + i_l * stride_rl + r_row * stride_rs
        for j in range(0, d + 1):
            b_h = _replay_node(b_h, kr, vr, gr, br, rr, tl.sum(tl.where(o_n == j, anc, 0)), i_hk, i_hv, o_k, o_v,
                               mask_k, mask_v, HK, HV, K, V, USE_QK_L2NORM, HAS_RNORM)
            if HAS_TRACK:
                if j == t_pos:
                    tl.store(state + i_l * stride_sl + t_row * stride_ss + i_hv * V * K + o_v[:, None] * K
                             + o_k[None, :], b_h.to(state.dtype.element_ty), mask=mask_h)
        tl.store(p_h, b_h.to(state.dtype.element_ty), mask=mask_h)


@triton.jit
def gdn_tree_commit_fwd_kernel(
    k, v, g, beta, A_log, dt_bias, state, state_indices, accept_nodes, accept_len, track_rows, track_len,
    stride_state, N, L,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, FUSED_GATING: tl.constexpr,
    HAS_TRACK: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    n = tl.load(accept_len + i_b)
    if HAS_STATE_INDICES:
        row = tl.load(state_indices + i_b).to(tl.int64)
    else:
        row = i_b.to(tl.int64)
    if (n > 0) & (row >= 0):
        o_k, o_v, mask_k, mask_v, mask_h, p_h, b_h = _layer_tile(state, row, stride_state, i_hv, i_v, K, V, BK, BV)
        if HAS_TRACK:  # also store the state after the first track_len accepted nodes to track_rows[b]
            t_row = tl.load(track_rows + i_b).to(tl.int64)
            t_len = tl.load(track_len + i_b)
            if (t_row >= 0) & (t_len == 0):
                tl.store(state + t_row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                         b_h.to(state.dtype.element_ty), mask=mask_h)
        for j in range(0, n):
            i = tl.load(accept_nodes + i_b * L + j)
            tok = i_b * N + i
            b_k = tl.load(k + (tok * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
            b_v = tl.load(v + (tok * HV + i_hv) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
            b_g, b_beta = _gdn_gate(g + tok * HV + i_hv, beta + tok * HV + i_hv, A_log + i_hv, dt_bias + i_hv,
                                    FUSED_GATING, True)
            b_h = _delta_rule_step(b_h, b_k, b_v, b_g, b_beta, USE_QK_L2NORM)
            if HAS_TRACK:
                if (t_row >= 0) & (t_len == j + 1):
                    tl.store(state + t_row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                             b_h.to(state.dtype.element_ty), mask=mask_h)
        tl.store(p_h, b_h.to(state.dtype.element_ty), mask=mask_h)


def commit_bv(V: int) -> int:
    """The replay's V-block (16: the best tile of the first H200 sweep)."""
    return min(triton.next_power_of_2(V), 16)


def gdn_tree_commit_layers_fwd(k, v, g, beta, state, rows, last, parents=None, track_rows=None,
                               track_steps=None, use_qk_l2norm: bool = True, BV: Optional[int] = None,
                               num_warps: int = 4, ring_rows: Optional[torch.Tensor] = None,
                               rnorm: Optional[torch.Tensor] = None):
    """Launcher of the all-layer replay commit (what the SGLang backend calls); updates ``state`` in place.

    Args:
        k (torch.Tensor): `[L, R, NR, Hk, K]` the verify's raw k per layer, request row and node.
        v (torch.Tensor): `[L, R, NR, Hv, V]`.
        g, beta (torch.Tensor): `[L, R, NR, Hv]` fp32 log decay and beta.
        state (torch.Tensor): `[L, S, Hv, V, K]` the state pool, updated in place at ``rows``.
        rows (torch.Tensor): `[B]` state slots (``-1``: skip).
        last (torch.Tensor): `[B]` last accepted node (``-1``: skip).
        parents (torch.Tensor): `[B, NP]` the verify tree (SGLang's format, entry 0 ignored), or None for chains.
        track_rows, track_steps (torch.Tensor): `[B]` optional prefix-cache snapshot rows and the
            path node after which each is taken (``-1``: none).
        ring_rows (torch.Tensor): `[B]` rows of k/v/g/beta holding each request's verify inputs
            (default ``rows``: buffers kept per state slot).
        rnorm (torch.Tensor): `[L, R, NR, Hk]` fp32, optional, with ``use_qk_l2norm``: each key's inverse L2 norm as
            the verify stored it (the ring's fifth buffer), read instead of formed again by every program.
    """
    L, S, NR, HK, K = k.shape
    HV, V = v.shape[3], v.shape[4]
    B = rows.shape[0]
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if tuple(v.shape[:3]) != (L, S, NR) or tuple(g.shape) != (L, S, NR, HV) or tuple(beta.shape) != (L, S, NR, HV):
        raise ValueError(f"v/g/beta must be [L, R, NR, Hv(, V)] = {(L, S, NR, HV, V)}, got "
                         f"{tuple(v.shape)}, {tuple(g.shape)}, {tuple(beta.shape)}")
    if state.dim() != 5 or state.shape[0] != L or tuple(state.shape[2:]) != (HV, V, K):
        raise ValueError(f"state must be [L, S, Hv, V, K] = {(L, 'S', HV, V, K)}, got {tuple(state.shape)}")
    ring_rows = rows if ring_rows is None else ring_rows
    if ring_rows.shape[0] < B:
        raise ValueError(f"ring_rows must have >= {B} entries, got {tuple(ring_rows.shape)}")
    if parents is not None and (parents.dim() != 2 or parents.shape[0] < B or parents.shape[1] > NR):
        raise ValueError(f"parents must be [>= B, <= NR] = [>={B}, <={NR}], got {tuple(parents.shape)}")
    if (track_rows is None) != (track_steps is None):
        raise ValueError("track_rows and track_steps go together")
    if rnorm is not None and (tuple(rnorm.shape) != (L, S, NR, HK) or rnorm.dtype != torch.float32
                              or not rnorm.is_contiguous() or not use_qk_l2norm):
        raise ValueError(f"rnorm must be contiguous fp32 [L, R, NR, Hk] = {(L, S, NR, HK)} with use_qk_l2norm, got "
                         f"{tuple(rnorm.shape)} {rnorm.dtype}")
    NP = parents.shape[1] if parents is not None else NR
    BN = triton.next_power_of_2(max(NP, 2))
    BK = triton.next_power_of_2(K)
    BV = BV or commit_bv(V)
    dummy = rows
    gdn_tree_commit_layers_fwd_kernel[(triton.cdiv(V, BV), B * HV, L)](
        k, v, g, beta, rnorm if rnorm is not None else g, state, rows, ring_rows,
        parents.contiguous() if parents is not None else dummy, last,
        track_rows if track_rows is not None else dummy, track_steps if track_steps is not None else dummy,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
        rnorm.stride(0) if rnorm is not None else 0, rnorm.stride(1) if rnorm is not None else 0, state.stride(0),
        state.stride(1), NP,
        HK=HK, HV=HV, K=K, V=V, BN=BN, BK=BK, BV=BV, USE_QK_L2NORM=use_qk_l2norm,
        HAS_PARENTS=parents is not None, HAS_TRACK=track_rows is not None, HAS_RNORM=rnorm is not None,
        num_warps=num_warps,
    )
    return state


def gdn_tree_commit_fwd(k, v, state, accept_nodes, accept_len, g=None, beta=None, *, A_log=None, a=None,
                        dt_bias=None, b=None, use_qk_l2norm: bool = False,
                        state_indices: Optional[torch.Tensor] = None, track_rows: Optional[torch.Tensor] = None,
                        track_len: Optional[torch.Tensor] = None, BV: Optional[int] = None, num_warps: int = 4):
    """Launcher of the one-layer replay commit over listed accepted nodes; updates ``state`` rows in place.

    ``track_rows`` / ``track_len`` `[B]` (optional, together): also write the state after the first
    ``track_len[b]`` accepted nodes to pool row ``track_rows[b]`` (``-1``: none)."""
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if (track_rows is None) != (track_len is None):
        raise ValueError("track_rows and track_len go together")
    BK = triton.next_power_of_2(K)
    BV = BV or commit_bv(V)
    dummy = state
    an, al = as_int32(accept_nodes), as_int32(accept_len)
    has_track = track_rows is not None
    gdn_tree_commit_fwd_kernel[(triton.cdiv(V, BV), B * HV)](
        k.contiguous(), v.contiguous(), (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, state,
        state_indices if state_indices is not None else dummy, an, al,
        track_rows if has_track else dummy, as_int32(track_len) if has_track else dummy,
        state.stride(0), N, an.shape[1],
        HK=HK, HV=HV, K=K, V=V, BK=BK, BV=BV,
        USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
        HAS_TRACK=has_track, num_warps=num_warps,
    )
    return state
