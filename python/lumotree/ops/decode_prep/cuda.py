"""A no-draft decode step's preparation as a registered CUDA op (``torch.ops.lumotree.decode_prep``,
csrc/decode_prep/decode_prep.cu): the definition is :mod:`lumotree.ops.decode_prep.naive`.

Why beside :mod:`lumotree.ops.decode_prep.triton`: it runs outside the CUDA graphs on every no-draft step, host-bound
at small batches, where a Triton launch cost the host 38 us a call on an H100 host
(``benchmark/results/launch_cost_h100.json``), a registered op's call a few. :func:`lumotree.ops.decode_prep` takes
this where the extension is built.
"""
from __future__ import annotations

import torch


def decode_prep(req_to_token, req_pool_indices, seq_lens, zero_kv=()):
    bs = seq_lens.shape[0]
    loc = torch.empty(bs, dtype=torch.int64, device=seq_lens.device)
    new = torch.empty_like(seq_lens)
    if bs == 0:
        return loc, new
    if req_to_token.stride(1) != 1:
        raise ValueError(f"decode_prep: req_to_token must have unit column stride, got strides {req_to_token.stride()}")
    pairs = list(zero_kv)
    for k, v in pairs:
        if not (k.is_contiguous() and v.is_contiguous()):
            raise ValueError("decode_prep: the KV buffers to zero must be contiguous (one slot's entry a row)")
    first = pairs[0] if pairs else (None, None)
    torch.ops.lumotree.decode_prep(req_to_token, req_pool_indices, seq_lens, loc, new, first[0], first[1])
    for k, v in pairs[1:]:  # further layers (a draft model of several): the reference's writes
        k[loc] = 0
        v[loc] = 0
    return loc, new
