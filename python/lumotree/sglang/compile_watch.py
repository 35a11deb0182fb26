"""How many Triton kernels this process has compiled (or loaded from Triton's disk cache) so far, and SGLang's
just-in-time CUDA modules it has built.

A kernel that meets a new specialisation compiles on the scheduler's thread inside the decode step that met it --
tens to hundreds of milliseconds (a 116 ms compile of SGLang's slot kernel inside a profiled window; a LUMOTREE
server's first decode steps, serving its warm-up requests, read ~83 ms where its later ones took 3 ms, Qwen3-Next MoE
shape, one H100). The adaptive tree size's step clock (:class:`lumotree.sglang.worker.StepClock`) leaves out the
sample of a step in whose interval the count moved: such a time is the compile's, not the candidate's, and a few of
them decide a bucket before its own samples outvote them.

:func:`install` chains a counter onto Triton's post-compile hook (``triton.knobs.runtime.jit_post_compile_hook``,
which Triton calls after every compile or disk-cache load, never on a hit of its in-memory cache), keeping any hook
set before (the benchmark's compile log, :mod:`lumotree.sglang.jit_log`), once per process; and counts each build
of one of SGLang's just-in-time CUDA modules (:func:`on_jit_builds`).

Why the CUDA modules too: SGLang 0.5.17 builds some kernels with nvcc on first use (``sglang.kernels.jit.utils.
load_jit``, through tvm-ffi; not Triton, so Triton's hook does not see them) -- its decode position kernel took 8-9 s
inside a LUMOTREE server's first no-draft step on a fresh machine (``benchmark/results/moe_cold_start_h100.json``).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

_count = 0
_installed = False


def count() -> int:
    """Triton compiles (and disk-cache loads) and JIT CUDA module builds seen since :func:`install`."""
    return _count


def _chained(previous):
    def hook(*args, **kwargs):
        global _count
        _count += 1
        return previous(*args, **kwargs) if previous is not None else None
    return hook


# the functions of ``tvm_ffi.cpp`` that build a module (``load_jit`` calls one of them where its build cache has no
# module yet, and loads a cached one without them)
TVM_BUILDS = ("load", "load_inline")


def on_jit_builds(callback: Callable[[str, float, float], None], cpp=None) -> bool:
    """Call ``callback(name, started, seconds)`` (``started``: ``time.time()`` at the start) after each build of a
    just-in-time CUDA module by ``tvm_ffi.cpp`` (``cpp``: that module, for tests) -- chained onto what is there, so that
    several watchers see every build; a build that raises is passed on unreported. ``False`` where tvm-ffi is
    missing."""
    if cpp is None:
        try:
            from tvm_ffi import cpp
        except ImportError:
            return False
    for attr in TVM_BUILDS:
        build = getattr(cpp, attr, None)
        if build is None:
            continue

        def watched(name, *args, _build=build, **kwargs):
            started, tic = time.time(), time.perf_counter()
            out = _build(name, *args, **kwargs)
            callback(str(name), started, time.perf_counter() - tic)
            return out

        setattr(cpp, attr, watched)
    return True


def _count_build(name, started, seconds) -> None:
    global _count
    _count += 1


def install(knobs=None, cpp=None) -> Optional[Callable[[], int]]:
    """Count Triton's compiles and SGLang's JIT CUDA module builds from now on (once per process; ``knobs``:
    ``triton.knobs``, ``cpp``: ``tvm_ffi.cpp``, for tests); :func:`count`, or ``None`` where Triton has no such hook."""
    global _installed
    if _installed:
        return count
    if knobs is None:
        try:
            from triton import knobs
        except ImportError:
            return None
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return None
    runtime.jit_post_compile_hook = _chained(runtime.jit_post_compile_hook)
    on_jit_builds(_count_build, cpp)
    _installed = True
    return count
