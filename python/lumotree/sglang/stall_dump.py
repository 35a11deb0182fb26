"""Benchmark-only: the Python stacks of a server's threads when one of its scheduler's steps stalls.

Registered only when ``LUMOTREE_BENCH_STALL_DUMP_S`` is set (seconds, e.g. ``2``); never part of a normal launch.
The Triton compile log (:mod:`lumotree.sglang.jit_log`) names a stall that a kernel compile causes; a stall with no
compile logged -- a first step that waits seconds on something else (a ``torch.compile`` in a worker pool, a lock, a
lazy import) -- shows only as a gap between two log lines. This arms :func:`faulthandler.dump_traceback_later` around
``Scheduler.run_batch`` and ``Scheduler.process_batch_result`` (SGLang's ``HookRegistry``, ``AROUND``): a call that
runs longer than the threshold has every thread's stack written to the server's standard error (its log) once per
threshold while it lasts, even while the scheduler's thread sits in native code holding the GIL; a call that returns
in time writes nothing. Each dump starts with faulthandler's ``Timeout (H:MM:SS)!`` line; the stack of the scheduler's
thread shows which call stalled, the log lines around it when.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys

logger = logging.getLogger(__name__)

ENV = "LUMOTREE_BENCH_STALL_DUMP_S"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
HOOKED = ("run_batch", "process_batch_result")


def threshold(env=os.environ):
    """The threshold in seconds (``> 0``), or ``None`` when the dump is off; a value that is not a positive number
    raises ``ValueError`` naming the variable."""
    raw = env.get(ENV)
    if raw is None or raw == "":
        return None
    try:
        s = float(raw)
    except ValueError:
        s = float("nan")
    if not s > 0:
        raise ValueError(f"{ENV}={raw!r}: expected a positive number of seconds")
    return s


def armed(name: str, seconds: float, file=None):
    """An ``AROUND`` hook ``(original, self, *args, **kwargs)`` that dumps every thread's stack to ``file`` (default
    standard error) each ``seconds`` that the wrapped call ``name`` runs."""

    def hook(original, self, *args, **kwargs):
        faulthandler.dump_traceback_later(seconds, repeat=True, file=file if file is not None else sys.stderr)
        try:
            return original(self, *args, **kwargs)
        finally:
            faulthandler.cancel_dump_traceback_later()

    return hook


def install(env=os.environ) -> bool:
    """Register the hooks where :data:`ENV` is set; whether they were."""
    seconds = threshold(env)
    if seconds is None:
        return False
    from lumotree.sglang.patches import register_hook

    for name in HOOKED:
        register_hook(f"{SCHEDULER}.{name}", armed(name, seconds), "AROUND")
    logger.info("LumoTree stall dump: thread stacks after %g s in Scheduler.%s", seconds, " / ".join(HOOKED))
    return True
