"""Adaptive tree size: each decode step of a LUMOTREE server picks its draft tree -- the configured
tree or none (a one-token verify, i.e. a plain decode step) -- from the running batch and the
measured acceptance, with a cost model of step time per (batch, tree size) measured while serving.

Why: a speculative step costs more than a decode step, and the gap grows with the batch (the
verify's tokens scale with ``batch x tree`` while a decode step is weight-bound). At acceptance
``a`` (accepted draft tokens per step) a tree pays only while
``(1 + a) / T_tree(batch) > 1 / T_none(batch)``; SGLang 0.5.17's ``--speculative-adaptive`` makes a
similar choice for EAGLE chains from a hand-written per-batch config. This policy needs no config:

* the **cost model** ``T[c][bucket]`` is the median time of the last ``WINDOW`` decode steps
  served with tree size ``c`` at that batch bucket (batches padded to powers of two, as CUDA graphs
  are). A step's time is the time between its start and the next decode step's start on the device
  (the worker's :class:`~lumotree.sglang.worker.StepClock`: the target forward, drafting, selection,
  commit, and whatever the device waited for the host in between -- what a user waits for); a step
  followed by a prefill or an idle gap gives no sample, nor does a step whose interval held a Triton compile
  (:mod:`lumotree.sglang.compile_watch`). A median, because single
  steps can take 100x the usual (a first compile at a new shape, a profiler starting): on the H200
  an average of such samples made a bucket serve its slower candidate. Why the device's clock and not
  the host's: under SGLang's overlap scheduler the host interval between two launches ends when an
  *earlier* step's results are in, so runs of a candidate started with samples of the step before them;
  dropping a run's first sample did not make up for it -- right after a probe the tree's step read about a
  decode step's time (10.9 against ~40 ms at batch 128, 9.8 against ~25 at 64, 27B shapes, H200) and the
  bucket chose the tree on a rate 2.5-3.5x too high until its own steps outvoted those samples. A bucket's estimates are
  never above those of the next larger bucket that has measured every candidate (a step's time grows with the
  batch), which keeps a bucket met while a pass's batch ramps up -- few samples, the ones a stray prefill
  inflates -- from serving the wrong candidate; every candidate's from the same bucket, so that a slow spell
  inflates all of a bucket's candidates alike (:meth:`TreeSizePolicy.step_time`). The policy's own decisions
  (:meth:`TreeSizePolicy.choose`; not LUMOTREE_SUFFIX's per-request choice) read a drafting candidate's time as
  never below a shallower candidate's at the same batch (a drafted step runs that step's forward and more), so
  that estimates from different buckets or few samples never make a tree whose drafts miss look faster than no
  draft (:meth:`TreeSizePolicy.decision_time`);
* the **acceptance** ``a`` is a moving average of the accepted drafts per request over the steps that
  drafted -- restarted at each drafted run that follows no-draft steps: its first ``GAP_SAMPLES`` steps
  are averaged over their rows (requests) with the estimate from before the gap weighing as one row, so
  a probe shows within its run that the acceptance rose. Why rows: a probe has one or two counted steps;
  with the old estimate weighing as a whole step, a probe of a batch of 128 whose drafts
  were accepted again (1.9 per step after 0.1) estimated 1.3 -- below the ~1.4 a chain step needed
  there -- and the bucket served no draft through passes whose drafts were accepted (27B shapes, H200).
  At batch 1 a row is a step, as before;
* the server's first bucket **explores** (every candidate for a run of ``RUN`` consecutive steps); a
  bucket met later **borrows** the step times it lacks from the nearest bucket that has them (its own
  samples replace them as they come), so it serves its best estimate at once. Why: a batch shrinks
  through every smaller bucket as its requests end; exploring each of them there served no draft in
  the middle of drafted passes, about a tenth of the steps of a 128-token pass (27B shapes, batch 8
  and 32, H200). They come from the nearest bucket, the larger on a tie; from a smaller one the tree's
  time is the further off (a step's time grows with the batch, the tree's faster than no draft's),
  which leans the estimate towards a tree until the bucket's own samples are in;
* (the averaging weight above and the probe intervals below are LUMOTREE's, the module's constants;
  LUMOTREE_SUFFIX's policy averages more slowly and probes more often, :data:`SUFFIX_SETTINGS`)
* a bucket serves the candidate of most tokens per second, switching only past a ``MARGIN``
  (hysteresis), and now and then serves the other candidate for one run (a **probe**) so that both
  estimates stay current: after ``PROBE_EVERY`` steps at first, the interval doubling each time a
  probe leaves the choice as it was, up to ``PROBE_MAX``, and back to ``PROBE_EVERY`` when the choice
  changes, and never sooner than the probe's cost allows: a probe of a candidate that does not pay loses
  ``probe_run x T_other x (1 - rate_other / rate_best)`` seconds, and the interval is at least that
  over ``PROBE_BUDGET`` (2/3 %) of ``T_best`` (:meth:`TreeSizePolicy._probe_floor`). Why: where drafts
  miss, a tree step costs about 1.7x (batch 1) to 2x (batch 32) a decode step (27B shapes, H200), so a
  3-step probe every 128 steps lost 1.6-2.3 % against no speculation -- most of what a server whose drafts miss
  lost; with the floor the first probe after a switch to no draft comes after ~200 (batch 1) to ~350
  (batch 32) steps. A probe is ``RUN`` steps long where the bucket has no time samples of the candidate
  yet, else ``probe_run``: of no draft 3 steps; of the tree a cold and one counted drafted step from batch 4
  on (more at batch 1-2, for four samples), after which the bucket keeps its choice for one step while the
  counted step's acceptance comes back (overlap) and then decides -- a third drafted step, as probes had
  before, was cost without information: its acceptance arrived after the decision. On a LUMOTREE server (MTP drafts,
  not the decode-exact mode) the cold step is a **warm** no-draft step instead: SGLang's one-node verify with the MTP
  draft-extend, so that the drafted steps after it draft from the model's own draft and are all counted
  (:meth:`TreeSizePolicy._tree_run`; the intervals stay those of a cold probe) -- where the bucket's warm step is
  measured no slower than its drafted step (:meth:`TreeSizePolicy.warm_pays`). Acceptance that drops
  while the tree is served is seen at once (every drafted step measures it), so
  while a tree is served a probe of no draft only refreshes the decode step's time: once the bucket
  has its own samples of it, such probes come every ``PROBE_MAX`` steps. Acceptance that rises while no
  draft is served is seen at the next probe, within ``PROBE_MAX`` steps.
  A probe of the tree that keeps no draft by a **close call** (:meth:`TreeSizePolicy._close_call`: within one
  standard error of the switch, from fewer than ``EXTEND_ROWS`` request samples) is extended once, by a cold step and
  counted steps for ``EXTEND_ROWS`` more samples. Why: at batch 8 of the Qwen3-Next MoE shape (one H200) one counted
  step's 8 samples read 1.33 accepted drafts where the oracle's accept ~1.95, and the bucket kept no draft through the
  measured pass (0.89x no speculation); on the CPU model of that pass sequence
  (``benchmark/serving/sim_pass_choice.py``) the extension takes the measured pass from 0.960 to 0.998 of the better fixed choice there, and changes nothing at
  the 27B shape's batches or where drafts miss. Served: in the MoE table on one H100 it acted once in each of two
  servers, at batch 8 with accepted drafts (estimates 1.71 and 1.58), and the bucket switched to the tree after it.
  Runs, not single steps: the first drafted step after no-draft steps drafts from zeros (the worker
  skips the MTP draft-extend on no-draft steps) and its acceptance is not counted, so a drafted step
  between two no-draft steps would never measure the acceptance -- and a policy that alternated would
  never learn that the tree pays.

Pure Python and host-only (the step times and accept lengths it reads are on the host already): the
worker (:mod:`lumotree.sglang.worker`) calls :meth:`TreeSizePolicy.choose` before a decode step,
:meth:`~TreeSizePolicy.observe_time` with each step's time once the device has it (a step or two later) and
:meth:`~TreeSizePolicy.observe_accept` when SGLang has the accept lengths on the host.

Candidates are tree sizes named by their draft steps (SGLang's runtime states are keyed by steps):
``0`` = no draft, and the server's ``--speculative-num-steps`` tree. A LUMOTREE_SUFFIX server (SGLang's
NGRAM loop, :mod:`lumotree.sglang.suffix`) has one tree size, ``--speculative-num-draft-tokens`` nodes
drafted on the host: its candidates are ``0`` and ``1`` (:data:`SUFFIX_TREE`), the suffix tree.
``--speculative-adaptive-config FILE`` (JSON ``{"candidate_steps": [...]}``, a subset of those two)
restricts them; one candidate serves a fixed tree. A LUMOTREE chain (``--speculative-eagle-topk 1``) may also list
shallower chains (``[0, 1, 3]``: no draft, a one-step chain, the three-step one): the verify's tokens grow with
``batch x (steps + 1)``, so at large batches a shallower chain can pay where the deepest breaks even. Their
acceptance is the deepest chain's read through a per-depth acceptance ``p`` (a ``k``-step chain accepts
``p + ... + p^k`` drafts per request, :func:`chain_accept`): each drafted step's sample enters the one estimate as
the deepest chain would have accepted it, and a candidate's tokens per step come from it. Opt-in: served as
``[0, 1, 3]`` beside the default on one H100 it made no more tokens/s at batch 1 and 64 (:func:`candidate_steps`).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import math
import statistics
from typing import Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

EMA = 0.2  # weight of a new sample in the acceptance average
GAP_SAMPLES = 4  # steps after a no-draft gap averaged with the estimate from before it before the EMA resumes
WINDOW = 5  # step-time samples per candidate and bucket the median is taken over (a probe's run outweighs older ones)
MIN_SAMPLES = 3  # step-time samples per candidate and bucket before the policy trusts the bucket
# consecutive steps a candidate is explored or probed for: a drafted first step is cold (no acceptance), and its
# results arrive a step late (overlap): MIN_SAMPLES time samples and more than one counted acceptance
RUN = MIN_SAMPLES + 2
# a probe of a candidate whose step time the bucket has measured: of no draft, for its step time (PROBE_RUN
# steps, the last sample arriving after the decision); of the tree, for the
# acceptance: a cold step (drafted after no-draft steps), then counted steps until PROBE_ROWS request samples
# are in -- and the decision waits one no-draft step for the last of them (overlap: results arrive a step late)
# rather than drafting one more step whose acceptance the decision would not see (tree_probe_run)
PROBE_RUN = 3
# a re-timing of a stale no-draft estimate (TreeSizePolicy.remeasure): one step more than the window, so that the
# window's every sample is new even where a run's last step gives none (a steady clock, worker.StepClock)
REMEASURE_RUN = WINDOW + 1
# a re-measure whose own samples still read no draft the slower was not stale: the wait to the next doubles, from
# probe_max up to this many times it (TreeSizePolicy.remeasure)
REMEASURE_BACKOFF = 16
PROBE_ROWS = 4
MARGIN = 0.03  # switch only when the other candidate is this much faster (tokens per second)
# a close call (TreeSizePolicy._close_call): a tree probe that kept no draft is extended once where the tree would pay
# at an acceptance within CLOSE_Z standard errors of the probe's estimate; the extension drafts a cold step and enough
# counted steps for EXTEND_ROWS more request samples (1 to GAP_SAMPLES steps), averaged with the probe's own
CLOSE_Z = 1.0
EXTEND_ROWS = 24
# a bucket that serves a tree leaves it for no draft only where the tree would not pay even at an acceptance DROP_Z
# standard errors of the moving average above its estimate (TreeSizePolicy._drop_unsure)
DROP_Z = 3.0
SD_FLOOR = 0.5  # the least standard deviation of a request's accepted drafts the close call assumes (few samples)
# a tree probe whose counted steps held no running request (every row had finished: its sample left them out,
# worker.StepLedger.note_live_rows) measured nothing: it is run again, up to this many times in a row, and the
# decision after such a probe keeps the probe interval. Why: at batch 32 of the Qwen3-Next MoE shape (one H100) a
# probe fell on the benchmark's one-token passes, whose requests finish at their prefill, decided on the acceptance
# from before the no-draft stretch (0.00) and doubled the interval: no draft through the measured pass at accept ~2.4
EMPTY_PROBE_REPEATS = 3
PROBE_EVERY = 128  # steps of a bucket before its first probe run of the candidate not chosen
PROBE_MAX = 1024  # the longest interval between probe runs (doubling from PROBE_EVERY while probes confirm)
# share of the time served a probe of a candidate that does not pay may cost (interval floor). 2 / 3 of the 1 % it
# was while a tree probe also drafted the step whose acceptance arrives after the decision (3 drafted steps from
# batch 4 on, now 2): the same intervals, each probe a third cheaper
PROBE_BUDGET = 0.01 * 2 / 3
# the step clock's candidate of a warm no-draft step (TreeSizePolicy.warm): not a candidate, so its time is no sample
WARM = -1


@functools.lru_cache(maxsize=4096)
def tree_probe_run(batch: int) -> int:
    """Drafted steps of a probe of a measured tree at ``batch``: a cold step and enough counted steps for
    ``PROBE_ROWS`` request samples -- 2 from batch 4 on, 5 at batch 1; the decision then waits one no-draft
    step for the last step's acceptance (:attr:`_Bucket.settle`). Why several at small batches: at batch 1 a
    probe that decided on one request's one step (p 0.8 oracle drafts: none accepted a fifth of the time),
    averaged with the estimate from before the gap, served no draft through a measured pass (H200). Why no
    third drafted step from batch 4 on: under the overlap scheduler its acceptance arrives after the decision,
    so it only cost a drafted step (~2-3x a decode step where drafts miss, 27B shapes, H200)."""
    return 1 + -(-PROBE_ROWS // bucket(batch))


def probe_run(batch: int, steps: int) -> int:
    """Steps of a probe of the measured candidate ``steps`` at ``batch``: :func:`tree_probe_run` for a tree,
    ``PROBE_RUN`` for no draft."""
    return tree_probe_run(batch) if steps > 0 else PROBE_RUN


@functools.lru_cache(maxsize=4096)
def bucket(batch: int) -> int:
    """The batch bucket a step's time is kept under: the next power of two (CUDA-graph padding)."""
    return 1 << max(0, int(batch) - 1).bit_length()


