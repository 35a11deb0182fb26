"""Decode-exact tree verify kernels (same signatures as ``naive.py`` where they mirror it).

``gdn_tree_exact_verify_fwd_kernel`` is SGLang 0.5.17's packed GDN decode kernel
(``fused_recurrent_gated_delta_rule_packed_decode_kernel``: tile ``[BV = min(V, 32), K]``, one warp)
with its one step turned into a walk of the node's root path: the program of node ``i`` loads the
committed state tile once and applies, in registers, the decode step of every path node root first,
with the decode kernel's own expressions in its own order (gates, ``beta`` rounded to ``b``'s dtype,
in-kernel L2 norms); the tile shape and warp count are the decode kernel's, so Triton lays the
reductions out alike and every node's output is the decode's, bit for bit (checked on the GPU by
``test/ops/test_exact_gpu.py``). Nodes near the root are recomputed by every descendant: ``O(depth)``
steps per node, no state leaves registers, nothing per node is stored but the raw k, v and the gates
the replay commit reads (``ring_*``).

``tree_decode_kv_fwd_kernel`` lays out, per node, the KV slot list of a decode at its position
(prefix, then the root path), for SGLang's own split-KV decode attention kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lumotree.ops.gdn_tree.commit import gdn_tree_commit_layers_fwd
from lumotree.ops.gdn_tree.tiles import _root_path

__all__ = ["gdn_tree_exact_verify_fwd", "gdn_tree_exact_commit_layers_fwd", "conv_tree_exact_states",
           "tree_decode_kv_fwd", "exact_bv"]


def exact_bv(V: int) -> int:
    """The decode kernel's V tile (``min(next_pow2(V), 32)``)."""
    return min(triton.next_power_of_2(V), 32)


@triton.jit
def gdn_tree_exact_verify_fwd_kernel(
    x, a, b, A_log, dt_bias, o, state, state_indices, parents, ring_k, ring_v, ring_g, ring_beta, ring_rows,
    scale, stride_x, stride_ab, stride_s, stride_rk, stride_rv, stride_rg, N, NP,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BN: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
    HAS_PARENTS: tl.constexpr, HAS_RING: tl.constexpr,
):
    i_v, i_nh, i_t = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]

    tok = i_n * N + i_t
    state_idx = tl.load(state_indices + i_n).to(tl.int64)
    p_o = o + (tok * HV + i_hv) * V + o_v

    if state_idx < 0:
        zero = tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty)
        tl.store(p_o, zero, mask=mask_v)
        return

    p_h0 = state + state_idx * stride_s
    p_h0 = p_h0 + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(p_h0, mask=mask_h, other=0).to(tl.float32)

    o_n = tl.arange(0, BN)
    anc, d = _root_path(parents, i_t, i_n, NP, BN, HAS_PARENTS)
    for j in range(0, d + 1):
        node = tl.sum(tl.where(o_n == j, anc, 0))
        t = (i_n * N + node).to(tl.int64)
        p_mixed = x + t * stride_x
        k_off = (H * K) + i_h * K + o_k
        v_off = (2 * H * K) + i_hv * V + o_v
        b_k = tl.load(p_mixed + k_off, mask=mask_k, other=0).to(tl.float32)
        b_v = tl.load(p_mixed + v_off, mask=mask_v, other=0).to(tl.float32)
        if USE_QK_L2NORM_IN_KERNEL:
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)

        a_val = tl.load(a + t * stride_ab + i_hv).to(tl.float32)
        b_val = tl.load(b + t * stride_ab + i_hv).to(tl.float32)
        A_log_val = tl.load(A_log + i_hv).to(tl.float32)
        dt_bias_val = tl.load(dt_bias + i_hv).to(tl.float32)
        xx = a_val + dt_bias_val
        softplus_x = tl.where(xx <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(xx)), xx)
        g_val = -tl.exp(A_log_val) * softplus_x
        beta_val = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)

        b_h *= tl.exp(g_val)
        b_v -= tl.sum(b_h * b_k[None, :], 1)
        b_v *= beta_val
        b_h += b_v[:, None] * b_k[None, :]

        if HAS_RING:
            if node == i_t:  # this node's own inputs, kept for the replay commit (raw k and v, decode's gates)
                r_row = tl.load(ring_rows + i_n).to(tl.int64)
                if r_row >= 0:
                    tl.store(ring_v + r_row * stride_rv + (i_t * HV + i_hv) * V + o_v,
                             tl.load(p_mixed + v_off, mask=mask_v, other=0), mask=mask_v)
                    if i_v == 0:
                        tl.store(ring_g + r_row * stride_rg + i_t * HV + i_hv, g_val)
                        tl.store(ring_beta + r_row * stride_rg + i_t * HV + i_hv, beta_val)
                        if i_hv % (HV // H) == 0:
                            tl.store(ring_k + r_row * stride_rk + (i_t * H + i_h) * K + o_k,
                                     tl.load(p_mixed + k_off, mask=mask_k, other=0), mask=mask_k)

    p_q = x + tok.to(tl.int64) * stride_x + i_h * K + o_k
    b_q = tl.load(p_q, mask=mask_k, other=0).to(tl.float32)
    if USE_QK_L2NORM_IN_KERNEL:
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
    b_q = b_q * scale
    b_o = tl.sum(b_h * b_q[None, :], 1)
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)


