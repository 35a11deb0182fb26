"""Benchmark-only: the Python stacks of a server's threads when one of its scheduler's steps stalls.

Registered only when ``LUMOTREE_BENCH_STALL_DUMP_S`` is set (seconds, e.g. ``2``); never part of a normal launch.
The compile log (:mod:`lumotree.sglang.jit_log`: Triton's compiles, SGLang's JIT CUDA module builds) names a stall
that a kernel compile causes; a stall with no compile logged -- a first step that waits seconds on something else (a
``torch.compile`` in a worker pool, a lock, a lazy import) -- shows only as a gap between two log lines. This marks
each ``Scheduler.run_batch`` and ``Scheduler.process_batch_result`` call (SGLang's ``HookRegistry``, ``AROUND``) for a
watchdog thread (:class:`Watch`): a call that runs longer than the threshold has every thread's stack written to the
server's standard error (its log) once per threshold while it lasts, after a ``LumoTree stall dump: <call> running
<s> s`` line; a call that returns in time writes nothing. The stack of the scheduler's thread shows where the call
waits, the log lines around it when.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time

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


class Watch:
    """One watchdog thread for the hooked calls: a call marks its start (a float store, no system call: arming a
    ``faulthandler`` timer per call started a thread each time, ~36 us a call on this project's CI machine -- a
    few percent of a 1.8 ms step) and its end; the thread wakes every ``poll`` seconds and, while a call has run
    over ``seconds`` since its start or its last dump, writes a ``LumoTree stall dump: <call> running <s> s``
    line and every thread's stack (:func:`faulthandler.dump_traceback`) to ``file``. It needs the GIL to look: a
    stall inside native code that holds the GIL is dumped when that code lets go."""

    def __init__(self, seconds: float, file=None, poll=None, clock=time.perf_counter):
        self.seconds, self.file, self.clock = seconds, file, clock
        self.poll = poll if poll is not None else min(0.25, seconds / 4)
        self.call = None  # (name, start) of the hooked call in progress
        self.dumped = {}  # start -> when its last dump was written
        self._thread = None

    def hook(self, name: str):
        """An ``AROUND`` hook ``(original, self, *args, **kwargs)`` that marks the call ``name`` while it runs (and
        starts the watchdog thread at its first call)."""

        def around(original, obj, *args, **kwargs):
            if self._thread is None:  # the first hooked call: only the scheduler's process makes one
                self.start()
            outer = self.call
            self.call = (name, self.clock())
            try:
                return original(obj, *args, **kwargs)
            finally:
                self.call = outer

        return around

    def check(self) -> bool:
        """One look (the thread's loop body): whether it dumped."""
        call = self.call
        if call is None:
            return False
        name, start = call
        now = self.clock()
        if now - self.dumped.get(start, start) < self.seconds:
            return False
        out = self.file if self.file is not None else sys.stderr
        out.write(f"LumoTree stall dump: {name} running {now - start:.1f} s\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
        self.dumped = {start: now}
        return True

    def start(self) -> "Watch":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lumotree-stall-dump", daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while True:
            time.sleep(self.poll)
            try:
                self.check()
            except Exception:  # a diagnostic never takes the server down
                logger.exception("LumoTree stall dump failed")


def install(env=os.environ) -> bool:
    """Register the hooks where :data:`ENV` is set; whether they were."""
    seconds = threshold(env)
    if seconds is None:
        return False
    from lumotree.sglang.patches import register_hook

    watch = Watch(seconds)  # its thread starts at the first hooked call (the plugin loads in every process)
    for name in HOOKED:
        register_hook(f"{SCHEDULER}.{name}", watch.hook(name), "AROUND")
    logger.info("LumoTree stall dump: thread stacks after %g s in Scheduler.%s", seconds, " / ".join(HOOKED))
    return True
