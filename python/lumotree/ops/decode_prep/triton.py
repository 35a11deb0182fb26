"""A no-draft decode step's preparation (:mod:`lumotree.ops.decode_prep.naive`) in one launch.

Why: the step is host-bound at small batches (Qwen3-Next MoE shape, batch 1, one H100: 2.17 ms a step against no
speculation's 1.66 ms, the step's own preparation 0.24 ms of it; ``git show
16dedbd:benchmark/results/moe_step_parts_h100.json``); its lengths + 1, SGLang's slot lookup (a Triton launch) and the
MTP entries' clear (the pool's ``set_kv_buffer``: a store kernel behind its Python) were three launches. Served as one
(with the relay hook of :mod:`lumotree.sglang.patches.future_map_cold_rows`): the preparation 0.15 ms, the step 1.82
against 1.69 ms, ``benchmark/results/moe_step_parts_h100.json``. One program per request: the slot, the new length, and the zeroed
rows of one (k, v) buffer pair.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements of a KV row zeroed per loop step


# one compiled variant per dtype signature, whatever the batch's views (offsets, strides): the step's tensors are views
# at any offset, and a variant compiled mid-serving stalls every running request (DecodeStep.warm_prep compiles the
# served one at start-up)
@triton.jit(do_not_specialize=["r2t_stride", "k_row", "v_row"],
            do_not_specialize_on_alignment=["p_r2t", "p_rows", "p_seq", "p_loc", "p_new", "p_k", "p_v"])
def decode_prep_fwd_kernel(p_r2t, r2t_stride, p_rows, p_seq, p_loc, p_new, p_k, p_v, k_row, v_row,
                           HAS_KV: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    r = tl.load(p_rows + b).to(tl.int64)
    s = tl.load(p_seq + b)
    loc = tl.load(p_r2t + r * r2t_stride + s.to(tl.int64)).to(tl.int64)
    tl.store(p_loc + b, loc)
    tl.store(p_new + b, s + 1)
    if HAS_KV:
        j = tl.arange(0, BLOCK)
        for start in range(0, k_row, BLOCK):
            tl.store(p_k + loc * k_row + start + j, tl.zeros([BLOCK], dtype=p_k.dtype.element_ty),
                     mask=start + j < k_row)
        for start in range(0, v_row, BLOCK):
            tl.store(p_v + loc * v_row + start + j, tl.zeros([BLOCK], dtype=p_v.dtype.element_ty),
                     mask=start + j < v_row)


def outputs(req_to_token, seq_lens, zero_kv):
    """``(loc, new_seq_lens, pairs)`` for a launcher of the preparation (this one's and the CUDA op's,
    :mod:`lumotree.ops.decode_prep.cuda`): the outputs allocated, the inputs checked, ``zero_kv`` as a list; ``pairs``
    ``None`` for an empty batch (nothing to launch)."""
    bs = seq_lens.shape[0]
    loc = torch.empty(bs, dtype=torch.int64, device=seq_lens.device)
    new = torch.empty_like(seq_lens)
    if bs == 0:
        return loc, new, None
    if req_to_token.stride(1) != 1:
        raise ValueError(f"decode_prep: req_to_token must have unit column stride, got strides {req_to_token.stride()}")
    pairs = list(zero_kv)
    for k, v in pairs:
        if not (k.is_contiguous() and v.is_contiguous()):
            raise ValueError("decode_prep: the KV buffers to zero must be contiguous (one slot's entry a row)")
    return loc, new, pairs


def zero_further(pairs, loc) -> None:
    """The (k, v) pairs after the first (a draft model of several layers): the reference's writes; the launch zeroes
    the first."""
    for k, v in pairs[1:]:
        k[loc] = 0
        v[loc] = 0


def decode_prep(req_to_token, req_pool_indices, seq_lens, zero_kv=()):
    loc, new, pairs = outputs(req_to_token, seq_lens, zero_kv)
    if pairs is None:
        return loc, new
    first = pairs[0] if pairs else (loc, loc)
    decode_prep_fwd_kernel[(seq_lens.shape[0],)](req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens, loc,
                                                 new, first[0], first[1], first[0][0].numel() if pairs else 0,
                                                 first[1][0].numel() if pairs else 0, HAS_KV=bool(pairs), BLOCK=BLOCK)
    zero_further(pairs, loc)
    return loc, new
