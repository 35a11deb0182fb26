"""Triton kernels for the GDN tree ops; same signatures as ``naive.py``.

Verify (``gdn_tree_verify_fwd_kernel``). A tile is (request ``b``, value head ``hv``, V-block
``iv``): a ``[BV, K]`` slice of the state, independent of every other tile. A persistent grid of
programs takes tiles round-robin. For its tile a program loads the committed state once (in place
from SGLang's pool row ``state_indices[b]``), then walks the tree's nodes in the descriptor's
depth-first ``order``: consecutive nodes of one path are chained in registers; when the walk
reaches the head of a dependent path, the program reloads the boundary state of the head's parent
from its scratch slot ``depth(parent)``; after a boundary node it stores the state into slot
``depth(node)``. Only boundary states ever leave registers, and the scratch is per *program*
(``programs x SLOTS x BV x K``), so it does not grow with the batch or with the tree's node count.

Commit (``gdn_tree_commit_fwd_kernel``): one program per tile replays the accepted root path from
the pool row and writes the final state back into the same row. No per-node snapshots anywhere.

Gating can be fused (``A_log, a, dt_bias, b`` -> ``g = -exp(A_log) softplus(a + dt_bias)``,
``beta = sigmoid(b)``, as SGLang's fused kernel does) or given precomputed (``g, beta``).
"""
from __future__ import annotations

import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from lumotree.ops.gdn_tree.common import L2NORM_EPS, check_accept, check_gdn_inputs
from lumotree.tree import TreeDescriptor

__all__ = ["gdn_tree_verify", "gdn_tree_commit", "gdn_tree_verify_fwd", "gdn_tree_chunk_verify_fwd",
           "gdn_tree_split_verify_fwd", "gdn_tree_commit_fwd", "gdn_tree_commit_vnew_fwd",
           "gdn_tree_commit_layers_fwd"]


@triton.jit
def _gdn_gate(p_g, p_beta, p_alog, p_dtb, FUSED_GATING: tl.constexpr, mask):
    if FUSED_GATING:
        x = tl.load(p_g, mask=mask, other=0.0).to(tl.float32) + tl.load(p_dtb).to(tl.float32)
        sp = tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)
        b_g = -tl.exp(tl.load(p_alog).to(tl.float32)) * sp
        b_beta = 1.0 / (1.0 + tl.exp(-tl.load(p_beta, mask=mask, other=0.0).to(tl.float32)))
    else:
        b_g = tl.load(p_g, mask=mask, other=0.0).to(tl.float32)
        b_beta = tl.load(p_beta, mask=mask, other=0.0).to(tl.float32)
    return b_g, b_beta


@triton.jit
def _delta_rule_step(b_h, b_k, b_v, b_g, b_beta, USE_QK_L2NORM: tl.constexpr):
    """One gated delta rule update of a `[BV, K]` fp32 state tile by one token (the replay's step)."""
    if USE_QK_L2NORM:
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
    b_h *= tl.exp(b_g)
    b_u = (b_v - tl.sum(b_h * b_k[None, :], 1)) * b_beta
    return b_h + b_u[:, None] * b_k[None, :]


@triton.jit
def _root_path(parents, last, i_b, NP, BN: tl.constexpr, HAS_PARENTS: tl.constexpr):
    """``(anc, d)``: the root path of node ``last`` of request ``i_b``, root first (``anc[j]`` is the
    node at depth ``j``, ``j <= d``), walked up SGLang-format ``parents`` `[B, NP]` (entry 0
    ignored); without parents the tree is a chain and the path is ``0 .. last``."""
    o_n = tl.arange(0, BN)
    if HAS_PARENTS:
        node = last
        d = 0
        while (node > 0) & (d < NP):
            node = tl.load(parents + i_b * NP + node).to(tl.int32)
            d += 1
        anc = tl.full([BN], -1, tl.int32)
        node = last
        j = d
        while j >= 0:
            anc = tl.where(o_n == j, node, anc)
            if j > 0:
                node = tl.load(parents + i_b * NP + node).to(tl.int32)
            j -= 1
    else:
        d = last
        anc = o_n
    return anc, d


@triton.jit
def _track_pos(track_rows, track_steps, i_b, anc, o_n, d, HAS_TRACK: tl.constexpr):
    """``(t_row, t_pos)``: the prefix-cache snapshot row of request ``i_b`` and the position on its
    accepted path (``anc[0..d]``) after which it is taken; ``t_pos = -1``: no snapshot."""
    t_pos = -1
    t_row = i_b.to(tl.int64) * 0 - 1
    if HAS_TRACK:
        t_row = tl.load(track_rows + i_b).to(tl.int64)
        t_node = tl.load(track_steps + i_b).to(tl.int32)
        on_path = (anc == t_node) & (o_n <= d)
        if (t_row >= 0) & (t_node >= 0) & (tl.sum(on_path.to(tl.int32)) > 0):
            t_pos = tl.sum(tl.where(on_path, o_n, 0))
    return t_row, t_pos


