"""Hook: a prompt-interior state tracked by an extend (:mod:`lumotree.sglang.prompt_state`) lives on that extend only.

Why: SGLang's decode and verify paths read ``ScheduleBatch.mamba_track_indices`` as the ``extra_buffer`` cache's
interval snapshot wherever it is set, and a prefill batch whose requests all continue becomes the running batch
as it is (``filter_batch`` keeps its fields); a batch rebuilt between preparation and forward (none of the paths
LumoTree's servers run, but not excluded) would not carry the fields and must not cache the slots.

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on ``Scheduler.run_batch``): before SGLang's method,
:func:`lumotree.sglang.prompt_state.before_forward` marks the requests' slots as written where the batch still
carries the fields it was given (else frees them); after it, :func:`lumotree.sglang.prompt_state.after_forward`
clears them. Batches without tracking pass through with one attribute read. Installed only while a LumoTree
server runs.

Remove when: SGLang scopes ``mamba_track_*`` to the forward that takes them (or :mod:`lumotree.sglang.patches.
prompt_state_batch` goes).
"""
from __future__ import annotations

from lumotree.sglang.prompt_state import BATCH_ATTR, after_forward, before_forward

TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"


def run_batch(original, self, batch, *args, **kwargs):
    if getattr(batch, BATCH_ATTR, None) is None:
        return original(self, batch, *args, **kwargs)
    before_forward(batch)
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        after_forward(batch)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, run_batch, "AROUND")
