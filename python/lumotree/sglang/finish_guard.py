"""A finished request's state is never advanced (the ``LUMOTREE`` / ``LUMOTREE_SUFFIX`` workers).

SGLang's overlap scheduler launches step N+1 before it processes step N's results, so a request
whose output reached ``max_new_tokens`` in step N is still verified in step N+1 (SGLang 0.5.17's
result processor skips it then: "should only happen when overlap scheduling is enabled"). When it
processes step N, SGLang donates the request's state slot to the radix cache under the request's
tokens -- and step N+1's commit, already launched, advances that slot past them. The cached state
then holds tokens its key does not, and the next turn that hits it starts from a wrong state
(``benchmark/serving/cache_consistency.py``: session 8 measured it on LUMOTREE_SUFFIX, while the
no-speculation server's cached states matched a fresh prefill).

:class:`FinishGuard` is mixed into LumoTree's workers: per decode step it hands the backend each
request's length limit (prompt + ``max_new_tokens`` - 1 tokens in the KV cache: the request has
all its output once the pre-verify length reaches it) and the batch; the commit
(:meth:`lumotree.sglang.backend.LumoTreeGDNBackend.commit_after_verify`) then skips every request
whose pre-verify length has reached its limit (last step -1: neither the GDN state nor the conv
window is written).

Stop tokens (the request's ``stop_token_ids``, EOS ids and the tokenizer's EOS / extra stop ids, as
SGLang's ``Req._check_token_based_finish``; none with ``ignore_eos``) are told on the device from the
verify's tree tokens: a request whose tree root -- the previous step's bonus token -- is a stop token
ended in the previous step; one that accepts a stop token inside this step's path is marked in
``finished_slots`` (per request-pool row, cleared when a prefill takes the row) and skipped from the
next step on. Host sync-free: the limits and stop tables go to the device without blocking, every
test runs there. Not covered: stop strings / regexes (matched on the host's text, one step late).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import torch

NO_LIMIT = 1 << 62
logger = logging.getLogger(__name__)
_warned = set()


def _warn_once(msg: str) -> None:
    key = msg.split("(")[0]
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg)


def length_limits(reqs: Sequence) -> List[int]:
    """Per request: the pre-verify KV length at which its output is complete
    (``len(prompt) + max_new_tokens - 1``; no limit when ``max_new_tokens`` is unset)."""
    out = []
    for r in reqs:
        m = getattr(getattr(r, "sampling_params", None), "max_new_tokens", None)
        out.append(NO_LIMIT if m is None else len(r.origin_input_ids) + int(m) - 1)
    return out


def stop_ids(req) -> List[int]:
    """The token ids that end ``req`` (SGLang's ``Req._check_token_based_finish``); [] with ``ignore_eos``."""
    sp = getattr(req, "sampling_params", None)
    if sp is None or getattr(sp, "ignore_eos", False):
        return []
    ids = set(getattr(sp, "stop_token_ids", None) or ())
    ids |= set(getattr(req, "eos_token_ids", None) or ())
    tok = getattr(req, "tokenizer", None)
    if tok is not None:
        if getattr(tok, "eos_token_id", None) is not None:
            ids.add(tok.eos_token_id)
        ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
    return sorted(int(i) for i in ids)


def stop_table(reqs: Sequence) -> torch.Tensor:
    """`[B, S]` stop token ids per request, ``-1`` padded (S >= 1)."""
    rows = [stop_ids(r) for r in reqs]
    width = max([1] + [len(r) for r in rows])
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)


def path_mask(parents: Optional[torch.Tensor], last: torch.Tensor, n: int) -> torch.Tensor:
    """`[B, n]` bool: the nodes on the root path of node ``last[b]`` (root and ``last`` included;
    none where ``last < 0``). ``parents`` `[B, n]` (None: a chain)."""
    from lumotree.tree import ancestor_mask

    B = last.shape[0]
    idx = torch.arange(n, device=last.device)
    safe = last.clamp(min=0).long()
    if parents is None:
        on = idx[None, :] <= safe[:, None]
    else:
        anc = ancestor_mask(parents[:B])  # [B, n, n]: anc[b, i, j]: j is i or an ancestor of i
        on = anc[torch.arange(B, device=last.device), safe]
    return on & (last[:, None] >= 0)


def is_stop(tokens: torch.Tensor, stops: torch.Tensor) -> torch.Tensor:
    """``tokens`` `[B, n]` that are one of their row's ``stops`` `[B, S]` (``-1`` padding)."""
    return ((tokens[:, :, None] == stops[:, None, :]) & (stops[:, None, :] >= 0)).any(-1)


