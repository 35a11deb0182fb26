"""GDN tree verify kernels: every draft node's output from the committed state, which is read in
place and never written. Two forms:

**Mix** (:func:`gdn_tree_mix_verify_fwd`; what the SGLang backend serves, and the public op up to
``MIX_MAX_NODES``): the whole tree is one chunk of the chunked (WY) gated delta rule, with the
causal mask replaced by the tree's ancestor mask -- node i's quantities only involve its ancestors,
so every root path is computed exactly as the chain it is, and no per-node (or boundary) state is
ever formed. The chunk's output is linear in ``q h^T``, ``k h^T`` and ``v``:

    o = diag(Lq) (q h^T) + Lk (k h^T) + Lv v,   Lq = scale e^G,  M = P T,
    Lk = -scale M diag(beta e^G),  Lv = scale M diag(beta)          ([BT] and [BT, BT])

(``P`` the ancestor-masked, decayed ``q k^T``; ``T = (I + A)^-1``; ``G`` the log decay along each
root path). Pass 1 (one program per request and *key* head) forms only the Gram matrices and the
``[BT, BT]`` mixing matrices; pass 2 (V-blocks x requests x value heads) reads each state tile once
and meets the whole tree in one transposed dot, ``o^T = h Q^T + v^T Lv^T`` with
``Q = diag(Lq) q + Lk k`` -- the state tile is the MMA's M-side operand. Both passes keep the raw
k, v and gates in the caller's buffers (``ring``) for the replay commit (:mod:`.commit`).

**Walk** (:func:`gdn_tree_walk_verify_fwd`; the public op beyond ``MIX_MAX_NODES``, up to 255
nodes): path-parallel with boundary states. A tile is (request, value head, V-block); a persistent
grid walks the tree's nodes in the descriptor's depth-first ``order``: consecutive nodes of one
path are chained in registers; the head of a dependent path resumes from the boundary state of its
parent, kept in a scratch slot ``depth(parent)``. Only boundary states leave registers, and the
scratch is per program (``programs x SLOTS x BV x K``), independent of the batch and tree size.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from lumotree.ops.gdn_tree.tiles import (_anc_mask, _gdn_gate, _l2norm_rows, _state_tile, _tree_T, check_precision,
                                         num_sms, ring_args, token_rows)
from lumotree.tree import TreeDescriptor

__all__ = ["gdn_tree_mix_verify_fwd", "gdn_tree_walk_verify_fwd", "mix_config", "walk_config", "walk_schedule",
           "MIX_MAX_NODES"]

MIX_MAX_NODES = 64  # the mix verify holds a tree as [BT, BT] tiles; beyond, the walk


@triton.jit
def gdn_tree_mix_prep_fwd_kernel(
    q, k, g, beta, A_log, dt_bias, mix, state_indices, anc_mask, num_nodes,
    ring_rows, ring_k, ring_v, ring_g, ring_beta, stride_rk, stride_rv, stride_rg, ring_rnorm, stride_rr,
    scale, N, stride_qt, stride_kt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    PRECISION: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
    FUSED_GATING: tl.constexpr, STORE_RING: tl.constexpr, HEADS: tl.constexpr, STORE_RNORM: tl.constexpr,
):
    """Mix verify, pass 1 (one program per request and ``HEADS`` value heads of a key head's group): the Gram
    matrices ``k k^T`` and ``q k^T`` of the key head, then per value head the gates, ``T`` and the mixing
    matrices. ``HEADS`` = the group (``Hv / Hk``): the Gram matrices formed once per key head; fewer: the group's
    value heads in parallel programs, each forming them again (more programs at small batches). Layout of ``mix``
    per (request, value head): ``Lk [BT, BT] | Lv [BT, BT] | Lq [BT]`` fp32. Ring stores: raw k (once per key
    head) and the gates (v: pass 2)."""
    GROUP: tl.constexpr = HV // HK
    PARTS: tl.constexpr = GROUP // HEADS  # programs per key head
    pid = tl.program_id(0)
    i_b = pid // (HK * PARTS)
    i_hk = (pid // PARTS) % HK
    j0 = (pid % PARTS) * HEADS  # the first value head of the group this program serves
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
        if store & (j0 == 0):
            tl.store(ring_k + r_row * stride_rk + (o_t[:, None] * HK + i_hk) * K + o_k[None, :],
                     b_k.to(ring_k.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])
            if STORE_RNORM:  # the key's inverse L2 norm, for a commit that does not form it again
                tl.store(ring_rnorm + r_row * stride_rr + o_t * HK + i_hk,
                         1.0 / tl.sqrt(tl.sum(b_k * b_k, 1) + 1e-6), mask=m_t)
    if USE_QK_L2NORM:
        b_q = _l2norm_rows(b_q)
        b_k = _l2norm_rows(b_k)
    b_m = _anc_mask(anc_mask, i_b, N, o_t, m_t)
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION)
    b_qk = tl.where(b_m, tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION), 0.0)
    for j in range(HEADS):
        i_hv = i_hk * GROUP + j0 + j
        b_g, b_beta = _gdn_gate(g + tok * HV + i_hv, beta + tok * HV + i_hv, A_log + i_hv, dt_bias + i_hv,
                                FUSED_GATING, m_t)
        b_beta = tl.where(m_t, b_beta, 0.0)
        if store:
            tl.store(ring_g + r_row * stride_rg + o_t * HV + i_hv, b_g, mask=m_t)
            tl.store(ring_beta + r_row * stride_rg + o_t * HV + i_hv, b_beta, mask=m_t)
        b_G, b_decay, b_T = _tree_T(b_kk, b_g, b_beta, b_m, o_t, PRECISION)
        b_eG = tl.exp(b_G)
        b_M = tl.dot(b_qk * b_decay, b_T, input_precision=PRECISION)  # P T
        base = (i_b * HV + i_hv).to(tl.int64) * (2 * BT * BT + BT)
        p_l = mix + base + o_t[:, None] * BT + o_t[None, :]
        tl.store(p_l, -scale * b_M * (b_beta * b_eG)[None, :])
        tl.store(p_l + BT * BT, scale * b_M * b_beta[None, :])
        tl.store(mix + base + 2 * BT * BT + o_t, scale * b_eG)


@triton.jit
def gdn_tree_mix_apply_fwd_kernel(
    q, k, v, mix, o, state, state_indices, num_nodes, ring_rows, ring_v, stride_rv, stride_state, N,
    stride_qt, stride_kt, stride_vt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr, STORE_RING: tl.constexpr,
):
    """Mix verify, pass 2 (grid: V-blocks x requests x value heads): the committed state tile, read
    once in place from the pool row, meets the tree in one transposed dot,
    ``o^T = h Q^T + v^T Lv^T`` `[BV, BT]` with ``Q = diag(Lq) q + Lk k`` `[BT, K]`. Also keeps raw
    v in the ring (for the commit)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    row, o_k, o_v, m_k, m_v, b_h = _state_tile(state, state_indices, stride_state, i_b, i_hv, i_v, K, V, BK, BV,
                                               HAS_STATE_INDICES)
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
    p_vT = tok[None, :] * stride_vt + i_hv * V + o_v[:, None]
    m_vT = m_t[None, :] & m_v[:, None]
    b_vT = tl.load(v + p_vT, mask=m_vT, other=0.0)  # [BV, BT]
    if STORE_RING:
        r_row = tl.load(ring_rows + i_b).to(tl.int64)
        if (row >= 0) & (r_row >= 0):
            tl.store(ring_v + r_row * stride_rv + (o_t[None, :] * HV + i_hv) * V + o_v[:, None],
                     b_vT.to(ring_v.dtype.element_ty), mask=m_vT)
    b_lk = tl.load(mix + base + o_t[:, None] * BT + o_t[None, :])
    b_lvT = tl.load(mix + base + BT * BT + o_t[None, :] * BT + o_t[:, None])  # [j, i] = Lv[i, j]
    b_Q = b_lq[:, None] * b_q + tl.dot(b_lk, b_k, input_precision=PRECISION)  # [BT, K]
    b_oT = tl.dot(b_h, tl.trans(b_Q), input_precision=PRECISION)  # [BV, BT]
    b_oT += tl.dot(b_vT.to(tl.float32), b_lvT, input_precision=PRECISION)
    tl.store(o + (tok[None, :] * HV + i_hv) * V + o_v[:, None], b_oT.to(o.dtype.element_ty), mask=m_vT)


def mix_config(BT: int, V: int, B: int, HK: int, device) -> tuple:
    """``(BV, apply warps, prep warps)`` of the mix verify. Pass 2 keeps a 32 KiB state tile per
    program (BV = 64 with 4 warps was the fastest pass-2 tiling timed on the H200; the transposed dot
    needs BV >= 16 warps). Pass 1: 2 warps once there are >= 2 programs per SM at <= 32 nodes (H200:
    9-16 % faster verify at batch 32), else 4 (2 warps: 2x slower at 64 nodes, batch 8)."""
    BV = min(triton.next_power_of_2(V), 64)
    prep = 2 if BT <= 32 and B * HK >= 2 * num_sms(device) else 4
    return BV, max(1, min(4, BV // 16)), prep


def gdn_tree_mix_verify_fwd(q, k, v, state, tree: Optional[TreeDescriptor], g=None, beta=None, *, A_log=None,
                            a=None, dt_bias=None, b=None, scale: Optional[float] = None,
                            use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None,
                            anc_mask: Optional[torch.Tensor] = None, num_nodes: Optional[torch.Tensor] = None,
                            precision: str = "tf32x3", out: Optional[torch.Tensor] = None,
                            ring: Optional[tuple] = None, ring_rows: Optional[torch.Tensor] = None,
                            BV: Optional[int] = None, num_warps: Optional[int] = None,
                            prep_warps: Optional[int] = None, prep_heads: Optional[int] = None):
    """Launcher of the mix tree verify (see the module docstring); returns ``o`` `[B, N, Hv, V]`.

    Args:
        q, k (torch.Tensor): `[B, N, Hk, K]`; may be strided views into one packed projection (each
            token's heads contiguous, tokens evenly spaced), as SGLang's conv output is.
        v (torch.Tensor): `[B, N, Hv, V]`, likewise.
        state (torch.Tensor): `[pool, Hv, V, K]` fp32, read at rows ``state_indices`` (-1: a padded
            request, read as zeros).
        tree (TreeDescriptor): or None when ``anc_mask`` `[B, N, N]` int8 and ``num_nodes`` `[B]`
            are given (all the kernels read; built once per step and shared by every layer).
        g, beta (torch.Tensor): `[B, N, Hv]` the gates; or the raw ``A_log, a, dt_bias, b`` (fused gating).
        precision (str): ``tl.dot`` input precision: ``tf32x3`` (fp32-accurate, served), ``tf32``, ``ieee``.
        ring (tuple): optional ``(k, v, g, beta)`` buffers `[R, NR, Hk, K]`, `[R, NR, Hv, V]`,
            `[R, NR, Hv]` x2 (``NR >= N``), and optionally fp32 ``rnorm`` `[R, NR, Hk]` (each key's inverse L2
            norm, with ``use_qk_l2norm``): raw k, v and the gates are stored at row ``ring_rows[b]``
            (default ``state_indices[b]``) for :func:`~lumotree.ops.gdn_tree.commit.gdn_tree_commit_layers_fwd`.
    """
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if N > MIX_MAX_NODES:
        raise ValueError(f"the mix verify holds trees of up to {MIX_MAX_NODES} nodes, got {N}")
    scale = K ** -0.5 if scale is None else scale
    BT = max(16, triton.next_power_of_2(N))
    BK = triton.next_power_of_2(K)
    d_bv, d_warps, d_prep = mix_config(BT, V, B, HK, q.device)
    BV, num_warps, prep_warps = BV or d_bv, num_warps or d_warps, prep_warps or d_prep
    group = HV // HK
    prep_heads = prep_heads or group
    if group % prep_heads:
        raise ValueError(f"prep_heads must divide the {group} value heads of a key head's group, got {prep_heads}")
    if BV < 16 * num_warps and q.is_cuda:  # (a code-generation limit: the interpreter has none)
        raise ValueError(f"the mix verify's transposed state dot needs BV >= 16 * num_warps, got BV={BV}, "
                         f"num_warps={num_warps} (BV=64 with 8 warps hit an illegal memory access on the H200)")
    check_precision(precision)
    if anc_mask is None:
        anc_mask = tree.mask.to(torch.int8)
    if num_nodes is None:
        num_nodes = tree.num_nodes
    (q, sq), (k, sk), (v, sv) = token_rows(q), token_rows(k), token_rows(v)
    if out is None:
        out = torch.empty(B, N, HV, V, dtype=q.dtype, device=q.device)
    dummy = state
    r_rows, rk, rv, rg, rb, srk, srv, srg = ring_args(ring, ring_rows, state_indices, (B, N, HK, K, HV, V), dummy)
    rnorm = ring[4] if ring is not None and len(ring) == 5 else None
    if rnorm is not None and not use_qk_l2norm:
        raise ValueError("a ring's inverse key norms need use_qk_l2norm")
    si = state_indices if state_indices is not None else dummy
    mix = torch.empty(B * HV * (2 * BT * BT + BT), dtype=torch.float32, device=q.device)
    gdn_tree_mix_prep_fwd_kernel[(B * HK * (group // prep_heads),)](
        q, k, (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, mix, si, anc_mask.contiguous(), num_nodes,
        r_rows, rk, rv, rg, rb, srk, srv, srg, rnorm if rnorm is not None else dummy,
        rnorm.stride(0) if rnorm is not None else 0, scale, N, sq, sk,
        HK=HK, HV=HV, K=K, BT=BT, BK=BK, PRECISION=precision, USE_QK_L2NORM=use_qk_l2norm,
        HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused, STORE_RING=ring is not None,
        HEADS=prep_heads, STORE_RNORM=rnorm is not None, num_warps=prep_warps,
    )
    gdn_tree_mix_apply_fwd_kernel[(triton.cdiv(V, BV), B * HV)](
        q, k, v, mix, out, state, si, num_nodes, r_rows, rv, srv, state.stride(0), N, sq, sk, sv,
        HK=HK, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, PRECISION=precision, USE_QK_L2NORM=use_qk_l2norm,
        HAS_STATE_INDICES=state_indices is not None, STORE_RING=ring is not None, num_warps=num_warps,
    )
    return out


# ------------------------------------------------------------------------------------------------ walk
@triton.jit
def gdn_tree_walk_verify_fwd_kernel(
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


def walk_schedule(tree: TreeDescriptor):
    """The walk the kernel follows, one int32 per step (static shapes, no sync):
    ``node | (resume slot + 1) << 8 | (save slot + 1) << 16`` in depth-first order, where a
    dependent path's head resumes from slot ``depth(parent)`` and a boundary node saves to slot
    ``depth(node)``; plus ``num_nodes``. Trees up to 255 nodes."""
    if tree.max_nodes > 255:
        raise ValueError(f"the walk verify packs node ids in 8 bits: at most 255 nodes, got {tree.max_nodes}")
    idx = torch.arange(tree.max_nodes, device=tree.device)
    node = tree.order
    dependent = (tree.is_head & (idx[None, :] > 0)).gather(1, node)
    par = tree.parents.gather(1, node).clamp(min=0)
    resume = torch.where(dependent, tree.depth.gather(1, par) + 1, 0)
    save = torch.where(tree.is_boundary.gather(1, node), tree.depth.gather(1, node) + 1, 0)
    schedule = (node | (resume << 8) | (save << 16)).int().contiguous()
    return schedule, tree.num_nodes.int().contiguous()


def walk_config(V: int):
    """``(BV, num_warps, programs per SM)`` of the walk verify (best of an H200 sweep)."""
    return min(triton.next_power_of_2(V), 16), 2, 8


def gdn_tree_walk_verify_fwd(q, k, v, state, tree: TreeDescriptor, g=None, beta=None, *, A_log=None, a=None,
                             dt_bias=None, b=None, scale: Optional[float] = None, use_qk_l2norm: bool = False,
                             state_indices: Optional[torch.Tensor] = None, num_slots: Optional[int] = None,
                             BV: Optional[int] = None, out: Optional[torch.Tensor] = None):
    """Launcher of the walk verify (see the module docstring); same inputs as the mix verify
    (contiguous q/k/v). ``num_slots``: a static bound on 1 + the deepest boundary's depth (default:
    the tree's maximum depth, one host sync)."""
    fused = g is None
    B, N, HK, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    BK = triton.next_power_of_2(K)
    d_bv, num_warps, programs_per_sm = walk_config(V)
    BV = BV or d_bv
    if num_slots is None:
        num_slots = int(tree.depth.max().item()) + 1
    num_tiles = B * HV * triton.cdiv(V, BV)
    nprog = max(1, min(num_tiles, num_sms(q.device) * programs_per_sm))
    scratch = torch.empty(nprog * num_slots * BV * BK, dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty(B, N, HV, V, dtype=q.dtype, device=q.device)
    dummy = state
    gdn_tree_walk_verify_fwd_kernel[(nprog,)](
        q.contiguous(), k.contiguous(), v.contiguous(),
        (a if fused else g).contiguous(), (b if fused else beta).contiguous(),
        A_log if fused else dummy, dt_bias if fused else dummy, out, state,
        state_indices if state_indices is not None else dummy, scratch, *walk_schedule(tree),
        scale, num_tiles, state.stride(0), N,
        HK=HK, HV=HV, K=K, V=V, BK=BK, BV=BV, SLOTS=num_slots,
        USE_QK_L2NORM=use_qk_l2norm, HAS_STATE_INDICES=state_indices is not None, FUSED_GATING=fused,
        num_warps=num_warps,
    )
    return out
