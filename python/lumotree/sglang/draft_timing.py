"""Benchmark-only: the host time of the model-free draft preparation per decode step, as a server spends it.

Registered only when ``LUMOTREE_BENCH_DRAFT_TIMING=1``; never part of a normal launch. A model-free
speculative server (SGLang's NGRAM, LumoTree's LUMOTREE_SUFFIX: the same NGRAM loop) prepares each step's
drafts on the scheduler's thread before the verify is launched -- context tracking, drafting, SGLang's
tree layout -- so that time adds to every step of a host-bound server. The CPU benchmark
(``benchmark/drafters/suffix_host_cost.py --worker``) times it on synthetic contexts; this times it
served, on the workload's own requests, for both servers alike:

* SGLang's ``NGRAMWorker._prepare_draft_tokens`` through an ``AROUND`` hook (SGLang's ``HookRegistry``);
* LUMOTREE_SUFFIX's override of it (:func:`lumotree.sglang.suffix.prepare_draft_tokens`) through
  :func:`measure`, which the override calls (a subclass method is not reached by a hook on the base class).

Per batch bucket (the next power of two) the wall times of ``REPORT_EVERY`` steps are logged as one line,
``LumoTree draft timing: batch bucket B: median X ms, p95 Y ms over N steps, total Z ms``, which
``benchmark/serving/sglang_server.py: draft_timing`` reads back from the server log.

LUMOTREE_SUFFIX also admits each prefill batch's prompts into its drafter right after launching the prefill
(:func:`lumotree.sglang.suffix.admit_prefilled`): :data:`ADMISSIONS` times the scheduler thread's share of those calls
per bucket of the batch's request count (``LumoTree admission timing: ...``, the same form, "batches" for "steps");
the indexing they leave running in the background is waited for, where it is still running, inside the next drafted
step's preparation, which :data:`TIMER` times.

Both workers begin a drafted step's preparation by copying the last step's accepted tokens to the host, which waits
for that step's GPU work: time on the scheduler's thread, but the GPU's, not the drafter's. :func:`measure` waits for
it first (the current stream, which that copy waits on) and times the wait apart (:data:`WAIT`, ``LumoTree draft-wait
timing: ...``), so that :data:`TIMER` holds the host work alone. Inside it LUMOTREE_SUFFIX's one call into the C++
drafter per step (``step_layout``: the step's appends, drafts and their layout, the GIL released) is timed apart too
(:data:`NATIVE`, ``LumoTree draft-native timing: ...``): the rest of :data:`TIMER` is the Python around it. And the
part of :data:`TIMER` a step spends blocked on admissions still indexing in the background
(:meth:`lumotree.sglang.suffix.SuffixCorpus._wait_for`, reported through :func:`add_held`) is timed apart per step, zero
where it did not wait (:data:`HELD`, ``LumoTree draft-held timing: ...``). Where a step instead drafted nothing for
requests still indexing, how much longer their indexing ran (:data:`LEFT`, ``LumoTree admission-left timing: ...``,
per admission batch, bucketed by its request count): what a step that waited for it would have waited.
"""
from __future__ import annotations

import collections
import logging
import os
import time
from typing import Callable, Dict, List

from lumotree.sglang.adaptive import bucket

logger = logging.getLogger(__name__)

ENV = "LUMOTREE_BENCH_DRAFT_TIMING"
TARGET = "sglang.srt.speculative.ngram_worker.NGRAMWorker._prepare_draft_tokens"
REPORT_EVERY = 64  # steps of a batch bucket per logged line


def enabled(env=os.environ) -> bool:
    return env.get(ENV) == "1"


class DraftTimer:
    """Wall times (ms) per batch bucket; a line logged per ``every`` samples of a bucket."""

    def __init__(self, every: int = REPORT_EVERY, log: Callable[..., None] = logger.info, what: str = "draft",
                 unit: str = "steps"):
        self.every, self.log, self.what, self.unit = every, log, what, unit
        self.samples: Dict[int, List[float]] = collections.defaultdict(list)

    def add(self, batch: int, seconds: float) -> None:
        b = bucket(batch)  # the adaptive tree size's buckets (CUDA-graph padding)
        got = self.samples[b]
        got.append(seconds * 1e3)
        if len(got) >= self.every:
            s = sorted(got)
            self.log("LumoTree %s timing: batch bucket %d: median %.3f ms, p95 %.3f ms over %d %s, total %.1f ms",
                     self.what, b, s[len(s) // 2], s[min(len(s) - 1, int(0.95 * len(s)))], len(s), self.unit, sum(s))
            got.clear()


TIMER = DraftTimer()
WAIT = DraftTimer(what="draft-wait")
NATIVE = DraftTimer(what="draft-native")
ADMISSIONS = DraftTimer(every=16, what="admission", unit="batches")
HELD = DraftTimer(what="draft-held")
# per admission batch whose requests a decode step found still indexing: from that step's preparation to the indexing's
# end (the wait that step would have had, had it waited instead of drafting nothing for them); zero-length where the
# indexing ended before the step looked (LumoTree's corpus, lumotree.sglang.suffix.SuffixCorpus)
LEFT = DraftTimer(every=16, what="admission-left", unit="admissions")
_on = enabled()
_held = [0.0]  # seconds the draft preparation in progress waited for background admissions


def enabled_now() -> bool:
    """Whether this process times (the server's switch, read once at :func:`install`)."""
    return _on


def add_held(seconds: float) -> None:
    """A wait of the draft preparation in progress for admissions indexing in the background (:data:`HELD`)."""
    if _on:
        _held[0] += seconds


def wait_for_last_step(batch) -> bool:
    """Wait for what a drafted step's preparation waits for first: the last step's accepted tokens, where they are on
    a GPU (its current stream, which their copy to the host waits on). Whether there was anything to wait for."""
    tokens = getattr(getattr(batch, "spec_info", None), "accept_tokens", None)
    if tokens is None or not getattr(tokens, "is_cuda", False):
        return False
    import torch

    torch.cuda.current_stream(tokens.device).synchronize()
    return True


def measure(fn, worker, batch, *args, timer=None, **kwargs):
    """``fn(worker, batch, ...)``, its wall time added to ``timer`` when timing is on; by default (``timer=None``) a
    draft preparation's: the wait for the last step (:func:`wait_for_last_step`) to :data:`WAIT`, the rest to
    :data:`TIMER`."""
    if not _on:
        return fn(worker, batch, *args, **kwargs)
    t0 = time.perf_counter()
    if timer is None and wait_for_last_step(batch):
        t1 = time.perf_counter()
        WAIT.add(len(batch.reqs), t1 - t0)
        t0 = t1
    _held[0] = 0.0
    out = fn(worker, batch, *args, **kwargs)
    (timer or TIMER).add(len(batch.reqs), time.perf_counter() - t0)
    if timer is None:
        HELD.add(len(batch.reqs), _held[0])
    return out


def timed(timer: DraftTimer, batch_size: int, fn, *args):
    """``fn(*args)``, its wall time added to ``timer`` when timing is on (no wait first)."""
    if not _on:
        return fn(*args)
    t0 = time.perf_counter()
    out = fn(*args)
    timer.add(batch_size, time.perf_counter() - t0)
    return out


def _around(original, self, batch, *args, **kwargs):
    """The hook on SGLang's method (registered only when timing is on): the same measurement."""
    return measure(original, self, batch, *args, **kwargs)


def install() -> None:
    """Register the hook on SGLang's draft preparation (when :data:`ENV` is ``1``)."""
    global _on
    _on = enabled()
    if not _on:
        return
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, _around, "AROUND")
