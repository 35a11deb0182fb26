"""The state-row copy (:mod:`lumotree.ops.state_rows.naive`) in one launch.

Why: a LumoTree prefill keeps one prompt-interior state per request (:mod:`lumotree.sglang.prompt_state`), which SGLang's
extend path copies out of the chunk states in every GDN layer as three kernels -- the gather of ``h[src]``, its cast to
the pool's fp32, the scatter into the pool -- and those were the prefill's whole cost beyond no speculation's on the
device: at the 27B shape (32 prompts of 256 tokens a batch, one H100) 223 more index kernels (+11.8 ms), 192 cast
copies (6.4 ms) and 79 gathers (2.6 ms) over three 8192-token forwards, ~7 ms a forward. One program copies one block of
one row, reading the chunk state once in its dtype and writing the fp32 row once.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from lumotree.ops.state_rows import rows_contiguous

BLOCK = 4096  # elements of a row per program


# row strides and the row length vary with the model, not with the batch: specialised (divisibility), so each model
# compiles one variant (at start-up: lumotree.sglang.prompt_state.warm_copy); the row indices are the batch's own
@triton.jit(do_not_specialize_on_alignment=["p_src_rows", "p_dst_rows"])
def copy_state_rows_fwd_kernel(p_src, src_stride, p_src_rows, p_dst, dst_stride, p_dst_rows, n_elem,
                               BLOCK: tl.constexpr):
    i = tl.program_id(0)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < n_elem
    s = tl.load(p_src_rows + i).to(tl.int64)
    d = tl.load(p_dst_rows + i).to(tl.int64)
    b_x = tl.load(p_src + s * src_stride + o, mask=m)
    tl.store(p_dst + d * dst_stride + o, b_x.to(p_dst.dtype.element_ty), mask=m)


def copy_state_rows(src, src_rows, dst, dst_rows):
    n = src_rows.numel()
    if dst_rows.numel() != n:
        raise ValueError(f"copy_state_rows: {n} source rows but {dst_rows.numel()} destination rows")
    if tuple(src.shape[1:]) != tuple(dst.shape[1:]):
        raise ValueError(f"copy_state_rows: source rows {tuple(src.shape[1:])} and destination rows "
                         f"{tuple(dst.shape[1:])} differ")
    if not (rows_contiguous(src) and rows_contiguous(dst)):
        raise ValueError(f"copy_state_rows: each row must be contiguous (source strides {src.stride()}, destination "
                         f"strides {dst.stride()})")
    if n == 0:
        return
    n_elem = math.prod(dst.shape[1:])  # (no view of a row: host work on a prefill waiting for its host)
    grid = (n, triton.cdiv(n_elem, BLOCK))
    copy_state_rows_fwd_kernel[grid](src, src.stride(0), src_rows, dst, dst.stride(0), dst_rows, n_elem,
                                     BLOCK=BLOCK, num_warps=8)