def gdn_tree_exact_verify_fwd(x, a, b, A_log, dt_bias, state, state_indices, parents, H: int, scale: float,
                              ring=None, ring_rows=None, use_qk_l2norm: bool = True, out=None):
    """Launcher of the decode-exact GDN tree verify (see the module docstring; ``naive.py`` mirrors it).

    Args:
        x (torch.Tensor): `[B, N, 2*H*K + HV*V]` (or `[B*N, ...]`) the conv output, q/k/v packed.
        a, b (torch.Tensor): `[B, N, HV]` (or `[B*N, HV]`) gate inputs, rows contiguous.
        A_log, dt_bias (torch.Tensor): `[HV]`.
        state (torch.Tensor): `[S, HV, V, K]` the layer's state pool (read only).
        state_indices (torch.Tensor): `[B]` pool rows (``-1``: padding).
        parents (torch.Tensor): `[B, >= N]` SGLang-format parents (entry 0 ignored) or None (chains).
        ring: optional ``(k [R, NR, H, K], v [R, NR, HV, V], g [R, NR, HV], beta [R, NR, HV])`` the
            commit's inputs, written at ``ring_rows[b]`` for nodes ``0 .. N-1``.
    Returns:
        `[B, N, HV, V]` in ``x``'s dtype.
    """
    HV, V, K = state.shape[-3:]
    B = state_indices.shape[0]
    if x.dim() == 2:
        x = x.view(B, -1, x.shape[-1])
    N = x.shape[1]
    if x.shape[-1] != 2 * H * K + HV * V or HV % H:
        raise ValueError(f"x must pack q, k (H={H} x K={K}) and v (HV={HV} x V={V}), got {tuple(x.shape)}")
    a, b = a.reshape(B * N, HV), b.reshape(B * N, HV)
    if x.stride(-1) != 1 or x.stride(0) != N * x.stride(1) or a.stride(-1) != 1 or b.stride() != a.stride():
        raise ValueError("x, a and b must have contiguous rows")
    if state.stride(-1) != 1 or tuple(state.stride()[1:]) != (V * K, K, 1):
        raise ValueError("each state row must be a contiguous [HV, V, K]")
    if parents is not None and (parents.dim() != 2 or parents.shape[0] < B or parents.shape[1] < N
                                or not parents.is_contiguous()):
        raise ValueError(f"parents must be contiguous [>= {B}, >= {N}], got {tuple(parents.shape)}")
    NP = parents.shape[1] if parents is not None else N
    o = out if out is not None else x.new_empty(B, N, HV, V)
    dummy = state_indices
    if ring is not None:
        rk, rv, rg, rb = ring
        if ring_rows is None or rk.shape[1:] != (rk.shape[1], H, K) or rk.shape[1] < N:
            raise ValueError("ring needs ring_rows and [R, >= N, H, K] keys")
        ring_args = (rk, rv, rg, rb, ring_rows, rk.stride(0), rv.stride(0), rg.stride(0))
    else:
        ring_args = (dummy, dummy, dummy, dummy, dummy, 0, 0, 0)
    BK = triton.next_power_of_2(K)
    if BK != K:
        raise ValueError(f"the decode kernel needs K a power of two (one K block), got K={K}")
    BV = exact_bv(V)
    gdn_tree_exact_verify_fwd_kernel[(triton.cdiv(V, BV), B * HV, N)](
        x, a, b, A_log, dt_bias, o, state, state_indices,
        parents if parents is not None else dummy, *ring_args[:5],
        scale, x.stride(1), a.stride(0), state.stride(0), *ring_args[5:], N, NP,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BN=triton.next_power_of_2(max(NP, 2)), SOFTPLUS_THRESHOLD=20.0,
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm, HAS_PARENTS=parents is not None, HAS_RING=ring is not None,
        num_warps=1, num_stages=3,
    )
    return o


