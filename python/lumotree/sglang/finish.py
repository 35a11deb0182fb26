"""Where a request ends, told on the device: a speculative step accepts no token past a request's end,
and SGLang's overlap scheduler caches a finished request's state as its key has it.

Both rest on one table per request-pool slot (:class:`FinishedRows`): the token ids SGLang's
``Req._check_token_based_finish`` stops the request on (its ``stop_token_ids``, the model's and the
tokenizer's EOS ids; none with ``ignore_eos``) and the KV length at which its output holds
``max_new_tokens`` tokens, written when the request is admitted by prefill (:meth:`FinishedRows.admit`).

**The accepted run ends at the request's end** (:meth:`FinishedRows.clamp_run`, every LUMOTREE and
LUMOTREE_SUFFIX verify,
``patches/eagle_sample_end.py``). A verify step accepts a run of tokens (drafts + bonus); when the run
holds a stop token or reaches ``max_new_tokens`` before its last token, SGLang keeps the tokens
after it in the KV cache and the GDN state (the commit replays the whole run) while the host trims
the output -- so the finished request's cached state holds tokens past its key, and the next turn
that hits it (a multi-turn agent's prompt holds the reply) starts from a wrong state. The clamp cuts
the run at its first finishing token, which becomes the step's bonus token: the output is the same,
the commit stops where the key stops, and the KV cache of the request is what a non-speculative
server's would be (the last token, the stop, has no KV).

**The overlap scheduler with a consistent radix cache** (the default with the radix cache on). SGLang's overlap
scheduler launches decode step N+1 before it processes step N's results, so a request that finished in
step N still takes part in step N+1. With the ``no_buffer`` state cache the finished request's own
state slot is what the radix cache keeps (SGLang donates it), and by the time it is cached step N+1 has
already updated it. SGLang therefore refuses ``no_buffer`` with overlap, and its ``extra_buffer``
strategy (interval snapshots) served speculative requests states that differ from a fresh prefill
(``benchmark/results/cache_consistency_h200.json``). Without a host sync:

* **on the device**, after each step, the rows whose request that step finished by the same rule are
  marked (:meth:`FinishedRows.mark_step`);
* the next step's GDN state indices of marked rows become ``-1`` (SGLang's padding sentinel: the conv
  and recurrent kernels, LumoTree's verify and commit skip such rows; :meth:`FinishedRows.mask_rows`,
  called by the backend after SGLang filled the indices, graph replay included): the extra step
  leaves the finished request's state slot as step N left it;
* **on the host**, a request that finished for a reason the device does not see (a stop string, an
  abort, a grammar, a vocabulary-boundary stop, a length limit other than ``max_new_tokens``) or that
  the device rule does not cover (grammar-constrained requests: the grammar may cut the accepted
  tokens) is released without inserting its state (:func:`trusts_device_finish`; SGLang's
  ``skip_radix_cache_insert``).

The device rule marks only requests the host also finishes (the same stop sets, the same length
count; property-tested against SGLang's ``Req.update_finish_state``), so a running request is never
cut or skipped. Both LumoTree workers (the LUMOTREE tree worker and the LUMOTREE_SUFFIX NGRAM-loop
worker, which LUMOTREE_ORACLE shares) wrap their forward in :func:`forward_marked`; which servers run
the overlap form is :func:`lumotree.sglang.scheduling.overlap_applies`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from lumotree import ops

MAX_STOP_IDS = 16  # stop token ids per request the device table holds; a request with more is not device-ruled


def stop_token_ids(req) -> Optional[set]:
    """The token ids SGLang's ``Req._check_token_based_finish`` stops ``req`` on (empty with
    ``ignore_eos``), or ``None`` when the device rule must not cover the request."""
    sp = req.sampling_params
    if getattr(req, "grammar", None) is not None:
        return None  # the grammar may cut the accepted tokens: the device would see tokens the host drops
    if sp.ignore_eos:
        return set()
    ids = set(sp.stop_token_ids or ())
    ids |= set(getattr(req, "eos_token_ids", None) or ())
    tok = getattr(req, "tokenizer", None)
    if tok is not None:
        if getattr(tok, "eos_token_id", None) is not None:
            ids.add(int(tok.eos_token_id))
        ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
    return {int(t) for t in ids}


def ruled_stop_ids(req) -> Optional[set]:
    """The stop ids of :func:`stop_token_ids` where the device rule covers ``req`` (at most
    ``MAX_STOP_IDS`` of them and a ``max_new_tokens``), else ``None``."""
    ids = stop_token_ids(req)
    if ids is None or len(ids) > MAX_STOP_IDS or req.sampling_params.max_new_tokens is None:
        return None
    return ids


class FinishedRows:
    """Per request-pool slot: the device finish rule's inputs and the finished mark (see the module
    docstring). One per request pool, shared by the worker (marks) and the GDN backends (masks).

    Args:
        slots (int): request-pool slots (``req_to_token.shape[0]``).
        device: where the tables live.
    """

    def __init__(self, slots: int, device):
        self.stop = torch.full((slots, MAX_STOP_IDS), -1, dtype=torch.int64, device=device)
        self.max_len = torch.zeros(slots, dtype=torch.int64, device=device)  # KV length at which the output is full
        self.ruled = torch.zeros(slots, dtype=torch.bool, device=device)  # the device rule covers the request
        self.done = torch.zeros(slots, dtype=torch.bool, device=device)
        self.ones = torch.ones(slots, dtype=torch.int32, device=device)  # a prefill's accept lengths (mark_step)
        self._live = torch.zeros(slots, dtype=torch.bool, device=device)
        # the rows of the step being marked still running after it (:meth:`mark_step`), ``None`` until it is marked
        self.step_live: Optional[torch.Tensor] = None
        if (self.done.device.type == "cuda" and ops.backend_for(self.done.device) == "triton"
                and not ops.cuda_op("mask_finished")):  # (the CUDA op compiles nothing)
            from lumotree.ops.finish.triton import warm_mask_finished

            warm_mask_finished(self.done.device)  # compiled at start-up: mask_rows runs before every decode forward

    @classmethod
    def of(cls, req_to_token_pool) -> "FinishedRows":
        """The pool's table, made on first use."""
        rows = getattr(req_to_token_pool, "lumotree_finished", None)
        if rows is None:
            rt = req_to_token_pool.req_to_token
            rows = cls(rt.shape[0], rt.device)
            req_to_token_pool.lumotree_finished = rows
        return rows

    # ------------------------------------------------------------------ host: admission
    def admit(self, reqs: Sequence, req_pool_indices: torch.Tensor) -> None:
        """Rows of requests entering a batch by prefill (every chunk of a chunked prefill): their rule
        inputs, not finished. The KV length at which a request's output holds ``max_new_tokens`` tokens
        is ``len(origin_input_ids) + max_new_tokens - 1`` (the last sampled token has no KV yet).

        The rows travel as one ``int64 [n, MAX_STOP_IDS + 2]`` block (stop ids, the length, the rule): one pinned
        host copy, one copy to the device, three index copies and a fill. Why: a multi-turn agent's turn starts
        with a prefill of one request, and three tensors built per request, pinned, copied and assigned apart took
        0.29-0.46 ms of the scheduler's thread per prefill at 32 concurrent agents (tiny model, H200 hosts)."""
        n = len(reqs)
        if n == 0:
            return
        block = np.full((n, MAX_STOP_IDS + 2), -1, dtype=np.int64)
        block[:, MAX_STOP_IDS:] = 0  # not ruled, no length
        for i, req in enumerate(reqs):
            ids = ruled_stop_ids(req)
            if ids is None:
                continue
            block[i, :len(ids)] = sorted(ids)
            block[i, MAX_STOP_IDS] = len(req.origin_input_ids) + int(req.sampling_params.max_new_tokens) - 1
            block[i, MAX_STOP_IDS + 1] = 1
        host = torch.from_numpy(block)
        dev = self.done.device
        if dev.type == "cuda":  # pinned, so that the copy is asynchronous: no wait for the step in flight
            host = host.pin_memory()
        rows = host.to(dev, non_blocking=True)
        idx = req_pool_indices[:n].to(device=dev, dtype=torch.long)
        # index_copy_ / index_fill_ (a batch's rows are distinct): half the host time of indexed assignment
        self.stop.index_copy_(0, idx, rows[:, :MAX_STOP_IDS])
        self.max_len.index_copy_(0, idx, rows[:, MAX_STOP_IDS])
        self.ruled.index_copy_(0, idx, rows[:, MAX_STOP_IDS + 1].bool())
        self.done.index_fill_(0, idx, False)

    # ------------------------------------------------------------------ device: after a decode step
    def mark_step(self, req_pool_indices: torch.Tensor, next_token_ids: torch.Tensor, accept_lens: torch.Tensor,
                  new_seq_lens: torch.Tensor, stride: int) -> None:
        """Mark the rows this decode step finished (device ops only, no sync; a mark stays until the slot's
        next request is admitted: the step after a finish is the one to skip). ``next_token_ids``
        ``[bs * stride]``: each row's accepted tokens first (SGLang's V2 layout), ``accept_lens`` ``[bs]``
        drafts + bonus, ``new_seq_lens`` ``[bs]`` the KV length after the step
        (:func:`lumotree.ops.mark_finished`: one kernel launch on CUDA). The same launch writes which of the
        step's rows are still running after it: :attr:`step_live` (``[bs]`` bool, until the next step's mark).

        Why there: an adaptive worker's acceptance sample of a drafted step counts only those rows
        (:meth:`lumotree.sglang.worker.StepLedger.note_live_rows`), and reading them from ``done`` after the mark --
        a gather and a negation, then a copy into a newly pinned host tensor -- took 0.076 ms median per decode step
        at one agent, 0.56 s of the 19.3 s of decode intervals (tiny model, H200, run ``1-agent-flags-alone``)."""
        bs = accept_lens.shape[0]
        live = self._live[:bs] if bs <= self._live.shape[0] else None
        ops.mark_finished(self.done, self.stop, self.max_len, self.ruled, req_pool_indices, next_token_ids,
                          accept_lens, new_seq_lens, stride, live)
        self.step_live = live

    # ------------------------------------------------------------------ device: a verify's accepted run
    def clamp_run(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, predict: torch.Tensor,
                  accept_lens: torch.Tensor, accept_index: torch.Tensor) -> torch.Tensor:
        """Cut each row's accepted run at its first finishing token (device ops only). ``accept_index``
        ``[bs, W]``: the run's tree nodes into ``predict`` (root first, ``-1`` past the run; modified in
        place), ``accept_lens`` ``[bs]`` drafts + bonus, ``seq_lens`` ``[bs]`` the KV length before the
        step. Returns the new ``accept_lens`` (:func:`lumotree.ops.clamp_run`: one kernel launch on CUDA)."""
        return ops.clamp_run(self.stop, self.max_len, self.ruled, req_pool_indices, seq_lens, predict, accept_lens,
                             accept_index)

    # ------------------------------------------------------------------ device: before a forward
    def mask_rows(self, state_indices: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
        """Set the GDN state indices of finished rows to ``-1`` in place (``state_indices`` ``[>= n]``,
        ``req_pool_indices`` ``[n]``; :func:`lumotree.ops.mask_finished`: one kernel launch on CUDA, where the torch
        ops -- a gather and a masked fill -- were two of the eager launches between a no-draft step's decode graphs
        that no speculation's decode step does not have, ``benchmark/results/no_draft_step_gaps_h100.json``)."""
        ops.mask_finished(state_indices, self.done, req_pool_indices)


def trusts_device_finish(req) -> bool:
    """Whether the finished ``req``'s state slot was left as its last step made it (so its state may be
    cached): it finished by the device rule's stop tokens or ``max_new_tokens`` and the rule covers it."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN

    reason = req.finished_reason
    ids = ruled_stop_ids(req)
    if ids is None:
        return False
    if isinstance(reason, FINISH_LENGTH):
        return len(req.output_ids) >= req.sampling_params.max_new_tokens
    if isinstance(reason, FINISH_MATCHED_TOKEN):
        return isinstance(reason.matched, int) and int(reason.matched) in ids
    return False


def ends_after_step(reqs, lag: int) -> bool:
    """Whether every request of a decode step about to launch is certain to have ended once the step has run: it has
    finished, or the step's one token at least brings its output to ``max_new_tokens`` -- the output on the host plus
    ``lag`` tokens not processed yet (the overlap scheduler's: 1 where the step launched before this one held the
    request -- it adds a token at least --, else 0). ``False`` for no requests or one without a ``max_new_tokens``.

    Such a step (the last of a batch that ends together, and under the overlap scheduler the extra step after it,
    which still holds the requests the step before finished) keeps none of a draft's tokens: the adaptive worker
    serves it no draft without a policy decision (:meth:`lumotree.sglang.worker.StepLedger.choose`). A lower bound
    on the tokens the step adds: where it is wrong (a grammar's sync processed the step before) a step that could
    have drafted serves no draft -- the output is the same either way."""
    if not reqs:
        return False
    for req in reqs:
        limit = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
        if limit is None or (len(req.output_ids) + lag + 1 < limit and not req.finished()):
            return False
    return True


def admit_batch(batch) -> None:
    """A worker's call before each forward: a prefill batch admits its requests into the pool's table."""
    if batch.forward_mode.is_extend():
        FinishedRows.of(batch.req_to_token_pool).admit(batch.reqs, batch.req_pool_indices)


def forward_marked(consistent: bool, batch, forward):
    """A speculative worker's forward (``forward()``, SGLang's, on ``batch``) with this module's
    bookkeeping around it: a prefill batch admits its requests (the run clamp); with the overlap
    scheduler's consistent cache (``consistent``) the rows the step finished are marked after it. The
    result layouts are SGLang's EAGLE V2 and NGRAM workers': ``next_token_ids`` ``[bs]`` after a prefill,
    each row's accepted tokens first (stride ``speculative_num_draft_tokens``) after a decode step."""
    prefill = batch.forward_mode.is_extend()
    admit_batch(batch)
    seq_lens, rows = batch.seq_lens, batch.req_pool_indices  # as the forward finds them (it may rebind them)
    if consistent and not batch.forward_mode.is_idle():
        FinishedRows.of(batch.req_to_token_pool).step_live = None  # until this step's rows are marked
    out = forward()
    if not consistent or batch.forward_mode.is_idle() or getattr(out, "next_token_ids", None) is None:
        return out
    fin = FinishedRows.of(batch.req_to_token_pool)
    if prefill:  # the prefill's sampled token can finish a request too (a stop token, max_new_tokens 1)
        bs = seq_lens.shape[0]
        fin.mark_step(rows, out.next_token_ids, fin.ones[:bs], seq_lens, 1)
    elif getattr(out, "accept_lens", None) is not None:
        fin.mark_step(rows, out.next_token_ids, out.accept_lens, out.new_seq_lens, out.speculative_num_draft_tokens)
    return out


def keep_out_of_cache(consistent: bool, req) -> None:
    """SGLang's ``prepare_for_kv_cache_release`` for a speculative worker: with the overlap scheduler's
    consistent cache a finished request's state is cached only if the device rule kept its slot as its
    last step left it (:func:`trusts_device_finish`)."""
    if consistent and not trusts_device_finish(req):
        req.skip_radix_cache_insert = True
