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
window is written). Host sync-free: the limits go to the device without blocking, the test runs on
the device. Not covered: requests ended by a stop token or string (their end is known on the host
only, one step late).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

NO_LIMIT = 1 << 62


def length_limits(reqs: Sequence) -> List[int]:
    """Per request: the pre-verify KV length at which its output is complete
    (``len(prompt) + max_new_tokens - 1``; no limit when ``max_new_tokens`` is unset)."""
    out = []
    for r in reqs:
        m = getattr(getattr(r, "sampling_params", None), "max_new_tokens", None)
        out.append(NO_LIMIT if m is None else len(r.origin_input_ids) + int(m) - 1)
    return out


def unfinished_steps(steps: torch.Tensor, seq_lens: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """``steps`` with ``-1`` (skip) for the requests whose pre-verify length ``seq_lens`` has
    reached their limit."""
    bs = steps.shape[0]
    done = seq_lens[:bs].to(torch.long) >= limits[:bs].to(device=seq_lens.device, dtype=torch.long)
    return torch.where(done, torch.full_like(steps, -1), steps)


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
        if lin is None or mode is None or not mode.is_decode() or not getattr(batch, "reqs", None):
            return super().forward_batch_generation(batch, *args, **kwargs)
        limits = torch.tensor(length_limits(batch.reqs), dtype=torch.long)
        if torch.cuda.is_available() and batch.seq_lens.is_cuda:
            limits = limits.pin_memory().to(batch.seq_lens.device, non_blocking=True)
        lin.finish_limits = (batch, limits)
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
