"""Benchmark-only: every Triton kernel a server compiles (or loads from Triton's disk cache) while it serves.

Registered only when ``LUMOTREE_BENCH_JIT_LOG=1``; never part of a normal launch. A kernel that meets a new
specialization (a new ``tl.constexpr`` value, an integer argument newly equal to 1 or divisible by 16, a new
dtype) is compiled on the scheduler's thread, inside the step that met it: every running request waits, for
a fraction of a second to seconds. Start-up warm-up and CUDA-graph capture compile what they meet; what a
served workload meets later shows up as stalls in its turn latencies. This logs each compile, as Triton's
``jit_cache_hook`` (before) and ``jit_post_compile_hook`` (after) see it:
``LumoTree JIT: <unix time> <ms> ms <module>.<kernel> <each argument's type and specialization>``, which
``benchmark/serving/sglang_server.py: jit_compiles`` reads back from the server log. SGLang's just-in-time CUDA
modules (built by nvcc through tvm-ffi on first use, not Triton; :func:`lumotree.sglang.compile_watch.on_jit_builds`)
are logged the same way when they build: ``LumoTree JIT: <unix time> <ms> ms tvm_ffi.<module> (nvcc build)``.
"""
from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)

ENV = "LUMOTREE_BENCH_JIT_LOG"


def enabled(env=os.environ) -> bool:
    return env.get(ENV) == "1"


class JitLog:
    """The two hooks (Triton calls them with keyword arguments ``key``, ``repr``, ``fn``, ``compile``, ...)."""

    def __init__(self, log=logger.info, clock=time.perf_counter, wall=time.time):
        self.log, self.clock, self.wall = log, clock, wall
        self.started = {}

    def before(self, *args, **kwargs):
        self.started[self._id(kwargs)] = self.clock()
        return False  # never skip the compile

    def after(self, *args, **kwargs):
        t0 = self.started.pop(self._id(kwargs), None)
        ms = (self.clock() - t0) * 1e3 if t0 is not None else float("nan")
        fn = kwargs.get("fn")
        name = f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}" if fn is not None else "?"
        key = kwargs.get("key")
        spec = key[0] if isinstance(key, tuple) and key else key  # each argument's type and specialization
        self.log("LumoTree JIT: %.6f %.1f ms %s %s", self.wall(), ms, name, str(spec)[:400])
        return False

    def built(self, name, started, seconds):
        """A JIT CUDA module ``name`` built in ``seconds`` (:func:`lumotree.sglang.compile_watch.on_jit_builds`)."""
        self.log("LumoTree JIT: %.6f %.1f ms tvm_ffi.%s (nvcc build)", started + seconds, seconds * 1e3, name)

    @staticmethod
    def _id(kwargs):
        fn = kwargs.get("fn")
        return (id(fn.jit_function) if fn is not None and hasattr(fn, "jit_function") else None, str(kwargs.get("key")))


def install(cpp=None) -> None:
    """Set Triton's compile hooks and watch the JIT CUDA module builds (when :data:`ENV` is ``1``; ``cpp``:
    ``tvm_ffi.cpp``, for tests)."""
    if not enabled():
        return
    from triton import knobs

    from lumotree.sglang import compile_watch

    hooks = JitLog()
    compile_watch.on_jit_builds(hooks.built, cpp)
    after, previous = hooks.after, knobs.runtime.jit_post_compile_hook  # keep a hook set before (compile_watch)

    def post_compile(*args, **kwargs):
        if previous is not None:
            previous(*args, **kwargs)
        return after(*args, **kwargs)

    knobs.runtime.jit_cache_hook = hooks.before
    knobs.runtime.jit_post_compile_hook = post_compile
