"""Tree verify attention (:mod:`lumotree.ops.tree_attention.naive`) as two Triton launches.

Why: SGLang's Triton backend verifies a draft tree's full-attention layers with its *prefill* kernel
(``extend_attention_fwd``), one program per (request, query head, query tile) walking the request's
whole prefix serially: at Qwen3.5-27B's heads (24 query, 4 KV, head dim 256) every KV block is
loaded once per query head (6 times per KV head), and a batch-32 verify of a 3-step chain took
2.0-2.4 ms of a ~17.5 ms drafted step on the H200 against ~0.2 ms for a decode step's attention.

How (flash-decoding over the prefix, the tree block in the merge):

* **prefix pass** (:func:`tree_attention_prefix_fwd_kernel`), grid ``(bs, Hkv x row blocks, S)``: a
  program takes *all* of a request's verify rows of one KV head -- ``n`` nodes x ``G = Hq / Hkv`` query
  heads, e.g. 4 x 6 = 24 rows -- against one of ``S`` splits of the prefix, so each key and value block
  is loaded once for the whole group and the row tile feeds ``tl.dot``; it writes the split's normalised
  partial output and log-sum-exp (an empty split writes zeros and ``-inf``: nothing is read that was
  not written);
* **merge** (:func:`tree_attention_merge_fwd_kernel`), grid ``(bs, Hkv x row blocks)``: combines the
  splits, then attends to the request's own verify tokens under the tree's ancestor mask and folds
  them in by log-sum-exp.

``S`` comes from the batch (about two waves of programs on the GPU), not from sequence lengths, so a
CUDA graph captured for a batch size serves every length.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

MAX_SPLITS = 16
# the split count varies with the batch (tree_attention_config): 16 at batch 1-4, 1 from 72 on (4-token chains, 132
# SMs). Triton compiles an integer argument's value 1 and its multiples of 16 as variants of their own, so a server
# capturing verify graphs at batch sizes 128 .. 1 compiled each kernel three times per verify width (an H200's server
# log: ~1-2 s stalls where the split count first left 1 and first reached 16); unspecialized, once (an H200's first
# start: one compile of each per verify width, 4 and 1 tokens)
UNSPECIALIZED = ["S"]
LOG2E = 1.4426950408889634


@triton.jit
def _online_softmax_step(b_m, b_l, b_acc, b_s, b_v):
    """One block of keys into a running softmax: scores ``b_s`` `[BM, BN]` (log2 units, ``-inf`` where
    unseen), values ``b_v`` `[BN, BDV]`; returns the new row maxima, sums and accumulator. A row that has
    seen no key yet keeps weight 0 (no ``-inf - -inf``)."""
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_ref = tl.where(b_mn == float("-inf"), 0., b_mn)
    b_p = tl.exp2(b_s - b_ref[:, None])
    b_alpha = tl.exp2(b_m - b_ref)
    b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
    return b_mn, b_l * b_alpha + tl.sum(b_p, 1), b_acc


@triton.jit(do_not_specialize=UNSPECIALIZED)
def tree_attention_prefix_fwd_kernel(
        q, k_buffer, v_buffer, kv_indptr, kv_indices, o_part, lse_part, scale_log2, S,
        stride_qt, stride_qh, stride_kbs, stride_kbh, stride_vbs, stride_vbh,
        stride_ob, stride_oh, stride_os, stride_om, stride_lb, stride_lh, stride_ls,
        N: tl.constexpr, G: tl.constexpr, MB: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
        BD: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr):
    i_b, i_hm, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk, i_mb = i_hm // MB, i_hm % MB
    o_m = i_mb * BM + tl.arange(0, BM)
    m_m = o_m < N * G
    tok = i_b * N + o_m // G
    head = i_hk * G + o_m % G
    o_d, o_dv = tl.arange(0, BD), tl.arange(0, BDV)
    p_q = q + tok[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_m[:, None] & (o_d[None, :] < D), other=0.)

    kv_start = tl.load(kv_indptr + i_b).to(tl.int64)
    L = tl.load(kv_indptr + i_b + 1).to(tl.int64) - kv_start
    per = tl.cdiv(tl.cdiv(L, S), BLOCK_N) * BLOCK_N
    lo = i_s * per
    hi = tl.minimum(lo + per, L)

    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_acc = tl.zeros([BM, BDV], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < hi
        slot = tl.load(kv_indices + kv_start + o_n, mask=m_n, other=0).to(tl.int64)
        b_k = tl.load(k_buffer + slot[None, :] * stride_kbs + i_hk * stride_kbh + o_d[:, None],
                      mask=m_n[None, :] & (o_d[:, None] < D), other=0.)
        b_s = tl.dot(b_q, b_k) * scale_log2
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))
        b_v = tl.load(v_buffer + slot[:, None] * stride_vbs + i_hk * stride_vbh + o_dv[None, :],
                      mask=m_n[:, None] & (o_dv[None, :] < DV), other=0.)
        b_m, b_l, b_acc = _online_softmax_step(b_m, b_l, b_acc, b_s, b_v)

    seen = b_l > 0
    b_o = tl.where(seen[:, None], b_acc / tl.where(seen, b_l, 1.)[:, None], 0.)
    b_lse = tl.where(seen, b_m + tl.log2(tl.where(seen, b_l, 1.)), float("-inf"))
    p_o = o_part + i_b * stride_ob + i_hk * stride_oh + i_s * stride_os + o_m[:, None] * stride_om + o_dv[None, :]
    tl.store(p_o, b_o, mask=m_m[:, None] & (o_dv[None, :] < DV))
    tl.store(lse_part + i_b * stride_lb + i_hk * stride_lh + i_s * stride_ls + o_m, b_lse, mask=m_m)


@triton.jit(do_not_specialize=UNSPECIALIZED)
def tree_attention_merge_fwd_kernel(
        q, k, v, anc, o_part, lse_part, out, scale_log2, S,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ab, stride_ai,
        stride_ob, stride_oh, stride_os, stride_om, stride_lb, stride_lh, stride_ls, stride_outt, stride_outh,
        N: tl.constexpr, G: tl.constexpr, MB: tl.constexpr, BM: tl.constexpr, NP: tl.constexpr,
        D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, HAS_ANC: tl.constexpr):
    i_b, i_hm = tl.program_id(0), tl.program_id(1)
    i_hk, i_mb = i_hm // MB, i_hm % MB
    o_m = i_mb * BM + tl.arange(0, BM)
    m_m = o_m < N * G
    node = o_m // G
    tok = i_b * N + node
    head = i_hk * G + o_m % G
    o_d, o_dv = tl.arange(0, BD), tl.arange(0, BDV)

    # the prefix's splits, by log-sum-exp
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_acc = tl.zeros([BM, BDV], tl.float32)
    p_base = o_part + i_b * stride_ob + i_hk * stride_oh + o_m[:, None] * stride_om + o_dv[None, :]
    for i_s in range(S):
        b_ls = tl.load(lse_part + i_b * stride_lb + i_hk * stride_lh + i_s * stride_ls + o_m, mask=m_m,
                       other=float("-inf"))
        b_os = tl.load(p_base + i_s * stride_os, mask=m_m[:, None] & (o_dv[None, :] < DV), other=0.)
        b_mn = tl.maximum(b_m, b_ls)
        b_ref = tl.where(b_mn == float("-inf"), 0., b_mn)  # no key yet: weights stay 0
        b_alpha, b_w = tl.exp2(b_m - b_ref), tl.exp2(b_ls - b_ref)
        b_acc = b_acc * b_alpha[:, None] + b_os * b_w[:, None]
        b_l = b_l * b_alpha + b_w
        b_m = b_mn

    # the request's verify tokens: a node sees itself and its ancestors
    p_q = q + tok[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_m[:, None] & (o_d[None, :] < D), other=0.)
    o_j = tl.arange(0, NP)
    m_j = o_j < N
    tok_j = (i_b * N + o_j).to(tl.int64)
    b_k = tl.load(k + tok_j[None, :] * stride_kt + i_hk * stride_kh + o_d[:, None],
                  mask=m_j[None, :] & (o_d[:, None] < D), other=0.)
    b_s = tl.dot(b_q, b_k) * scale_log2
    if HAS_ANC:
        sees = tl.load(anc + i_b * stride_ab + node[:, None] * stride_ai + o_j[None, :],
                       mask=m_m[:, None] & m_j[None, :], other=0) != 0
    else:
        sees = o_j[None, :] <= node[:, None]
    sees = sees & m_j[None, :]
    b_s = tl.where(sees, b_s, float("-inf"))
    b_v = tl.load(v + tok_j[:, None] * stride_vt + i_hk * stride_vh + o_dv[None, :],
                  mask=m_j[:, None] & (o_dv[None, :] < DV), other=0.)
    b_m, b_l, b_acc = _online_softmax_step(b_m, b_l, b_acc, b_s, b_v)
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.)[:, None]
    p_out = out + tok[:, None].to(tl.int64) * stride_outt + head[:, None] * stride_outh + o_dv[None, :]
    tl.store(p_out, b_o.to(out.dtype.element_ty), mask=m_m[:, None] & (o_dv[None, :] < DV))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tree_attention_config(bs: int, n: int, hq: int, hkv: int, sms: int = 132):
    """``(BM, MB, S)``: rows per program (the ``n x G`` verify rows of a KV head, tiled by at most 64),
    row blocks, and prefix splits -- as many as give about two waves of prefix programs (``sms``
    multiprocessors), at most ``MAX_SPLITS``. A function of the shapes only: CUDA-graph safe."""
    rows = n * (hq // hkv)
    BM = min(64, max(16, triton.next_power_of_2(rows)))
    MB = triton.cdiv(rows, BM)
    S = max(1, min(MAX_SPLITS, triton.cdiv(2 * sms, bs * hkv * MB)))
    return BM, MB, S


def tree_verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor,
                          v_buffer: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                          anc: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                          out: Optional[torch.Tensor] = None, splits: Optional[int] = None) -> torch.Tensor:
    """Same as :func:`lumotree.ops.tree_attention.naive.tree_verify_attention` (see there for the
    arguments); ``out`` (`[bs * n, Hq, Dv]`, may be a strided view) receives the result; ``splits``
    overrides the prefix split count (tests)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [tokens, heads, dim], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    T, Hq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    bs = kv_indptr.shape[0] - 1
    if bs < 1 or T % bs:
        raise ValueError(f"{T} verify tokens do not split evenly over {bs} requests")
    n = T // bs
    if Hq % Hkv or k.shape != (T, Hkv, D) or v.shape[:2] != (T, Hkv):
        raise ValueError(f"heads: q {Hq}, k/v {Hkv} (query heads must be a multiple of KV heads; k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)})")
    if k_buffer.shape[1:] != (Hkv, D) or v_buffer.shape[1:] != (Hkv, Dv):
        raise ValueError(f"KV pool {tuple(k_buffer.shape)} / {tuple(v_buffer.shape)} does not match k / v heads")
    if anc is not None and tuple(anc.shape) != (bs, n, n):
        raise ValueError(f"anc must be [{bs}, {n}, {n}], got {tuple(anc.shape)}")
    if out is None:
        out = torch.empty(T, Hq, Dv, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (T, Hq, Dv):
        raise ValueError(f"out must be [{T}, {Hq}, {Dv}], got {tuple(out.shape)}")
    for t in (q, k, v, k_buffer, v_buffer, out):
        if t.stride(-1) != 1:
            raise ValueError("q, k, v, out and the KV pool need a contiguous last dimension")
    sms = _sm_count(q.device.index or 0) if q.is_cuda else 132
    BM, MB, S = tree_attention_config(bs, n, Hq, Hkv, sms)
    S = splits or S
    G = Hq // Hkv
    BD, BDV = triton.next_power_of_2(D), triton.next_power_of_2(Dv)
    scale_log2 = (D ** -0.5 if scale is None else scale) * LOG2E
    o_part = torch.empty(bs, Hkv, S, MB * BM, Dv, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(bs, Hkv, S, MB * BM, dtype=torch.float32, device=q.device)
    if anc is not None and anc.dtype == torch.bool:
        anc = anc.view(torch.int8)
    if anc is not None and anc.stride(-1) != 1:
        anc = anc.contiguous()
    block_n = 32 if BD > 128 else 64
    warps = 4 if BM * BDV <= 32 * 256 else 8  # the fp32 accumulator's rows x Dv over the program's threads
    tree_attention_prefix_fwd_kernel[(bs, Hkv * MB, S)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, o_part, lse_part, scale_log2, S,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2),
        N=n, G=G, MB=MB, BM=BM, D=D, DV=Dv, BD=BD, BDV=BDV, BLOCK_N=block_n, num_warps=warps, num_stages=2)
    tree_attention_merge_fwd_kernel[(bs, Hkv * MB)](
        q, k, v, anc if anc is not None else q, o_part, lse_part, out, scale_log2, S,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        anc.stride(0) if anc is not None else 0, anc.stride(1) if anc is not None else 0,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2), out.stride(0), out.stride(1),
        N=n, G=G, MB=MB, BM=BM, NP=max(16, triton.next_power_of_2(n)), D=D, DV=Dv, BD=BD, BDV=BDV,
        HAS_ANC=anc is not None, num_warps=warps, num_stages=1)
    return out
