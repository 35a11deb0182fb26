"""Hook: the prefill delayer's verdict on a pass with nothing to prefill, when its group is this rank alone.

Why: with ``--enable-prefill-delayer`` (SGLang 0.5.17) every scheduler pass ends in
``PrefillDelayerSinglePassExecutor.finalize``, which, on a pass that did not ask the delayer (nothing waiting, the
running batch full), negotiates ``local_prefillable=False`` anyway: the local row packed into a tensor, the gather
(:mod:`lumotree.sglang.patches.prefill_delayer_gather` skips its collective on one rank), then a ``min``/``max``/``sum``
and ``.item()`` per field -- about a dozen small torch CPU ops per pass to conclude that nothing is prefillable. That is
most passes of a decode-bound server. Served at 8 concurrent agents (tiny model, H200, run ``8-agents-early-delayer``)
LUMOTREE_SUFFIX's ``get_next_batch_to_run`` took 0.66 ms median per decode step at 8 requests with its default delayer
against 0.43 without it (no speculation 0.29). LUMOTREE_SUFFIX turns the delayer on by default
(:func:`lumotree.sglang.scheduling.default_prefill_delayer`).

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on ``PrefillDelayer._negotiate_should_allow_prefill``): where the
delayer's group is this rank alone (:func:`lumotree.sglang.patches.prefill_delayer_gather._alone`) and the pass is not
prefillable, the verdict SGLang's pure function gives for that case is built directly -- status ``none``, allowed,
no reason, nothing prefillable or forced by the token watermark, the delay state cleared, the wait carried from the
state before (what its metrics observe) -- and the delayer's state set as SGLang's wrapper sets it. Every other pass
runs SGLang's. The verdicts equal SGLang's on a random stream of passes (``benchmark/serving/prefill_delayer_cpu.py``,
``test/sglang/test_prefill_delayer.py``).

Remove when: SGLang decides a one-rank non-prefillable pass without tensors (or skips the negotiation when nothing
waits).
"""
from __future__ import annotations

import time

from lumotree.sglang.patches.prefill_delayer_gather import _alone

TARGET = "sglang.srt.managers.prefill_delayer.PrefillDelayer._negotiate_should_allow_prefill"


def idle_alone(original, self, *args, **kwargs):
    local_prefillable = kwargs["local_prefillable"] if "local_prefillable" in kwargs else args[0]
    if local_prefillable or not _alone(self):
        return original(self, *args, **kwargs)
    from sglang.srt.managers.prefill_delayer import _NegotiateOutput

    prev = self._curr_state
    self._curr_state = None
    return _NegotiateOutput(next_state=None, input_estimation="none", output_allow=True, output_reason="",
                            num_prefillable=0, num_token_watermark_force_allow=0,
                            wait_forward_passes=prev.delayed_count if prev else 0,
                            wait_seconds=(time.perf_counter() - prev.start_time) if prev else 0.0)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, idle_alone, "AROUND")
