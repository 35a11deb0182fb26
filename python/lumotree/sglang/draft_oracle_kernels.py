"""The draft oracle's recording and injection (:class:`lumotree.sglang.draft_oracle.DraftOracle`) as
one kernel launch each, on CUDA; the torch forms in ``draft_oracle.py`` are their definition (tested
against each other in Triton's interpreter).

Why: the oracle is benchmark apparatus that stands in for a drafter whose acceptance is known; it
should cost what a drafter's bookkeeping costs, not ~20 (recording, every step) and ~50 (injection,
every drafted step) eager torch launches -- host time added to a step that is host-bound at small
batches, on the LUMOTREE and NEXTN servers it measures (27B shapes, H200).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _uniform_bits(key, idx):
    """The 24 bits :func:`lumotree.sglang.draft_oracle.uniform` divides by 2**24 (int64 arithmetic)."""
    m = 0x5BD1E995
    h = ((key & 0xFFFFFFFF) * m) & 0xFFFFFFFF
    h = h ^ (idx & 0xFFFFFFFF)
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 15)) * m) & 0xFFFFFFFF
    h = h ^ (h >> 13)
    return h & 0xFFFFFF


@triton.jit
def oracle_record_fwd_kernel(p_cont, p_filled, p_row_slot, p_row_plen, p_row_end, p_rows, p_seq, p_tok, p_acc, stride,
                             cont_stride, max_len, PREFILL: tl.constexpr, BLOCK_J: tl.constexpr):
    b = tl.program_id(0)
    r = tl.load(p_rows + b).to(tl.int64)
    slot = tl.load(p_row_slot + r)
    j = tl.arange(0, BLOCK_J)
    if PREFILL:
        idx = j.to(tl.int64)  # output 0 only
        keep = j < 1
        toks = tl.load(p_tok + b + j, mask=keep, other=0).to(tl.int64)
    else:
        idx = tl.load(p_seq + b).to(tl.int64) - tl.load(p_row_plen + r) + 1 + j
        keep = (j < stride) & (j < tl.load(p_acc + b).to(tl.int64))
        toks = tl.load(p_tok + b * stride + j, mask=keep, other=0).to(tl.int64)
    keep = keep & (slot >= 0) & (idx >= 0) & (idx < max_len) & (idx < tl.load(p_row_end + r))
    tl.store(p_cont + slot * cont_stride + idx, toks, mask=keep)
    end = tl.max(tl.where(keep, idx + 1, 0), axis=0)
    tl.atomic_max(p_filled + slot, end, mask=(slot >= 0) & (end > 0))


@triton.jit
def oracle_inject_fwd_kernel(p_tok, p_pos, p_next, p_rows, p_cont, p_filled, p_row_slot, p_row_plen, p_slot_key,
                             p_fnode, p_ftok, n, levels, cont_stride, max_len, threshold, BLOCK_N: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    r = tl.load(p_rows + b).to(tl.int64)
    slot = tl.load(p_row_slot + r)
    sc = tl.maximum(slot, 0)
    filled = tl.load(p_filled + sc)
    i = tl.arange(0, BLOCK_N)
    in_n = i < n
    b_tok = tl.load(p_tok + b * n + i, mask=in_n, other=0)
    b_pos = tl.load(p_pos + b * n + i, mask=in_n, other=0).to(tl.int64)
    pos0 = tl.load(p_pos + b * n).to(tl.int64)
    tok0 = tl.load(p_tok + b * n).to(tl.int64)
    o = pos0 - tl.load(p_row_plen + r)  # the root's output index
    root_ok = (slot >= 0) & (o >= 0) & (o < filled) & (o < max_len)
    root_ok = root_ok & (tl.load(p_cont + sc * cont_stride + tl.minimum(tl.maximum(o, 0), max_len - 1)) == tok0)
    # k: the leading successes of the levels' draws
    d = tl.arange(0, BLOCK_D).to(tl.int64) + 1
    in_d = d <= levels
    idx_d = o + d
    valid_d = root_ok & (idx_d < filled) & (idx_d < max_len)
    key = tl.load(p_slot_key + sc)
    succ = valid_d & (_uniform_bits(key, idx_d) < threshold)
    k = tl.min(tl.where(in_d & ~succ, d, levels + 1), axis=0) - 1
    # the first-child chain from the root; the forcing plan: level d's parent (the chain node of depth d - 1)
    # and the recorded output d, for d <= k + 1 where known
    on_chain = i < 0
    prev = r * 0
    for lv in range(levels + 1):
        fidx = o + lv + 1
        f_ok = root_ok & (prev >= 0) & (lv <= k) & (fidx < filled) & (fidx < max_len)
        ftok = tl.load(p_cont + sc * cont_stride + tl.minimum(tl.maximum(fidx, 0), max_len - 1))
        tl.store(p_fnode + b * (levels + 1) + lv, tl.where(f_ok, prev, -1))
        tl.store(p_ftok + b * (levels + 1) + lv, tl.where(f_ok, ftok, -1))
        if lv < levels:
            nxt = tl.load(p_next + b * n + tl.maximum(prev, 0)).to(tl.int64)
            prev = tl.where(prev >= 0, nxt, -1)
            on_chain = on_chain | ((i == prev) & (prev >= 0))
    depth = b_pos - pos0
    idx = o + depth
    valid = root_ok & (depth >= 1) & (depth <= levels) & (idx < filled) & (idx < max_len)
    truth = tl.load(p_cont + sc * cont_stride + tl.minimum(tl.maximum(idx, 0), max_len - 1), mask=in_n, other=0)
    chosen = on_chain & (depth <= k)
    cur = b_tok.to(tl.int64)
    new = tl.where(chosen & valid, truth, cur)
    clash = valid & (new == truth) & ~chosen
    new = tl.where(clash, tl.where(truth > 0, truth - 1, 1), new)
    tl.store(p_tok + b * n + i, new.to(b_tok.dtype), mask=in_n & (i > 0))


def record(oracle, req_pool_indices, seq_lens, tokens, accept_lens, stride: int, prefill: bool) -> None:
    bs = seq_lens.shape[0]
    if bs == 0:
        return
    acc = accept_lens if accept_lens is not None else seq_lens  # unread with PREFILL
    oracle_record_fwd_kernel[(bs,)](oracle.cont, oracle.filled, oracle.row_slot, oracle.row_plen, oracle.row_end,
                                    req_pool_indices.contiguous(), seq_lens.contiguous(), tokens.contiguous(),
                                    acc.contiguous(), stride, oracle.cont.stride(0), oracle.max_len,
                                    PREFILL=bool(prefill), BLOCK_J=triton.next_power_of_2(max(int(stride), 1)))


def threshold(p: float) -> int:
    """The 24-bit draws below which a level succeeds: ``bits / 2**24 < p``  <=>  ``bits < ceil(p 2**24)``."""
    return int(math.ceil(p * (1 << 24)))


def inject(oracle, draft_token, positions, next_token, req_pool_indices, levels: int) -> None:
    bs, n = next_token.shape[0], next_token.shape[1]
    if bs == 0 or levels <= 0:
        return
    if not draft_token.is_contiguous():
        raise ValueError("draft oracle: draft_token must be contiguous (it is rewritten in place)")
    fnode = torch.empty(bs, levels + 1, dtype=torch.int64, device=draft_token.device)
    ftok = torch.empty_like(fnode)
    oracle_inject_fwd_kernel[(bs,)](draft_token, positions.contiguous(), next_token.contiguous(),
                                    req_pool_indices.contiguous(), oracle.cont, oracle.filled, oracle.row_slot,
                                    oracle.row_plen, oracle.slot_key, fnode, ftok, n, levels, oracle.cont.stride(0),
                                    oracle.max_len, threshold(oracle.p), BLOCK_N=triton.next_power_of_2(n),
                                    BLOCK_D=triton.next_power_of_2(levels))
    return fnode, ftok
