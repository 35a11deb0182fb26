"""Step times every tensor-parallel rank's tree-size policy takes at the same decode steps.

Why: with ``--tp-size`` > 1 every rank runs its own scheduler and worker, and each decode step's forward has
collectives, so every rank must serve the same candidate (the same runtime state, the same verify shapes) at every
step. The policy (:class:`~lumotree.sglang.adaptive.TreeSizePolicy`, and LUMOTREE_SUFFIX's per-request choice) decides
from the batch size, the accept lengths and the step times. The first two are the same on every rank (SGLang's
ranks schedule the same batches and sample the same tokens); the step times are each rank's own device clock
(:class:`~lumotree.sglang.worker.StepClock`) and differ. So the policy takes no time sample as it comes: every
:data:`EVERY`-th decode step the ranks all-gather over SGLang's CPU group of the tensor-parallel ranks, and every
rank feeds its policy rank 0's samples of the steps since the last exchange, in the same order -- the policies stay
equal, with each step's time arriving up to ``EVERY`` steps later than on one GPU.

The same exchange carries each rank's fingerprint of what it chose (the candidates and batch sizes of its steps since
the exchange, its acceptance estimate). Ranks that differ anyway -- a bug, not a case -- are seen by every rank at
the same exchange: all of them serve the configured tree from then on (:class:`RanksDiverged`), and the server log
says so. A step between the divergence and the exchange may have launched different collectives on different
ranks; the exchange makes a divergence visible, it cannot undo one.
"""
from __future__ import annotations

import zlib
from typing import List, Optional, Tuple

EVERY = 8  # decode steps between two exchanges of step times (one all-gather of a few samples on the CPU group)


class RanksDiverged(RuntimeError):
    """The ranks' policies chose differently (see the module docstring)."""


class SharedStepTimes:
    """Rank 0's step-time samples, handed to every rank's policy at the same decode steps (module docstring).

    Args:
        group: the tensor-parallel ranks' CPU (gloo) process group (SGLang's ``get_tp_group().cpu_group``).
        rank: this rank's index in the group; ``world``: the group's size.
        gather: ``gather(payload) -> [payload of each rank]`` (default ``torch.distributed.all_gather_object`` over
            ``group``; tests pass their own).
    """

    def __init__(self, group=None, rank: int = 0, world: int = 1, gather=None, every: int = EVERY):
        self.rank, self.world, self.every = rank, world, every
        self._gather = gather if gather is not None else self._all_gather(group, world)
        self._mine: List[Tuple[int, int, float]] = []  # rank 0's samples since the last exchange
        self._steps = 0  # decode steps since the server started
        self._trace = 0  # CRC of this rank's (batch, candidate) choices since the last exchange
        self.exchanges = 0

    @staticmethod
    def _all_gather(group, world):
        def gather(payload):
            import torch.distributed as dist

            out = [None] * world
            dist.all_gather_object(out, payload, group=group)
            return out

        return gather

    def chose(self, batch_size: int, steps: int) -> None:
        """This rank launches a decode step of ``batch_size`` requests serving candidate ``steps``."""
        self._trace = zlib.crc32(b"%d,%d;" % (batch_size, steps), self._trace)

    def take(self, local: List[Tuple[int, int, float]], accept: Optional[float], step: bool = True):
        """The samples the policy takes now: ``[]`` between exchanges; at an exchange rank 0's since the last one.
        ``local``: this rank's samples read from its clock since the last call; ``accept``: its policy's acceptance
        estimate (for the fingerprint); ``step``: a decode step is being chosen (an idle batch is not counted).
        Raises :class:`RanksDiverged` on every rank alike when the ranks' fingerprints differ."""
        if self.rank == 0:
            self._mine.extend(local)
        if not step:
            return []
        self._steps += 1
        if self._steps % self.every:
            return []
        fingerprint = (self._trace, repr(accept))
        got = self._gather((self._mine if self.rank == 0 else None, fingerprint))
        self._mine, self._trace = [], 0
        self.exchanges += 1
        prints = [g[1] for g in got]
        if any(p != prints[0] for p in prints):
            raise RanksDiverged(f"the tensor-parallel ranks' tree-size policies chose differently (fingerprints per "
                                f"rank: {prints}); every rank serves the configured tree from now on")
        return list(got[0][0] or [])


def for_server(server_args) -> Optional[SharedStepTimes]:
    """:class:`SharedStepTimes` over SGLang's tensor-parallel CPU group where ``--tp-size`` > 1; ``None`` on one GPU."""
    if (getattr(server_args, "tp_size", 1) or 1) <= 1:
        return None
    from sglang.srt.distributed import get_tp_group

    g = get_tp_group()
    return SharedStepTimes(g.cpu_group, g.rank_in_group, g.world_size)