def _ema(old: Optional[float], new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """How fast a :class:`TreeSizePolicy` follows acceptance and how often it probes: the weight of a new sample in
    the acceptance average (``EMA``) and the probe interval's start, cap and cost budget (``PROBE_EVERY``,
    ``PROBE_MAX``, ``PROBE_BUDGET``); the allowance for the acceptance's noise before a served tree is left
    (``DROP_Z``, :meth:`TreeSizePolicy._drop_unsure`; 0: none) and whether the probe floor holds back the first probe
    after the choice changed (``floor_first``). :meth:`current`: the module's values (LUMOTREE's MTP tree);
    :data:`SUFFIX_SETTINGS`: LUMOTREE_SUFFIX's."""
    ema: float
    probe_every: int
    probe_max: int
    probe_budget: float
    drop_z: float = 0.0
    floor_first: bool = True

    @classmethod
    def current(cls) -> "PolicySettings":
        return cls(ema=EMA, probe_every=PROBE_EVERY, probe_max=PROBE_MAX, probe_budget=PROBE_BUDGET, drop_z=DROP_Z,
                   floor_first=False)


# LUMOTREE_SUFFIX's policy: a suffix draft's acceptance swings within a turn (a request accepts 20 drafts a step, then
# none while it writes something new, then 20 again), and at one agent a fifth of the average per drafted step
# turned the tree off after a few misses until the next probe 128 steps later -- most of a turn. On the CPU model of
# a served 1-agent run (benchmark/drafters/policy_replay.py; benchmark/results/policy_replay_cpu.json: the module's
# settings 2.12x no speculation there, the served run 2.29x) a slower average and probes every 16-256 steps made
# 2.72x at 1 agent (a fixed tree: 2.82x), 1.95x at 8 (1.86x), 1.27x at 32 (1.23x). The probe budget trades the
# rest against what probes cost where drafts never pay: 5 % made 2.83x / 1.97x / 1.34x but lost 1.3-2.3 % against no
# speculation there, 1 % loses 0.8-0.9 % (the module's 0.67 %: 0.4-0.6 %, and 2.58x / 1.89x / 1.24x with these other
# settings); chosen in a sweep of 24 settings (EMA 0.05-0.1, first probe after 16-64 steps, cap 128-256) and of the
# budget, benchmark/results/policy_sweep_cpu.json. Served (benchmark/results/agents_h200.json, run
# policy-1-32-agents): 5 % less decode time than the module's settings at 1 agent by step counts, equal at 32
# (the noise allowance and the early first probe, LUMOTREE's since, were not served with its suffix drafts: off)
SUFFIX_SETTINGS = PolicySettings(ema=0.05, probe_every=16, probe_max=256, probe_budget=0.01, drop_z=0.0,
                                 floor_first=True)
# what --speculative-adaptive-config may set
POLICY_KEYS = ("ema", "probe_every", "probe_max", "probe_budget", "drop_z", "floor_first")
REQUEST_KEY = "request_quantile"  # and LUMOTREE_SUFFIX's per-request choice (lumotree.sglang.request_choice.KEY)


@dataclasses.dataclass
class _Bucket:
    times: Dict[int, collections.deque]
    samples: Dict[int, int]
    chosen: Optional[int] = None
    since_probe: int = 0
    run: Optional[int] = None  # the candidate an exploration or probe run serves
    run_left: int = 0  # steps of that run still to serve
    probe_every: int = PROBE_EVERY  # the current interval between probe runs (the policy's settings set it)
    probed: bool = False  # a probe run ended and its outcome is not yet taken
    settle: int = 0  # decisions after a tree probe that keep the choice while its last acceptance is on the way
    medians: Dict[int, float] = dataclasses.field(default_factory=dict)  # step_time's, until the next sample
    remeasure_wait: int = 0  # decisions of the bucket before no draft may be re-measured again (remeasure)
    remeasure_every: int = 0  # the current wait after a re-measure (remeasure: doubles while re-measures confirm)
    remeasured_at: Optional[int] = None  # samples[0] when the last re-measure started
    probe_of: Optional[int] = None  # the candidate the bucket's last probe run served
    extended: bool = False  # that probe was extended once already (close call)
    empty_probes: int = 0  # tree probes in a row that held no running request (EMPTY_PROBE_REPEATS)
    confirmed: bool = False  # a probe has run since the bucket's choice last changed (its probe floor applies)
    # the last warm no-draft steps' times (s): whether a probe of the tree starts warm or cold (TreeSizePolicy._tree_run)
    warm_times: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=WINDOW))


