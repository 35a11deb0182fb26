"""Reference of a no-draft decode step's preparation (:class:`lumotree.sglang.decode_step.DecodeStep`): each request's
KV slot for this step's token, its length after the step, and the draft model's KV entries at that slot zeroed
(:mod:`lumotree.sglang.mtp_entries`). Plain torch ops, the definition :mod:`lumotree.ops.decode_prep.triton` is tested
against.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch


def decode_prep(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                zero_kv: Sequence[Tuple[torch.Tensor, torch.Tensor]] = ()) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out_cache_loc, new_seq_lens)`` of a decode step of ``bs`` requests whose lengths ``seq_lens`` exclude this
    step's input token (SGLang's speculative V2 convention): the token's slot ``req_to_token[row, seq_len]`` (int64)
    and ``seq_lens + 1`` (``seq_lens``' dtype); every ``(k, v)`` buffer pair of ``zero_kv`` gets its rows at those
    slots zeroed.

    Args:
        req_to_token (torch.Tensor): `[rows, max_context]` the request pool's token slots.
        req_pool_indices (torch.Tensor): `[bs]` the requests' rows.
        seq_lens (torch.Tensor): `[bs]` the requests' lengths before the step.
        zero_kv: pairs of KV buffers `[slots, ...]` (one slot's entry a contiguous row), zeroed at the step's slots.
    """
    loc = req_to_token[req_pool_indices.long(), seq_lens.long()].to(torch.int64)
    for k, v in zero_kv:
        k[loc] = 0
        v[loc] = 0
    return loc, seq_lens + 1