class FinishInfo:
    """What the guard hands the backend for one decode step (see the module docstring)."""

    def __init__(self, batch, limits: torch.Tensor, stops: torch.Tensor, any_stop: bool = True):
        self.batch, self.limits, self.stops = batch, limits, stops
        self.any_stop = any_stop  # False: no request of the batch ends on a token (all ignore_eos)

    def filter(self, last_step: torch.Tensor, track_steps: Optional[torch.Tensor], parents: Optional[torch.Tensor],
               finished_slots: Optional[torch.Tensor]):
        """``(last_step, track_steps)`` with ``-1`` for the requests that had ended before this step;
        marks in ``finished_slots`` the requests whose committed path holds a stop token."""
        bs = last_step.shape[0]
        seq_lens = self.batch.seq_lens
        if self.limits.shape[0] < bs or seq_lens.shape[0] < bs:
            return last_step, track_steps
        dev = last_step.device
        done = seq_lens[:bs].to(torch.long) >= self.limits[:bs].to(device=dev, dtype=torch.long)
        tokens = getattr(getattr(self.batch, "spec_info", None), "draft_token", None)
        if self.any_stop and tokens is not None and self.stops.shape[0] >= bs:
            n = parents.shape[1] if parents is not None else tokens.numel() // max(1, seq_lens.shape[0])
            if n > 0 and tokens.numel() % n == 0 and tokens.numel() // n >= bs:
                done = self._ended_by_stop(done, tokens.reshape(-1, n)[:bs].to(dev).long(), parents, last_step,
                                           finished_slots)
        last_step = last_step.masked_fill(done, -1)
        if track_steps is not None:
            track_steps = track_steps.masked_fill(done, -1)
        return last_step, track_steps

    def _ended_by_stop(self, done, tokens, parents, last_step, finished_slots):
        """``done`` or'ed with the requests whose tree root (the previous bonus token) is a stop token
        or whose request-pool row is marked; marks the rows whose path this step holds one."""
        bs, n = tokens.shape
        stop_node = is_stop(tokens, self.stops[:bs].to(tokens.device))
        done = done | stop_node[:, 0]
        pool_rows = getattr(self.batch, "req_pool_indices", None)
        if finished_slots is not None and pool_rows is not None:
            rows = pool_rows[:bs].to(tokens.device).long()
            done = done | finished_slots[rows]
            hit = (stop_node & path_mask(parents, last_step, n))[:, 1:].any(-1) & ~done
            finished_slots[rows] = finished_slots[rows] | hit
        return done


def guard_steps(backend, last_step: torch.Tensor, track_steps: Optional[torch.Tensor],
                parents: Optional[torch.Tensor]):
    """The commit's ``(last_step, track_steps)`` under this step's guard (``backend.finish_limits``, set
    by :class:`FinishGuard`; unchanged without one). Allocates the backend's ``finished_slots`` on first
    use; an unexpected batch turns the guard off for the step with a warning, never fails it."""
    info = getattr(backend, "finish_limits", None)
    if info is None:
        return last_step, track_steps
    size = getattr(backend.req_to_token_pool, "size", None)
    if getattr(backend, "finished_slots", None) is None and size is not None:
        backend.finished_slots = torch.zeros(size + 1, dtype=torch.bool, device=last_step.device)
    try:
        return info.filter(last_step, track_steps, parents, getattr(backend, "finished_slots", None))
    except Exception as e:
        _warn_once(f"LumoTree finish guard off for this step ({e!r}): a request that ended in the last step may "
                   "still advance its cached state")
        return last_step, track_steps


def linear_backend(worker):
    """LumoTree's GDN backend under ``worker``'s target model (None if it is not LumoTree's)."""
    runner = getattr(getattr(worker, "target_worker", None), "model_runner", None)
    lin = getattr(getattr(runner, "attn_backend", None), "linear_attn_backend", None)
    return lin if getattr(lin, "lumotree", False) else None


class FinishGuard:
    """Mixin for SGLang's speculative workers (before the worker class in the bases)."""

    def forward_batch_generation(self, batch, *args, **kwargs):
        lin = linear_backend(self)
        mode = getattr(batch, "forward_mode", None)
        if lin is None or mode is None or not getattr(batch, "reqs", None):
            return super().forward_batch_generation(batch, *args, **kwargs)
        if not mode.is_decode():  # a prefill takes these request-pool rows: forget their old requests
            slots = getattr(lin, "finished_slots", None)
            if slots is not None and getattr(batch, "req_pool_indices", None) is not None:
                slots[batch.req_pool_indices.to(slots.device).long()] = False
            return super().forward_batch_generation(batch, *args, **kwargs)
        try:
            limits = torch.tensor(length_limits(batch.reqs), dtype=torch.long)
            stops = stop_table(batch.reqs)
            any_stop = bool((stops >= 0).any())  # host tensor: no sync
            if torch.cuda.is_available() and batch.seq_lens.is_cuda:
                dev = batch.seq_lens.device
                limits = limits.pin_memory().to(dev, non_blocking=True)
                stops = stops.pin_memory().to(dev, non_blocking=True)
            lin.finish_limits = FinishInfo(batch, limits, stops, any_stop)
        except Exception as e:  # never take the server down; say so (once)
            _warn_once(f"LumoTree finish guard off for this step ({e!r}): a request that ended in the last step "
                       "may still advance its cached state")
            lin.finish_limits = None
        try:
            return super().forward_batch_generation(batch, *args, **kwargs)
        finally:
            lin.finish_limits = None


_GUARDED: Dict[type, type] = {}


def guarded(worker_cls: type) -> type:
    """``worker_cls`` with :class:`FinishGuard` (one subclass per worker class)."""
    if worker_cls not in _GUARDED:
        _GUARDED[worker_cls] = type(f"LumoTree{worker_cls.__name__}", (FinishGuard, worker_cls), {})
    return _GUARDED[worker_cls]
