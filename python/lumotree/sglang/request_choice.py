"""The per-step draft choice of a LUMOTREE_SUFFIX server from each running request's own acceptance: the server's
default (settings: ``--speculative-adaptive-config`` with ``{"candidate_steps": [0, 1], "request_quantile": {...}}``).

Why: the batch-wide choice (:class:`lumotree.sglang.adaptive.TreeSizePolicy` alone, as LUMOTREE servers choose)
drafts a decode step when the batch's *mean* acceptance makes the tree pay for the batch's tokens per second. At 32
concurrent agents that mean is carried by the few requests copying long runs (5-20 drafts a step) while most of the
batch writes text no draft foresees -- every session's second turn arrives at once and writes new text --, so the
server keeps drafting and those requests advance one token per drafted step, ~1.8x a decode step (run
``32-agents-nodraft-floor``: those second turns took 748 ms median against 503 on the same server pinned to its
no-draft step and 512 without speculation; they are the 32-agent p95). This choice drafts a step only when the
request at the batch's ``quantile`` of acceptance gains from it: ``1 + a_q >= T_tree / T_none`` (``T``: the policy's
measured step times at the batch's bucket), where ``a_q`` is that quantile of the requests' own estimates -- an
average of each request's accepted drafts over its drafted steps (``weight`` per new sample; a request first seen
takes the running mean of all requests' samples, so a new turn starts drafting as the server's turns have lately
paid), drifting back towards that mean by ``drift`` per no-draft step. After ``probe_every`` no-draft steps in a row
it drafts one step (a probe: its samples refresh the estimates; on a steady step clock the ledger serves it as two
drafted steps, so that the tree's step is timed too: :attr:`lumotree.sglang.worker.StepLedger.STEADY_PROBE_RUN`);
the interval doubles, up to ``probe_max``, each time a probe leaves the batch's quantile below the break-even, and
returns to ``probe_every`` when it does not.

Served (tiny model, one H200, runs ``*-request-choice`` of ``benchmark/results/agents_h200.json``), against the
batch-wide choice it replaced: +2.4 / +4.8 / +2.5 % tokens/s at 32 / 8 / 1 concurrent agents (the repeats' means),
p95 turn latency over all turns 0.876 against 0.967 s at 32 agents (no speculation 0.914); see ``docs/performance.md``.
Designed on the project's CPU model of the served 32-agent streams (``benchmark/drafters/policy_replay.py``, mode
``request_quantile``, the same class; ``benchmark/results/policy_criteria_cpu.json``).

Pure Python, host-only; the worker's :class:`lumotree.sglang.worker.StepLedger` calls :meth:`decide` before a decode
step with the batch's request ids and :meth:`observe` when the step's accepted drafts per request are on the host.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

KEY = "request_quantile"  # the --speculative-adaptive-config key
PRIOR = 4.0  # a request's estimate before any request's drafted step was observed
MEAN_DECAY = 0.99  # per observed drafted row, the weight of the running mean's past


@dataclasses.dataclass(frozen=True)
class RequestQuantileSettings:
    quantile: float = 0.25
    weight: float = 0.8
    drift: float = 0.05
    probe_every: int = 16
    probe_max: int = 256

    def check(self, where: str) -> "RequestQuantileSettings":
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.probe_every, self.probe_max))
        nums = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   for v in (self.quantile, self.weight, self.drift))
        if not (ints and nums and 0 <= self.quantile < 1 and 0 < self.weight <= 1 and 0 <= self.drift <= 1
                and 1 <= self.probe_every <= self.probe_max):
            raise ValueError(f"{where}: {KEY} takes quantile in [0, 1), weight in (0, 1], drift in [0, 1], "
                             f"probe_every <= probe_max whole steps >= 1; got {dataclasses.asdict(self)}")
        return self


class RequestQuantile:
    """Draft or not, per decode step, from the running requests' own acceptance (module docstring).

    Args:
        settings: :class:`RequestQuantileSettings`.
        memory: request estimates kept (the least recently seen are dropped past it; a request dropped and seen
            again starts from the running mean).
    """

    def __init__(self, settings: RequestQuantileSettings = RequestQuantileSettings(), memory: int = 8192):
        self.settings = settings
        self.memory = memory
        self.est: "collections.OrderedDict[object, float]" = collections.OrderedDict()
        self._mean = [0.0, 0.0]  # decayed sum of drafted rows' accepted drafts, decayed row count
        self.since = 0  # no-draft steps since the last drafted one
        self.interval = settings.probe_every
        self._probe = False  # the last drafted step was a probe (its observation sets the interval)
        self.decisions = [0, 0, 0]  # drafted by the criterion, probes, no draft (diagnostics, tests)

    def prior(self) -> float:
        s, n = self._mean
        return s / n if n > 0 else PRIOR

    def _estimate(self, rid, prior: float) -> float:
        got = self.est.get(rid)
        if got is None:
            return prior
        self.est.move_to_end(rid)
        return got

    def quantile_of(self, rids: Sequence) -> float:
        """The batch's ``quantile`` of the requests' estimates (requests not seen yet: the running mean)."""
        if not rids:
            return 0.0
        prior = self.prior()
        est = sorted(self._estimate(r, prior) for r in rids)
        return est[min(len(est) - 1, int(self.settings.quantile * len(est)))]

    def pays(self, rids: Sequence, ratio: float) -> bool:
        """Whether the batch's quantile request gains from a drafted step costing ``ratio`` no-draft steps."""
        return self.quantile_of(rids) + 1.0 >= ratio

    def decide(self, rids: Sequence, ratio: float) -> bool:
        """Whether the next decode step of the requests ``rids`` drafts; ``ratio``: the drafted step's time over the
        no-draft step's at the batch's bucket."""
        if self.pays(rids, ratio):  # drafting pays again: so would the next probe (the interval restarts)
            self.since, self._probe, self.interval = 0, False, self.settings.probe_every
            self.decisions[0] += 1
            return True
        self.since += 1
        if self.since > self.interval:
            self.since, self._probe = 0, True
            self.decisions[1] += 1
            return True
        self.decisions[2] += 1
        return False

    def observe(self, rids: Sequence, drafted: bool, accepted: Sequence[Optional[int]], ratio: Optional[float] = None):
        """A step's results (one step late under the overlap scheduler): ``accepted[i]`` the accepted drafts of
        request ``rids[i]``, ``None`` for a row whose sample does not count (it finished in the step, or drafted
        nothing although the step drafted). ``ratio``: the drafted step's cost as :meth:`decide` took it, for a
        probe's verdict on the probe interval."""
        s = self.settings
        prior = self.prior()
        if drafted:
            for rid, k in zip(rids, accepted):
                if k is None:
                    continue
                old = self.est.get(rid, prior)
                self.est[rid] = (1 - s.weight) * old + s.weight * k
                self.est.move_to_end(rid)
                self._mean[0] = MEAN_DECAY * self._mean[0] + k
                self._mean[1] = MEAN_DECAY * self._mean[1] + 1
            if self._probe:
                self._probe = False
                if ratio is not None and not self.pays(rids, ratio):
                    self.interval = min(2 * self.interval, s.probe_max)
                else:
                    self.interval = s.probe_every
        else:
            for rid in rids:
                old = self.est.get(rid)
                if old is not None:
                    self.est[rid] = old + s.drift * (prior - old)
        while len(self.est) > self.memory:
            self.est.popitem(last=False)


