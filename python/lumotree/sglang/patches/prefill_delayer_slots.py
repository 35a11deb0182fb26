"""Hook: LUMOTREE_SUFFIX's default prefill delayer holds a prefill on its queue trigger alone, not on SGLang's slot
trigger.

Why: SGLang 0.5.17's ``PrefillDelayer`` holds a prefill on two triggers. The queue trigger (opt-in,
``--prefill-delayer-queue-min-ratio``) waits until a share of the running batch is queued, capped at
``--prefill-delayer-max-delay-ms``: what LUMOTREE_SUFFIX turns on by default to batch the one-at-a-time turns of
closed-loop agents (:func:`lumotree.sglang.scheduling.default_prefill_delayer`). The slot trigger, always on with the
delayer (made for DP attention's balance), also holds a prefill while fewer slots are free than the largest prefill
batch of late (``max_prefill_bs``, decaying 0.2 % a pass), up to ``--prefill-delayer-max-delay-passes`` (30) passes
and no time cap. Where clients keep about ``--max-running-requests`` requests in flight -- agents, each sending its
next turn as its reply ends -- that condition holds nearly always after the first burst, so every turn's prefill
waits out the 30 passes: ~110 ms at 8 requests' 3.7-ms drafted steps. At 8 agents a tenth of the batch rounds to no
queue, so the slot trigger was the only one acting. Runs that left it out had the lower p95 turn latency
(``8-agents-early-delayer`` without the delayer 0.462 s against 0.480, ``32-agents-delayer-default`` at 48 running
1.06 against 1.14; ``docs/performance.md``).

How: SGLang's ``HookRegistry``: ``PrefillDelayer.__init__`` (``AROUND``) notes on the delayer whether the server's
arguments carry LumoTree's mark (:data:`MARK`, set by ``default_prefill_delayer`` only: a user's own
``--enable-prefill-delayer`` keeps SGLang's delayer as SGLang serves it), and ``_negotiate_should_allow_prefill``
(``AROUND``) asks SGLang's pure function with an unbounded running cap on such a delayer, which makes the slot
condition (``max_running_requests - running < max_prefill_bs``) false and leaves every other verdict to SGLang's own
code: the queue trigger, its time and pass caps, the token watermark, the first-pass skip.

Remove when: SGLang can turn the slot trigger off by a flag.
"""
from __future__ import annotations

TARGET_INIT = "sglang.srt.managers.prefill_delayer.PrefillDelayer.__init__"
TARGET = "sglang.srt.managers.prefill_delayer.PrefillDelayer._negotiate_should_allow_prefill"
MARK = "_lumotree_queue_trigger_only"  # on the server's arguments: LumoTree's default delayer
_ON = "_lumotree_queue_trigger_only"  # on the delayer: no slot trigger
UNBOUNDED = 1 << 40  # a running cap no batch comes near: the slot condition never holds


def note_mark(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    server_args = kwargs.get("server_args", args[3] if len(args) > 3 else None)
    setattr(self, _ON, bool(getattr(server_args, MARK, False)))


def queue_trigger_only(original, self, *args, **kwargs):
    if getattr(self, _ON, False) and "max_running_requests" in kwargs:  # SGLang's callers pass keywords
        kwargs["max_running_requests"] = UNBOUNDED
    return original(self, *args, **kwargs)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET_INIT, note_mark, "AROUND")
    register_hook(TARGET, queue_trigger_only, "AROUND")
