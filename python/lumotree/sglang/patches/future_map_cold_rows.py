"""Hook: the overlap scheduler's relay of a no-draft step's draft input without copying its constant stubs.

Why: under SGLang 0.5.17's overlap scheduler every speculative step's draft input goes through the ``FutureMap``:
``stash`` copies its ``bonus_tokens``, ``topk_p``, ``topk_index`` and ``hidden_states`` into per-request-row buffers
(four indexed writes) and the next step's ``_resolve_spec_extras`` gathers them back (four allocations and a Triton
launch). A step LumoTree serves without a draft, and a prefill whose draft-extend it skipped, hands over constant
stubs for the three draft fields (:class:`lumotree.sglang.worker.ColdStubs`: read-only views of kept buffers), and the
step after a no-draft step is mostly another one, which reads none of them. So at batch 1 of the Qwen3-Next MoE shape,
where the no-draft step is host-bound (2.17 ms against no speculation's 1.66 ms on one H100, SGLang's relay around
the worker 0.58 ms against 0.33 ms: ``git show 16dedbd:benchmark/results/moe_step_parts_h100.json``), the relay copied,
per step, three tensors whose values were known. Served: a relay round 111 -> 43 µs in one process
(``benchmark/results/relay_host_cost_h100.json``), the relay's parts +0.16 ms over no speculation's in a served step
(``benchmark/results/moe_step_parts_h100.json``).

How: SGLang's ``HookRegistry`` (``HookType.AROUND``) on ``FutureMap.stash`` and ``FutureMap._resolve_spec_extras``.
The worker names the stub fields it hands over and its batch's host rows (:func:`note_stub`, :func:`note_rows`).
``stash`` of such a draft input writes the bonus tokens alone and records the rows as *cold* (their three buffers
stale, their draft input the stubs); any other stash first takes its rows out of the record, and where its host rows
are not known writes the stubs into every cold row's buffers and empties the record. ``_resolve_spec_extras`` of a
batch whose rows are all cold gathers the bonus tokens alone and hands the stubs' views over for the rest (the draft
reads them, nothing writes them); a batch with some cold rows has the stubs written into those rows' buffers first,
then SGLang's method. So a row's buffers are stale only while its last stash was a stub's, and whatever reads them
through SGLang's method reads what SGLang's own relay would have left there. Not with SGLang's debug asserts, a
draft-probability or DSA relay, or before the buffers exist (the first stash allocates them): SGLang's methods.

Remove when: SGLang's relay skips fields a step marks constant (or its FutureMap relays only what the next step reads).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

FUTURE_MAP = "sglang.srt.managers.overlap_utils.FutureMap"
SERVED_LINE = "a batch's draft input relayed as the no-draft step's stubs, without their copies"  # logged once

_stubs = None  # the worker's ColdStubs (their views are what a cold row's draft input holds)
_pending = None  # (topk_p tensor object of the stub draft input being returned, its host rows)
_rows: Optional[torch.Tensor] = None  # host request-pool rows of the batch the worker ran last


def note_rows(rows_cpu: Optional[torch.Tensor]) -> None:
    """The host request-pool rows (``req_pool_indices_cpu``) of the batch the worker is running; ``None``: unknown."""
    global _rows
    _rows = rows_cpu


def note_stub(stubs, draft_input, rows_cpu: Optional[torch.Tensor]) -> None:
    """``draft_input`` (a step's next draft input for ``rows_cpu``) holds ``stubs``' views: its stash may leave
    them out of the buffers."""
    global _stubs, _pending
    _stubs = stubs
    _pending = (draft_input.topk_p, rows_cpu) if rows_cpu is not None else None


class ColdRows:
    """Request-pool rows whose FutureMap buffers hold no longer what their draft input is: the stubs'."""

    def __init__(self):
        self.rows = set()
        self.kept = 0  # stashes that left the stubs out (diagnostics, tests)
        self.served = 0  # resolves served from the stubs
        self.written = 0  # rows whose stubs were written into the buffers before SGLang's method read them

    def write(self, fm, rows) -> None:
        """Write the stubs into the buffers of ``rows`` (all cold) and forget them."""
        rows = sorted(rows)
        if not rows:
            return
        n = len(rows)
        if n > _stubs.rows:
            _stubs._grow(n)
        idx = torch.tensor(rows, dtype=torch.int64).to(fm.device, non_blocking=True)
        fm.topk_p_buf[idx] = _stubs.topk_p[:n].to(fm.topk_p_buf.dtype)
        fm.topk_index_buf[idx] = _stubs.topk_index[:n].to(fm.topk_index_buf.dtype)
        if fm.need_hidden_states:
            fm.hidden_states_buf[idx] = _stubs.hidden_states[:n].to(fm.hidden_states_buf.dtype)
        self.rows.difference_update(rows)
        self.written += n


def _cold_of(fm) -> ColdRows:
    got = fm.__dict__.get("lumotree_cold_rows")
    if got is None:
        got = fm.lumotree_cold_rows = ColdRows()
    return got


def _plain(fm) -> bool:
    """Whether this map's relay is the one the hooks know: topk fields, no draft probabilities or DSA indices, no
    debug asserts, buffers allocated."""
    try:
        from sglang.srt.managers import overlap_utils

        debug = bool(getattr(overlap_utils, "_DEBUG_ASSERT", False))
    except ImportError:
        debug = True
    return (not debug and fm._forward_buf_initialized and getattr(fm, "need_topk", False)
            and getattr(fm, "draft_probs_buf", None) is None and getattr(fm, "dsa_topk_indices_buf", None) is None
            and not fm.spec_algo.is_ngram() and not (fm.need_hidden_states and _stubs.hidden_states is None))


def stash(original, self, future_indices, payload, *args, **kwargs):
    global _pending
    pending, _pending = _pending, None
    n = future_indices.shape[0]
    cold = self.__dict__.get("lumotree_cold_rows")
    if n == 0 or _stubs is None or not _plain(self):
        if cold is not None and cold.rows and n > 0:  # (the buffers became another relay's: nothing left stale)
            cold.write(self, cold.rows)
        return original(self, future_indices, payload, *args, **kwargs)
    cold = _cold_of(self)
    rows = _rows if _rows is not None and _rows.shape[0] == n else None
    if pending is not None and payload.topk_p is pending[0] and rows is not None and pending[1].shape[0] == n:
        self.output_tokens_buf[future_indices] = payload.bonus_tokens.to(self.output_tokens_buf.dtype)
        cold.rows.update(rows.tolist())
        cold.kept += 1
        return None
    if cold.rows:  # a stash of real draft fields: its rows are not cold any more
        if rows is None:
            cold.write(self, cold.rows)  # which rows are written is not known here: leave none stale
        else:
            cold.rows.difference_update(rows.tolist())
    return original(self, future_indices, payload, *args, **kwargs)


def resolve_spec_extras(original, self, batch, *args, **kwargs):
    cold = self.__dict__.get("lumotree_cold_rows")
    if cold is None or not cold.rows:
        return original(self, batch, *args, **kwargs)
    draft_input = batch.spec_info
    indices = getattr(draft_input, "future_indices", None) if draft_input is not None else None
    rows = getattr(batch, "req_pool_indices_cpu", None)
    if indices is None or indices.shape[0] == 0 or not _plain(self):
        return original(self, batch, *args, **kwargs)
    if rows is None or rows.shape[0] != indices.shape[0] or getattr(draft_input, "future_dsa_topk_indices_available",
                                                                   False):
        cold.write(self, cold.rows)  # rows unknown here: the buffers made whole, SGLang's method
        return original(self, batch, *args, **kwargs)
    listed = rows.tolist()
    inside = [r for r in listed if r in cold.rows]
    if len(inside) == len(listed):
        bs = len(listed)
        if bs > _stubs.rows:
            _stubs._grow(bs)
        indices.record_stream(torch.get_device_module(self.device).current_stream())
        draft_input.bonus_tokens = self.output_tokens_buf[indices]
        draft_input.topk_p, draft_input.topk_index = _stubs.topk_p[:bs], _stubs.topk_index[:bs]
        if self.need_hidden_states:
            draft_input.hidden_states = _stubs.hidden_states[:bs]
        cold.served += 1
        if cold.served == 1:
            logger.info("LumoTree: %s", SERVED_LINE)
        return None
    if inside:
        cold.write(self, set(inside))
    return original(self, batch, *args, **kwargs)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(f"{FUTURE_MAP}.stash", stash, "AROUND")
    register_hook(f"{FUTURE_MAP}._resolve_spec_extras", resolve_spec_extras, "AROUND")
