"""Hook: a speculative batch's host lengths taken from the host where LumoTree published them from the host, without
SGLang's wait for their device copy.

Why: under SGLang 0.5.17's overlap scheduler a speculative (V2) batch learns its lengths at its launch:
``FutureMap.resolve_seq_lens_cpu`` waits for the previous step's publish on a private stream, copies the lengths
from the device and synchronizes that stream -- the accepted lengths of a drafted step exist only on the device. A
step LumoTree serves without a draft (``lumotree.sglang.decode_step``: every row + 1) and a prefill (its input
lengths) publish lengths the host already holds. Served at 32 concurrent agents (tiny model, H200, run
``32-agents-nodraft-floor`` of ``benchmark/results/agents_h200.json``) that wait took 0.13 ms of a no-draft step's
2.75 ms median (no speculation's decode step 2.56 ms, which has no such wait). SGLang copies host lengths only where
the loop is NGRAM's (LUMOTREE_SUFFIX: always) or one of the step's attention backends declares
``needs_cpu_seq_lens``; a LUMOTREE server on the Triton backends (as served) declares none, waits for nothing, and
this hook leaves it alone (it says so once in the log).

How: SGLang's ``HookRegistry`` (``HookType.AROUND``) on ``FutureMap.publish`` and ``FutureMap.resolve_seq_lens_cpu``.
LumoTree's own publishes of host-known lengths go through :func:`publish_known`, which names the lengths' host copy
for the one ``publish`` call it makes; the publish hook then records them per request-pool row in the map's
:class:`HostLengths`. Any other publish (a drafted step's, SGLang's own workers') forgets every row (its rows are
on the device alone). The resolve hook serves a batch whose rows are all recorded from the record: the device
lengths gathered as SGLang gathers them (its stream still waits for the publish event, without a host sync), the
host lengths from the record; otherwise, or with SGLang's debug asserts, without the CPU mirror, or on HIP,
SGLang's method. The first :data:`CHECK_FIRST` batches served so and every :data:`CHECK_EVERY`-th after also run
SGLang's method and compare: a difference turns the record off for the process, with an error in the log (a wrong
host length would misplace KV slots).

Remove when: SGLang's overlap scheduler takes host lengths from a worker that knows them (or its spec-V2 resolve
stops synchronizing for them).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

FUTURE_MAP = "sglang.srt.managers.overlap_utils.FutureMap"
CHECK_EVERY = 64  # served batches between two comparisons with SGLang's device copy
CHECK_FIRST = 16  # and the first this many, each (a server's first steps show a wrong record at once)
MISMATCH_LINE = "host lengths differ from the device's"  # the error's start, if a comparison finds a difference
SERVED_LINE = "a speculative batch's lengths were all published from the host"  # logged once, at the first
# logged once where SGLang copies no host lengths for this server (its attention backends declare none, e.g. a LUMOTREE
# server on the Triton backends): no wait to skip, the record stays unused
UNNEEDED_LINE = "this server's attention backends take no host lengths"

_pending = None  # (new_seq_lens tensor, rows_cpu, lens_cpu) of the publish being made by publish_known


class HostLengths:
    """Host lengths per request-pool row as last published from the host; ``-1``: not known on the host."""

    def __init__(self, size: int):
        self.lens = torch.full((size,), -1, dtype=torch.int64)
        self.on = True
        self.served = 0  # batches served from the record
        self.checked = 0  # of which compared with SGLang's device copy

    def record(self, rows: torch.Tensor, lens: torch.Tensor) -> None:
        self.lens[rows.to(torch.int64)] = lens.to(torch.int64)

    def forget(self) -> None:
        self.lens.fill_(-1)

    def lookup(self, rows: torch.Tensor) -> Optional[torch.Tensor]:
        """The rows' host lengths (a copy), or ``None`` when any row's is not known."""
        if not self.on or rows is None or rows.numel() == 0:
            return None
        got = self.lens[rows.to(torch.int64)]
        return got if bool((got >= 0).all()) else None


def publish_known(on_publish, new_seq_lens: torch.Tensor, rows_cpu, lens_cpu) -> None:
    """``on_publish(new_seq_lens)`` (the scheduler's ``FutureMap.publish`` of a batch's lengths) with their host copy:
    ``lens_cpu`` for the request-pool rows ``rows_cpu``. Without a host copy (``None``) a plain publish."""
    global _pending
    if rows_cpu is not None and lens_cpu is not None and rows_cpu.shape == lens_cpu.shape:
        _pending = (new_seq_lens, rows_cpu, lens_cpu.clone())
    try:
        on_publish(new_seq_lens)
    finally:
        _pending = None


def _record_of(fm) -> HostLengths:
    got = fm.__dict__.get("lumotree_host_lengths")
    if got is None:
        got = fm.lumotree_host_lengths = HostLengths(int(fm.req_pool_size))
    return got


def publish(original, self, future_indices, new_seq_lens, *args, **kwargs):
    global _pending
    known, _pending = _pending, None
    out = original(self, future_indices, new_seq_lens, *args, **kwargs)
    if not self.needs_cpu_seq_lens:  # SGLang copies no host lengths for this server: nothing to record
        return out
    if known is not None and known[0] is new_seq_lens and known[1].shape[0] == future_indices.shape[0]:
        _record_of(self).record(known[1], known[2])
    elif "lumotree_host_lengths" in self.__dict__:
        self.lumotree_host_lengths.forget()
    return out


def _sglang_debug() -> bool:
    try:
        from sglang.srt.managers import overlap_utils

        return bool(getattr(overlap_utils, "_DEBUG_ASSERT", False) or getattr(overlap_utils, "_is_hip", False))
    except ImportError:
        return True


def resolve_seq_lens_cpu(original, self, batch, *args, **kwargs):
    rec = self.__dict__.get("lumotree_host_lengths")
    spec = getattr(batch, "spec_info", None)
    fi = getattr(spec, "future_indices", None) if spec is not None else None
    if not self.needs_cpu_seq_lens:  # SGLang's method copies nothing: no wait to skip
        if fi is not None and not self.__dict__.get("lumotree_said_unneeded"):
            self.lumotree_said_unneeded = True
            logger.info("LumoTree: %s (SGLang copies none, so there is no wait to skip)", UNNEEDED_LINE)
        return original(self, batch, *args, **kwargs)
    if rec is None or fi is None or self.publish_ready is None or _sglang_debug():
        return original(self, batch, *args, **kwargs)
    lens = rec.lookup(getattr(batch, "req_pool_indices_cpu", None))
    if lens is None or lens.shape[0] != fi.shape[0]:
        return original(self, batch, *args, **kwargs)
    rec.served += 1
    if rec.served == 1:
        logger.info("LumoTree: %s; its lengths taken from the host, without waiting for their device copy",
                    SERVED_LINE)
    if rec.served <= CHECK_FIRST or rec.served % CHECK_EVERY == 0:
        out = original(self, batch, *args, **kwargs)
        rec.checked += 1
        if not torch.equal(batch.seq_lens_cpu.to(torch.int64), lens):
            rec.on = False
            rec.forget()
            logger.error("LumoTree: %s (host %s, device %s, request-pool rows %s); taken from the device from now on",
                         MISMATCH_LINE, lens.tolist()[:8], batch.seq_lens_cpu.tolist()[:8],
                         batch.req_pool_indices_cpu.tolist()[:8])
        return out
    self.publish_ready.wait()  # the schedule stream's gather below waits for the publish, the host does not
    batch.seq_lens = self.new_seq_lens_buf[fi]
    batch.seq_lens_cpu = lens
    batch.seq_lens_sum = int(lens.sum())
    return None


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(f"{FUTURE_MAP}.publish", publish, "AROUND")
    register_hook(f"{FUTURE_MAP}.resolve_seq_lens_cpu", resolve_seq_lens_cpu, "AROUND")
