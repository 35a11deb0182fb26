"""Reference of the device finish rule (:mod:`lumotree.sglang.finish`): which requests a decode step
finished, and where a verify's accepted run must end. Plain torch ops, the definition the fused
kernels of :mod:`lumotree.ops.finish.triton` are tested against.

The rule's tables, per request-pool slot ``r``: ``stop[r]`` ``[S]`` the stop token ids (``-1`` =
none), ``max_len[r]`` the KV length at which the output holds ``max_new_tokens`` tokens, ``ruled[r]``
whether the rule covers the request, ``done[r]`` whether a step finished it.
"""
from __future__ import annotations

from typing import Optional

import torch


def mark_finished(done: torch.Tensor, stop: torch.Tensor, max_len: torch.Tensor, ruled: torch.Tensor,
                  req_pool_indices: torch.Tensor, next_token_ids: torch.Tensor, accept_lens: torch.Tensor,
                  new_seq_lens: torch.Tensor, stride: int, live: Optional[torch.Tensor] = None) -> None:
    """Set ``done[r]`` for the rows this decode step finished (a stop token among its accepted tokens,
    or the KV length reached ``max_len``), where the rule covers them; marks are never cleared here.
    With ``live``: also which of the step's rows are still running after it (``not done``), in the same pass.

    Args:
        done (torch.Tensor): `[slots]` bool, updated in place.
        stop (torch.Tensor): `[slots, S]` int64.
        max_len (torch.Tensor): `[slots]` int64.
        ruled (torch.Tensor): `[slots]` bool.
        req_pool_indices (torch.Tensor): `[>= bs]` the step's rows.
        next_token_ids (torch.Tensor): `[>= bs * stride]` each row's accepted tokens first.
        accept_lens (torch.Tensor): `[bs]` accepted tokens per row (drafts + bonus).
        new_seq_lens (torch.Tensor): `[>= bs]` KV length after the step.
        stride (int): tokens per row in ``next_token_ids``.
        live (torch.Tensor, optional): `[>= bs]` bool, written: row ``i`` of the step is still running after it.
    """
    bs = accept_lens.shape[0]
    if bs == 0:
        return
    idx = req_pool_indices[:bs].long()
    tok = next_token_ids[:bs * stride].view(bs, stride).long()
    valid = torch.arange(stride, device=tok.device)[None] < accept_lens[:, None].long()
    st = stop[idx]  # [bs, S]
    hit = ((tok[:, :, None] == st[:, None, :]) & (st[:, None, :] >= 0) & valid[:, :, None]).flatten(1).any(1)
    full = new_seq_lens[:bs].long() >= max_len[idx]
    now = done[idx] | ((hit | full) & ruled[idx])
    done[idx] = now
    if live is not None:
        live[:bs] = ~now


def clamp_run(stop: torch.Tensor, max_len: torch.Tensor, ruled: torch.Tensor, req_pool_indices: torch.Tensor,
              seq_lens: torch.Tensor, predict: torch.Tensor, accept_lens: torch.Tensor,
              accept_index: torch.Tensor) -> torch.Tensor:
    """Cut each row's accepted run at its first finishing token; returns the new accept lengths.

    Args:
        stop, max_len, ruled: the rule's tables (module docstring).
        req_pool_indices (torch.Tensor): `[>= bs]` the step's rows.
        seq_lens (torch.Tensor): `[>= bs]` KV length before the step.
        predict (torch.Tensor): `[bs * N]` the target's token at each tree node.
        accept_lens (torch.Tensor): `[bs]` drafts + bonus.
        accept_index (torch.Tensor): `[bs, W]` the run's nodes into ``predict`` (root first, ``-1`` past
            the run); positions past the new length become ``-1`` in place.
    """
    bs, width = accept_index.shape
    if bs == 0:
        return accept_lens
    idx = req_pool_indices[:bs].long()
    pos = torch.arange(width, device=accept_index.device)[None]
    valid = pos < accept_lens[:, None].long()
    tok = predict[accept_index.clamp(min=0).long()].long()  # run token j: the target's token at node j
    st = stop[idx]
    hit = ((tok[:, :, None] == st[:, None, :]) & (st[:, None, :] >= 0)).any(-1)
    # run token j brings the output to (seq_len - prompt + 1) + j + 1 tokens: full from j >= max_len - seq_len - 1
    full = pos >= (max_len[idx] - seq_lens[:bs].long() - 1)[:, None]
    ends = (hit | full) & valid & ruled[idx][:, None]
    first = torch.where(ends.any(1), ends.int().argmax(1), accept_lens.long() - 1)
    new_lens = torch.minimum(accept_lens.long(), first + 1).to(accept_lens.dtype)
    accept_index.masked_fill_(pos >= new_lens[:, None].long(), -1)
    return new_lens


def mask_finished(state_indices: torch.Tensor, done: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
    """Set the state index of each of a step's rows whose request is marked finished to ``-1`` in place (SGLang's
    padding sentinel: the GDN kernels skip the row), for the first ``min(len(req_pool_indices), len(state_indices))``
    rows.

    Args:
        state_indices (torch.Tensor): `[>= n]` the step's GDN state indices (int32 or int64), updated in place.
        done (torch.Tensor): `[slots]` bool, the finished marks (:func:`mark_finished`).
        req_pool_indices (torch.Tensor): `[>= n]` the step's rows.
    """
    n = min(req_pool_indices.shape[0], state_indices.shape[0])
    if n == 0:
        return
    state_indices[:n].masked_fill_(done[req_pool_indices[:n].long()], -1)