def gdn_tree_exact_commit_layers_fwd(k, v, g, beta, state, rows, last, parents=None, track_rows=None,
                                     track_steps=None, ring_rows=None):
    """The replay commit with the decode kernel's tile (``BV = min(V, 32)``, one warp): its step
    (``gdn_tree.tiles._delta_rule_step``) is the decode step's expressions in their order, so with
    the gates the exact verify kept the committed state is the decode's, bit for bit."""
    return gdn_tree_commit_layers_fwd(k, v, g, beta, state, rows, last, parents, track_rows, track_steps,
                                      use_qk_l2norm=True, BV=exact_bv(v.shape[-1]), num_warps=1,
                                      ring_rows=ring_rows)


def conv_tree_exact_states(root_state, windows, parents, out=None):
    """Device twin of ``naive.conv_tree_exact_states`` (gathers; static shapes, no host sync).

    Args:
        root_state (torch.Tensor): `[B, dim, W-1]` the committed conv states (gathered *before* SGLang's
            tree conv, which shifts the pool rows in place).
        windows (torch.Tensor): `[B, >= N, dim, W-1]` every node's window, as SGLang's tree conv keeps them.
        parents (torch.Tensor): `[B, N]` (entry 0 ignored).
        out (torch.Tensor): optional `[B*N, dim, W-1]` destination (any strides).
    """
    B, N = parents.shape
    par = parents.long().clamp(min=0)
    par = torch.where(torch.arange(N, device=par.device)[None] > 0, par, 0)
    idx = par[:, :, None, None].expand(B, N, windows.shape[2], windows.shape[3])
    st = torch.gather(windows[:, :N], 1, idx)
    st[:, 0] = root_state
    if out is None:
        return st
    out.view(B, N, *out.shape[1:]).copy_(st)
    return out


@triton.jit
def tree_decode_kv_fwd_kernel(req_to_token, req_pool_indices, seq_lens, parents, out_cache_loc, kv_indptr,
                              kv_indices, stride_r2t, N, NP, BN: tl.constexpr, BLOCK: tl.constexpr,
                              HAS_PARENTS: tl.constexpr):
    q = tl.program_id(0)
    i_b = q // N
    i_t = q % N
    L = tl.load(seq_lens + i_b).to(tl.int32)
    req = tl.load(req_pool_indices + i_b).to(tl.int64)
    start = tl.load(kv_indptr + q).to(tl.int64)
    for s in range(0, L, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        m = offs < L
        tl.store(kv_indices + start + offs,
                 tl.load(req_to_token + req * stride_r2t + offs, mask=m).to(kv_indices.dtype.element_ty), mask=m)
    anc, d = _root_path(parents, i_t, i_b, NP, BN, HAS_PARENTS)
    o_n = tl.arange(0, BN)
    m = o_n <= d
    locs = tl.load(out_cache_loc + i_b * N + tl.where(m, anc, 0), mask=m)
    tl.store(kv_indices + start + L + o_n, locs.to(kv_indices.dtype.element_ty), mask=m)


def tree_decode_kv_fwd(req_to_token, req_pool_indices, seq_lens, parents, out_cache_loc, N: int, depth,
                       kv_indptr=None, kv_indices=None):
    """Device twin of ``naive.tree_decode_kv``; ``depth`` `[B, N]` the nodes' depths (root 0).
    ``kv_indices`` (int32 or int64, as SGLang's decode uses) must hold ``sum(seq_lens) * N + sum(depth + 1)``
    entries (no host sync here: size it for the worst case). Returns ``(kv_indptr, kv_indices, kv_lens)``."""
    B = seq_lens.shape[0]
    lens = (seq_lens.to(torch.int32)[:, None] + depth.to(torch.int32) + 1).reshape(-1)
    if kv_indptr is None:
        kv_indptr = torch.zeros(B * N + 1, dtype=torch.int32, device=seq_lens.device)
    kv_indptr[:1].zero_()  # (no host-to-device copy: runs inside CUDA graph capture)
    torch.cumsum(lens, 0, out=kv_indptr[1: B * N + 1])
    if parents is not None and not parents.is_contiguous():
        parents = parents.contiguous()
    NP = parents.shape[1] if parents is not None else N
    tree_decode_kv_fwd_kernel[(B * N,)](
        req_to_token, req_pool_indices, seq_lens, parents if parents is not None else seq_lens, out_cache_loc,
        kv_indptr, kv_indices, req_to_token.stride(0), N, NP, BN=triton.next_power_of_2(max(NP, 2)), BLOCK=1024,
        HAS_PARENTS=parents is not None)
    return kv_indptr, kv_indices, lens
