"""Hook: the prefill delayer's verdict asked before the scheduler ranks and sizes the waiting requests, not after.

Why: with ``--enable-prefill-delayer`` (SGLang 0.5.17) ``Scheduler._get_new_batch_prefill_raw`` first ranks the
waiting queue (``calc_priority``: a radix-tree match of every waiting prompt under the default ``lpm`` policy), builds
a ``PrefillAdder`` and checks the first request's KV budget, and only then asks the delayer, which holds the prefill
on most passes while it waits for more requests. Each held pass redid that work: served at 32 concurrent agents (tiny
model, H200, ``docs/performance.md``) LUMOTREE_SUFFIX's ``get_next_batch_to_run`` took 1.51 ms per decode step at 32
requests with the delayer on (run ``32-agents-delayer-default``; no speculation's 0.58 with it against 0.34 without)
and 0.61 without the delayer (run ``32-agents-prefill-delayer``, another machine, 1.77 with it); with this hook 0.84
(run ``32-agents-early-delayer``, a third machine). LUMOTREE_SUFFIX turns the delayer on by default
(:func:`lumotree.sglang.scheduling.default_prefill_delayer`).

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on the method): on a pass that would reach the adder -- requests
waiting, none chunked, the running batch not full, no grammar compiling, no hierarchical cache, no priority
preemption, no hybrid-SWA model, no diffusion LM, a delayer whose group is this rank alone
(:func:`lumotree.sglang.patches.prefill_delayer_gather._alone`) -- the delayer is asked first, with the arguments the
adder would give it (``local_prefillable=True``); a hold returns ``(None, running_batch)`` as SGLang's held pass does,
and an allow runs SGLang's method, whose own ask then reads the pass's recorded verdict (the delayer answers once per
pass). The verdicts are SGLang's wherever its adder reaches the ask; on a pass where it would not (the first request
does not fit in the KV pool, no request slot is free) SGLang reports "not prefillable" and restarts the delay, this
asks as prefillable and may hold: no prefill on that pass either way, and a delay that started earlier ends earlier
(its caps count from its start).

Remove when: SGLang asks the delayer before ``calc_priority`` (or caches the ranking across held passes).
"""
from __future__ import annotations

from lumotree.sglang.patches.prefill_delayer_gather import _alone

TARGET = "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw"


def _flexkv() -> bool:
    try:
        from sglang.srt.runtime_context import get_memory

        return bool(get_memory().enable_flexkv)
    except (ImportError, ValueError, AttributeError):
        return False


def _asks_early(self, single_pass, running_batch) -> bool:
    """Whether this pass asks the delayer before SGLang's method (the conditions in the module docstring)."""
    return (single_pass is not None and self.chunked_req is None and len(self.waiting_queue) > 0
            and not running_batch.batch_is_full and not self.grammar_manager.has_waiting_grammars()
            and not getattr(self, "enable_hierarchical_cache", False) and not self.enable_priority_preemption
            and not self.is_hybrid_swa and getattr(self, "dllm_config", None) is None and not _flexkv()
            and _alone(self.prefill_delayer))


def ask_delayer_first(original, self, prefill_delayer_single_pass=None, running_batch=None, *args, **kwargs):
    if _asks_early(self, prefill_delayer_single_pass, running_batch):
        allowed = prefill_delayer_single_pass.negotiate_should_allow_prefill(
            local_prefillable=True, running_batch=running_batch.batch_size(), max_prefill_bs=int(self.max_prefill_bs),
            max_running_requests=self.max_running_requests, waiting_queue_len=len(self.waiting_queue))
        if not allowed:
            return None, running_batch
    return original(self, *args, prefill_delayer_single_pass=prefill_delayer_single_pass, running_batch=running_batch,
                    **kwargs)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, ask_delayer_first, "AROUND")
