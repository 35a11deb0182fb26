"""Triton building blocks shared by the GDN tree verify (:mod:`.verify`) and commit (:mod:`.commit`)
kernels, and their launchers' input plumbing.

A *tile* is the fp32 state slice ``[BV, K]`` of one request, one value head and one V-block, read
in place from the request's row of SGLang's pool ``[pool, Hv, V, K]``. Key heads are shared by
``Hv // Hk`` value heads (GQA, as in Qwen3.5). The tree-masked WY helpers (:func:`_anc_mask`,
:func:`_tree_T`) turn a whole tree into one chunk of the chunked gated delta rule, with the
causal mask replaced by the ancestor mask.
"""
from __future__ import annotations

import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from lumotree.ops.gdn_tree.common import L2NORM_EPS

PRECISIONS = ("tf32x3", "tf32", "ieee")


@triton.jit
def _gdn_gate(p_g, p_beta, p_alog, p_dtb, FUSED_GATING: tl.constexpr, mask):
    """``(g, beta)``: given (``FUSED_GATING=False``) or from SGLang's raw gating
    ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (``p_g`` holds ``a``, ``p_beta`` ``b``)."""
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
def _l2norm_rows(x):
    return x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]


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
def _replay_node(b_h, k, v, g, beta, rnorm, i, i_hk, i_hv, o_k, o_v, mask_k, mask_v,
                 HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 USE_QK_L2NORM: tl.constexpr, HAS_RNORM: tl.constexpr):
    """Apply node ``i`` kept node-major in one request's buffers (``k`` `[NR, Hk, K]`, ``v``
    `[NR, Hv, V]`, ``g``/``beta`` `[NR, Hv]`, pointers at the request's row) to the state tile. ``HAS_RNORM``:
    the key's inverse L2 norm is read from ``rnorm`` `[NR, Hk]` (the verify's) instead of formed again."""
    b_k = tl.load(k + (i * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + (i * HV + i_hv) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    b_g = tl.load(g + i * HV + i_hv).to(tl.float32)
    b_beta = tl.load(beta + i * HV + i_hv).to(tl.float32)
    if HAS_RNORM:
        b_k = b_k * tl.load(rnorm + i * HK + i_hk)
        b_h = _delta_rule_step(b_h, b_k, b_v, b_g, b_beta, False)
    else:
        b_h = _delta_rule_step(b_h, b_k, b_v, b_g, b_beta, USE_QK_L2NORM)
    return b_h


@triton.jit
def _anc_mask(anc_mask, i_b, N, o_t, m_t):
    """Request ``i_b``'s ancestor mask (self included) as booleans `[BT, BT]`, False on padding."""
    m_tt = m_t[:, None] & m_t[None, :]
    return tl.load(anc_mask + i_b.to(tl.int64) * N * N + o_t[:, None] * N + o_t[None, :], mask=m_tt, other=0) != 0


@triton.jit
def _tree_T(b_kk, b_g, b_beta, b_m, o_t, PRECISION: tl.constexpr):
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
        b_P = tl.dot(b_P, b_P, input_precision=PRECISION)  # A^(2p)
        b_T = tl.dot(b_T, b_I + b_P, input_precision=PRECISION)
        p = p * 2
    return b_G, b_decay, b_T


assert L2NORM_EPS == 1e-6  # the kernels hard-code the shared epsilon


# ---------------------------------------------------------------------------------------- launchers' plumbing
@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's CPU interpreter (TRITON_INTERPRET=1) in tests
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def token_rows(x: torch.Tensor):
    """``(x, token stride)`` for a `[B, N, H, D]` tensor whose rows may be strided views into a packed
    projection (each token's `[H, D]` contiguous, tokens evenly spaced); anything else is copied."""
    B, N, H, D = x.shape
    if x.stride(3) == 1 and x.stride(2) == D and x.stride(0) == N * x.stride(1):
        return x, x.stride(1)
    return x.contiguous(), H * D


def ring_args(ring, ring_rows, state_indices, dims, dummy):
    """Kernel arguments of the verify's stores for the replay commit (raw k, v, g, beta per request
    row, node-major; ``ring = None``: none)."""
    B, N, HK, K, HV, V = dims
    if ring is None:
        return (dummy, dummy, dummy, dummy, dummy, 0, 0, 0)
    rk, rv, rg, rb = ring[:4]
    if state_indices is None:
        raise ValueError("ring stores need state_indices (padded requests, slot -1, store nothing)")
    ring_rows = state_indices if ring_rows is None else ring_rows
    if ring_rows.shape[0] < B:
        raise ValueError(f"ring_rows must have >= {B} entries, got {tuple(ring_rows.shape)}")
    if (tuple(rk.shape[1:]) != (rk.shape[1], HK, K) or tuple(rv.shape[2:]) != (HV, V) or rk.shape[1] < N
            or tuple(rg.shape[1:]) != (rk.shape[1], HV) or rb.shape != rg.shape
            or (len(ring) == 5 and (tuple(ring[4].shape) != (rk.shape[0], rk.shape[1], HK)
                                    or ring[4].dtype != torch.float32))
            or len(ring) not in (4, 5) or not all(t.is_contiguous() for t in ring)):
        raise ValueError("ring must be contiguous (k [S, NR, Hk, K], v [S, NR, Hv, V], g/beta [S, NR, Hv], optional "
                         f"fp32 inverse key norms [S, NR, Hk]) with NR >= {N}, got {[tuple(t.shape) for t in ring]}")
    return (ring_rows, rk, rv, rg, rb, rk.stride(0), rv.stride(0), rg.stride(0))


def check_kernel_state(state: torch.Tensor) -> None:
    if not state.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":  # (the interpreter runs on CPU tensors)
        raise ValueError("the Triton GDN tree kernels need CUDA tensors; use lumotree.ops (dispatches) or naive.py")
    if state.dtype != torch.float32:
        raise ValueError(f"the Triton kernels keep the state in float32, got {state.dtype}")
    if state[0].stride() != (state.shape[2] * state.shape[3], state.shape[3], 1):
        raise ValueError("each state row must be contiguous [Hv, V, K] (the pool's leading stride may differ)")


def as_int32(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if x is None:
        return None
    return x.contiguous() if x.dtype == torch.int32 else x.int().contiguous()