@triton.jit
def _path_rows(k, v, g, beta, anc, m_n, i_hk, i_hv, o_k, o_v, mask_k, mask_v, HK: tl.constexpr, HV: tl.constexpr,
               K: tl.constexpr, V: tl.constexpr, USE_QK_L2NORM: tl.constexpr, V_T: tl.constexpr):
    """The accepted path's rows from one request's ring buffers (pointers at its row; ``anc[j]``
    the node at depth ``j``, valid where ``m_n``), in one round of loads: keys `[BN, BK]`
    (L2-normalised if asked), values `[BN, BV]` (``V_T``: transposed, `[BV, BN]`), log decays and
    betas `[BN]` (0 off the path)."""
    node = tl.where(m_n, anc, 0)
    p_k = tl.load(k + (node[:, None] * HK + i_hk) * K + o_k[None, :], mask=m_n[:, None] & mask_k[None, :],
                  other=0.0).to(tl.float32)
    if V_T:
        p_vT = tl.load(v + (node[None, :] * HV + i_hv) * V + o_v[:, None], mask=m_n[None, :] & mask_v[:, None],
                       other=0.0).to(tl.float32)
    else:
        p_vT = tl.load(v + (node[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_n[:, None] & mask_v[None, :],
                       other=0.0).to(tl.float32)
    p_g = tl.load(g + node * HV + i_hv, mask=m_n, other=0.0).to(tl.float32)
    p_b = tl.load(beta + node * HV + i_hv, mask=m_n, other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        p_k = _l2norm_rows(p_k)
    return p_k, p_vT, p_g, p_b


@triton.jit
def _gathered_step(b_h, p_k, p_v, p_g, p_b, sel):
    """One replay step on a path gathered by :func:`_path_rows` (keys already normalised, values
    `[BN, BV]`): the node where ``sel`` is picked in registers."""
    return _delta_rule_step(b_h, tl.sum(tl.where(sel[:, None], p_k, 0.0), 0), tl.sum(tl.where(sel[:, None], p_v, 0.0), 0),
                            tl.sum(tl.where(sel, p_g, 0.0)), tl.sum(tl.where(sel, p_b, 0.0)), False)


@triton.jit
def _layer_tile(state, row, stride_ss, i_hv, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr):
    """``(o_k, o_v, mask_k, mask_v, mask_h, p_h, h)``: the fp32 state tile `[BV, BK]` of value head
    ``i_hv``, V-block ``i_v`` at pool row ``row`` of one layer's pool ``state``, and its pointers."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    p_h = state + row * stride_ss + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    return o_k, o_v, mask_k, mask_v, mask_h, p_h, tl.load(p_h, mask=mask_h, other=0.0).to(tl.float32)


@triton.jit
def _replay_node(b_h, k, v, g, beta, i, i_hk, i_hv, o_k, o_v, mask_k, mask_v,
                 HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 USE_QK_L2NORM: tl.constexpr, knorm=None):
    """Apply node ``i`` kept node-major in one request's buffers (``k`` `[NR, Hk, K]`, ``v``
    `[NR, Hv, V]`, ``g``/``beta`` `[NR, Hv]`, pointers at the request's row) to the state tile.
    ``knorm`` (``[NR, Hk]`` at the request's row, with ``USE_QK_L2NORM=False``): the keys' norms
    the verify kept, divided out instead of reducing the key again."""
    b_k = tl.load(k + (i * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    if knorm is not None:
        b_k = b_k * (1.0 / tl.load(knorm + i * HK + i_hk))
    b_v = tl.load(v + (i * HV + i_hv) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    b_g = tl.load(g + i * HV + i_hv).to(tl.float32)
    b_beta = tl.load(beta + i * HV + i_hv).to(tl.float32)
    return _delta_rule_step(b_h, b_k, b_v, b_g, b_beta, USE_QK_L2NORM)


@triton.jit
def _tree_chunk_inputs(q, k, v, g, beta, A_log, dt_bias, tok, i_hk, i_hv, o_k, o_v, m_t, m_k, m_v,
                       stride_qt, stride_kt, stride_vt, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       FUSED_GATING: tl.constexpr):
    """q, k `[BT, BK]` and v `[BT, BV]` of one request and head in fp32 -- rows may be views into one
    packed projection (token strides), heads contiguous in a row -- and the gates (beta 0 on padding)."""
    b_q = tl.load(q + tok[:, None] * stride_qt + i_hk * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    b_k = tl.load(k + tok[:, None] * stride_kt + i_hk * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    b_v = tl.load(v + tok[:, None] * stride_vt + i_hv * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                  other=0.0).to(tl.float32)
    b_g, b_beta = _gdn_gate(g + tok * HV + i_hv, beta + tok * HV + i_hv, A_log + i_hv, dt_bias + i_hv,
                            FUSED_GATING, m_t)
    b_beta = tl.where(m_t, b_beta, 0.0)
    return b_q, b_k, b_v, b_g, b_beta


@triton.jit
def _store_ring(ring_k, ring_v, ring_g, ring_beta, r_row, stride_rk, stride_rv, stride_rg, b_k, b_v, b_g, b_beta,
                store_k, store_g, o_t, o_k, o_v, m_t, m_k, m_v, i_hk, i_hv,
                HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, STORE_V: tl.constexpr = True):
    """What the replay commit needs, in request row ``r_row``: raw k (``store_k``: one program per
    k-head), v (``STORE_V``) and the gates (``store_g``: one program per value head), node-major."""
    if store_k:
        tl.store(ring_k + r_row * stride_rk + (o_t[:, None] * HK + i_hk) * K + o_k[None, :],
                 b_k.to(ring_k.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])
    if STORE_V:
        tl.store(ring_v + r_row * stride_rv + (o_t[:, None] * HV + i_hv) * V + o_v[None, :],
                 b_v.to(ring_v.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
    if store_g:
        tl.store(ring_g + r_row * stride_rg + o_t * HV + i_hv, b_g, mask=m_t)
        tl.store(ring_beta + r_row * stride_rg + o_t * HV + i_hv, b_beta, mask=m_t)


@triton.jit
def _tree_wy(b_q, b_k, b_g, b_beta, anc_mask, i_b, N, o_t, m_t, PRECISION_LOW: tl.constexpr,
             USE_QK_L2NORM: tl.constexpr):
    """The tree-masked WY chunk's state-independent core: ``(q, k)`` L2-normalised, the ancestor
    mask ``m``, the log decay ``G`` summed along each root path, ``decay = e^(G_i - G_j)`` on
    ancestors (0 elsewhere) and ``T = (I + A)^-1``."""
    if USE_QK_L2NORM:
        b_q = _l2norm_rows(b_q)
        b_k = _l2norm_rows(b_k)
    b_m = _anc_mask(anc_mask, i_b, N, o_t, m_t)
    # PRECISION_LOW: the dots whose rounding barely reaches the outputs (k k^T, the T products, w,
    # w h^T: ~1e-5 relative each in tf32, CPU-emulated); PRECISION: u, q h^T, q k^T, P vn (~3e-4 each)
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION_LOW)
    b_G, b_decay, b_T = _tree_T(b_kk, b_g, b_beta, b_m, o_t, PRECISION_LOW)
    return b_q, b_k, b_m, b_G, b_decay, b_T


@triton.jit
def _l2norm_rows(x):
    return x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]


@triton.jit
def _anc_mask(anc_mask, i_b, N, o_t, m_t):
    """Request ``i_b``'s ancestor mask (self included) as booleans `[BT, BT]`, False on padding."""
    m_tt = m_t[:, None] & m_t[None, :]
    return tl.load(anc_mask + i_b.to(tl.int64) * N * N + o_t[:, None] * N + o_t[None, :], mask=m_tt, other=0) != 0


@triton.jit
def _tree_T(b_kk, b_g, b_beta, b_m, o_t, PRECISION_LOW: tl.constexpr):
    """From the keys' Gram matrix ``k k^T``, one value head's gates and the ancestor mask: the log
    decay ``G`` summed along each root path, ``decay = e^(G_i - G_j)`` on ancestors (0 elsewhere)
    and ``T = (I + A)^-1`` with ``A = beta_i (k k^T)_ij decay_ij`` on strict ancestors."""
    b_G = tl.sum(tl.where(b_m, b_g[None, :], 0.0), 1)  # log decay summed along the root path
    b_decay = tl.exp(tl.where(b_m, b_G[:, None] - b_G[None, :], float("-inf")))  # 0 off the ancestor set
    eye = o_t[:, None] == o_t[None, :]
    b_A = tl.where(eye, 0.0, b_beta[:, None] * b_kk * b_decay)  # strict ancestors only
    # T = (I + A)^-1. A only links a node to its strict ancestors, so A^(depth+1) = 0 and
    # T = (I - A)(I + A^2)(I + A^4)... is exact once the power passes the depth: log2(depth) rounds.
    b_I = tl.where(eye, 1.0, 0.0)
    b_T = b_I - b_A
    dmax = tl.max(tl.sum(b_m.to(tl.int32), 1)) - 1
    b_P = b_A
    p = 1
    while 2 * p <= dmax:  # covers powers < 2p; A^(dmax+1) = 0
        b_P = tl.dot(b_P, b_P, input_precision=PRECISION_LOW)  # A^(2p)
        b_T = tl.dot(b_T, b_I + b_P, input_precision=PRECISION_LOW)
        p = p * 2
    return b_G, b_decay, b_T


@triton.jit
def gdn_tree_chunk_verify_fwd_kernel(
    q, k, v, g, beta, A_log, dt_bias, o, vnew, state, state_indices, anc_mask, num_nodes,
    ring_rows, ring_k, ring_v, ring_g, ring_beta, stride_rk, stride_rv, stride_rg,
    pc_rows, pc_last, pc_parents, pc_k, pc_v, pc_g, pc_beta, stride_pk, stride_pv, stride_pg, PC_NP,
    scale, stride_state, N, stride_qt, stride_kt, stride_vt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr,
    STORE_VNEW: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, FUSED_GATING: tl.constexpr,
    STORE_RING: tl.constexpr, PRE_COMMIT: tl.constexpr, PC_HAS_PARENTS: tl.constexpr, PC_BN: tl.constexpr,
):
    """All paths of one request's tree at once: the chunked (WY) gated delta rule over a single
    chunk holding the whole tree, with the causal mask replaced by the ancestor mask. Node i's
    quantities only involve its ancestors, so every root path is computed exactly as the chain
    it is; no per-node (and no boundary) state is ever formed."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    n = tl.load(num_nodes + i_b)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t = o_t < n
    m_k = o_k < K
    m_v = o_v < V
    tok = i_b * N + o_t
    # the committed state tile is the kernel's main traffic: issue its load first so its latency
    # overlaps the state-independent part (gating, T, W, U)
    if HAS_STATE_INDICES:
        row = tl.load(state_indices + i_b).to(tl.int64)
    else:
        row = i_b.to(tl.int64)
    b_h = tl.load(state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                  mask=m_v[:, None] & m_k[None, :] & (row >= 0), other=0.0)  # [BV, K] fp32
    if PRE_COMMIT:  # first commit the previous step's accepted path into the tile (and the pool): the
        # state is read once and written once per step for both (instead of commit: read + write,
        # then verify: read again)
        p_row = tl.load(pc_rows + i_b).to(tl.int64)
        p_last = tl.load(pc_last + i_b).to(tl.int32)
        if (row >= 0) & (p_row >= 0) & (p_last >= 0):
            b_h = b_h.to(tl.float32)
            anc, d = _root_path(pc_parents, p_last, i_b, PC_NP, PC_BN, PC_HAS_PARENTS)
            o_n = tl.arange(0, PC_BN)
            for j in range(0, d + 1):
                b_h = _replay_node(b_h, pc_k + p_row * stride_pk, pc_v + p_row * stride_pv, pc_g + p_row * stride_pg,
                                   pc_beta + p_row * stride_pg, tl.sum(tl.where(o_n == j, anc, 0)), i_hk, i_hv,
                                   o_k, o_v, m_k, m_v, HK, HV, K, V, USE_QK_L2NORM)
            tl.store(state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                     b_h.to(state.dtype.element_ty), mask=m_v[:, None] & m_k[None, :])
        # reload the committed tile (from L2; written by other threads of this program) in the layout
        # the verify's dots want, instead of converting the replay's layout through shared memory
        tl.debug_barrier()
        b_h = tl.load(state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                      mask=m_v[:, None] & m_k[None, :] & (row >= 0), other=0.0)
    b_q, b_k, b_v, b_g, b_beta = _tree_chunk_inputs(q, k, v, g, beta, A_log, dt_bias, tok, i_hk, i_hv, o_k, o_v,
                                                    m_t, m_k, m_v, stride_qt, stride_kt, stride_vt, HV, K, V,
                                                    FUSED_GATING)
    if STORE_RING:
        r_row = tl.load(ring_rows + i_b).to(tl.int64)
        if (row >= 0) & (r_row >= 0):
            _store_ring(ring_k, ring_v, ring_g, ring_beta, r_row, stride_rk, stride_rv, stride_rg, b_k, b_v, b_g,
                        b_beta, (i_v == 0) & (i_hv % (HV // HK) == 0), i_v == 0, o_t, o_k, o_v, m_t, m_k, m_v,
                        i_hk, i_hv, HK, HV, K, V)
    b_q, b_k, b_m, b_G, b_decay, b_T = _tree_wy(b_q, b_k, b_g, b_beta, anc_mask, i_b, N, o_t, m_t, PRECISION_LOW,
                                                USE_QK_L2NORM)
    b_eG = tl.exp(b_G)
    b_w = tl.dot(b_T, b_k * (b_beta * b_eG)[:, None], input_precision=PRECISION_LOW)  # [BT, K]
    b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=PRECISION)  # [BT, BV]
    b_h = b_h.to(tl.float32)
    b_vn = b_u - tl.dot(b_w, tl.trans(b_h), input_precision=PRECISION_LOW)  # the delta-rule innovations
    if STORE_VNEW:  # u_i per node and head: all the commit needs besides k and g (V floats, not V x K)
        tl.store(vnew + (tok[:, None] * HV + i_hv) * V + o_v[None, :], b_vn, mask=m_t[:, None] & m_v[None, :])
    b_qh = tl.dot(b_q, tl.trans(b_h), input_precision=PRECISION)
    b_p = tl.where(b_m, tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION) * b_decay, 0.0)
    b_o = (b_eG[:, None] * b_qh + tl.dot(b_p, b_vn, input_precision=PRECISION)) * scale
    tl.store(o + (tok[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@triton.jit
def gdn_tree_split_prep_fwd_kernel(
    q, k, v, g, beta, A_log, dt_bias, qt, c, state_indices, anc_mask, num_nodes,
    ring_rows, ring_k, ring_v, ring_g, ring_beta, stride_rk, stride_rv, stride_rg,
    scale, N, stride_qt, stride_kt, stride_vt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, FUSED_GATING: tl.constexpr,
    STORE_RING: tl.constexpr, FACTORED: tl.constexpr = False,
):
    """Split verify, pass 1 (one program per request and value head): everything of the
    tree-masked WY chunk that does not involve the state. With ``P`` the ancestor-masked, decayed
    ``q k^T``, ``w``/``u`` the WY-transformed keys/values and ``G`` the log decay along each root
    path, the chunk's output ``o = scale (e^G q h^T + P (u - w h^T))`` is rewritten as
    ``o = Q h^T + C`` with ``Q = scale (e^G q - P w)`` `[N, K]` and ``C = scale P u`` `[N, V]`,
    stored fp32 for pass 2, which reads the state once. No state is read or written here."""
    i_bh = tl.program_id(0)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    n = tl.load(num_nodes + i_b)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BVF)
    m_t = o_t < n
    m_k = o_k < K
    m_v = o_v < V
    tok = i_b * N + o_t
    b_q, b_k, b_v, b_g, b_beta = _tree_chunk_inputs(q, k, v, g, beta, A_log, dt_bias, tok, i_hk, i_hv, o_k, o_v,
                                                    m_t, m_k, m_v, stride_qt, stride_kt, stride_vt, HV, K, V,
                                                    FUSED_GATING)
    if STORE_RING:
        if HAS_STATE_INDICES:
            row = tl.load(state_indices + i_b).to(tl.int64)
        else:
            row = i_b.to(tl.int64)
        r_row = tl.load(ring_rows + i_b).to(tl.int64)
        if (row >= 0) & (r_row >= 0):
            _store_ring(ring_k, ring_v, ring_g, ring_beta, r_row, stride_rk, stride_rv, stride_rg, b_k, b_v, b_g,
                        b_beta, i_hv % (HV // HK) == 0, True, o_t, o_k, o_v, m_t, m_k, m_v, i_hk, i_hv, HK, HV, K, V)
    b_q, b_k, b_m, b_G, b_decay, b_T = _tree_wy(b_q, b_k, b_g, b_beta, anc_mask, i_b, N, o_t, m_t, PRECISION_LOW,
                                                USE_QK_L2NORM)
    b_eG = tl.exp(b_G)
    if FACTORED:  # M = P T first ([BT, BT]): two [BT, BT] x [BT, K|V] dots instead of four, no w / u tiles
        b_p = tl.where(b_m, tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION) * b_decay, 0.0)
        b_M = tl.dot(b_p, b_T, input_precision=PRECISION)
        b_qt = (b_eG[:, None] * b_q - tl.dot(b_M, b_k * (b_beta * b_eG)[:, None], input_precision=PRECISION)) * scale
        b_c = tl.dot(b_M, b_v * b_beta[:, None], input_precision=PRECISION) * scale
    else:  # (P after w and u: the order measured on the GPU)
        b_w = tl.dot(b_T, b_k * (b_beta * b_eG)[:, None], input_precision=PRECISION_LOW)  # [BT, BK]
        b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=PRECISION)  # [BT, BVF]
        b_p = tl.where(b_m, tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION) * b_decay, 0.0)
        b_qt = (b_eG[:, None] * b_q - tl.dot(b_p, b_w, input_precision=PRECISION)) * scale
        b_c = tl.dot(b_p, b_u, input_precision=PRECISION) * scale
    base = i_bh.to(tl.int64) * BT
    tl.store(qt + (base + o_t[:, None]) * BK + o_k[None, :], b_qt, mask=m_t[:, None])
    tl.store(c + (base + o_t[:, None]) * BVF + o_v[None, :], b_c, mask=m_t[:, None])


@triton.jit
def _state_tile(state, state_indices, stride_state, i_b, i_hv, i_v, K: tl.constexpr, V: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, HAS_STATE_INDICES: tl.constexpr):
    """``(row, o_k, o_v, m_k, m_v, h)``: request ``i_b``'s committed state tile `[BV, BK]` (fp32) of
    value head ``i_hv``, V-block ``i_v``, read in place from its pool row (row -1: zeros)."""
    if HAS_STATE_INDICES:
        row = tl.load(state_indices + i_b).to(tl.int64)
    else:
        row = i_b.to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    b_h = tl.load(state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                  mask=m_v[:, None] & m_k[None, :] & (row >= 0), other=0.0).to(tl.float32)
    return row, o_k, o_v, m_k, m_v, b_h


@triton.jit
def gdn_tree_split_apply_fwd_kernel(
    qt, c, o, state, state_indices, num_nodes, stride_state, N,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BVF: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
    APPLY_T: tl.constexpr = False,
):
    """Split verify, pass 2 (grid: V-blocks x requests x value heads): ``o = Q h^T + C`` -- the
    committed state tile is read once, in place from the pool row, and meets the whole tree in
    one dot; nothing else of the tree is on this pass's critical path. ``APPLY_T``: the dot is
    formed transposed, ``o^T = h Q^T`` `[BV, BT]`, so the state tile is the MMA's M-side operand
    (its rows fill the 64-row tensor-core tiles; a tree's <= 16 rows would fill a quarter) and can
    stay in registers; only ``Q`` goes through shared memory."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    row, o_k, o_v, m_k, m_v, b_h = _state_tile(state, state_indices, stride_state, i_b, i_hv, i_v, K, V, BK, BV,
                                               HAS_STATE_INDICES)
    n = tl.load(num_nodes + i_b)
    o_t = tl.arange(0, BT)
    m_t = o_t < n
    base = i_bh.to(tl.int64) * BT
    b_qt = tl.load(qt + (base + o_t[:, None]) * BK + o_k[None, :], mask=m_t[:, None], other=0.0)
    if APPLY_T:
        b_cT = tl.load(c + (base + o_t[None, :]) * BVF + o_v[:, None], mask=m_t[None, :] & m_v[:, None], other=0.0)
        b_oT = tl.dot(b_h, tl.trans(b_qt), input_precision=PRECISION) + b_cT
        tl.store(o + ((i_b * N + o_t[None, :]) * HV + i_hv) * V + o_v[:, None], b_oT.to(o.dtype.element_ty),
                 mask=m_t[None, :] & m_v[:, None])
    else:
        b_c = tl.load(c + (base + o_t[:, None]) * BVF + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_o = tl.dot(b_qt, tl.trans(b_h), input_precision=PRECISION) + b_c
        tl.store(o + ((i_b * N + o_t[:, None]) * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])


@triton.jit
def gdn_tree_mix_prep_fwd_kernel(
    q, k, g, beta, A_log, dt_bias, mix, state_indices, anc_mask, num_nodes,
    ring_rows, ring_k, ring_v, ring_g, ring_beta, stride_rk, stride_rv, stride_rg,
    scale, N, stride_qt, stride_kt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr, FUSED_GATING: tl.constexpr, STORE_RING: tl.constexpr,
    HEADS: tl.constexpr = 0, ring_knorm=None, stride_rn=0, STORE_KNORM: tl.constexpr = False,
):
    """Mix verify, pass 1 (one program per request and *key* head): the node-mixing matrices of
    the tree-masked WY chunk. The chunk's output ``o = scale (e^G q h^T + P T (beta v - beta e^G k
    h^T))`` is linear in ``q h^T``, ``k h^T`` and ``v``:

        o = diag(Lq) (q h^T) + Lk (k h^T) + Lv v,   Lq = scale e^G,  M = P T,
        Lk = -scale M diag(beta e^G),  Lv = scale M diag(beta)           ([BT] and [BT, BT])

    so this pass only needs the Gram matrices ``k k^T`` and ``q k^T`` (formed once per key head and
    shared by its ``Hv / Hk`` value heads) and ``[BT, BT]`` algebra per value head; no ``[BT, K]``
    or ``[BT, V]`` tile is formed or stored. Layout of ``mix`` per (request, value head):
    ``Lk [BT, BT] | Lv [BT, BT] | Lq [BT]`` fp32. Ring stores: raw k and the gates (v: pass 2).

    ``HEADS`` (a divisor of ``Hv / Hk``; 0 = all): value heads per program -- fewer spread one key
    head's value heads over more programs (each forms the Gram matrices again), for batches too
    small to fill the GPU with one program per key head. ``STORE_KNORM``: also keep each node's
    key norm ``sqrt(|k|^2 + 1e-6)`` in ``ring_knorm`` `[R, NR, Hk]` fp32 (the replay commit's
    ``HAS_KNORM``)."""
    GROUP: tl.constexpr = HV // HK
    if HEADS == 0 or HEADS == GROUP:
        i_bk = tl.program_id(0)
        j0 = 0
    else:
        i_bk = tl.program_id(0) // (GROUP // HEADS)
        j0 = (tl.program_id(0) % (GROUP // HEADS)) * HEADS
    i_b = i_bk // HK
    i_hk = i_bk % HK
    n = tl.load(num_nodes + i_b)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_t = o_t < n
    m_k = o_k < K
    tok = i_b * N + o_t
    b_q = tl.load(q + tok[:, None] * stride_qt + i_hk * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    b_k = tl.load(k + tok[:, None] * stride_kt + i_hk * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    store = False
    r_row = i_b.to(tl.int64)
    if STORE_RING:
        if HAS_STATE_INDICES:
            row = tl.load(state_indices + i_b).to(tl.int64)
        else:
            row = i_b.to(tl.int64)
        r_row = tl.load(ring_rows + i_b).to(tl.int64)
        store = (row >= 0) & (r_row >= 0)
        if store & (j0 == 0):  # (raw k: once per key head)
            tl.store(ring_k + r_row * stride_rk + (o_t[:, None] * HK + i_hk) * K + o_k[None, :],
                     b_k.to(ring_k.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])
            if STORE_KNORM:  # the key's L2 norm as the commit divides by it (it need not reduce k again)
                tl.store(ring_knorm + r_row * stride_rn + o_t * HK + i_hk, tl.sqrt(tl.sum(b_k * b_k, 1) + 1e-6),
                         mask=m_t)
    if USE_QK_L2NORM:
        b_q = _l2norm_rows(b_q)
        b_k = _l2norm_rows(b_k)
    b_m = _anc_mask(anc_mask, i_b, N, o_t, m_t)
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION_LOW)
    b_qk = tl.where(b_m, tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION), 0.0)
    for j in range(GROUP if HEADS == 0 else HEADS):
        i_hv = i_hk * GROUP + j0 + j
        b_g, b_beta = _gdn_gate(g + tok * HV + i_hv, beta + tok * HV + i_hv, A_log + i_hv, dt_bias + i_hv,
                                FUSED_GATING, m_t)
        b_beta = tl.where(m_t, b_beta, 0.0)
        if store:
            tl.store(ring_g + r_row * stride_rg + o_t * HV + i_hv, b_g, mask=m_t)
            tl.store(ring_beta + r_row * stride_rg + o_t * HV + i_hv, b_beta, mask=m_t)
        b_G, b_decay, b_T = _tree_T(b_kk, b_g, b_beta, b_m, o_t, PRECISION_LOW)
        b_eG = tl.exp(b_G)
        b_M = tl.dot(b_qk * b_decay, b_T, input_precision=PRECISION)  # P T
        base = (i_b * HV + i_hv).to(tl.int64) * (2 * BT * BT + BT)
        p_l = mix + base + o_t[:, None] * BT + o_t[None, :]
        tl.store(p_l, -scale * b_M * (b_beta * b_eG)[None, :])
        tl.store(p_l + BT * BT, scale * b_M * b_beta[None, :])
        tl.store(mix + base + 2 * BT * BT + o_t, scale * b_eG)


@triton.jit
def _mix_apply_tile(
    i_v, i_bh, q, k, v, mix, o, state, state_indices, num_nodes, ring_rows, ring_v, stride_rv, stride_state, N,
    stride_qt, stride_kt, stride_vt, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, STORE_RING: tl.constexpr, APPLY_T: tl.constexpr,
    APPLY_FMA: tl.constexpr,
):
    """One (V-block, request x value head) tile of the mix verify's pass 2 (see the kernels below)."""
    i_b = i_bh // HV
    i_hv = i_bh % HV
    row, o_k, o_v, m_k, m_v, b_h = _state_tile(state, state_indices, stride_state, i_b, i_hv, i_v, K, V, BK, BV,
                                               HAS_STATE_INDICES)
    _mix_apply_core(b_h, row, o_k, o_v, m_k, m_v, i_b, i_hv, i_bh, q, k, v, mix, o, num_nodes, ring_rows, ring_v,
                    stride_rv, N, stride_qt, stride_kt, stride_vt, HK, HV, K, V, BT, PRECISION, PRECISION_LOW,
                    USE_QK_L2NORM, STORE_RING, APPLY_T, APPLY_FMA)


@triton.jit
def _mix_apply_core(
    b_h, row, o_k, o_v, m_k, m_v, i_b, i_hv, i_bh, q, k, v, mix, o, num_nodes, ring_rows, ring_v, stride_rv, N,
    stride_qt, stride_kt, stride_vt, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    STORE_RING: tl.constexpr, APPLY_T: tl.constexpr, APPLY_FMA: tl.constexpr,
):
    """Pass 2 of the mix verify on a state tile ``b_h`` already in registers (pool row ``row``)."""
    i_hk = i_hv // (HV // HK)
    n = tl.load(num_nodes + i_b)
    o_t = tl.arange(0, BT)
    m_t = o_t < n
    tok = i_b * N + o_t
    b_q = tl.load(q + tok[:, None] * stride_qt + i_hk * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    b_k = tl.load(k + tok[:, None] * stride_kt + i_hk * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        b_q = _l2norm_rows(b_q)
        b_k = _l2norm_rows(b_k)
    base = i_bh.to(tl.int64) * (2 * BT * BT + BT)
    b_lq = tl.load(mix + base + 2 * BT * BT + o_t)
    if STORE_RING:
        r_row = tl.load(ring_rows + i_b).to(tl.int64)
    if APPLY_T:
        p_vT = tok[None, :] * stride_vt + i_hv * V + o_v[:, None]
        m_vT = m_t[None, :] & m_v[:, None]
        b_vT = tl.load(v + p_vT, mask=m_vT, other=0.0)  # [BV, BT]
        if STORE_RING:
            if (row >= 0) & (r_row >= 0):
                tl.store(ring_v + r_row * stride_rv + (o_t[None, :] * HV + i_hv) * V + o_v[:, None],
                         b_vT.to(ring_v.dtype.element_ty), mask=m_vT)
        b_lk = tl.load(mix + base + o_t[:, None] * BT + o_t[None, :])
        b_lvT = tl.load(mix + base + BT * BT + o_t[None, :] * BT + o_t[:, None])  # [j, i] = Lv[i, j]
        b_Q = b_lq[:, None] * b_q + tl.dot(b_lk, b_k, input_precision=PRECISION)  # [BT, K]
        if APPLY_FMA:
            b_oT = tl.dot(b_vT.to(tl.float32), b_lvT, input_precision=PRECISION)  # Lv v, transposed [BV, BT]
            for t in range(0, n):
                q_t = tl.sum(tl.where(o_t[:, None] == t, b_Q, 0.0), 0)  # row t of Q  [BK]
                col = tl.sum(b_h * q_t[None, :], 1)  # h Q[t]  [BV]
                b_oT = tl.where(o_t[None, :] == t, b_oT + col[:, None], b_oT)
        else:  # (the order measured on the GPU)
            b_oT = tl.dot(b_h, tl.trans(b_Q), input_precision=PRECISION)  # [BV, BT]
            b_oT += tl.dot(b_vT.to(tl.float32), b_lvT, input_precision=PRECISION)
        tl.store(o + (tok[None, :] * HV + i_hv) * V + o_v[:, None], b_oT.to(o.dtype.element_ty), mask=m_vT)
    else:
        b_v = tl.load(v + tok[:, None] * stride_vt + i_hv * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                      other=0.0)
        if STORE_RING:
            if (row >= 0) & (r_row >= 0):
                tl.store(ring_v + r_row * stride_rv + (o_t[:, None] * HV + i_hv) * V + o_v[None, :],
                         b_v.to(ring_v.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        p_l = mix + base + o_t[:, None] * BT + o_t[None, :]
        b_lk = tl.load(p_l)
        b_lv = tl.load(p_l + BT * BT)
        b_qh = tl.dot(b_q, tl.trans(b_h), input_precision=PRECISION)
        b_kh = tl.dot(b_k, tl.trans(b_h), input_precision=PRECISION_LOW)
        b_o = b_lq[:, None] * b_qh + tl.dot(b_lk, b_kh, input_precision=PRECISION)
        b_o += tl.dot(b_lv, b_v.to(tl.float32), input_precision=PRECISION)
        tl.store(o + (tok[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])


@triton.jit
def gdn_tree_mix_apply_fwd_kernel(
    q, k, v, mix, o, state, state_indices, num_nodes, ring_rows, ring_v, stride_rv, stride_state, N,
    stride_qt, stride_kt, stride_vt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr, STORE_RING: tl.constexpr, APPLY_T: tl.constexpr = False,
    APPLY_FMA: tl.constexpr = False,
):
    """Mix verify, pass 2 (grid: V-blocks x requests x value heads): the committed state tile is
    read once, in place from the pool row, and meets the tree's normalised queries and keys in two
    dots; pass 1's mixing matrices then combine them with the values:
    ``o = diag(Lq) (q h^T) + Lk (k h^T) + Lv v``. Also keeps raw v in the ring (for the commit).

    ``APPLY_T``: ``Q = diag(Lq) q + Lk k`` `[BT, K]` first (a small dot), then one state dot formed
    transposed, ``o^T = h Q^T + v^T Lv^T`` `[BV, BT]`: the state tile is the MMA's M-side operand
    (see :func:`gdn_tree_split_apply_fwd_kernel`). ``APPLY_FMA`` (with ``APPLY_T``): the state
    product in fp32 FMAs instead, one tree node per step (``oᵀ[:, t] = h Q[t]``, ``n`` steps) -- the
    state tile is never split into tf32 halves (the tf32x3 MMA's register cost) and the sums are
    exact fp32."""
    _mix_apply_tile(tl.program_id(0), tl.program_id(1), q, k, v, mix, o, state, state_indices, num_nodes, ring_rows,
                    ring_v, stride_rv, stride_state, N, stride_qt, stride_kt, stride_vt, HK, HV, K, V, BT, BK, BV,
                    PRECISION, PRECISION_LOW, USE_QK_L2NORM, HAS_STATE_INDICES, STORE_RING, APPLY_T, APPLY_FMA)


@triton.jit
def gdn_tree_mix_step_fwd_kernel(
    q, k, v, mix, o, state, state_indices, num_nodes, ring_rows, ring_v, stride_rv, stride_state, N,
    stride_qt, stride_kt, stride_vt,
    pc_rows, pc_last, pc_parents, pc_k, pc_v, pc_g, pc_beta, stride_pk, stride_pv, stride_pg, PC_NP,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr, STORE_RING: tl.constexpr, APPLY_T: tl.constexpr, APPLY_FMA: tl.constexpr,
    PC_HAS_PARENTS: tl.constexpr, PC_BN: tl.constexpr, PC_GATHER: tl.constexpr = True,
):
    """The fused step in mix form: pass 2 of this step's verify, with the previous step's replay
    commit done on the tile first. The tile is read once, the previous accepted path (its k, v and
    gates kept in a second ring, ``pc_*``, at ring row ``pc_rows[b]``; last node ``pc_last[b]``,
    -1: nothing to commit) is replayed onto it in registers, the committed tile is written back to
    the pool row, and this step's tree meets it -- one state read and one write per step for both
    (separately: the commit reads and writes, the verify reads again). ``PC_GATHER`` (default): the
    path's rows are loaded in one round first; ``False``: one round of loads per step, as the
    served replay commit (the gathered form measured slower)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    row, o_k, o_v, m_k, m_v, b_h = _state_tile(state, state_indices, stride_state, i_b, i_hv, i_v, K, V, BK, BV,
                                               HAS_STATE_INDICES)
    p_row = tl.load(pc_rows + i_b).to(tl.int64)
    p_last = tl.load(pc_last + i_b).to(tl.int32)
    if (row >= 0) & (p_row >= 0) & (p_last >= 0):
        o_n = tl.arange(0, PC_BN)
        anc, d = _root_path(pc_parents, p_last, i_b, PC_NP, PC_BN, PC_HAS_PARENTS)
        if PC_GATHER:
            p_k, p_v, p_g, p_b = _path_rows(pc_k + p_row * stride_pk, pc_v + p_row * stride_pv,
                                            pc_g + p_row * stride_pg, pc_beta + p_row * stride_pg, anc, o_n <= d,
                                            i_hv // (HV // HK), i_hv, o_k, o_v, m_k, m_v, HK, HV, K, V,
                                            USE_QK_L2NORM, False)
        for j in range(0, d + 1):
            if PC_GATHER:
                b_h = _gathered_step(b_h, p_k, p_v, p_g, p_b, o_n == j)
            else:
                b_h = _replay_node(b_h, pc_k + p_row * stride_pk, pc_v + p_row * stride_pv, pc_g + p_row * stride_pg,
                                   pc_beta + p_row * stride_pg, tl.sum(tl.where(o_n == j, anc, 0)),
                                   i_hv // (HV // HK), i_hv, o_k, o_v, m_k, m_v, HK, HV, K, V, USE_QK_L2NORM)
        tl.store(state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                 b_h.to(state.dtype.element_ty), mask=m_v[:, None] & m_k[None, :])
    _mix_apply_core(b_h, row, o_k, o_v, m_k, m_v, i_b, i_hv, i_bh, q, k, v, mix, o, num_nodes, ring_rows, ring_v,
                    stride_rv, N, stride_qt, stride_kt, stride_vt, HK, HV, K, V, BT, PRECISION, PRECISION_LOW,
                    USE_QK_L2NORM, STORE_RING, APPLY_T, APPLY_FMA)


@triton.jit
def gdn_tree_mix_apply_persistent_fwd_kernel(
    q, k, v, mix, o, state, state_indices, num_nodes, ring_rows, ring_v, stride_rv, stride_state, N,
    stride_qt, stride_kt, stride_vt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, PRECISION_LOW: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr, STORE_RING: tl.constexpr, APPLY_T: tl.constexpr, APPLY_FMA: tl.constexpr,
    NUM_TILES, NV: tl.constexpr, STAGES: tl.constexpr,
):
    """Pass 2 of the mix verify as a persistent grid: each program walks tiles ``pid, pid + P, ...``
    (V-blocks of one head adjacent) in a software-pipelined loop (``STAGES``), so the next tile's
    state load can be in flight while this tile's dots run -- the one-tile-per-program grid only
    overlaps tiles across its 3 resident programs per SM (166 registers at 4 warps, <= 16 nodes)."""
    for tile in tl.range(tl.program_id(0), NUM_TILES, tl.num_programs(0), num_stages=STAGES):
        # (tl.cast: the loop index is a plain int in the interpreter)
        _mix_apply_tile(tl.cast(tile % NV, tl.int32), tl.cast(tile // NV, tl.int32), q, k, v, mix, o, state,
                        state_indices, num_nodes, ring_rows, ring_v, stride_rv, stride_state, N, stride_qt, stride_kt,
                        stride_vt, HK, HV, K, V, BT, BK, BV,
                        PRECISION, PRECISION_LOW, USE_QK_L2NORM, HAS_STATE_INDICES, STORE_RING, APPLY_T, APPLY_FMA)


@triton.jit
def gdn_tree_verify_fwd_kernel(
    q, k, v, g, beta, A_log, dt_bias, o, state, state_indices, scratch, schedule, num_nodes,
    scale, num_tiles, stride_state, N,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, SLOTS: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, FUSED_GATING: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NV: tl.constexpr = (V + BV - 1) // BV
    o_k = tl.arange(0, BK)
    o_vb = tl.arange(0, BV)
    mask_k = o_k < K
    p_scr = scratch + pid.to(tl.int64) * (SLOTS * BV * BK) + o_vb[:, None] * BK + o_k[None, :]
    for tile in range(pid, num_tiles, nprog):
        i_v = tile % NV
        i_bh = tile // NV
        i_b = i_bh // HV
        i_hv = i_bh % HV
        i_hk = i_hv // (HV // HK)
        o_v = i_v * BV + o_vb
        mask_v = o_v < V
        mask_h = mask_v[:, None] & mask_k[None, :]
        if HAS_STATE_INDICES:
            row = tl.load(state_indices + i_b).to(tl.int64)
        else:
            row = i_b.to(tl.int64)
        p_h = state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_h, mask=mask_h & (row >= 0), other=0.0).to(tl.float32)
        n = tl.load(num_nodes + i_b)
        for t in range(0, n):
            # one packed word per step: node | (slot to resume from + 1) << 8 | (slot to save to + 1) << 16
            w = tl.load(schedule + i_b * N + t)
            i = w & 255
            load_slot = ((w >> 8) & 255) - 1
            save_slot = ((w >> 16) & 255) - 1
            if load_slot >= 0:  # head of a dependent path: resume from its boundary state
                b_h = tl.load(p_scr + load_slot * (BV * BK))
            tok = i_b * N + i
            b_q = tl.load(q + (tok * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
            b_k = tl.load(k + (tok * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
            b_v = tl.load(v + (tok * HV + i_hv) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
            b_g, b_beta = _gdn_gate(g + tok * HV + i_hv, beta + tok * HV + i_hv, A_log + i_hv, dt_bias + i_hv,
                                    FUSED_GATING, True)
            if USE_QK_L2NORM:
                b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
                b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            b_h *= tl.exp(b_g)
            b_u = (b_v - tl.sum(b_h * b_k[None, :], 1)) * b_beta
            b_h += b_u[:, None] * b_k[None, :]
            b_o = tl.sum(b_h * b_q[None, :], 1) * scale
            tl.store(o + (tok * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mask_v)
            if save_slot >= 0:  # boundary node: its state seeds the paths of its later children
                tl.store(p_scr + save_slot * (BV * BK), b_h)
                tl.debug_barrier()


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


@triton.jit
def gdn_tree_commit_layers_fwd_kernel(
    k, v, g, beta, state, rows, ring_rows, parents, last, track_rows, track_steps,
    stride_kl, stride_ks, stride_vl, stride_vs, stride_gl, stride_gs, stride_sl, stride_ss, NP,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_PARENTS: tl.constexpr,
    HAS_TRACK: tl.constexpr, GATHER: tl.constexpr = False, knorm=None, stride_nl=0, stride_ns=0,
    HAS_KNORM: tl.constexpr = False,
):
    """Replay commit of every GDN layer in one launch, reading the verify's buffers in place:
    ``k[l, r, node]`` `[Hk, K]`, ``v[l, r, node]`` `[Hv, V]`, ``g/beta[l, r, node]`` `[Hv]` with
    ``r = ring_rows[b]``; the state is read and written at pool row ``rows[b]``. The accepted root
    path is found here by walking ``parents`` up from ``last[b]``. ``GATHER``: the whole path's k,
    v and gates are loaded in one round before the steps (each step then picks its row in
    registers), instead of one dependent round of loads per step. ``HAS_KNORM``: each node's key
    norm is read from ``knorm[l, r, node]`` `[Hk]` (kept by the mix verify's pass 1) instead of
    reduced across the program's warps again at every step (a fifth of a step's instructions)."""
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
            g + i_l * stride_gl + r_row * stride_gs, beta + i_l * stride_gl + r_row * stride_gs  # the request's ring row
        if GATHER:
            p_k, p_v, p_g, p_b = _path_rows(kr, vr, gr, br, anc, o_n <= d, i_hk, i_hv, o_k, o_v, mask_k, mask_v,
                                            HK, HV, K, V, USE_QK_L2NORM, False)
        for j in range(0, d + 1):
            if GATHER:
                b_h = _gathered_step(b_h, p_k, p_v, p_g, p_b, o_n == j)
            elif HAS_KNORM:
                b_h = _replay_node(b_h, kr, vr, gr, br, tl.sum(tl.where(o_n == j, anc, 0)), i_hk, i_hv, o_k, o_v,
                                   mask_k, mask_v, HK, HV, K, V, False, knorm + i_l * stride_nl + r_row * stride_ns)
            else:
                b_h = _replay_node(b_h, kr, vr, gr, br, tl.sum(tl.where(o_n == j, anc, 0)), i_hk, i_hv, o_k, o_v,
                                   mask_k, mask_v, HK, HV, K, V, USE_QK_L2NORM)
            if HAS_TRACK:
                if j == t_pos:
                    tl.store(state + i_l * stride_sl + t_row * stride_ss + i_hv * V * K + o_v[:, None] * K
                             + o_k[None, :], b_h.to(state.dtype.element_ty), mask=mask_h)
        tl.store(p_h, b_h.to(state.dtype.element_ty), mask=mask_h)


@triton.jit
def gdn_tree_commit_layers_dot_fwd_kernel(
    k, v, g, beta, state, rows, ring_rows, parents, last, track_rows, track_steps,
    stride_kl, stride_ks, stride_vl, stride_vs, stride_gl, stride_gs, stride_sl, stride_ss, NP,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_PARENTS: tl.constexpr,
    HAS_TRACK: tl.constexpr, PRECISION: tl.constexpr,
):
    """The all-layer replay commit in chunk (WY) form: the accepted root path (``L = d + 1`` nodes,
    gathered from the verify's ring rows) is applied to the ``[BV, K]`` state tile with tensor-core
    dots instead of ``L`` dependent rank-1 steps. With the path's normalised keys ``k`` `[L, K]`,
    ``G`` its cumulative log decay, ``T = (I + A)^-1`` (``A`` the chain's strictly-lower
    ``beta_i (k_i . k_j) e^(G_i - G_j)``), ``X = h k^T`` `[BV, L]` and
    ``Y = v^T diag(beta) - X diag(beta e^G)``, the innovations are ``vn^T = Y T^T`` and

        h_L = e^(G_L) h + Y T^T diag(c) k,    c_j = e^(G_L - G_j)

    (the closed form of :func:`gdn_tree_commit_vnew_fwd_kernel` with ``vn`` formed here). The
    prefix-cache snapshot at path position ``t`` is the same with ``(G_t, c^(t))``. Same grid,
    arguments and results as :func:`gdn_tree_commit_layers_fwd_kernel`."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_l = tl.program_id(2).to(tl.int64)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    row = tl.load(rows + i_b).to(tl.int64)
    r_row = tl.load(ring_rows + i_b).to(tl.int64)
    lst = tl.load(last + i_b).to(tl.int32)
    if (row >= 0) & (r_row >= 0) & (lst >= 0):
        o_p = tl.arange(0, BL)
        anc, d = _root_path(parents, lst, i_b, NP, BL, HAS_PARENTS)
        m_p = o_p <= d
        o_k, o_v, mask_k, mask_v, mask_h, p_h, b_h = _layer_tile(state + i_l * stride_sl, row, stride_ss, i_hv, i_v,
                                                                 K, V, BK, BV)
        kr, vr, gr, br = k + i_l * stride_kl + r_row * stride_ks, v + i_l * stride_vl + r_row * stride_vs, \
            g + i_l * stride_gl + r_row * stride_gs, beta + i_l * stride_gl + r_row * stride_gs  # the request's ring row
        b_k, b_vT, b_g, b_beta = _path_rows(kr, vr, gr, br, anc, m_p, i_hk, i_hv, o_k, o_v, mask_k, mask_v,
                                            HK, HV, K, V, USE_QK_L2NORM, True)
        m_c = (o_p[:, None] >= o_p[None, :]) & m_p[:, None] & m_p[None, :]  # the path is a chain
        b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION)
        b_G, _, b_T = _tree_T(b_kk, b_g, b_beta, m_c, o_p, PRECISION)
        b_X = tl.dot(b_h, tl.trans(b_k), input_precision=PRECISION)  # h k^T [BV, BL]
        b_Y = b_vT * b_beta[None, :] - b_X * (b_beta * tl.exp(b_G))[None, :]
        b_Tt = tl.trans(b_T)
        g_last = tl.sum(tl.where(o_p == d, b_G, 0.0))
        b_c = tl.where(m_p, tl.exp(g_last - b_G), 0.0)
        b_Z = tl.dot(b_Y, b_Tt * b_c[None, :], input_precision=PRECISION)  # vn^T diag(c) [BV, BL]
        b_new = tl.exp(g_last) * b_h + tl.dot(b_Z, b_k, input_precision=PRECISION)
        if HAS_TRACK:
            t_row, t_pos = _track_pos(track_rows, track_steps, i_b, anc, o_p, d, HAS_TRACK)
            if t_pos >= 0:
                g_t = tl.sum(tl.where(o_p == t_pos, b_G, 0.0))
                b_ct = tl.where(o_p <= t_pos, tl.exp(g_t - b_G), 0.0)
                b_Zt = tl.dot(b_Y, b_Tt * b_ct[None, :], input_precision=PRECISION)
                b_snap = tl.exp(g_t) * b_h + tl.dot(b_Zt, b_k, input_precision=PRECISION)
                tl.store(state + i_l * stride_sl + t_row * stride_ss + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                         b_snap.to(state.dtype.element_ty), mask=mask_h)
        tl.store(p_h, b_new.to(state.dtype.element_ty), mask=mask_h)


@triton.jit
def gdn_tree_commit_vnew_fwd_kernel(
    k, g, beta, A_log, dt_bias, vnew, state, state_indices, accept_nodes, accept_len, stride_state, N, L,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, FUSED_GATING: tl.constexpr,
):
    """Replay in closed form, from the innovations u_j the chunk verify stored:
    S_L = exp(G_L) S_0 + sum_j exp(G_L - G_j) u_j k_j^T (G: log decay summed along the path).
    The terms are independent rank-1 FMAs (no reductions, no step-to-step dependency), so the
    kernel streams the state once: read S_0, write S_L."""
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
        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        mask_k = o_k < K
        mask_v = o_v < V
        mask_h = mask_v[:, None] & mask_k[None, :]
        p_h = state + row * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_h, mask=mask_h, other=0.0).to(tl.float32)
        b_acc = tl.zeros([BV, BK], dtype=tl.float32)
        run = 0.0  # log decay of the path after node j
        for jj in range(0, n):
            j = n - 1 - jj
            i = tl.load(accept_nodes + i_b * L + j)
            tok = i_b * N + i
            b_k = tl.load(k + (tok * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
            if USE_QK_L2NORM:
                b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            b_u = tl.load(vnew + (tok * HV + i_hv) * V + o_v, mask=mask_v, other=0.0)
            b_g, _ = _gdn_gate(g + tok * HV + i_hv, beta + tok * HV + i_hv, A_log + i_hv, dt_bias + i_hv,
                               FUSED_GATING, True)
            b_acc += (tl.exp(run) * b_u)[:, None] * b_k[None, :]
            run += b_g
        b_h = b_h * tl.exp(run) + b_acc
        tl.store(p_h, b_h.to(state.dtype.element_ty), mask=mask_h)


assert L2NORM_EPS == 1e-6  # the kernels above hard-code the shared epsilon


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's CPU interpreter (TRITON_INTERPRET=1) in tests
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def tree_kernel_args(tree: TreeDescriptor):
    """The walk the verify kernel follows, one int32 per step (static shapes, no sync):
    ``node | (resume slot + 1) << 8 | (save slot + 1) << 16`` in depth-first order, where a
    dependent path's head resumes from slot ``depth(parent)`` and a boundary node saves to slot
    ``depth(node)``; plus ``num_nodes``. Trees up to 255 nodes."""
    if tree.max_nodes > 255:
        raise ValueError(f"the verify kernel packs node ids in 8 bits: at most 255 nodes, got {tree.max_nodes}")
    idx = torch.arange(tree.max_nodes, device=tree.device)
    node = tree.order
    dependent = (tree.is_head & (idx[None, :] > 0)).gather(1, node)
    par = tree.parents.gather(1, node).clamp(min=0)
    resume = torch.where(dependent, tree.depth.gather(1, par) + 1, 0)
    save = torch.where(tree.is_boundary.gather(1, node), tree.depth.gather(1, node) + 1, 0)
    schedule = (node | (resume << 8) | (save << 16)).int().contiguous()
    return schedule, tree.num_nodes.int().contiguous()


def default_config(V: int, num_bh: int):
    """(BV, num_warps, programs_per_sm) for the verify kernel; ``num_bh`` = batch x value heads."""
    return min(triton.next_power_of_2(V), 16), 2, 8  # best of the first H200 sweep (benchmark/results)


def default_chunk_config(BT: int, V: int, dtype: torch.dtype):
    """(BV, num_warps, dot precision) for the chunk verify kernel at padded tree size ``BT``."""
    prec = "tf32x3" if dtype == torch.float32 else "tf32"
    if BT <= 32:
        return min(triton.next_power_of_2(V), 64), 4, prec
    # H200 sweep at 64 nodes, bs 32: BV=128 355 us vs 417 us for BV=64 (tf32); tf32x3 operands at
    # BV=128 need 256 KiB of shared memory (> 227 KiB), so fp32 inputs keep BV=64 (tested on the H200).
    return min(triton.next_power_of_2(V), 128 if prec == "tf32" else 64), 8, prec


SERVED_PRECISIONS = ("tf32x3", "mixed", "tf32")


def served_chunk_config(BT: int, V: int, setting: str = "tf32x3"):
    """(BV, num_warps, precision, precision_low) of the served chunk verify for a precision setting
    ``tf32x3`` fp32-accurate dots; ``tf32`` one-pass tf32 dots
    (~5e-4 relative on the outputs, CPU-emulated); ``mixed`` tf32x3 for the dots the outputs are
    sensitive to and tf32 for the others (~2e-5), with BV = 32 at trees of <= 16 nodes, where the
    static sm_90 profile shows it almost spill-free (24 B of stack per thread vs 1008 B for tf32x3)."""
    if setting not in SERVED_PRECISIONS:
        raise ValueError(f"precision setting must be one of {SERVED_PRECISIONS}, got {setting!r}")
    if setting == "tf32":
        BV, warps, prec = default_chunk_config(BT, V, torch.bfloat16)
        return BV, warps, prec, prec
    BV, warps, prec = default_chunk_config(BT, V, torch.float32)
    if setting == "mixed":
        return (min(BV, 32) if BT <= 16 else BV), warps, "tf32x3", "tf32"
    return BV, warps, prec, prec


def _default_bv(V: int) -> int:
    return default_config(V, 0)[0]


def gdn_tree_verify_fwd(q, k, v, state, tree: TreeDescriptor, g=None, beta=None, *, A_log=None, a=None,
                        dt_bias=None, b=None, scale: Optional[float] = None, use_qk_l2norm: bool = False,
                        state_indices: Optional[torch.Tensor] = None, num_slots: Optional[int] = None,
                        kernel_args=None, BV: Optional[int] = None, num_warps: Optional[int] = None,
                        programs_per_sm: Optional[int] = None, out: Optional[torch.Tensor] = None,
                        scratch: Optional[torch.Tensor] = None):
    """Launcher. Either ``g, beta`` or the raw gating ``A_log, a, dt_bias, b`` (fused).

    ``num_slots`` is a static bound on 1 + the deepest boundary's depth (default: the tree's
    maximum node depth, which needs one host sync; pass e.g. ``speculative_num_steps + 1`` under
    CUDA graphs). ``kernel_args`` / ``scratch`` / ``out`` can be preallocated for graph capture."""
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    BK = triton.next_power_of_2(K)
    d_bv, d_warps, d_pps = default_config(V, B * HV)
    BV, num_warps, programs_per_sm = BV or d_bv, num_warps or d_warps, programs_per_sm or d_pps
    NV = triton.cdiv(V, BV)
    if num_slots is None:
        num_slots = int(tree.depth.max().item()) + 1
    num_tiles = B * HV * NV
    nprog = max(1, min(num_tiles, _num_sms(q.device) * programs_per_sm))
    if scratch is None:
        scratch = torch.empty(nprog * num_slots * BV * BK, dtype=torch.float32, device=q.device)
    elif scratch.numel() < nprog * num_slots * BV * BK:
        raise ValueError(f"scratch holds {scratch.numel()} floats, needs {nprog * num_slots * BV * BK}")
    if out is None:
        out = torch.empty(B, N, HV, V, dtype=q.dtype, device=q.device)
    ka = kernel_args if kernel_args is not None else tree_kernel_args(tree)
    dummy = state  # unused pointer slots
    gdn_tree_verify_fwd_kernel[(nprog,)](
        q.contiguous(), k.contiguous(), v.contiguous(),
        (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, out, state,
        state_indices if state_indices is not None else dummy, scratch, *ka,
        scale, num_tiles, state.stride(0), N,
        HK=HK, HV=HV, K=K, V=V, BK=BK, BV=BV, SLOTS=num_slots,
        USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
        num_warps=num_warps,
    )
    return out


def _token_rows(x: torch.Tensor):
    """``(x, token stride)`` for a `[B, N, H, D]` tensor whose rows may be strided views into a packed
    projection (each token's `[H, D]` contiguous, tokens evenly spaced); anything else is copied."""
    B, N, H, D = x.shape
    if x.stride(3) == 1 and x.stride(2) == D and x.stride(0) == N * x.stride(1):
        return x, x.stride(1)
    return x.contiguous(), H * D


def _check_precisions(precision: str, precision_low: Optional[str]) -> str:
    """``precision_low`` (default ``precision``), both checked."""
    precision_low = precision_low or precision
    for name, p_ in (("precision", precision), ("precision_low", precision_low)):
        if p_ not in ("tf32", "tf32x3", "ieee"):
            raise ValueError(f"{name} must be tf32, tf32x3 or ieee, got {p_!r}")
    return precision_low


def _chunk_inputs(q, k, v, tree, anc_mask, num_nodes, out):
    """The tree-masked verifies' shared inputs: token-strided q/k/v, the int8 ancestor mask and node
    counts (from ``tree`` unless given), the output buffer."""
    if anc_mask is None:
        anc_mask = tree.mask.to(torch.int8)
    if num_nodes is None:
        num_nodes = tree.num_nodes
    B, N = k.shape[:2]
    HV, V = v.shape[2], v.shape[3]
    if out is None:
        out = torch.empty(B, N, HV, V, dtype=q.dtype, device=q.device)
    return _token_rows(q), _token_rows(k), _token_rows(v), anc_mask, num_nodes, out


def _ring_args(ring, ring_rows, state_indices, dims, dummy):
    """Kernel arguments of the verify's ring stores (raw k, v, g, beta per request row, node-major)."""
    B, N, HK, K, HV, V = dims
    if ring is None:
        return (dummy, dummy, dummy, dummy, dummy, 0, 0, 0)
    rk, rv, rg, rb = ring
    if state_indices is None:
        raise ValueError("ring stores need state_indices (padded requests, slot -1, store nothing)")
    ring_rows = state_indices if ring_rows is None else ring_rows
    if ring_rows.shape[0] < B:
        raise ValueError(f"ring_rows must have >= {B} entries, got {tuple(ring_rows.shape)}")
    if (tuple(rk.shape[1:]) != (rk.shape[1], HK, K) or tuple(rv.shape[2:]) != (HV, V) or rk.shape[1] < N
            or tuple(rg.shape[1:]) != (rk.shape[1], HV) or rb.shape != rg.shape
            or not all(t.is_contiguous() for t in ring)):
        raise ValueError("ring must be contiguous (k [S, NR, Hk, K], v [S, NR, Hv, V], g/beta [S, NR, Hv]) "
                         f"with NR >= {N}, got {[tuple(t.shape) for t in ring]}")
    return (ring_rows, rk, rv, rg, rb, rk.stride(0), rv.stride(0), rg.stride(0))


def split_config(BT: int, V: int):
    """(BV, apply warps, prep warps) of the split verify (a first guess that keeps pass 2's state tile
    at 32 KiB per program and pass 1's [BT, V] tiles in registers; of the pass-2 tilings timed on the
    H200, BV=64 with 4 warps was the fastest)."""
    BV = min(triton.next_power_of_2(V), 64)
    return BV, max(1, min(4, BV // 16)), (4 if BT <= 16 else 8)  # pass 2 transposed: BV >= 16 warps


def gdn_tree_split_verify_fwd(q, k, v, state, tree: Optional[TreeDescriptor], g=None, beta=None, *, A_log=None,
                              a=None, dt_bias=None, b=None, scale: Optional[float] = None,
                              use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None,
                              anc_mask: Optional[torch.Tensor] = None, num_nodes: Optional[torch.Tensor] = None,
                              BV: Optional[int] = None, num_warps: Optional[int] = None,
                              prep_warps: Optional[int] = None, precision: str = "tf32x3",
                              precision_low: Optional[str] = None, out: Optional[torch.Tensor] = None,
                              ring: Optional[tuple] = None, ring_rows: Optional[torch.Tensor] = None,
                              factored: bool = False, prep_maxnreg: Optional[int] = None,
                              scratch: Optional[tuple] = None, passes: str = "both", form: str = "wy",
                              apply_t: bool = True, apply_fma: bool = False, apply_persistent: int = 0,
                              prep_heads: Optional[int] = None, pre_commit: Optional[dict] = None,
                              ring_knorm: Optional[torch.Tensor] = None, apply_maxnreg: Optional[int] = None):
    """Launcher of the split tree verify: the same outputs as :func:`gdn_tree_chunk_verify_fwd`
    (same arguments, same ring stores) in two passes. Pass 1 (one program per request and value
    head) does all the state-independent work of the tree-masked WY chunk and leaves
    ``Q = scale (e^G q - P w)`` and ``C = scale P u`` (fp32, ``B Hv BT (K + V)`` floats, allocated
    here); pass 2 reads each committed state tile once and computes ``o = Q h^T + C`` in one dot.
    The chunk kernel does both in one program per V-block, so its state read waits behind (and
    its registers are shared with) the WY algebra, repeated for every V-block.

    Pass-1 variants of ``form="wy"`` (timed on the H200: ``factored`` -21 % at 64
    nodes, up to -6 % elsewhere; ``prep_maxnreg`` slower): ``factored`` forms ``M = P T`` first, so
    ``Q`` and ``C`` take one ``[BT, BT] x [BT, K|V]`` dot each instead of two (no ``w``/``u``
    tiles); ``prep_maxnreg`` caps pass 1's registers per thread.

    ``scratch = (Q, C)`` preallocated fp32 buffers of at least ``B Hv BT K`` and ``B Hv BT V'``
    floats (``V'`` = V rounded up to a power of two); ``passes`` = ``"prep"`` / ``"apply"`` runs
    one pass only (timing them apart; ``"apply"`` reads the ``scratch`` a ``"prep"`` call left).

    ``form="mix"``: pass 1 runs once per request and *key* head and leaves only the `[BT, BT]`
    node-mixing matrices (:func:`gdn_tree_mix_prep_fwd_kernel`; ``scratch = (mix,)`` of
    ``B Hv (2 BT^2 + BT)`` floats); pass 2 rebuilds ``Q`` from them and the normalised q, k, and
    meets the state tile once. Same outputs and ring stores as ``"wy"``; the served default.

    ``apply_t`` (default): pass 2 forms its state dot transposed, ``o^T = h Q^T`` (the state tile
    on the MMA's M side); ``False``: ``o = Q h^T``, the untransposed orientation.
    ``apply_fma`` (``form="mix"``, transposed): the state product in fp32 FMAs, one node per step.
    ``apply_persistent=P`` (``form="mix"``): pass 2 as a persistent, software-pipelined grid of ``P``
    programs per SM (:func:`gdn_tree_mix_apply_persistent_fwd_kernel`). ``prep_heads`` (``form="mix"``):
    value heads per pass-1 program (default all of a key head's; 1: one program per value head).
    ``pre_commit`` (``form="mix"``; as in :func:`gdn_tree_chunk_verify_fwd`): the fused step -- pass 2
    first replays the previous step's accepted path onto each state tile and writes it back
    (:func:`gdn_tree_mix_step_fwd_kernel`); the state is read once and written once for both.
    ``pre_commit["gather"] = False``: the replay loads each path node's row per step (the served
    commit's way) instead of the whole path first.
    ``ring_knorm`` (``form="mix"`` with ``ring``): `[R, NR, Hk]` fp32, pass 1 also keeps each node's
    key norm there, for :func:`gdn_tree_commit_layers_fwd`'s ``k_norm``. ``apply_maxnreg``
    (``form="mix"``): caps pass 2's registers per thread (128: 4 instead of 3 programs per SM at
    <= 16 nodes, 184 B of spills per thread in the sm_90 build; the Nsight profile found pass 2 short
    of loads in flight at 18 % occupancy)."""
    if passes not in ("both", "prep", "apply"):
        raise ValueError(f"passes must be both, prep or apply, got {passes!r}")
    if form not in SPLIT_FORMS:
        raise ValueError(f"form must be one of {SPLIT_FORMS}, got {form!r}")
    if apply_fma and (form != "mix" or not apply_t):
        raise ValueError("apply_fma is a variant of form='mix' with apply_t=True")
    if (apply_persistent or prep_heads or pre_commit is not None or apply_maxnreg) and form != "mix":
        raise ValueError("apply_persistent / prep_heads / pre_commit / apply_maxnreg are variants of form='mix'")
    if pre_commit is not None and (apply_persistent or passes == "prep"):
        raise ValueError("pre_commit runs in pass 2's one-tile grid (not with apply_persistent or passes='prep')")
    if form == "mix" and (factored or prep_maxnreg):
        raise ValueError("factored / prep_maxnreg are variants of form='wy' (pass 1 of form='mix' has no [BT, K] tiles)")
    if passes == "apply" and scratch is None:
        raise ValueError("passes='apply' reads Q and C from the scratch a 'prep' call filled: pass scratch")
    if ring_knorm is not None:
        if form != "mix" or ring is None:
            raise ValueError("ring_knorm is kept by form='mix' beside its ring stores: pass ring too")
        NR = ring[0].shape[1]
        if (ring_knorm.dtype != torch.float32 or not ring_knorm.is_contiguous()
                or tuple(ring_knorm.shape) != (ring[0].shape[0], NR, k.shape[2])):
            raise ValueError(f"ring_knorm must be contiguous fp32 [R, NR, Hk] = {(ring[0].shape[0], NR, k.shape[2])}, "
                             f"got {tuple(ring_knorm.shape)} {ring_knorm.dtype}")
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    BT = max(16, triton.next_power_of_2(N))
    BK = triton.next_power_of_2(K)
    BVF = triton.next_power_of_2(V)
    d_bv, d_warps, d_prep = split_config(BT, V)
    # mix pass 1 ([BT, BT] tiles, one program per request and key head): 2 warps once there are >= 2
    # programs per SM at <= 32 nodes (H200: 9-16 % faster verify at bs 32, 4-14 % slower at
    # bs 8), else 4 (2 warps: 2x slower at 64 nodes, bs 8)
    mix_prep_warps = prep_warps or (2 if BT <= 32 and B * HK >= 2 * _num_sms(q.device) else 4)
    BV, num_warps, prep_warps = BV or d_bv, num_warps or d_warps, prep_warps or d_prep
    if apply_t and BV < 16 * num_warps and q.is_cuda:  # (a code-generation limit: the interpreter has none)
        raise ValueError(f"apply_t (pass 2 transposed) needs BV >= 16 * num_warps, got BV={BV}, num_warps={num_warps} "
                         "(BV=64 with 8 warps hit an illegal memory access on the H200); pass "
                         "apply_t=False or fewer warps")
    precision_low = _check_precisions(precision, precision_low)
    (q, sq), (k, sk), (v, sv), anc_mask, num_nodes, out = _chunk_inputs(q, k, v, tree, anc_mask, num_nodes, out)
    dummy = state
    ring_args = _ring_args(ring, ring_rows, state_indices, (B, N, HK, K, HV, V), dummy)
    si = state_indices if state_indices is not None else dummy
    if form == "mix":
        return _mix_verify(
            q, k, v, sq, sk, sv, state, si, anc_mask, num_nodes, out, ring_args, scratch=scratch, passes=passes,
            fused=fused, g=g, beta=beta, A_log=A_log, a=a, dt_bias=dt_bias, b=b, scale=scale, l2=use_qk_l2norm,
            has_si=state_indices is not None, store_ring=ring is not None, precision=precision,
            precision_low=precision_low, BT=BT, BK=BK, BV=BV, num_warps=num_warps, prep_warps=mix_prep_warps,
            apply_t=apply_t, apply_fma=apply_fma, persistent=apply_persistent, prep_heads=prep_heads,
            pre_commit=((*_pre_commit_args(pre_commit, ring, state_indices, (B, HK, K, HV, V), dummy),
                         bool(pre_commit.get("gather", True))) if pre_commit is not None else None),
            knorm=ring_knorm, apply_maxnreg=apply_maxnreg)
    if scratch is None:
        qt = torch.empty(B * HV * BT * BK, dtype=torch.float32, device=q.device)
        c = torch.empty(B * HV * BT * BVF, dtype=torch.float32, device=q.device)
    else:
        qt, c = scratch
        if (qt.dtype != torch.float32 or c.dtype != torch.float32 or not qt.is_contiguous() or not c.is_contiguous()
                or qt.numel() < B * HV * BT * BK or c.numel() < B * HV * BT * BVF):
            raise ValueError(f"scratch must be contiguous fp32 (Q, C) of >= {B * HV * BT * BK} and "
                             f">= {B * HV * BT * BVF} floats")
    if passes != "apply":
        gdn_tree_split_prep_fwd_kernel[(B * HV,)](
            q, k, v, (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
            A_log if fused else dummy, dt_bias if fused else dummy, qt, c, si, anc_mask.contiguous(), num_nodes,
            *ring_args, scale, N, sq, sk, sv,
            HK=HK, HV=HV, K=K, V=V, BT=BT, BK=BK, BVF=BVF, PRECISION=precision, PRECISION_LOW=precision_low,
            USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
            STORE_RING=ring is not None, FACTORED=factored, num_warps=prep_warps,
            **({"maxnreg": prep_maxnreg} if prep_maxnreg else {}),
        )
    if passes != "prep":
        gdn_tree_split_apply_fwd_kernel[(triton.cdiv(V, BV), B * HV)](
            qt, c, out, state, si, num_nodes, state.stride(0), N,
            HV=HV, K=K, V=V, BT=BT, BK=BK, BVF=BVF, BV=BV, PRECISION=precision,
            HAS_STATE_INDICES=state_indices is not None, APPLY_T=apply_t, num_warps=num_warps,
        )
    return out


SPLIT_FORMS = ("wy", "mix")
COMMIT_FORMS = ("replay", "gather", "dot")


def _mix_verify(q, k, v, sq, sk, sv, state, si, anc_mask, num_nodes, out, ring_args, *, scratch, passes, fused, g,
                beta, A_log, a, dt_bias, b, scale, l2, has_si, store_ring, precision, precision_low, BT, BK, BV,
                num_warps, prep_warps, apply_t, apply_fma, persistent, prep_heads, pre_commit, knorm=None,
                apply_maxnreg=None):
    """The two launches of :func:`gdn_tree_split_verify_fwd` with ``form="mix"`` (tensors as
    prepared there; ``pre_commit``: the checked ``(pc_args, pc_bn)`` or None)."""
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    size = B * HV * (2 * BT * BT + BT)
    if scratch is None:
        mix = torch.empty(size, dtype=torch.float32, device=q.device)
    else:
        (mix,) = scratch
        if mix.dtype != torch.float32 or not mix.is_contiguous() or mix.numel() < size:
            raise ValueError(f"scratch must be (mix,): contiguous fp32 of >= {size} floats")
    ring_rows, rk, rv, rg, rb, srk, srv, srg = ring_args
    if passes != "apply":
        heads = prep_heads or HV // HK
        if (HV // HK) % heads:
            raise ValueError(f"prep_heads must divide Hv / Hk = {HV // HK}, got {heads}")
        gdn_tree_mix_prep_fwd_kernel[(B * HK * (HV // HK // heads),)](
            q, k, (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
            A_log if fused else state, dt_bias if fused else state, mix, si, anc_mask.contiguous(), num_nodes,
            ring_rows, rk, rv, rg, rb, srk, srv, srg, scale, N, sq, sk,
            HK=HK, HV=HV, K=K, BT=BT, BK=BK, PRECISION=precision, PRECISION_LOW=precision_low, USE_QK_L2NORM=l2,
            HAS_STATE_INDICES=has_si, FUSED_GATING=fused, STORE_RING=store_ring, HEADS=0 if heads == HV // HK else heads,
            num_warps=prep_warps,
            **(dict(ring_knorm=knorm, stride_rn=knorm.stride(0), STORE_KNORM=True) if knorm is not None else {}),
        )
    if passes != "prep":
        args = (q, k, v, mix, out, state, si, num_nodes, ring_rows, rv, srv, state.stride(0), N, sq, sk, sv)
        meta = dict(HK=HK, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, PRECISION=precision, PRECISION_LOW=precision_low,
                    USE_QK_L2NORM=l2, HAS_STATE_INDICES=has_si, STORE_RING=store_ring, APPLY_T=apply_t,
                    APPLY_FMA=apply_fma, num_warps=num_warps, **({"maxnreg": apply_maxnreg} if apply_maxnreg else {}))
        NV = triton.cdiv(V, BV)
        if pre_commit is not None:
            pc_args, pc_bn, pc_gather = pre_commit
            gdn_tree_mix_step_fwd_kernel[(NV, B * HV)](*args, *pc_args, PC_HAS_PARENTS=pc_args[2] is not state,
                                                       PC_BN=pc_bn, PC_GATHER=pc_gather, **meta)
        elif persistent:
            tiles = NV * B * HV
            gdn_tree_mix_apply_persistent_fwd_kernel[(min(tiles, persistent * _num_sms(q.device)),)](
                *args, NUM_TILES=tiles, NV=NV, STAGES=2, **meta)
        else:
            gdn_tree_mix_apply_fwd_kernel[(NV, B * HV)](*args, **meta)
    return out


def _pre_commit_args(pre_commit, ring, state_indices, dims, dummy):
    """Kernel arguments of a fused step's previous-step commit (``pre_commit``: ``ring`` -- k, v, g,
    beta of the previous step, not this step's --, ``rows``, ``last``, optional ``parents``), checked."""
    B, HK, K, HV, V = dims
    if pre_commit is not None:
        pk, pv, pg, pb = pre_commit["ring"]
        p_rows, p_last, p_par = pre_commit["rows"], pre_commit["last"], pre_commit.get("parents")
        if state_indices is None:
            raise ValueError("pre_commit needs state_indices")
        if ring is not None and any(x.data_ptr() == y.data_ptr() for x, y in zip(ring, pre_commit["ring"])):
            raise ValueError("pre_commit's buffers must not be the ones this verify writes (ring): "
                             "alternate two sets between steps")
        NPP = pk.shape[1]
        if (tuple(pk.shape[2:]) != (HK, K) or tuple(pv.shape[1:]) != (NPP, HV, V) or tuple(pg.shape[1:]) != (NPP, HV)
                or pb.shape != pg.shape or not all(t.is_contiguous() for t in (pk, pv, pg, pb))):
            raise ValueError("pre_commit ring must be contiguous k [R, NP, Hk, K], v [R, NP, Hv, V], g/beta [R, NP, Hv]; "
                             f"got {[tuple(t.shape) for t in pre_commit['ring']]}")
        if p_rows.shape[0] < B or p_last.shape[0] < B:
            raise ValueError(f"pre_commit rows/last must have >= {B} entries")
        if p_par is not None and (p_par.dim() != 2 or p_par.shape[0] < B or p_par.shape[1] > NPP):
            raise ValueError(f"pre_commit parents must be [>= {B}, <= {NPP}], got {tuple(p_par.shape)}")
        pc_np = p_par.shape[1] if p_par is not None else NPP
        pc_args = (p_rows, p_last, p_par.contiguous() if p_par is not None else dummy, pk, pv, pg, pb,
                   pk.stride(0), pv.stride(0), pg.stride(0), pc_np)
        pc_bn = triton.next_power_of_2(max(pc_np, 2))
    else:
        pc_args = (dummy, dummy, dummy, dummy, dummy, dummy, dummy, 0, 0, 0, 1)
        pc_bn = 2
    return pc_args, pc_bn


def gdn_tree_chunk_verify_fwd(q, k, v, state, tree: Optional[TreeDescriptor], g=None, beta=None, *, A_log=None,
                              a=None, dt_bias=None, b=None, scale: Optional[float] = None,
                              use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None,
                              anc_mask: Optional[torch.Tensor] = None, num_nodes: Optional[torch.Tensor] = None,
                              BV: Optional[int] = None, num_warps: Optional[int] = None,
                              precision: Optional[str] = None, out: Optional[torch.Tensor] = None,
                              vnew_out: Optional[torch.Tensor] = None, ring: Optional[tuple] = None,
                              ring_rows: Optional[torch.Tensor] = None, pre_commit: Optional[dict] = None,
                              precision_low: Optional[str] = None):
    """Launcher of the tensor-core tree verify (one tree-masked WY chunk per request and head).

    ``anc_mask`` is ``tree.mask`` as int8 `[B, N, N]` (built once per step, shared by all layers);
    with ``anc_mask`` and ``num_nodes`` `[B]` given, ``tree`` may be None (all the kernel reads).
    q, k, v may be strided views into one packed projection (see :func:`_token_rows`).
    ``precision`` is the tl.dot input precision: ``tf32x3`` (fp32-accurate; default for fp32
    inputs), ``tf32`` (default for bf16/fp16 inputs, whose own rounding is coarser) or ``ieee``.
    ``precision_low`` (default: ``precision``) is used instead for the dots whose rounding barely
    reaches the outputs (k kᵀ, the T products, w, w hᵀ); ``precision="tf32x3", precision_low="tf32"``
    is the mixed setting (CPU-emulated output error ~2e-5 vs 5e-4 for tf32 throughout).
    ``ring = (k, v, g, beta)``, per row `[R, NR, Hk, K]`, `[R, NR, Hv, V]`, `[R, NR, Hv]` x2
    (``NR >= N``): the kernel also stores the raw k, v and the gates there, under row
    ``ring_rows[b]`` (default: the state slot ``state_indices[b]``), for
    :func:`gdn_tree_commit_layers_fwd` (requests whose state slot or ring row is < 0 are skipped).

    ``pre_commit`` (the fused step: commit of the previous step + this verify, one state read and one
    write): ``dict(ring=(k, v, g, beta), rows=[B], last=[B], parents=[B, NP] or None)`` -- the
    previous verify's buffers (same layout as ``ring``, a different tensor: this kernel writes
    ``ring``), each request's row in them and its last accepted node. The kernel replays that
    accepted path into the state tile, writes it to the pool row, then verifies from it; the same
    as :func:`gdn_tree_commit_layers_fwd` (one layer) followed by this verify."""
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    BT = max(16, triton.next_power_of_2(N))
    BK = triton.next_power_of_2(K)
    d_bv, d_warps, d_prec = default_chunk_config(BT, V, q.dtype)
    BV, num_warps, precision = BV or d_bv, num_warps or d_warps, precision or d_prec
    precision_low = _check_precisions(precision, precision_low)
    (q, sq), (k, sk), (v, sv), anc_mask, num_nodes, out = _chunk_inputs(q, k, v, tree, anc_mask, num_nodes, out)
    dummy = state
    ring_args = _ring_args(ring, ring_rows, state_indices, (B, N, HK, K, HV, V), dummy)
    pc_args, pc_bn = _pre_commit_args(pre_commit, ring, state_indices, (B, HK, K, HV, V), dummy)
    gdn_tree_chunk_verify_fwd_kernel[(triton.cdiv(V, BV), B * HV)](
        q, k, v, (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, out, vnew_out if vnew_out is not None else dummy,
        state, state_indices if state_indices is not None else dummy, anc_mask.contiguous(), num_nodes,
        *ring_args, *pc_args, scale, state.stride(0), N, sq, sk, sv,
        HK=HK, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, PRECISION=precision, PRECISION_LOW=precision_low,
        STORE_VNEW=vnew_out is not None,
        USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
        STORE_RING=ring is not None, PRE_COMMIT=pre_commit is not None,
        PC_HAS_PARENTS=pre_commit is not None and pre_commit.get("parents") is not None, PC_BN=pc_bn,
        num_warps=num_warps,
    )
    return out


def gdn_tree_commit_fwd(k, v, state, accept_nodes, accept_len, g=None, beta=None, *, A_log=None, a=None,
                        dt_bias=None, b=None, use_qk_l2norm: bool = False,
                        state_indices: Optional[torch.Tensor] = None, track_rows: Optional[torch.Tensor] = None,
                        track_len: Optional[torch.Tensor] = None, BV: Optional[int] = None,
                        num_warps: int = 4):
    """Launcher of the replay commit; updates ``state`` rows in place.

    ``track_rows`` / ``track_len`` `[B]` (optional, together): also write the state after the first
    ``track_len[b]`` accepted nodes to pool row ``track_rows[b]`` (``-1``: none) -- the prefix-cache
    snapshot SGLang's hybrid radix cache takes at interval crossings, from the same replay."""
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BK = triton.next_power_of_2(K)
    BV = BV or _default_bv(V)
    dummy = state
    an = accept_nodes.int().contiguous() if accept_nodes.dtype != torch.int32 else accept_nodes.contiguous()
    al = accept_len.int().contiguous() if accept_len.dtype != torch.int32 else accept_len.contiguous()
    has_track = track_rows is not None
    if has_track != (track_len is not None):
        raise ValueError("track_rows and track_len go together")
    gdn_tree_commit_fwd_kernel[(triton.cdiv(V, BV), B * HV)](
        k.contiguous(), v.contiguous(), (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, state,
        state_indices if state_indices is not None else dummy, an, al,
        track_rows if has_track else dummy, track_len.int().contiguous() if has_track else dummy,
        state.stride(0), N, an.shape[1],
        HK=HK, HV=HV, K=K, V=V, BK=BK, BV=BV,
        USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
        HAS_TRACK=has_track, num_warps=num_warps,
    )
    return state


def gdn_tree_commit_layers_fwd(k, v, g, beta, state, rows, last, parents=None, track_rows=None,
                               track_steps=None, use_qk_l2norm: bool = True, BV: Optional[int] = None,
                               num_warps: int = 4, ring_rows: Optional[torch.Tensor] = None, form: str = "replay",
                               precision: str = "tf32x3", k_norm: Optional[torch.Tensor] = None):
    """Launcher of the all-layer replay commit on the verify's k/v/g/beta buffers (what the SGLang backend calls).

    Args:
        k (torch.Tensor): `[L, R, NR, Hk, K]` the verify's raw k per layer, ring row and node.
        v (torch.Tensor): `[L, R, NR, Hv, V]`.
        g, beta (torch.Tensor): `[L, R, NR, Hv]` fp32 log decay and beta.
        state (torch.Tensor): `[L, S, Hv, V, K]` the state pool, updated in place at ``rows``.
        rows (torch.Tensor): `[B]` state slots (``-1``: skip).
        ring_rows (torch.Tensor): `[B]` rows of k/v/g/beta holding each request's verify inputs
            (default ``rows``: buffers kept per state slot).
        last (torch.Tensor): `[B]` last accepted node (``-1``: skip).
        parents (torch.Tensor): `[B, NP]` the verify tree (entry 0 ignored), or None for chains.
        track_rows, track_steps (torch.Tensor): `[B]` optional prefix-cache snapshot rows and the
            path node after which each is taken (``-1``: none).
        form (str): ``"replay"`` (one rank-1 step per path node, the served form), ``"gather"``
            (the same steps, the path's rows loaded in one round first) or ``"dot"``
            (the path in chunk form on tensor cores, :func:`gdn_tree_commit_layers_dot_fwd_kernel`;
            ``precision`` its dots; default tile BV = 64; needs ``BV >= 16 * num_warps``).
        k_norm (torch.Tensor): optional `[L, R, NR, Hk]` fp32, the keys' norms the mix verify kept
            (``ring_knorm``; ``use_qk_l2norm`` and ``form="replay"`` only): the replay divides by
            them instead of reducing each key again in every program and step.
    """
    if form not in COMMIT_FORMS:
        raise ValueError(f"form must be one of {COMMIT_FORMS}, got {form!r}")
    if k_norm is not None and (form != "replay" or not use_qk_l2norm):
        raise ValueError("k_norm is read by form='replay' with use_qk_l2norm=True only")
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
    NP = parents.shape[1] if parents is not None else NR
    BN = triton.next_power_of_2(max(NP, 2))
    BK = triton.next_power_of_2(K)
    dummy = rows
    if form == "dot":
        BV = BV or min(triton.next_power_of_2(V), 64)
        _check_precisions(precision, None)
        if BV < 16 * num_warps and state.is_cuda:
            raise ValueError(f"form='dot' needs BV >= 16 * num_warps, got BV={BV}, num_warps={num_warps}")
        gdn_tree_commit_layers_dot_fwd_kernel[(triton.cdiv(V, BV), B * HV, L)](
            k, v, g, beta, state, rows, ring_rows, parents.contiguous() if parents is not None else dummy, last,
            track_rows if track_rows is not None else dummy, track_steps if track_steps is not None else dummy,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1), state.stride(0),
            state.stride(1), NP,
            HK=HK, HV=HV, K=K, V=V, BL=max(16, BN), BK=BK, BV=BV, USE_QK_L2NORM=use_qk_l2norm,
            HAS_PARENTS=parents is not None, HAS_TRACK=track_rows is not None, PRECISION=precision,
            num_warps=num_warps,
        )
        return state
    BV = BV or _default_bv(V)
    kn = {}
    if k_norm is not None:
        if k_norm.dtype != torch.float32 or not k_norm.is_contiguous() or tuple(k_norm.shape) != (L, S, NR, HK):
            raise ValueError(f"k_norm must be contiguous fp32 [L, R, NR, Hk] = {(L, S, NR, HK)}, "
                             f"got {tuple(k_norm.shape)} {k_norm.dtype}")
        kn = dict(knorm=k_norm, stride_nl=k_norm.stride(0), stride_ns=k_norm.stride(1), HAS_KNORM=True)
    gdn_tree_commit_layers_fwd_kernel[(triton.cdiv(V, BV), B * HV, L)](
        k, v, g, beta, state, rows, ring_rows, parents.contiguous() if parents is not None else dummy, last,
        track_rows if track_rows is not None else dummy, track_steps if track_steps is not None else dummy,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1), state.stride(0),
        state.stride(1), NP,
        HK=HK, HV=HV, K=K, V=V, BN=BN, BK=BK, BV=BV, USE_QK_L2NORM=use_qk_l2norm,
        HAS_PARENTS=parents is not None, HAS_TRACK=track_rows is not None, GATHER=form == "gather",
        num_warps=num_warps, **kn,
    )
    return state


def gdn_tree_commit_vnew_fwd(k, vnew, state, accept_nodes, accept_len, g=None, beta=None, *, A_log=None, a=None,
                             dt_bias=None, b=None, use_qk_l2norm: bool = False,
                             state_indices: Optional[torch.Tensor] = None, BV: Optional[int] = None,
                             num_warps: int = 4):
    """Launcher of the closed-form commit from the verify's stored innovations ``vnew`` `[B, N, Hv, V]` fp32."""
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = vnew.shape[2], vnew.shape[3]
    BK = triton.next_power_of_2(K)
    BV = BV or min(triton.next_power_of_2(V), 32)
    dummy = state
    an = accept_nodes.int().contiguous() if accept_nodes.dtype != torch.int32 else accept_nodes.contiguous()
    al = accept_len.int().contiguous() if accept_len.dtype != torch.int32 else accept_len.contiguous()
    gdn_tree_commit_vnew_fwd_kernel[(triton.cdiv(V, BV), B * HV)](
        k.contiguous(), (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, vnew, state,
        state_indices if state_indices is not None else dummy, an, al, state.stride(0), N, an.shape[1],
        HK=HK, HV=HV, K=K, V=V, BK=BK, BV=BV,
        USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
        num_warps=num_warps,
    )
    return state


def _check_kernel_inputs(state, q_or_k):
    if not state.is_cuda:
        raise ValueError("the Triton GDN tree kernels need CUDA tensors; use lumotree.ops (dispatches) or naive.py")
    if state.dtype != torch.float32:
        raise ValueError(f"the Triton kernels keep the state in float32, got {state.dtype}")
    if state[0].stride() != (state.shape[2] * state.shape[3], state.shape[3], 1):
        raise ValueError("each state row must be contiguous [Hv, V, K] (the pool's leading stride may differ)")


CHUNK_MAX_NODES = 64


def verify_impl() -> str:
    """``LUMOTREE_GDN_VERIFY``: ``chunk`` (tensor-core tree-masked WY, default) or ``walk`` (the
    register-resident path walk with boundary states)."""
    impl = os.environ.get("LUMOTREE_GDN_VERIFY", "chunk").strip().lower()
    if impl not in ("chunk", "walk"):
        raise ValueError(f"LUMOTREE_GDN_VERIFY must be 'chunk' or 'walk', got {impl!r}")
    return impl


def gdn_tree_verify(q, k, v, g, beta, state, tree: TreeDescriptor, scale: Optional[float] = None,
                    use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None):
    """Tree verify (Triton). Same contract as :func:`lumotree.ops.gdn_tree.naive.gdn_tree_verify`;
    returns ``o`` in q's dtype."""
    check_gdn_inputs(q, k, v, g, beta, state, tree, state_indices)
    _check_kernel_inputs(state, k)
    out = torch.zeros(*v.shape, dtype=q.dtype, device=q.device)  # padding nodes stay zero
    # the chunk kernel holds the tree as one [N, N] block: beyond 64 nodes it would exceed the
    # registers / shared memory it was tuned for, so larger trees take the walk
    use_chunk = verify_impl() == "chunk" and k.shape[1] <= CHUNK_MAX_NODES
    fwd = gdn_tree_chunk_verify_fwd if use_chunk else gdn_tree_verify_fwd
    return fwd(q, k, v, state, tree, g, beta, scale=scale, use_qk_l2norm=use_qk_l2norm,
               state_indices=state_indices, out=out)


def gdn_tree_commit(k, v, g, beta, state, tree: TreeDescriptor, accept_nodes, accept_len,
                    use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None,
                    track_rows: Optional[torch.Tensor] = None, track_len: Optional[torch.Tensor] = None):
    """Accepted-path replay commit (Triton), in place on ``state`` (or pool rows ``state_indices``)."""
    B, N, *_ = check_gdn_inputs(None, k, v, g, beta, state, tree, state_indices)
    check_accept(accept_nodes, accept_len, B, N)
    _check_kernel_inputs(state, k)
    return gdn_tree_commit_fwd(k, v, state, accept_nodes, accept_len, g, beta, use_qk_l2norm=use_qk_l2norm,
                               state_indices=state_indices, track_rows=track_rows, track_len=track_len)
