"""The device finish rule's per-step kernels as registered CUDA ops (``torch.ops.lumotree.mark_finished`` /
``mask_finished``, csrc/finish/finish.cu): the definition is :mod:`lumotree.ops.finish.naive`.

Why beside :mod:`lumotree.ops.finish.triton`: both run outside the CUDA graphs on every decode step, and a no-draft
step at a small batch is host-bound; a Triton launch cost the host 47 us (mark) and 29 us (mask) a call on an H100
host (``benchmark/results/launch_cost_h100.json``), a registered op's call a few. :func:`lumotree.ops.mark_finished`
and :func:`lumotree.ops.mask_finished` take these where the extension is built. ``clamp_run`` (a verify's) stays
Triton's.
"""
from __future__ import annotations

import torch

from lumotree.ops.finish.triton import _u8, check_mark


def mark_finished(done, stop, max_len, ruled, req_pool_indices, next_token_ids, accept_lens, new_seq_lens,
                  stride: int, live=None) -> None:
    if check_mark(done, stop, max_len, ruled, live, accept_lens) == 0:
        return
    torch.ops.lumotree.mark_finished(_u8(done), stop, max_len, _u8(ruled), req_pool_indices, next_token_ids,
                                     accept_lens, new_seq_lens, live, int(stride))


def mask_finished(state_indices, done, req_pool_indices) -> None:
    if min(req_pool_indices.shape[0], state_indices.shape[0]) == 0:
        return
    if not done.is_contiguous():
        raise ValueError("finish rule: done must be contiguous")
    torch.ops.lumotree.mask_finished(state_indices, _u8(done), req_pool_indices)