class TreeSizePolicy:
    """Chooses the draft steps of each decode step; see the module docstring.

    Args:
        candidates (Sequence[int]): draft steps the server can serve (``0`` = no draft).
        prior_accept (float): accepted drafts per request assumed before any drafted step.
        tree_name (str): how the log names a drafting candidate (``format``-ed with it).
        settings (PolicySettings): its averaging and probing (default: the module's, :meth:`PolicySettings.current`).
    """

    def __init__(self, candidates: Sequence[int], prior_accept: Optional[float] = None, tree_name: str = "{}-step tree",
                 settings: Optional[PolicySettings] = None, warm_probes: bool = False):
        self.tree_name = tree_name  # a drafting candidate in the log (LUMOTREE_SUFFIX: its one tree)
        # a probe of a tree after no-draft steps starts with a warm no-draft step instead of a cold drafted one (warm)
        self.warm_probes = warm_probes
        self.warm = False  # the step just chosen serves no draft warm: the next step drafts (see _tree_run)
        self.settings = settings if settings is not None else PolicySettings.current()
        cands = sorted(set(int(c) for c in candidates))
        if not cands or cands[0] < 0:
            raise ValueError(f"candidate draft steps must be non-negative integers, got {list(candidates)}")
        self.candidates: List[int] = cands
        self.accept: Optional[float] = prior_accept
        # moving average of the requests' squared accepted drafts (a step's mean over its rows): their spread
        self._sq: Optional[float] = None
        # chains of several depths (a LUMOTREE chain's shallower candidates): ``accept`` is the deepest chain's, and
        # the others' are read from it and into it through a per-depth acceptance (chain_accept)
        drafting = [c for c in cands if c > 0]
        self._deepest: Optional[int] = drafting[-1] if len(drafting) > 1 else None
        self.buckets: Dict[int, _Bucket] = {}
        self._measured: Dict[int, set] = {c: set() for c in cands}  # buckets with MIN_SAMPLES times of a candidate
        self._borrows = False  # a bucket has measured every candidate: later buckets borrow (_choose)
        self._last: Optional[int] = None  # the candidate of the last step chosen (any bucket)
        # after a no-draft gap: [estimate before it, accepted drafts summed over rows, rows, steps, their squares
        # summed, steps averaged before the EMA resumes] of new samples; the last one closed, for a close call's
        # extension (_close_call), which reopens it
        self._gap: Optional[list] = None
        self._closed_gap: Optional[list] = None
        self._extend_gap = 0  # counted steps a close call's extension adds to the probe's average (choose)

    # ------------------------------------------------------------------ estimates
    def tokens_per_step(self, steps: int, accept: Optional[float] = None) -> float:
        """Expected tokens a request gains per step with ``steps`` draft steps (at acceptance ``accept``, default the
        estimate's)."""
        if steps == 0:
            return 1.0
        a = accept if accept is not None else self.accept if self.accept is not None else 0.0
        if self._deepest is not None and steps != self._deepest:
            a = chain_accept(chain_p(a, self._deepest), steps)
        return 1.0 + a

    def _bucket(self, batch: int) -> _Bucket:
        b = bucket(batch)
        if b not in self.buckets:
            self.buckets[b] = _Bucket({c: collections.deque(maxlen=WINDOW) for c in self.candidates},
                                      {c: 0 for c in self.candidates}, probe_every=self.settings.probe_every)
        return self.buckets[b]

    def observe_time(self, batch: int, steps: int, seconds: float) -> None:
        """Time of one decode step of ``batch`` requests served with ``steps`` draft steps (:data:`WARM`: a warm
        no-draft step, which is no candidate's sample; :meth:`_tree_run` weighs it against a drafted step)."""
        if steps == WARM and seconds > 0 and self.warm_probes:
            self._bucket(batch).warm_times.append(seconds)
            return
        if steps not in self.candidates or not seconds > 0:
            return
        st = self._bucket(batch)
        st.times[steps].append(seconds)
        st.samples[steps] += 1
        for other in self.buckets.values():  # every bucket's estimate may be capped by this one's (step_time)
            other.medians.pop(steps, None)
        if st.samples[steps] == MIN_SAMPLES:
            self._measured[steps].add(bucket(batch))
            for other in self.buckets.values():  # the buckets that cap every candidate may have changed
                other.medians.clear()
            self._borrows = self._borrows or min(st.samples.values()) >= MIN_SAMPLES

    def observe_accept(self, steps: int, accepted_drafts: Sequence[int]) -> None:
        """Accepted draft tokens per request of one step served with ``steps`` draft steps."""
        if steps == 0 or not accepted_drafts:
            return
        if self._deepest is not None and steps != self._deepest:  # as the deepest chain would have accepted
            same = chain_accept(chain_p(sum(accepted_drafts) / len(accepted_drafts), steps), self._deepest)
            accepted_drafts = [same] * len(accepted_drafts)
        a = sum(accepted_drafts) / len(accepted_drafts)
        sq = sum(x * x for x in accepted_drafts) / len(accepted_drafts)
        self._sq = _ema(self._sq, sq, self.settings.ema)
        if self._gap is None:
            self.accept = _ema(self.accept, a, self.settings.ema)
            return
        g = self._gap
        g[1] += sum(accepted_drafts)
        g[2] += len(accepted_drafts)
        g[3] += 1
        g[4] += sum(x * x for x in accepted_drafts)
        old, total, rows = g[0], g[1], g[2]
        self.accept = (total + old) / (rows + 1) if old is not None else total / rows
        if g[3] >= g[5]:
            self._gap, self._closed_gap = None, g
            self._sq = g[4] / rows if rows else self._sq  # restarts from the gap's, as the estimate does

    def step_time(self, batch: int, steps: int) -> Optional[float]:
        """Estimated seconds of a step of ``batch`` with ``steps``: the median of the bucket's own samples
        once it has ``MIN_SAMPLES``, else those of the nearest bucket that has them (ties: the larger);
        never above the estimate of the next larger bucket that has measured every candidate (a step's time grows
        with the batch: a small bucket's few samples, taken while a pass's batch ramps up, are the ones a
        stray prefill or compile inflates); ``None`` when no bucket has. Every candidate, not just ``steps``: a cap
        from a bucket that has measured only one candidate compares that candidate's time from there with the
        others' own -- on one H100 (Qwen3-Next MoE shape, batch 1) bucket 2 had only no-draft samples (2.1 ms, from the
        warm-up) while bucket 1's steps ran 1.5x slow for seconds (no draft 3.2 ms, the chain 6.5 ms): no draft's
        estimate was capped and the chain's was not, and the bucket served no draft through a pass whose drafts
        accepted ~1.9 (312 tokens/s against 591 in the same configuration's earlier run on that machine)."""
        b = bucket(batch)
        st = self.buckets.get(b)  # not created: a query (serves) reads buckets no step has run in
        if st is None or st.samples[steps] < MIN_SAMPLES:
            known = self._measured[steps]
            if known:
                b = min(known, key=lambda k: (abs(k.bit_length() - b.bit_length()), -k))
                st = self.buckets[b]
            elif st is None:
                return None
        m = st.medians.get(steps)
        if m is None and st.times[steps]:
            m = statistics.median(st.times[steps])
            # a step of a smaller batch is never slower than one of a larger (padded graphs); the cap comes from a
            # bucket that has measured every candidate, so that all of this bucket's candidates are capped by the
            # same bucket's times
            above = [k for k in set.intersection(*self._measured.values()) if k > b]
            if above:
                m = min(m, self.step_time(min(above), steps))
            st.medians[steps] = m
        return m

    def decision_time(self, batch: int, steps: int) -> Optional[float]:
        """:meth:`step_time` as the decisions read it: never below the estimate of a candidate with fewer draft steps
        at the same batch (a drafted step runs a shallower step's forward and more: drafting, a wider verify, its
        commit), so that a drafting candidate whose acceptance is ~0 never reads faster than no draft.

        Why: an estimate of each candidate may come from another bucket (borrowed) or from a few samples, and the
        two need not agree. On one H100 (27B shape, batch 1 benchmark) bucket 2's own no-draft samples, taken right
        after the start, read 32.0 ms while the chain's time was borrowed from bucket 1 (14.0 ms): the bucket served
        the chain at accept 0.00 (63 against 137 tokens/s estimated) until its own chain samples came in."""
        t = self.step_time(batch, steps)
        if t is None:
            return None
        for c in self.candidates:
            if c < steps:
                shallower = self.step_time(batch, c)
                if shallower is not None and shallower > t:
                    t = shallower
        return t

    def rate(self, batch: int, steps: int) -> Optional[float]:
        """Estimated tokens per second of the batch with ``steps`` (its :meth:`decision_time`); ``None`` before a
        time sample."""
        t = self.decision_time(batch, steps)
        return None if t is None else bucket(batch) * self.tokens_per_step(steps) / t

    # ------------------------------------------------------------------ decision
    def choose(self, batch: int) -> int:
        """The draft steps of the next decode step of ``batch`` requests."""
        self.warm = False
        if len(self.candidates) == 1:
            return self.candidates[0]
        steps = self._choose(batch)
        if steps > 0 and self._last == 0:  # drafting resumes: its acceptance is measured afresh
            g = self._gap or self._closed_gap
            if self._extend_gap and g is not None:  # a close call's extension: the probe's average goes on
                g[5] = g[3] + self._extend_gap
                self._gap = g
            else:
                self._gap = [self.accept, 0.0, 0, 0, 0.0, GAP_SAMPLES]
            self._extend_gap = 0
        self._last = steps
        return steps

    def ending_step(self) -> int:
        """No draft for a decode step after which every request of its batch has ended
        (:func:`lumotree.sglang.finish.ends_after_step`), without a decision: no token of a draft could be kept, and
        the step measures nothing (a probe started there held no running request, :data:`EMPTY_PROBE_REPEATS`). The
        buckets' runs, probe intervals and choices stay as they were; the next drafted step restarts the acceptance's
        average after a gap, as after any no-draft step. Only where no draft is a candidate."""
        if 0 not in self.candidates:
            raise ValueError(f"ending_step: no draft is not a candidate of {self.candidates}")
        self.warm = False
        self._last = 0
        return 0

    def _choose(self, batch: int) -> int:
        st = self._bucket(batch)
        run = self.run_step(batch)
        if run is not None:
            return run
        if st.settle > 0:  # a tree probe just ended: its last counted step's acceptance arrives after this step
            st.settle -= 1
            if st.chosen is not None:
                return st.chosen
        # until one bucket has measured every candidate, each bucket explores; after that they borrow
        unexplored = [c for c in self.candidates if self.step_time(batch, c) is None
                      or (st.samples[c] < MIN_SAMPLES and not self._borrows)]
        if unexplored:  # fewest samples first; drafting first, which also measures the acceptance
            return self._start_run(st, min(unexplored, key=lambda c: (st.samples[c], -c)))
        stale = self.remeasure(batch)
        if stale is not None:
            return stale
        rates = {c: self.rate(batch, c) for c in self.candidates}
        best = self._keeps(batch, rates, st.chosen)
        empty = st.probed and bool(st.probe_of) and self._gap is not None and self._gap[2] == 0
        if empty and st.empty_probes < EMPTY_PROBE_REPEATS:  # the probe saw no running request: again
            st.empty_probes += 1
            logger.info("LumoTree adaptive: batch bucket %d: a probe of the %s held no running request; probing "
                        "again", bucket(batch), self.tree_name.format(st.probe_of))
            st.settle = 1
            return self._tree_run(st, st.probe_of, tree_probe_run(batch), batch)
        if st.probed:
            st.empty_probes = 0
        if st.probed and best == 0 and st.chosen == 0 and self._close_call(batch, rates, st):
            st.extended = True
            k = min(GAP_SAMPLES, max(1, -(-EXTEND_ROWS // bucket(batch))))
            logger.info("LumoTree adaptive: batch bucket %d: a close call (%s; accept %.2f); the probe of the %s is "
                        "extended by %d counted steps", bucket(batch),
                        ", ".join(f"{c}: {rates[c]:.0f} tok/s" for c in self.candidates), self.accept or 0.0,
                        self.tree_name.format(st.probe_of), k)
            self._extend_gap = k
            st.settle = 1
            return self._tree_run(st, st.probe_of, 1 + k, batch)
        if st.probed and best == st.chosen and not empty:  # the decision right after a probe run left the choice
            st.probe_every = min(2 * st.probe_every, self.settings.probe_max)
        if best != st.chosen or st.probed:  # changes, and what each probe measured (probes are rare: logged too)
            logger.info("LumoTree adaptive: batch bucket %d -> %s (%s; accept %.2f)%s", bucket(batch),
                        "no draft" if best == 0 else self.tree_name.format(best),
                        ", ".join(f"{c}: {rates[c]:.0f} tok/s" for c in self.candidates),
                        self.accept or 0.0, " after a probe" if st.probed else "")
        st.probed = False
        if best != st.chosen:  # the interval restarts: a first probe PROBE_EVERY steps after the change
            st.probe_every, st.since_probe, st.confirmed = self.settings.probe_every, 0, False
            st.chosen = best
        if best > 0 and 0 in st.samples and st.samples[0] >= MIN_SAMPLES:
            # a drafting choice measures its acceptance itself (module docstring)
            st.probe_every = self.settings.probe_max
        st.since_probe += 1
        # the first probe after a change checks the choice: its floor applies only once a probe has confirmed it
        early = not st.confirmed and not self.settings.floor_first
        if st.since_probe >= st.probe_every and (early or st.since_probe >= self._probe_floor(batch, best)):
            st.since_probe, st.confirmed = 0, True
            st.probed = True
            other = self._probed(st, best)
            st.probe_of, st.extended = other, False
            # a candidate this bucket has borrowed the times of is timed as it is probed: RUN steps, a tree's first
            # of them warm where probes start warm (its times so far came from another bucket)
            length = RUN if st.samples[other] < MIN_SAMPLES else probe_run(batch, other)
            st.settle = 1 if other > 0 else 0
            return self._tree_run(st, other, length, batch) if other > 0 else self._start_run(st, other, length)
        return best

    def _close_call(self, batch: int, rates: Dict[int, float], st: _Bucket) -> bool:
        """Whether the decision after a probe of the tree, which kept no draft, is too close to trust: the bucket
        would switch to the tree (its rate ``MARGIN`` above no draft's) at an acceptance within ``CLOSE_Z`` standard
        errors above the probe's estimate (the request samples since drafting resumed, their deviation at least
        ``SD_FLOOR``), and the probe holds fewer than ``EXTEND_ROWS`` samples (batch 32 and up one counted step holds
        as many as an extension would add). Once per probe, for the deepest candidate (or the only drafting one).
        Why: where a drafted step costs 2.3x a decode step (Qwen3-Next MoE
        shape, 12 layers, batch 8, one H200) the chain pays from ~1.3-1.7 accepted drafts, and a probe of 8
        requests' one counted step, averaged with the estimate before it, read 1.33 where the oracle's drafts
        accept ~1.95: the server kept no draft through the measured pass (0.89x no speculation, SGLang's chain
        1.26x). An extension costs little where the call is close -- both candidates serve about alike -- and
        nothing where it is not (drafts that miss: the estimate is far below the tree's break-even)."""
        c = st.probe_of
        if st.extended or not c or (self._deepest is not None and c != self._deepest) or self.accept is None:
            return False
        g = self._gap or self._closed_gap
        t = self.decision_time(batch, c)
        if g is None or not 0 < g[2] < EXTEND_ROWS or t is None or not rates.get(0):
            return False  # a probe of EXTEND_ROWS samples or more (batch 32 and up) is as sure as an extension
        rows, mean = g[2], g[1] / g[2]
        var = max(0.0, g[4] / rows - mean * mean) * rows / (rows - 1) if rows > 1 else 0.0
        se = max(math.sqrt(var), SD_FLOOR) / math.sqrt(rows)
        # the acceptance from which the tree's rate is MARGIN above no draft's: where the bucket would switch (_kept)
        switch = (1.0 + MARGIN) * rates[0] * t / bucket(batch) - 1.0
        return self.accept + CLOSE_Z * se >= switch

    def accept_se(self, batch: int) -> Optional[float]:
        """The standard error of the acceptance's moving average at steps of ``batch`` requests: a request's standard
        deviation of accepted drafts (from the moving averages of their squares and of them) over ``sqrt(batch)`` -- a
        step's sample is the mean of its requests' -- times ``sqrt(w / (2 - w))``, ``w`` the averaging weight (an
        exponential average of independent samples); ``None`` before a drafted step."""
        mean, sq, w = self.accept, self._sq, self.settings.ema
        if mean is None or sq is None:
            return None
        return math.sqrt(max(0.0, sq - mean * mean) / max(1, batch) * w / (2.0 - w))

    def _drop_unsure(self, batch: int, steps: int, rates: Dict[int, float]) -> bool:
        """Whether a bucket serving the drafting candidate ``steps`` should keep it although no draft's estimated rate
        is the higher: at an acceptance ``DROP_Z`` standard errors (:meth:`accept_se`) above the estimate the
        candidate would still serve at least no draft's rate (``DROP_Z``: the settings' ``drop_z``). Why: at batch 1
        a step's sample is one request's accepted drafts (0 to 3 for a 3-step chain, standard deviation ~1.2 at p
        0.8), and the moving average of a few of them dipped below the break-even (~1.6 accepted drafts, Qwen3-Next
        MoE shape, H200 step times) now and then although the drafts were accepted 1.95 a step on average: each dip
        served no draft until the next probe, most of a measured pass in the policy's simulation
        (``benchmark/serving/sim_pass_choice.py``). Where drafts miss from a step on, the zeros drive the average and
        its spread down within a few steps more (7-8 drafted steps at batch 1 in the simulation, 4 before); from batch
        8 on a step's sample averages its requests and the allowance is small (batch 32: 4-5 steps, 4 before). A
        tree whose acceptance sits below its break-even (1.35 against ~1.6) is still left: the average of a few
        one-request samples strays that far below it (served on ~6 % of the steps there, the simulation)."""
        se = self.accept_se(batch)
        t = self.decision_time(batch, steps)
        if se is None or self.accept is None or t is None or not rates.get(0):
            return False
        return bucket(batch) * self.tokens_per_step(steps, self.accept + self.settings.drop_z * se) / t >= rates[0]

    def remeasure(self, batch: int) -> Optional[int]:
        """No draft, served for ``REMEASURE_RUN`` of the bucket's steps to time it again, where the bucket's own
        estimate of a no-draft step exceeds a drafting candidate's by more than ``MARGIN``; ``None`` otherwise (and
        within the wait after the bucket's last re-measure, below). Later steps of the run: :meth:`run_step`.

        Why: a drafted step runs the no-draft step's forward and more (drafting, a wider verify, its commit), so a
        no-draft estimate above a drafted one is stale -- samples that held a host stall or the next drafted step's
        host preparation (a step's time runs to the next step's launch, :class:`lumotree.sglang.worker.StepClock`,
        steady for the loops that draft on the host since). Nothing refreshed it where the
        stale estimate made drafting look free: a LUMOTREE_SUFFIX server (tiny model, 32 agents, one H100) kept no
        draft at 15.0 ms against its tree's 8.3-10.7 ms at bucket 32 through the whole run (no speculation's
        decode step: 2.8 ms); its per-request choice read the tree as cheaper than no draft and drafted every step,
        so the sessions' second turns, whose new text no draft foresees, advanced one token per drafted step (928
        ms median against no speculation's 678: the 32-agent p95, 24 % above no speculation's). The wait bounds
        what re-measuring costs where a no-draft step is truly the slower: the wait is ``probe_max`` decisions, doubling
        (up to ``REMEASURE_BACKOFF`` times that) each time the estimate that calls for a re-measure is the last
        re-measure's own -- no other no-draft sample since: a LUMOTREE_SUFFIX server at 1 agent (one H200) read its
        no-draft step at 2.1-5.0 ms against 2.3-3.5 drafted on its steady clock (host-bound steps: the no-draft step's
        own host work and the next step's) and re-measured 24 times, 6 no-draft steps each, all confirming."""
        if 0 not in self.candidates or len(self.candidates) < 2:
            return None
        st = self._bucket(batch)
        if st.remeasure_wait > 0:
            st.remeasure_wait -= 1
            return None
        if st.samples[0] < MIN_SAMPLES:  # no own estimate: it is explored or borrowed, not stale
            return None
        t_none = self.step_time(batch, 0)
        drafted = [self.step_time(batch, c) for c in self.candidates if c > 0 and st.samples[c] >= MIN_SAMPLES]
        # beyond MARGIN: a 1-step chain's verify at batch 1 costs about a decode step, and noise may order the two
        cheaper = [t for t in drafted if t is not None and t_none is not None and t < (1 - MARGIN) * t_none]
        if not cheaper:
            st.remeasured_at = None
            return None
        confirmed = st.remeasured_at is not None and st.samples[0] - st.remeasured_at <= REMEASURE_RUN
        st.remeasure_every = (min(2 * st.remeasure_every, REMEASURE_BACKOFF * self.settings.probe_max) if confirmed
                              else self.settings.probe_max)
        st.remeasured_at, st.remeasure_wait = st.samples[0], st.remeasure_every
        logger.info("LumoTree adaptive: batch bucket %d's no-draft step (%.3f ms) is estimated slower than its "
                    "drafted step (%.3f ms): its samples are stale; timing %d no-draft steps again", bucket(batch),
                    t_none * 1e3, min(cheaper) * 1e3, REMEASURE_RUN)
        return self._start_run(st, 0, REMEASURE_RUN)

    def run_step(self, batch: int) -> Optional[int]:
        """The candidate of a run the bucket is serving (exploration, probe or :meth:`remeasure`), that step
        counted; ``None`` where none is. For a caller that decides outside :meth:`choose` (LUMOTREE_SUFFIX's
        per-request choice, :class:`lumotree.sglang.worker.StepLedger`)."""
        st = self.buckets.get(bucket(batch))
        if st is None or st.run_left <= 0:
            return None
        st.run_left -= 1
        return st.run

    def serves(self, batch: int) -> Optional[int]:
        """The candidate a decision at ``batch`` would serve now outside exploration and probe runs -- the best
        estimated rate, the bucket's last choice kept within ``MARGIN`` or, a tree, within the acceptance's noise
        (:meth:`_keeps`) -- without deciding (nothing changes); ``None`` while a candidate has no step-time estimate
        anywhere or no drafted step has been measured."""
        if len(self.candidates) == 1:
            return self.candidates[0]
        if self.accept is None:
            return None
        rates = {c: self.rate(batch, c) for c in self.candidates}
        if any(r is None for r in rates.values()):
            return None
        st = self.buckets.get(bucket(batch))
        return self._keeps(batch, rates, st.chosen if st is not None else None)

    def _keeps(self, batch: int, rates: Dict[int, float], chosen: Optional[int]) -> int:
        """:meth:`_kept`, and a served tree kept where no draft is estimated faster within the acceptance's noise
        (:meth:`_drop_unsure`, where the settings' ``drop_z`` is above 0)."""
        best = self._kept(rates, chosen)
        if best == 0 and chosen and self.settings.drop_z > 0 and self._drop_unsure(batch, chosen, rates):
            return chosen
        return best

    @staticmethod
    def _kept(rates: Dict[int, float], chosen: Optional[int]) -> int:
        """The candidate of the best estimated rate, unless the bucket's last choice is within ``MARGIN`` of it
        (hysteresis)."""
        best = max(rates, key=rates.__getitem__)
        if chosen is not None and chosen != best and rates[best] < (1 + MARGIN) * rates[chosen]:
            return chosen
        return best

    def may_draft(self, low: int, high: int) -> bool:
        """Whether a decode step of ``low`` to ``high`` requests may draft by the current estimates: false only
        when :meth:`serves` says no draft at every batch bucket from ``bucket(low)`` to ``bucket(high)`` (``high``
        capped at the largest bucket a step has run in: larger ones borrow its estimates). Asked before a prefill
        (:mod:`lumotree.sglang.worker`): its requests decode in a batch of at least those prefilled since the last
        decode step (SGLang runs the prefills it can admit back to back) and at most those plus the last decode
        step's."""
        if self.candidates == [0]:
            return False
        ran = [b for b, st in self.buckets.items() if any(st.samples.values())]
        if not ran:
            return True
        b = bucket(max(1, low))
        end = max(b, min(bucket(max(low, high)), max(ran)))
        while b <= end:
            if self.serves(b) != 0:
                return True
            b *= 2
        return False

    def _probed(self, st: _Bucket, best: int) -> int:
        """The candidate a probe of the bucket serves: the one of fewest samples but ``best``; where no draft is
        served and every drafting candidate has its own step times, the shallowest chain. Why: a probe of a drafting
        candidate while no draft is served is for the acceptance, which every depth measures alike
        (:func:`chain_accept`: one estimate for all), and the shallowest costs least where it does not pay -- a
        1-step chain's step cost 1.18x a decode step at batch 1, the 3-step chain's 1.38x (27B shapes, one H100);
        the deeper chains keep the step times they were explored or last served with."""
        others = [c for c in self.candidates if c != best]
        if best == 0 and self._deepest is not None and all(st.samples[c] >= MIN_SAMPLES for c in others):
            return min(others)
        return min(others, key=lambda c: st.samples[c])

    def _probe_floor(self, batch: int, best: int) -> int:
        """The fewest steps between probe runs for which a probe of a candidate that does not pay costs at
        most ``PROBE_BUDGET`` of the time served: its ``probe_run`` steps take ``probe_run x T_other``,
        of which ``rate_other / rate_best`` is what they serve, the rest lost. 0 where the bucket has no
        own step times of the candidate (it is explored) or the estimates say the candidate pays."""
        st = self._bucket(batch)
        other = self._probed(st, best)
        if st.samples[other] < MIN_SAMPLES:
            return 0
        t_other, t_best = self.step_time(batch, other), self.step_time(batch, best)
        r_other, r_best = self.rate(batch, other), self.rate(batch, best)
        loss = probe_run(batch, other) * t_other * (1.0 - r_other / r_best)
        return 0 if loss <= 0 else math.ceil(loss / (self.settings.probe_budget * t_best))

    def serve_run(self, batch: int, steps: int, length: int) -> int:
        """Serve ``steps`` now and for the next ``length - 1`` decode steps of ``batch``'s bucket (:meth:`run_step`
        serves them): for a caller that decides outside :meth:`choose` (:class:`lumotree.sglang.worker.StepLedger`)."""
        if steps not in self.candidates or length < 1:
            raise ValueError(f"serve_run: {steps} is not a candidate of {self.candidates} or length {length} < 1")
        return self._start_run(self._bucket(batch), steps, length)

    def _tree_run(self, st: _Bucket, steps: int, length: int, batch: int) -> int:
        """A probe run of the drafting candidate ``steps``: ``length`` steps, the first of them cold where the step
        before served no draft (its draft comes from a stub; its acceptance is not counted). With ``warm_probes``
        that first step serves no draft *warm* instead -- a decode step whose MTP draft-extend runs (:attr:`warm`;
        :class:`lumotree.sglang.worker.LumoTreeWorker`), so that the ``length - 1`` drafted steps after it are all
        counted, the first drafting from the model's own draft. Why: where drafts miss, a cold drafted step cost as
        much as a counted one (1.4x a decode step at batch 1 of the 27B shape, 2.3x at batch 32 of the MoE shape, the
        policy's estimates in the server logs, one H100) and measured nothing; a probe from batch 4 on is a cold and
        one counted step, so the warm step takes half of its drafted steps. The
        interval between probes stays as for a cold probe (:meth:`_probe_floor` counts ``length`` drafted steps):
        the same probes, each cheaper -- where the warm step is the cheaper (:meth:`warm_pays`)."""
        if self.warm_probes and self._last == 0 and length > 1 and self.warm_pays(batch, steps):
            self.warm = True
            self._start_run(st, steps, length)  # the next length - 1 steps draft
            return 0
        return self._start_run(st, steps, length)

    def warm_pays(self, batch: int, steps: int) -> bool:
        """Whether a probe of the tree ``steps`` at ``batch`` starts with a warm no-draft step rather than a cold
        drafted one: until the bucket has timed ``MIN_SAMPLES`` warm steps, and then where their median time is at
        most the tree's step time (:meth:`step_time`). Why: both open a probe and measure nothing, and a warm step was
        not always the cheaper -- 1.12x a decode step against the chain's 1.37x at batch 1 of the 27B shape, but
        10.8 ms against the chain's 4.1 ms (a decode step 1.7 ms) at batch 1 of the 12-layer Qwen3-Next MoE shape,
        whose warm draft-extend runs outside CUDA graphs (one H100, the servers' logs). Several samples, because one
        warm step's time can hold one-off work (the second one-node verify of a batch size captures its post-verify
        CUDA graph, :mod:`lumotree.sglang.post_verify`), and a bucket that turned cold never times a warm step again."""
        st = self._bucket(batch)
        if len(st.warm_times) < MIN_SAMPLES:
            return True
        t_tree = self.step_time(batch, steps)
        return t_tree is None or statistics.median(st.warm_times) <= t_tree

    @staticmethod
    def _start_run(st: _Bucket, steps: int, length: Optional[int] = None) -> int:
        """Serve ``steps`` now and for the next ``length - 1`` steps of the bucket (default ``RUN``)."""
        st.run, st.run_left = steps, (RUN if length is None else length) - 1
        return steps

    def table(self) -> dict:
        """The model as it stands: per bucket, the step-time estimates (ms) and the choice."""
        return {"accept": self.accept, "buckets": {
            b: {"chosen": st.chosen, "samples": dict(st.samples), "probe_every": st.probe_every,
                "step_ms": {c: None if not t else round(statistics.median(t) * 1e3, 3) for c, t in st.times.items()}}
            for b, st in sorted(self.buckets.items())}}


def chain_accept(p: float, steps: int) -> float:
    """Accepted drafts per request of a ``steps``-step chain whose every draft is accepted with probability ``p``
    given its parent was: ``p + p^2 + ... + p^steps`` (what a shallower chain accepts, read from a deeper one's
    acceptance; the benchmark's controlled acceptance is exactly this)."""
    return sum(p ** i for i in range(1, steps + 1))


def chain_p(accepted: float, steps: int) -> float:
    """The per-draft ``p`` at which a ``steps``-step chain accepts ``accepted`` drafts per request
    (:func:`chain_accept`'s inverse; 0 at or below 0, 1 at or above ``steps``)."""
    if accepted <= 0:
        return 0.0
    if accepted >= steps:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_accept(mid, steps) < accepted else (lo, mid)
    return (lo + hi) / 2


def adaptive_tree_size(server_args) -> bool:
    """Whether a LUMOTREE or LUMOTREE_SUFFIX server chooses its tree size per step: by default, except with
    ``--enable-multi-layer-eagle``, the decode-exact mode and data parallelism (``--dp-size`` > 1, DP attention:
    its ranks run batches of their own, and ranks choosing differently would launch different collectives), which
    serve the configured tree. Tensor-parallel ranks choose alike: their policies take rank 0's step times at the
    same steps (:mod:`lumotree.sglang.shared_times`).

    A LUMOTREE server in the decode-exact mode chooses where ``--speculative-adaptive-config`` lists more than its
    configured tree (:func:`exact_choice`): both its step kinds compute what a decode computes -- the no-draft step
    is a decode step (SGLang's decode forward), the tree's verify the decode-exact one -- so its greedy outputs stay
    token-identical to the server without speculation whatever it chooses, and the switches between them can be
    checked token for token (``test/sglang/test_served_switch_gpu.py``)."""
    from lumotree.sglang.exact import exact_mode

    if getattr(server_args, "enable_multi_layer_eagle", False) or _data_parallel(server_args):
        return False
    return exact_choice(server_args) if exact_mode(server_args) else True


def _data_parallel(server_args) -> bool:
    return (getattr(server_args, "dp_size", 1) or 1) > 1 or bool(getattr(server_args, "enable_dp_attention", False))


def exact_choice(server_args) -> bool:
    """Whether a decode-exact server's ``--speculative-adaptive-config`` asks it to choose: a LUMOTREE server whose
    config lists candidates besides its configured tree (LUMOTREE_SUFFIX's decode-exact mode serves its tree on
    every step)."""
    if is_suffix(server_args):
        return False
    _, cfg = _config(server_args)
    got = cfg.get("candidate_steps") if isinstance(cfg, dict) else None
    return isinstance(got, list) and got != [int(server_args.speculative_num_steps or 0)]


def check_fixed_tree_config(server_args) -> None:
    """On a server that serves its configured tree on every step (:func:`adaptive_tree_size` false): raise
    ``ValueError`` naming ``--speculative-adaptive-config`` if that flag asks for any other candidate -- the server
    would ignore it. A config of the configured tree alone (``{"candidate_steps": [3]}``) is what it serves anyway."""
    path, cfg = _config(server_args)
    if cfg is None or adaptive_tree_size(server_args):
        return
    configured = SUFFIX_TREE if is_suffix(server_args) else int(server_args.speculative_num_steps or 0)
    got = cfg.get("candidate_steps") if isinstance(cfg, dict) else None
    if got == [configured]:
        return
    why = ("--enable-multi-layer-eagle" if getattr(server_args, "enable_multi_layer_eagle", False) else
           "data parallelism (--dp-size > 1 or --enable-dp-attention)" if _data_parallel(server_args) else
           "LUMOTREE_SUFFIX's decode-exact mode (--enable-deterministic-inference)" if is_suffix(server_args) else
           "the decode-exact mode (--enable-deterministic-inference) without candidate_steps in the config")
    raise ValueError(f"--speculative-adaptive-config {path}: {why} serves the configured tree on every step, so "
                     f"{got!r} cannot be chosen from; drop the flag (or give {{\"candidate_steps\": [{configured}]}})")


SUFFIX_TREE = 1  # LUMOTREE_SUFFIX's candidate for its draft tree (the NGRAM loop has one tree size and no draft steps)


def is_suffix(server_args) -> bool:
    return str(getattr(server_args, "speculative_algorithm", None) or "").upper() == "LUMOTREE_SUFFIX"


def _config(server_args):
    """``(path, JSON)`` of ``--speculative-adaptive-config``; ``(None, None)`` without one. Raises ``ValueError``
    naming the flag for a file that is not JSON."""
    path = getattr(server_args, "speculative_adaptive_config", None)
    if not path:
        return None, None
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--speculative-adaptive-config {path}: cannot read it as JSON ({e})") from None
    return path, cfg


def policy_settings(server_args) -> PolicySettings:
    """The adaptive policy's settings for a server: LUMOTREE_SUFFIX's (:data:`SUFFIX_SETTINGS`) or the module's
    (LUMOTREE), with those ``--speculative-adaptive-config`` sets (``ema`` in (0, 1], ``probe_every`` and
    ``probe_max`` whole steps, ``probe_every <= probe_max``, ``probe_budget`` in (0, 1), ``drop_z`` >= 0,
    ``floor_first`` true or false). Raises ``ValueError``
    naming the flag for a value out of range or a key neither this nor :func:`candidate_steps` reads."""
    base = SUFFIX_SETTINGS if is_suffix(server_args) else PolicySettings.current()
    path, cfg = _config(server_args)
    unknown = sorted(set(cfg) - {"candidate_steps", REQUEST_KEY, *POLICY_KEYS}) if isinstance(cfg, dict) else []
    if unknown:  # a misspelt setting would otherwise be ignored
        raise ValueError(f"--speculative-adaptive-config {path}: unknown keys {unknown} (LumoTree reads "
                         f"candidate_steps, the policy's {', '.join(POLICY_KEYS)} and LUMOTREE_SUFFIX's {REQUEST_KEY})")
    if not isinstance(cfg, dict) or not any(k in cfg for k in POLICY_KEYS):
        return base
    got = dataclasses.replace(base, **{k: cfg[k] for k in POLICY_KEYS if k in cfg})
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (got.probe_every, got.probe_max))
    nums = all(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in (got.ema, got.probe_budget, got.drop_z))
    if not (ints and nums and 0 < got.ema <= 1 and 1 <= got.probe_every <= got.probe_max
            and 0 < got.probe_budget < 1 and got.drop_z >= 0 and isinstance(got.floor_first, bool)):
        raise ValueError(f"--speculative-adaptive-config {path}: ema in (0, 1], probe_every <= probe_max whole steps "
                         f">= 1, probe_budget in (0, 1), drop_z >= 0, floor_first true or false; "
                         f"got {dataclasses.asdict(got)}")
    return got


def candidate_steps(server_args) -> List[int]:
    """The candidates a LUMOTREE server may serve: ``[0, --speculative-num-steps]`` in draft steps (0 = no draft);
    a LUMOTREE_SUFFIX server's ``[0, 1]``, 1 its suffix tree of ``--speculative-num-draft-tokens`` nodes. Why not a
    one-step chain beside a chain by default: served beside the two-candidate policy (27B shapes, one H100,
    ``benchmark/results/chain_depth_h100.json``) it made no more tokens/s at batch 1 and 64, accepted drafts or not
    (177 against 181 at batch 1, 4049 against 4048 at 64; its step cost 1.43x a decode step at batch 64, the 3-step
    chain's 1.76x, so it was never the better there), its state took 4.6 s more of start-up, and the batch where it
    might pay (128, where the 3-step chain breaks even on an H200) did not fit that H100 (64 requests ran). Or
    those of ``--speculative-adaptive-config`` (``{"candidate_steps": [...]}``, a subset; a LUMOTREE chain --
    ``--speculative-eagle-topk 1`` -- also shallower chains, any of ``0 .. --speculative-num-steps``). Raises
    ``ValueError`` naming the flag for a config that cannot be served."""
    suffix = is_suffix(server_args)
    steps = SUFFIX_TREE if suffix else int(server_args.speculative_num_steps or 0)
    full = [0, steps] if steps > 0 else [0]
    chain = not suffix and int(getattr(server_args, "speculative_eagle_topk", None) or 1) == 1
    servable = list(range(steps + 1)) if chain else full
    path, cfg = _config(server_args)
    if cfg is None:
        return full
    what = (f"a LUMOTREE_SUFFIX server reads {{\"candidate_steps\": [...]}} from {full} (0: no draft, "
            f"{SUFFIX_TREE}: its suffix tree)" if suffix else
            f'a LUMOTREE server reads {{"candidate_steps": [...]}} with draft steps from {servable}')
    got = cfg.get("candidate_steps") if isinstance(cfg, dict) else None
    if not isinstance(got, list) or not got or not all(isinstance(s, int) and not isinstance(s, bool) for s in got):
        raise ValueError(f"--speculative-adaptive-config {path}: {what}; got {cfg!r}")
    bad = sorted(set(got) - set(servable))
    if bad:
        served = (f"a LUMOTREE_SUFFIX server drafts its suffix tree ({SUFFIX_TREE}) or none (0)" if suffix else
                  f"a LUMOTREE chain drafts 0 to --speculative-num-steps {steps} steps" if chain else
                  f"a LUMOTREE tree (--speculative-eagle-topk above 1) drafts its --speculative-num-steps {steps} "
                  f"steps or none (0): shallower candidates serve chains (--speculative-eagle-topk 1)")
        raise ValueError(f"--speculative-adaptive-config {path}: candidate_steps {bad} cannot be served; "
                         f"{served}: use a subset of {servable}")
    return sorted(set(got))
