"""Start-up compiles: SGLang's speculative-decode slot kernel at every batch bucket (:func:`warm_spec_decode_slots`),
its mamba slot copy and clear at every index alignment (:func:`warm_slot_copies`), and the kernels around a verify
that are specialised on its width, at every width the server serves
(:func:`warm_verify_kernels`).

Every decode step of SGLang's speculative loops (EAGLE V2, which LUMOTREE runs, and NGRAM, which LUMOTREE_SUFFIX
runs) reserves its KV slots through ``sglang.srt.mem_cache.allocation.alloc_for_spec_decode``, whose Triton kernel
``assign_req_to_token_pool`` takes ``next_power_of_2(batch size)`` as a ``tl.constexpr``: the first decode step at
each new power-of-two bucket compiles it (or loads it from Triton's disk cache) on the scheduler's thread, inside the
step, while every running request waits. Seen: a 116 ms compile at a batch size the warm-up had not met inside a
profiled window of a LUMOTREE_SUFFIX server (tiny model, H200, ``benchmark/results/profile_no_draft_h200.json``); the
adaptive policy's step-time table of a LUMOTREE server (Qwen3-Next MoE shape, one H100) held 74-81 ms first steps at
buckets 2 and 4 where its other steps took 3-7 ms, and the batch-8 pass in which bucket 4 first drafted ended 0.3 s
after its first requests had (``benchmark/results/serving_speed_moe_h100.json``; the kernel was not identified there).
A server whose requests all end together never meets the smaller buckets in its warm-up; a speculative one meets them
as its requests end apart -- in the middle of serving.

:func:`warm_spec_decode_slots` compiles the kernel for every bucket up to the request pool's rows (no batch is larger)
through Triton's ``warmup`` (compile only, nothing launched), for both alignments the kernel is specialised on: the
allocator hands out ``out_cache_loc`` as a view of its free list at any offset, so its pointer is 16-byte aligned or
not from step to step. The kernel's other pointers are fresh tensors (aligned), its lengths ``int32``. With
``--page-size`` > 1 the paged allocator's own per-bucket kernels run before it, and a tree of ``topk`` > 1 moves its
accepted KV through two more (``move_accept_tokens_to_target_kvcache``: ``assign_extend_cache_locs``,
``fill_accept_out_cache_loc``, per power of two of the batch and of its accepted-token slots); those are not warmed here.
"""
from __future__ import annotations

import logging
import time
from typing import List, Optional, Sequence

import torch

logger = logging.getLogger(__name__)


def _compile_ahead(compile_all, what: str, otherwise: str) -> Optional[float]:
    """Run ``compile_all`` (Triton ``warmup`` calls) and return its seconds; ``None`` where it raised, which is logged
    and not raised: a compile ahead of time is not worth a server (``what`` then compiles while serving, as before:
    ``otherwise``)."""
    tic = time.perf_counter()
    try:
        compile_all()
    except Exception as e:
        logger.warning("LumoTree: %s could not be compiled ahead (%s: %s); %s", what, type(e).__name__, e, otherwise)
        return None
    return time.perf_counter() - tic


def buckets(rows: int) -> List[int]:
    """The powers of two from 1 up to the first one at or above ``rows`` (the batch sizes' ``next_power_of_2``)."""
    out, b = [1], 1
    while b < rows:
        b *= 2
        out.append(b)
    return out


def warm_spec_decode_slots(req_to_token_pool, kernel=None) -> Optional[dict]:
    """Compile ``assign_req_to_token_pool`` (``kernel``: SGLang's, default) for each batch bucket of the pool and both
    alignments of ``out_cache_loc``; ``{"buckets", "variants", "seconds"}``, or ``None`` where the pool is not on a
    CUDA device (nothing to compile) or has no table."""
    req_to_token = getattr(req_to_token_pool, "req_to_token", None)
    if req_to_token is None or not req_to_token.is_cuda:
        return None
    if kernel is None:
        from sglang.srt.mem_cache.allocation import assign_req_to_token_pool as kernel
    dev = req_to_token.device
    rows = torch.zeros(1, dtype=torch.int64, device=dev)  # req_pool_indices (int64, a fresh tensor)
    lens = torch.zeros(1, dtype=torch.int32, device=dev)  # cur / nxt kv lens (int32, fresh: aligned)
    loc = torch.zeros(2, dtype=torch.int64, device=dev)  # out_cache_loc: [0:] aligned, [1:] 8 bytes off
    sizes = buckets(int(req_to_token.shape[0]))

    def compile_all():
        for b in sizes:
            for out in (loc, loc[1:]):
                kernel.warmup(rows, req_to_token, lens, lens, out, int(req_to_token.shape[1]), b, grid=(1,))

    took = _compile_ahead(compile_all, "SGLang's speculative-decode slot kernel",
                          "it compiles at each new batch bucket while serving")
    if took is None:
        return None
    logger.info("LumoTree: SGLang's speculative-decode slot kernel compiled for batch buckets %s (2 alignments) in "
                "%.2f s, before serving", sizes, took)
    return dict(buckets=sizes, variants=2 * len(sizes), seconds=took)


