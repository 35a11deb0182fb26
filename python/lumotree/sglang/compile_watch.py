"""How many Triton kernels this process has compiled (or loaded from Triton's disk cache) so far.

A kernel that meets a new specialisation compiles on the scheduler's thread inside the decode step that met it --
tens to hundreds of milliseconds (a 116 ms compile of SGLang's slot kernel inside a profiled window; a LUMOTREE
server's first decode steps, serving its warm-up requests, read ~83 ms where its later ones took 3 ms, Qwen3-Next MoE
shape, one H100). The adaptive tree size's step clock (:class:`lumotree.sglang.worker.StepClock`) leaves out the
sample of a step in whose interval the count moved: such a time is the compile's, not the candidate's, and a few of
them decide a bucket before its own samples outvote them.

:func:`install` chains a counter onto Triton's post-compile hook (``triton.knobs.runtime.jit_post_compile_hook``,
which Triton calls after every compile or disk-cache load, never on a hit of its in-memory cache), keeping any hook
set before (the benchmark's compile log, :mod:`lumotree.sglang.jit_log`), once per process.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

logger = logging.getLogger(__name__)

_count = 0
_installed = False


def count() -> int:
    """Triton compiles (and disk-cache loads) seen since :func:`install`."""
    return _count


def _chained(previous):
    def hook(*args, **kwargs):
        global _count
        _count += 1
        return previous(*args, **kwargs) if previous is not None else None
    return hook


def install(knobs=None) -> Optional[Callable[[], int]]:
    """Count Triton's compiles from now on (once per process; ``knobs``: ``triton.knobs``, for tests); :func:`count`,
    or ``None`` where Triton has no such hook."""
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
    _installed = True
    return count