def settings_of(server_args) -> Optional[RequestQuantileSettings]:
    """The per-request choice's settings for a server: a LUMOTREE_SUFFIX server that chooses between no draft and
    its suffix tree (its default; ``--speculative-adaptive-config`` with ``candidate_steps`` ``[0, 1]``) has them,
    :class:`RequestQuantileSettings`' defaults or those the config's ``request_quantile`` object sets; ``None`` for
    any other server (a LUMOTREE one, a LUMOTREE_SUFFIX one pinned to one candidate or not adaptive). Raises
    ``ValueError`` naming the flag for a value out of range, an unknown field, or the key on a server that does not
    choose between no draft and the suffix tree."""
    from lumotree.sglang import adaptive

    path, cfg = adaptive._config(server_args)
    given = isinstance(cfg, dict) and KEY in cfg
    where = f"--speculative-adaptive-config {path}"
    if not adaptive.is_suffix(server_args):
        if given:
            raise ValueError(f"{where}: {KEY} is LUMOTREE_SUFFIX's per-request draft choice; this server is "
                             f"--speculative-algorithm {getattr(server_args, 'speculative_algorithm', None)}")
        return None
    if not given:
        chooses = adaptive.adaptive_tree_size(server_args) and (
            adaptive.candidate_steps(server_args) == [0, adaptive.SUFFIX_TREE])
        return RequestQuantileSettings() if chooses else None
    got = cfg[KEY]
    fields = {f.name for f in dataclasses.fields(RequestQuantileSettings)}
    if not isinstance(got, dict) or set(got) - fields:
        raise ValueError(f"{where}: {KEY} takes an object with the fields {sorted(fields)}; got {got!r}")
    if sorted(cfg.get("candidate_steps", [])) != [0, adaptive.SUFFIX_TREE]:
        raise ValueError(f"{where}: {KEY} chooses between no draft and the suffix tree: candidate_steps must be "
                         f"[0, {adaptive.SUFFIX_TREE}]; got {cfg.get('candidate_steps')!r}")
    return RequestQuantileSettings(**got).check(where)