def warm_slot_copies(mamba_pool, copy_kernel=None, clear_kernel=None, block=None) -> Optional[dict]:
    """Compile SGLang's fused conv-state slot kernels (``sglang.srt.mem_cache.mamba_slot_fused``: the copy the radix
    cache's ``MambaPool.copy_from`` launches, the clear of ``clear_slots``) for every alignment of their slot-index
    arguments, before serving; ``{"variants", "seconds"}``, or ``None`` where the pool does not fuse its slot ops or is
    not on a CUDA device. Why: their index tensors are views at any offset (16-byte aligned or not), and each new
    combination compiled inside a step -- a LUMOTREE server (``no_buffer`` state cache, whose prompt-end states are
    copied into cache slots) compiled the copy kernel three times after ready, 390-462 ms each, one inside a measured
    batch-8 pass (0.533x no speculation; Qwen3-Next MoE shape, one H100,
    ``benchmark/results/serving_speed_moe_flags_alone_h100.json``). Compile only (Triton's ``warmup``): nothing is
    launched, no slot is touched."""
    fuse = getattr(mamba_pool, "_should_fuse_slot_ops", None)
    if fuse is None or not fuse():
        return None
    desc = mamba_pool._conv_slot_desc
    if not desc.ptr.is_cuda or desc.ptr.numel() == 0:
        return None
    if copy_kernel is None or clear_kernel is None or block is None:
        from sglang.srt.mem_cache import mamba_slot_fused as msf

        copy_kernel, clear_kernel, block = msf._fused_slot_copy_kernel, msf._fused_slot_clear_kernel, msf._BLOCK
    idx = torch.zeros(2, dtype=torch.int64, device=desc.ptr.device)  # [0:] aligned, [1:] 8 bytes off
    n = 0

    def compile_all():
        nonlocal n
        for src in (idx, idx[1:]):
            clear_kernel.warmup(desc.ptr, desc.feat, desc.layer_stride, desc.slot_stride, src, desc.max_feat_blocks,
                                block, grid=(1,))
            n += 1
            for dst in (idx, idx[1:]):
                copy_kernel.warmup(desc.ptr, desc.feat, desc.layer_stride, desc.slot_stride, src, dst,
                                   desc.max_feat_blocks, block, grid=(1,))
                n += 1

    took = _compile_ahead(compile_all, "SGLang's mamba slot kernels", "they compile at each new index alignment while "
                          "serving")
    if took is None:
        return None
    logger.info("LumoTree: SGLang's mamba slot copy and clear kernels compiled for every index alignment (%d variants) "
                "in %.2f s, before serving", n, took)
    return dict(variants=n, seconds=took)


def warm_verify_kernels(req_to_token_pool, draft_tokens: Sequence[int], accept_widths: Sequence[int],
                        funcs=None) -> Optional[dict]:
    """Compile, before serving, the Triton kernels around a verify that are specialised on its width: SGLang's
    ``assign_extend_cache_locs_uniform`` (the verify's KV slots, per draft tokens per request: ``draft_tokens``) and
    ``fill_bonus_tokens`` (the bonus token, per accepted-run width: ``accept_widths``), and LumoTree's run clamp
    (:meth:`lumotree.sglang.finish.FinishedRows.clamp_run`, per width) -- by launches on one scratch row of the dtypes
    a served verify hands them (nothing of the pools is written: the slot kernel reads the table's first row into a
    scratch output, the clamp reads the finish tables' first row). ``funcs``: ``(assign, fill, clamp)`` in their
    places (tests). ``{"draft_tokens", "accept_widths", "seconds"}``, or ``None`` off the GPU or where a kernel cannot
    be launched ahead (it compiles while serving, as before).

    Why: a LUMOTREE server's first one-node verify -- the first warm no-draft step of a probe
    (:meth:`lumotree.sglang.adaptive.TreeSizePolicy._tree_run`) -- compiled the three for width 1 inside a measured pass
    (222 ms at batch 1, 27B shape, one H100: the pass ran at 0.68x no speculation), and its first drafted step their
    width-4 variants (260 ms) while it served its first request (``benchmark/results/
    serving_speed_27b_flags_alone_h100.json``, its JIT log)."""
    req_to_token = getattr(req_to_token_pool, "req_to_token", None)
    if req_to_token is None or not req_to_token.is_cuda:
        return None
    if funcs is None:
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_uniform_func as assign
        from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens_func as fill

        from lumotree.sglang.finish import FinishedRows

        clamp = FinishedRows.of(req_to_token_pool).clamp_run
    else:
        assign, fill, clamp = funcs
    dev = req_to_token.device
    rows = torch.zeros(1, dtype=torch.int64, device=dev)  # req_pool_indices
    seq = torch.zeros(1, dtype=torch.int64, device=dev)  # seq_lens
    tic = time.perf_counter()
    tokens, widths = sorted(set(int(n) for n in draft_tokens)), sorted(set(int(w) for w in accept_widths))
    try:
        for n in tokens:
            assign(req_pool_indices=rows, req_to_token=req_to_token, start_offset=seq, batch_size=1,
                   draft_token_num=n, device=dev)
        for w in widths:
            predict = torch.zeros(w, dtype=torch.int32, device=dev)  # the verify's greedy tokens
            accept_lens = torch.ones(1, dtype=torch.int32, device=dev)
            accept_index = torch.zeros((1, w), dtype=torch.int32, device=dev)
            fill(predict[accept_index], accept_lens, torch.empty(1, dtype=torch.int32, device=dev), w, 1)
            clamp(rows, seq, predict, accept_lens, accept_index)
    except Exception as e:  # a compile ahead of time is not worth a server
        logger.warning("LumoTree: the verify's width-specialised kernels could not be compiled ahead (%s: %s); they "
                       "compile at each verify width's first step while serving", type(e).__name__, e)
        return None
    took = time.perf_counter() - tic
    logger.info("LumoTree: the verify's width-specialised kernels compiled for %s draft tokens and accepted-run widths "
                "%s in %.2f s, before serving", tokens, widths, took)
    return dict(draft_tokens=tokens, accept_widths=widths, seconds=took)
