"""The device finish rule (:mod:`lumotree.ops.finish.naive`) as one kernel launch each.

Why: the rule runs outside the CUDA graphs on every decode step (:meth:`mark_finished`) and every
verify (:meth:`clamp_run`); as torch ops it was ~15 and ~25 eager launches, host time of a step that
is host-bound at small batches (27B shapes, H200: a drafted step's GPU time is ~8 ms of a ~12.5 ms
step at batch 1). One program per request row; the row's stop ids and tokens fit one block.
:meth:`mask_finished` (before every decode forward and verify) is one launch for up to 256 rows, and is not
specialised on the row count (one compiled variant per index dtype, :func:`warm_mask_finished`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Each kernel's per-step inputs: tensors SGLang's loop hands in (accept lengths, tokens, lengths, rows, state indices),
# which may be views that start anywhere in a buffer. Triton specialises a pointer argument on its 16-byte alignment,
# so a view off that grid compiled a new variant while requests waited (seen: mark_finished, its accept lengths off
# the grid, an 83 ms compile inside a measured pass; Qwen3-Next MoE shape, batch 1, one H100). The kernels load one
# element or one short row per program: the alignment hint has little to vectorize.
STEP_INPUTS = {
    "mark_finished_fwd_kernel": ["p_rows", "p_tok", "p_acc", "p_len", "p_live"],
    "clamp_run_fwd_kernel": ["p_rows", "p_seq", "p_predict", "p_acc", "p_index", "p_out"],
    "mask_finished_fwd_kernel": ["p_idx", "p_rows"],
}


@triton.jit(do_not_specialize_on_alignment=STEP_INPUTS["mark_finished_fwd_kernel"])
def mark_finished_fwd_kernel(p_done, p_stop, p_max_len, p_ruled, p_rows, p_tok, p_acc, p_len, p_live, stride,
                             stop_stride, S: tl.constexpr, BLOCK_J: tl.constexpr, HAS_LIVE: tl.constexpr):
    b = tl.program_id(0)
    r = tl.load(p_rows + b).to(tl.int64)
    j = tl.arange(0, BLOCK_J)
    s = tl.arange(0, S)
    acc = tl.load(p_acc + b).to(tl.int64)
    m_j = (j < stride) & (j < acc)
    b_tok = tl.load(p_tok + b * stride + j, mask=m_j, other=-1).to(tl.int64)
    b_stop = tl.load(p_stop + r * stop_stride + s).to(tl.int64)
    hit = (b_tok[:, None] == b_stop[None, :]) & (b_stop[None, :] >= 0) & m_j[:, None]
    any_hit = tl.max(tl.max(hit.to(tl.int32), axis=1), axis=0) > 0
    full = tl.load(p_len + b).to(tl.int64) >= tl.load(p_max_len + r)
    fin = (any_hit | full) & (tl.load(p_ruled + r) != 0)
    now = (tl.load(p_done + r) != 0) | fin
    tl.store(p_done + r, now.to(tl.uint8))
    if HAS_LIVE:  # the row still runs after this step
        tl.store(p_live + b, tl.where(now, 0, 1).to(tl.uint8))


@triton.jit(do_not_specialize_on_alignment=STEP_INPUTS["clamp_run_fwd_kernel"])
def clamp_run_fwd_kernel(p_stop, p_max_len, p_ruled, p_rows, p_seq, p_predict, p_acc, p_index, p_out, W,
                         stop_stride, S: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0)
    r = tl.load(p_rows + b).to(tl.int64)
    j = tl.arange(0, BLOCK_W)
    s = tl.arange(0, S)
    in_w = j < W
    acc = tl.load(p_acc + b).to(tl.int64)
    b_idx = tl.load(p_index + b * W + j, mask=in_w, other=-1)
    b_tok = tl.load(p_predict + tl.maximum(b_idx, 0).to(tl.int64), mask=in_w, other=-1).to(tl.int64)
    b_stop = tl.load(p_stop + r * stop_stride + s).to(tl.int64)
    hit = tl.max(((b_tok[:, None] == b_stop[None, :]) & (b_stop[None, :] >= 0)).to(tl.int32), axis=1) > 0
    lim = tl.load(p_max_len + r) - tl.load(p_seq + b).to(tl.int64) - 1
    ends = (hit | (j >= lim)) & (j < acc) & in_w & (tl.load(p_ruled + r) != 0)
    first = tl.min(tl.where(ends, j, BLOCK_W), axis=0).to(tl.int64)
    first = tl.where(first < BLOCK_W, first, acc - 1)
    new_len = tl.minimum(acc, first + 1)
    tl.store(p_out + b, new_len.to(p_out.dtype.element_ty))
    tl.store(p_index + b * W + j, tl.where(j >= new_len, -1, b_idx), mask=in_w)


@triton.jit(do_not_specialize=["n", "idx_stride"],
            do_not_specialize_on_alignment=STEP_INPUTS["mask_finished_fwd_kernel"])
def mask_finished_fwd_kernel(p_idx, p_done, p_rows, n, idx_stride, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    r = tl.load(p_rows + i, mask=m, other=0).to(tl.int64)
    fin = tl.load(p_done + r, mask=m, other=0) != 0
    tl.store(p_idx + i.to(tl.int64) * idx_stride, tl.full([BLOCK], -1, p_idx.dtype.element_ty), mask=m & fin)


MASK_BLOCK = 256  # rows per program of mask_finished (one program up to batch 256)


def _check_tables(done, stop, max_len, ruled) -> None:
    s = stop.shape[1]
    if stop.stride(1) != 1 or s & (s - 1):
        raise ValueError(f"finish rule: the stop table must be [slots, S] with unit column stride and S a power of "
                         f"two, got shape {tuple(stop.shape)} strides {stop.stride()}")
    for name, t in (("done", done), ("max_len", max_len), ("ruled", ruled)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"finish rule: {name} must be contiguous")


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def check_mark(done, stop, max_len, ruled, live, accept_lens) -> int:
    """The step's rows (``0``: nothing to launch), the mark's tables and its ``live`` output checked the same for every
    launcher of it (this one's and the CUDA op's, :mod:`lumotree.ops.finish.cuda`)."""
    bs = accept_lens.shape[0]
    if bs == 0:
        return 0
    _check_tables(done, stop, max_len, ruled)
    if live is not None and (live.dtype != torch.bool or live.shape[0] < bs or not live.is_contiguous()):
        raise ValueError(f"finish rule: live must be a contiguous bool [>= {bs}], got {live.dtype} "
                         f"{tuple(live.shape)}")
    return bs


def mark_finished(done, stop, max_len, ruled, req_pool_indices, next_token_ids, accept_lens, new_seq_lens,
                  stride: int, live=None) -> None:
    bs = check_mark(done, stop, max_len, ruled, live, accept_lens)
    if bs == 0:
        return
    mark_finished_fwd_kernel[(bs,)](_u8(done), stop, max_len, _u8(ruled), req_pool_indices.contiguous(),
                                    next_token_ids.contiguous(), accept_lens.contiguous(), new_seq_lens.contiguous(),
                                    _u8(live) if live is not None else done, stride, stop.stride(0), S=stop.shape[1],
                                    BLOCK_J=triton.next_power_of_2(max(int(stride), 1)), HAS_LIVE=live is not None)


def clamp_run(stop, max_len, ruled, req_pool_indices, seq_lens, predict, accept_lens, accept_index):
    bs, width = accept_index.shape
    if bs == 0:
        return accept_lens
    _check_tables(None, stop, max_len, ruled)
    if not accept_index.is_contiguous():
        raise ValueError("clamp_run: accept_index must be contiguous (it is cut in place)")
    out = torch.empty_like(accept_lens)
    clamp_run_fwd_kernel[(bs,)](stop, max_len, _u8(ruled), req_pool_indices.contiguous(), seq_lens.contiguous(),
                                predict.contiguous(), accept_lens.contiguous(),
                                accept_index, out, width, stop.stride(0), S=stop.shape[1],
                                BLOCK_W=triton.next_power_of_2(max(int(width), 1)))
    return out


def mask_finished(state_indices, done, req_pool_indices) -> None:
    n = min(req_pool_indices.shape[0], state_indices.shape[0])
    if n == 0:
        return
    if not done.is_contiguous():
        raise ValueError("finish rule: done must be contiguous")
    rows = req_pool_indices[:n]
    mask_finished_fwd_kernel[(triton.cdiv(n, MASK_BLOCK),)](state_indices, _u8(done), rows.contiguous(), n,
                                                             state_indices.stride(0), BLOCK=MASK_BLOCK)


def warm_mask_finished(device, dtypes=(torch.int32, torch.int64)) -> None:
    """Compile :func:`mask_finished` for every pairing of state-index and row dtypes by a launch on scratch tensors
    (nothing is marked): the kernel is not specialised on the row count, so that is every variant serving meets."""
    done = torch.zeros(1, dtype=torch.bool, device=device)
    for idx_dtype in dtypes:
        for row_dtype in dtypes:
            mask_finished(torch.zeros(1, dtype=idx_dtype, device=device), done,
                          torch.zeros(1, dtype=row_dtype, device=device))
