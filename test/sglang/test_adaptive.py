"""The adaptive tree size: the policy against a simulated server (step times per batch and tree size,
acceptance), the config flag, and the worker's bookkeeping (step-time attribution, state switches,
acceptance in launch order) on a worker object without a GPU."""
import dataclasses
import json
import logging
import math
import random
import statistics
from types import SimpleNamespace

import pytest

from lumotree.sglang import adaptive
from lumotree.sglang.adaptive import WARM, TreeSizePolicy, bucket


def test_bucket_is_the_cuda_graph_padding():
    assert [bucket(b) for b in (1, 2, 3, 5, 8, 9, 33, 64, 65)] == [1, 2, 4, 8, 8, 16, 64, 64, 128]


def simulate(policy, batch, t_none, t_tree, accept, steps=400, tree=3, seed=0, prev=None):
    """Serve ``steps`` decode steps as the worker does: a drafted step right after a no-draft step drafts
    from zeros and its acceptance is not counted (``prev``: the step before the first, default the tree).
    Returns how often each candidate ran after exploration."""
    rng = random.Random(seed)
    counts = {0: 0, tree: 0}
    prev = tree if prev is None else prev
    for i in range(steps):
        s = policy.choose(batch)
        t = (t_tree if s else t_none) * (1 + 0.02 * rng.random())
        policy.observe_time(batch, s, t)
        if not (s and prev == 0):
            policy.observe_accept(s, [accept] * batch)
        prev = s
        if i >= 2 * adaptive.RUN:
            counts[s] += 1
    return counts


@pytest.mark.parametrize("batch,t_none,t_tree,accept,want", [
    pytest.param(1, 10.0, 12.0, 1.4, 3, id="bs1-tree-pays"),           # 2.4 tokens for 1.2x the time
    pytest.param(32, 10.7, 33.0, 1.4, 0, id="bs32-tree-3x-decode"),    # 2.4 tokens for 3.1x: none
    pytest.param(8, 10.0, 14.0, 0.0, 0, id="bs8-nothing-accepted"),    # dummy weights: never pays
    pytest.param(64, 20.0, 21.0, 0.1, 3, id="bs64-cheap-tree"),        # 1.1 tokens for 1.05x: tree
])
def test_policy_serves_the_faster_candidate(batch, t_none, t_tree, accept, want):
    p = TreeSizePolicy([0, 3])
    counts = simulate(p, batch, t_none / 1e3, t_tree / 1e3, accept)
    other = 3 - want
    # after exploring it serves the faster candidate, probing the other for one run per PROBE_EVERY steps;
    # a served tree measures its acceptance itself: no draft is probed only every PROBE_MAX steps
    n = sum(counts.values())
    assert counts[want] > 0.95 * n, counts
    if want:
        assert counts[other] <= adaptive.RUN * (n // adaptive.PROBE_MAX + 1), counts
    else:
        assert 0 < counts[other] <= adaptive.RUN * (n // adaptive.PROBE_EVERY + 1), counts
    assert p.table()["buckets"][bucket(batch)]["chosen"] == want


def test_policy_follows_a_change_of_acceptance():
    p = TreeSizePolicy([0, 3])
    simulate(p, 8, 0.010, 0.014, 2.0, steps=200)          # accepted drafts: the tree pays
    assert p.table()["buckets"][8]["chosen"] == 3
    simulate(p, 8, 0.010, 0.014, 0.0, steps=200, seed=1)  # the workload stops accepting: none
    assert p.table()["buckets"][8]["chosen"] == 0
    simulate(p, 8, 0.010, 0.014, 2.0, steps=400, seed=2)  # probes see the acceptance come back
    assert p.table()["buckets"][8]["chosen"] == 3


def probe_starts(policy, batch, t_none, t_tree, accept, steps, seed=0):
    """The steps at which a run of the candidate not chosen starts (after exploration)."""
    rng, starts, prev_s = random.Random(seed), [], None
    for i in range(steps):
        s = policy.choose(batch)
        policy.observe_time(batch, s, (t_tree if s else t_none) * (1 + 0.02 * rng.random()))
        if not (s and prev_s == 0):
            policy.observe_accept(s, [accept] * batch)
        chosen = policy.buckets[bucket(batch)].chosen
        if chosen is not None and s != chosen and prev_s == chosen:
            starts.append(i)
        prev_s = s
    return starts


def test_probes_back_off_while_they_confirm_the_choice():
    """Drafts that never pay (dummy weights): the tree is probed after 128, 256, 512, then every 1024
    served steps -- the probes were most of what such a server lost against no speculation."""
    p = TreeSizePolicy([0, 3])
    starts = probe_starts(p, 32, 0.0094, 0.0159, 0.0, steps=6000)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    want = [256, 512, 1024, 1024, 1024]
    assert len(gaps) >= len(want) and all(abs(g - w) <= 2 * adaptive.RUN for g, w in zip(gaps, want)), (starts, gaps)
    assert p.table()["buckets"][32] == dict(p.table()["buckets"][32], chosen=0, probe_every=adaptive.PROBE_MAX)
    # the probes' share of the steps: at most one run per PROBE_MAX steps once backed off
    assert adaptive.RUN * len(starts) < 6000 * 0.01


def test_probes_see_acceptance_come_back_within_the_longest_interval():
    p = TreeSizePolicy([0, 3])
    probe_starts(p, 8, 0.010, 0.014, 0.0, steps=4000)  # backed off to the longest interval
    assert p.buckets[8].probe_every == adaptive.PROBE_MAX and p.buckets[8].chosen == 0
    for i in range(adaptive.PROBE_MAX + 4 * adaptive.RUN):  # the workload starts accepting
        s = p.choose(8)
        p.observe_time(8, s, 0.014 if s else 0.010)
        p.observe_accept(s, [2.0] * 8)
        if p.buckets[8].chosen == 3:
            break
    assert p.buckets[8].chosen == 3, p.table()
    # the served tree measures its acceptance on every step: no draft, whose time the bucket has, is
    # probed only every PROBE_MAX steps
    assert p.buckets[8].probe_every == adaptive.PROBE_MAX


def test_a_changed_choice_to_no_draft_probes_the_tree_early_again():
    p = TreeSizePolicy([0, 3])
    simulate(p, 8, 0.010, 0.014, 2.0, steps=300)
    assert p.buckets[8].chosen == 3
    simulate(p, 8, 0.010, 0.014, 0.0, steps=40, seed=1)
    assert p.buckets[8].chosen == 0 and p.buckets[8].probe_every == adaptive.PROBE_EVERY


def test_buckets_met_later_borrow_step_times_and_serve_their_best_at_once():
    """A batch of 32 whose requests end one after another passes through buckets 16, 8, 4, 2 and 1: each
    serves the tree that pays at once, from the step times of the nearest bucket measured, instead of
    exploring no draft for a run in the middle of the pass (27B shapes, H200: about a tenth of a
    128-token pass's steps); the bucket's own samples take over once it has them."""
    p = TreeSizePolicy([0, 3])
    simulate(p, 32, 0.0094, 0.0159, 1.9, steps=60)
    assert p.buckets[32].chosen == 3
    for b in (16, 8, 4, 2, 1):
        assert [p.choose(b) for _ in range(adaptive.RUN)] == [3] * adaptive.RUN, b
        for _ in range(adaptive.RUN):
            p.observe_time(b, 3, 0.0094 + 0.0002 * b)
    assert p.step_time(16, 3) == pytest.approx(0.0094 + 0.0032) and p.step_time(16, 0) == pytest.approx(0.0094, rel=0.03)
    # nearest first, ties to the larger bucket (its steps are the longer: the estimate leans to no draft)
    assert p.step_time(64, 0) == p.step_time(32, 0) and p.step_time(128, 3) == p.step_time(32, 3)
    q = TreeSizePolicy([0, 3])
    for b, t in ((2, 0.001), (8, 0.004)):
        for c in (0, 3):
            for _ in range(adaptive.MIN_SAMPLES):
                q.observe_time(b, c, t)
    assert q.step_time(4, 0) == pytest.approx(0.004)


def test_after_a_gap_a_probe_s_rows_outweigh_the_old_estimate():
    """Batch 128, no-draft step 15 ms, chain step 36 ms (needs ~1.4 accepted drafts): the drafts missed for
    a while, then are accepted again (1.9). The first probe's two counted steps hold 256 requests' samples;
    the estimate from before the gap weighs as one of them, so the probe switches to the tree. At batch 1
    one counted step is one row: the old estimate still damps a single request's sample."""
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 128, 0.015, 0.036, 0.0, steps=300)
    assert p.buckets[128].chosen == 0
    served = simulate_overlap(p, 128, 0.015, 0.036, 1.9, steps=p.buckets[128].probe_every + 2 * adaptive.RUN, seed=1)
    assert p.buckets[128].chosen == 3, (p.table(), served)
    q = TreeSizePolicy([0, 3])
    q.accept = 0.1
    q._gap = [0.1, 0.0, 0, 0, 0.0, adaptive.GAP_SAMPLES]
    q.observe_accept(3, [2])
    assert q.accept == pytest.approx(1.05)
    q.observe_accept(3, [2] * 8)
    assert q.accept == pytest.approx((0.1 + 18) / 10)


def test_a_probe_of_a_measured_candidate_is_short():
    """A probe of a tree whose step time the bucket has is for its acceptance: a cold step and one counted step
    from batch 4 on (its rows are PROBE_ROWS samples), not the RUN an unmeasured candidate's exploration takes,
    and no third drafted step whose acceptance would arrive after the decision (overlap)."""
    assert [adaptive.tree_probe_run(b) for b in (1, 2, 3, 4, 32, 128)] == [5, 3, 2, 2, 2, 2]
    p = TreeSizePolicy([0, 3])
    floor = math.ceil(2 * (0.0159 - 0.0094) / (adaptive.PROBE_BUDGET * 0.0094))
    served = simulate_overlap(p, 32, 0.0094, 0.0159, 0.0, steps=2 * adaptive.RUN + floor + 40)
    probe = served[2 * adaptive.RUN:]
    first = probe.index(3)
    assert probe[first:first + 3] == [3, 3, 0], probe


def test_probes_of_a_tree_that_does_not_pay_cost_at_most_the_budget():
    """Drafts that miss (batch 32, decode 9.4 ms, tree 15.9 ms, as on the H200): a probe (a cold and a counted
    drafted step) loses 2 x 6.5 ms, so probes come at least ~208 steps apart (2/3 % of the time), not every
    PROBE_EVERY steps -- the intervals of the 3-step probes before, each probe a third cheaper. The first probe after
    the choice changed (here: the exploration's end) checks it after PROBE_EVERY steps; the floor applies after it."""
    p = TreeSizePolicy([0, 3])
    served = simulate_overlap(p, 32, 0.0094, 0.0159, 0.0, steps=3000)
    start = 2 * adaptive.RUN + 10
    assert p.buckets[32].chosen == 0
    probes = [i for i in range(start, len(served)) if served[i] == 3 and served[i - 1] == 0]
    assert probes, served
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert abs(probes[0] - 2 * adaptive.RUN - adaptive.PROBE_EVERY) <= 2, probes
    assert len(gaps) >= 3 and min(gaps) >= 200, (probes, gaps)  # floor 208 (+-2 % noise)
    assert all(served[i:i + 3] == [3, 3, 0] for i in probes), [served[i:i + 3] for i in probes]
    extra = sum(served[start:]) / 3 * (0.0159 - 0.0094)  # seconds the probes' steps added
    assert extra <= 0.008 * (len(served) - start) * 0.0094
    assert TreeSizePolicy([0, 3])._probe_floor(32, 0) == 0  # no own step times of the tree: it is explored


def test_borrowed_times_never_serve_a_tree_that_does_not_pay():
    """Drafts that miss: a bucket met later serves no draft from its first step (the tree's borrowed
    time with nothing accepted loses) and probes the tree after PROBE_EVERY steps."""
    p = TreeSizePolicy([0, 3])
    simulate(p, 32, 0.0094, 0.0159, 0.0, steps=60)
    assert p.buckets[32].chosen == 0
    served = [p.choose(64) for _ in range(adaptive.PROBE_EVERY - 1)]
    assert set(served) == {0}


def test_buckets_are_independent_and_explored_drafting_first_in_runs():
    p = TreeSizePolicy([0, 3])
    # no samples yet: draft first (it also measures the acceptance), for a run of consecutive steps
    assert [p.choose(1) for _ in range(adaptive.RUN)] == [3] * adaptive.RUN
    for _ in range(adaptive.RUN):
        p.observe_time(1, 3, 0.01)
    assert [p.choose(1) for _ in range(adaptive.RUN)] == [0] * adaptive.RUN
    assert p.choose(100) == 3 and set(p.buckets) == {1, 128}


def test_a_tree_that_pays_is_learned_although_its_first_step_after_no_draft_is_cold():
    """The first drafted step after no-draft steps is not an acceptance sample (its draft comes from
    zeros): explored and probed one step at a time between no-draft steps, the tree's acceptance would
    never be measured and a tree that pays (2.4 tokens for 1.2x the time) never served."""
    p = TreeSizePolicy([0, 3])
    counts = simulate(p, 1, 0.010, 0.012, 1.4, prev=0)
    assert p.accept == pytest.approx(1.4)
    assert p.table()["buckets"][1]["chosen"] == 3 and counts[3] > 0.95 * sum(counts.values()), counts


def test_one_candidate_is_a_fixed_tree():
    p = TreeSizePolicy([3])
    assert {p.choose(b) for b in (1, 8, 64, 128)} == {3}


def test_policy_ignores_unknown_candidates_and_bad_times():
    p = TreeSizePolicy([0, 3])
    p.observe_time(4, 5, 0.01)
    p.observe_time(4, 3, 0.0)
    p.observe_time(4, 3, float("nan"))
    assert 4 not in p.buckets
    p.observe_accept(0, [5, 5])  # a no-draft step accepts nothing by construction: not an observation
    assert p.accept is None
    with pytest.raises(ValueError, match="non-negative"):
        TreeSizePolicy([-1, 3])


def test_candidate_steps_from_the_flags(tmp_path):
    sa = SimpleNamespace(speculative_num_steps=3, speculative_adaptive_config=None)
    assert adaptive.candidate_steps(sa) == [0, 3]
    cfg = tmp_path / "fixed.json"
    cfg.write_text(json.dumps({"candidate_steps": [3]}))
    sa.speculative_adaptive_config = str(cfg)
    assert adaptive.candidate_steps(sa) == [3]
    cfg.write_text(json.dumps({"candidate_steps": [0, 5]}))
    with pytest.raises(ValueError, match=r"--speculative-adaptive-config .*candidate_steps \[5\] cannot be served"):
        adaptive.candidate_steps(sa)
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))  # SGLang's per-batch format
    with pytest.raises(ValueError, match="--speculative-adaptive-config"):
        adaptive.candidate_steps(sa)
    cfg.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        adaptive.candidate_steps(sa)
    sa.speculative_adaptive_config = str(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="cannot read it"):
        adaptive.candidate_steps(sa)


class DeviceClock:
    """A fake device for :class:`~lumotree.sglang.worker.StepClock`: events record the device's time, which the
    test sets; an event is passed (``query()``) once the device time is at or past it."""

    def __init__(self):
        self.now = 0.0
        self.passed = float("inf")  # device time up to which recorded events have been reached

    def event(self):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def query(self):
                return self.t <= clock.passed

            def elapsed_time(self, later):
                return (later.t - self.t) * 1e3

        return Event()


def test_step_clock_times_each_step_by_the_next_step_s_start_and_skips_interrupted_ones():
    from lumotree.sglang.worker import StepClock

    dev = DeviceClock()
    clock = StepClock(dev.event)
    for t, (b, s) in zip([0.0, 0.010, 0.040, 0.050], [(8, 0), (8, 3), (8, 3), (8, 0)]):
        dev.now = t
        clock.start(b, s)
    dev.passed = 0.045  # the device has started the third step, not the fourth
    assert clock.samples() == [(8, 0, pytest.approx(0.010)), (8, 3, pytest.approx(0.030))]
    clock.interrupt()  # a prefill after the fourth step: the fourth's interval would hold it
    dev.now, dev.passed = 0.100, float("inf")
    clock.start(8, 3)
    assert clock.samples() == [(8, 3, pytest.approx(0.010))]  # the third's; the fourth gave none
    assert clock.samples() == []
    for t in (0.130, 0.140):
        dev.now = t
        clock.start(8, 3)
    # the first step after the prefill gives none either (its interval holds the prefill's result processing on the
    # host: test_the_step_after_a_prefill_gives_no_sample_under_the_overlap_pipeline); the one after it does
    assert clock.samples() == [(8, 3, pytest.approx(0.010))]


def test_a_steady_step_clock_times_only_steps_followed_by_their_own_candidate():
    """A loop that drafts on the host (LUMOTREE_SUFFIX) launches a drafted step only after the previous step's tokens
    are on the host and drafted from: the device idles through that preparation at the end of whatever step came
    before, so a no-draft step followed by a drafted one would carry the drafted step's preparation (here 6 ms) and a
    drafted step followed by a no-draft one would lack its own. The steady clock keeps the steps within runs."""
    from lumotree.sglang.worker import StepClock

    # device times of the launches: a no-draft step 2 ms; a drafted step 4 ms, launched after 6 ms of host preparation
    # past the end of the step before it; a no-draft step launches as the step before it ends
    plan = [(0, 0.000), (0, 0.002), (1, 0.010), (1, 0.020), (1, 0.030), (0, 0.034), (0, 0.036), (1, 0.044)]
    for steady, want in ((False, [(0, 0.002), (0, 0.008), (1, 0.010), (1, 0.010), (1, 0.004), (0, 0.002),
                                  (0, 0.008)]),
                         (True, [(0, 0.002), (1, 0.010), (1, 0.010), (0, 0.002)])):
        dev = DeviceClock()
        clock = StepClock(dev.event, steady=steady)
        for steps, t in plan:
            dev.now = t
            clock.start(8, steps)
        got = clock.samples()
        assert [(s, pytest.approx(x)) for _, s, x in got] == [(s, pytest.approx(x)) for s, x in want], (steady, got)


class Pipeline:
    """SGLang's overlap scheduler against one in-order device stream: the host launches step k + 1 (events
    recorded at launch reach the device when it is free), then waits for step k's results. Launching takes
    ``host_s``; each step runs ``seconds`` on the device. ``now``: the host's clock."""

    def __init__(self, host_s):
        self.host_s, self.now, self.free = host_s, 0.0, 0.0
        self.done = []  # device end time of each launched step

    def event(self):
        pipe = self

        class Event:
            def record(self):
                self.t = max(pipe.now, pipe.free)  # the device reaches it after the work queued before it

            def query(self):
                return self.t <= pipe.now

            def elapsed_time(self, later):
                return (later.t - self.t) * 1e3

        return Event()

    def launch(self, seconds, record):
        record()  # the worker's event, at the start of the launch
        self.now += self.host_s
        start = max(self.now, self.free)
        self.free = start + seconds
        self.done.append(self.free)

    def wait(self, k):
        self.now = max(self.now, self.done[k])


@pytest.mark.parametrize("host_s", [0.001, 0.020], ids=["device-bound", "host-bound"])
def test_step_clock_under_the_overlap_pipeline_times_each_step_s_own_candidate(host_s):
    """Steps of two candidates (10 ms and 30 ms on the device) alternating in runs, launched one ahead of the
    results as SGLang's overlap scheduler does: where the device is the bottleneck every sample is its own
    step's device time, the first of each run included (host intervals between launches timed the step before
    it); where the host is (20 ms a launch), run boundaries shift a little time between neighbours but each
    candidate's median is its own step's time."""
    from lumotree.sglang.worker import StepClock

    pipe = Pipeline(host_s)
    clock = StepClock(pipe.event)
    plan = [0] * 4 + [3] * 3 + [0] * 2 + [3] * 2 + [0] * 3
    got = []
    for k, steps in enumerate(plan):
        got += clock.samples()
        pipe.launch(0.030 if steps else 0.010, lambda: clock.start(8, steps))
        if k >= 1:
            pipe.wait(k - 1)  # results of the step before, after launching this one
    pipe.wait(len(plan) - 1)
    got += clock.samples()
    assert [s for _, s, _ in got] == plan[:-1]  # the last step has no next start
    for steps in (0, 3):
        own = [x for _, s, x in got if s == steps]
        want = max(0.030 if steps else 0.010, host_s)
        if host_s < 0.010:  # the device is the bottleneck: each step's own device time (the first: + its launch)
            assert own[1 if steps == 0 else 0:] == pytest.approx([want] * len(own[1 if steps == 0 else 0:])), got
        # either way the median the policy takes is the candidate's step: neither reads the other's time
        assert statistics.median(own) == pytest.approx(want), got


def test_the_step_after_a_prefill_gives_no_sample_under_the_overlap_pipeline():
    """SGLang's overlap scheduler launches the first decode step after a prefill, then processes the prefill's results
    (cache insertions, first tokens out: here 6 ms on the host), then launches the next step. Where the host is the
    bottleneck (a step every 3 ms of host work against 2 ms on the device) the first step's interval holds that
    processing: 9 ms against its run's 3 ms (at the MoE shape's batch 1 a bucket's no-draft step read 3.5-5.8 ms
    against its 1.7 ms steps, at pass starts). The clock gives it no sample: every sample is a step's own."""
    from lumotree.sglang.worker import StepClock

    dev = DeviceClock()
    clock = StepClock(dev.event)
    # device times at which each decode step's event is reached: four steps, a prefill from 12 to 32 ms, the first
    # step after it at 32 ms, the next one 6 + 3 ms later, then every 3 ms
    for t in (0.000, 0.003, 0.006, 0.009):
        dev.now = t
        clock.start(1, 0)
    clock.interrupt()
    for t in (0.032, 0.041, 0.044, 0.047, 0.050):
        dev.now = t
        clock.start(1, 0)
    got = clock.samples()
    assert [x for _, _, x in got] == pytest.approx([0.003] * 6), got  # 3 before the prefill, 3 after the first


def bookkeeping_worker(candidates, dev):
    """A LUMOTREE worker object without a GPU, configured for 3 draft steps: only the adaptive bookkeeping runs;
    ``switched`` lists the runtime states applied (each state is its draft steps)."""
    from lumotree.sglang.worker import StepLedger, worker_class

    w = object.__new__(worker_class())
    switched = []

    def apply_runtime_state(state):
        switched.append(state)
        w.speculative_num_steps = state

    w.apply_runtime_state = apply_runtime_state
    w.speculative_num_steps = 3
    w.tree_policy = TreeSizePolicy(candidates)
    w._tree_states = {c: c for c in candidates}
    w._ledger = StepLedger(w.tree_policy, first=3, event=dev.event)
    w._step_chosen = False
    return w, switched


def test_worker_attributes_step_times_and_switches_states(monkeypatch):
    pytest.importorskip("sglang")
    dev = DeviceClock()
    w, switched = bookkeeping_worker([0, 3], dev)
    monkeypatch.setattr(adaptive, "RUN", 1)  # one step per exploration run: a switch on every step

    def launch(t, batch):
        dev.now = t
        w.activate_step_by_batch(batch)

    launch(1.0, 8)   # explores the tree first
    launch(1.5, 8)   # the first step's time needs the second's start: not read yet, still the tree
    assert switched == [] and w.tree_policy.buckets[8].samples == {0: 0, 3: 0}
    launch(1.6, 8)   # the first step's 0.5 s read; no draft explored now
    assert switched == [0] and w.tree_policy.buckets[8].samples == {0: 0, 3: 1}
    launch(1.7, 0)   # idle: the second step's 0.1 s (a tree step: its own time, no lag on the device's clock);
    assert w.tree_policy.buckets[8].samples == {0: 0, 3: 2}  # the no-draft step before the gap gives none
    launch(3.0, 8)
    launch(3.2, 8)
    assert w.tree_policy.buckets[8].samples == {0: 0, 3: 2} and switched == [0]
    launch(3.25, 8)  # 3.0's 0.2 s, no draft's own
    assert w.tree_policy.buckets[8].samples == {0: 1, 3: 2}
    assert list(w.tree_policy.buckets[8].times[0]) == [pytest.approx(0.2)]
    assert list(w.tree_policy.buckets[8].times[3]) == [pytest.approx(0.5), pytest.approx(0.1)]
    w.tree_policy.choose = lambda batch: 3
    launch(3.3, 8)   # the tree after no-draft steps: drafted from zeros
    assert switched == [0, 3]
    # acceptance arrives in launch order: two tree steps, four no-draft steps, then the cold tree step
    w.on_verify_complete_cpu([2, 2])
    w.on_verify_complete_cpu([1, 1])
    assert w.tree_policy.accept == pytest.approx(0.8 * 2 + 0.2 * 1)
    for _ in range(4):
        w.on_verify_complete_cpu([0, 0])
    # the first tree after a no-draft step drafted from zeros (draft-extend skipped): not an acceptance
    w.on_verify_complete_cpu([0, 0])
    assert w.tree_policy.accept == pytest.approx(1.8)


def test_no_draft_steps_skip_the_draft_extend_and_its_graphs():
    pytest.importorskip("sglang")
    from lumotree.sglang import worker as wmod

    cls = wmod.worker_class()
    w = object.__new__(cls)
    calls = []
    w._draft_worker = SimpleNamespace(_draft_extend_for_decode=lambda b, o: calls.append(("extend", b)))
    w._stub_skipped_draft_extend = lambda b, o: calls.append(("stub", b))
    w._skip_draft_extend_without_draft()
    w.speculative_num_steps = 0
    w._draft_worker._draft_extend_for_decode("b0", None)
    w.speculative_num_steps = 3
    w._draft_worker._draft_extend_for_decode("b1", None)
    w.speculative_num_steps, w._warm = 0, True  # a warm no-draft step (TreeSizePolicy.warm): its draft-extend runs
    w._draft_worker._draft_extend_for_decode("b2", None)
    w._warm = False
    w._draft_worker._draft_extend_for_decode("b3", None)
    assert calls == [("stub", "b0"), ("extend", "b1"), ("extend", "b2"), ("stub", "b3")]

    captured = []

    class Draft:
        def _capture_cuda_graphs(self):
            captured.append(1)

    dw = Draft()
    with wmod._no_draft_graphs(dw):
        dw._capture_cuda_graphs()
    dw._capture_cuda_graphs()
    assert captured == [1]  # only the call outside the no-draft build captured


def test_a_slow_outlier_does_not_decide_a_bucket():
    """Single steps far slower than the rest (a first compile at a new shape) must not make the
    bucket serve its slower candidate: the no-draft step is 2x faster here, one sample of it 100x slower."""
    p = TreeSizePolicy([0, 3])
    p.observe_accept(3, [0] * 32)
    for i in range(adaptive.MIN_SAMPLES):
        p.observe_time(32, 0, 1.2 if i == 0 else 0.012)
        p.observe_time(32, 3, 0.024)
    assert p.choose(32) == 0


def simulate_overlap(policy, batch, t_none, t_tree, accept, steps, seed=0, rows_of=None, t_warm=None):
    """As :func:`simulate`, timed as the worker times a step under SGLang's overlap scheduler: each step's own
    time (the device's clock), read when the next step has started -- at the launch after next -- and results
    (acceptance) one step late. ``accept``: each request's accepted drafts, or a function drawing them from a
    ``random.Random``; ``t_tree``: the drafted step's time, or ``{steps: time}`` per drafting candidate. ``rows_of``:
    instead, the ``k``-th counted drafted step's rows are ``rows_of(k)`` and step times carry no noise. ``t_warm``: a
    warm no-draft step's time (default ``t_none``). Returns the candidates served, in order."""
    rng, served, pending, timed, k, warm = random.Random(seed), [], None, [], 0, False
    for _ in range(steps):
        s = policy.choose(batch)
        if len(timed) >= 2:
            policy.observe_time(batch, *timed.pop(0))
        if pending is not None:
            policy.observe_accept(*pending)
        # after a warm no-draft step (TreeSizePolicy.warm: the MTP draft-extend ran) a drafted step is not cold
        cold = s and served and served[-1] == 0 and not warm
        warm = policy.warm
        if rows_of is not None:
            rows = rows_of(k) if s and not cold else None
            k += rows is not None
        else:  # a chain of s steps accepts at most s drafts (the oracle's leading successes, cut at its depth)
            rows = [min(s, accept(rng)) for _ in range(batch)] if callable(accept) else [min(s, accept)] * batch
        pending = None if cold or not s else (s, rows)
        t = t_tree.get(s) if isinstance(t_tree, dict) else t_tree  # ``t_tree``: per drafting candidate, or one
        base = t if s else t_warm if warm and t_warm is not None else t_none
        timed.append((WARM if warm else s, base * (1 if rows_of is not None else 1 + 0.02 * rng.random())))
        served.append(s)
    return served


def test_a_probe_shows_risen_acceptance_at_once():
    """Batch 32, no-draft step 9.4 ms, tree step 15.9 ms (27B shapes, H200): the tree pays from 0.7 accepted
    drafts. The server first sees no acceptance (a prompt's first pass), then 1.4 per step: the first probe
    after the change must switch to the tree -- an average still weighted by the zeros before the no-draft
    stretch needed a second probe, up to PROBE_MAX steps later, and served no draft meanwhile."""
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 32, 0.0094, 0.0159, 0.0, steps=700)
    assert p.buckets[32].chosen == 0 and p.buckets[32].probe_every > adaptive.PROBE_EVERY
    served = simulate_overlap(p, 32, 0.0094, 0.0159, 1.4, steps=p.buckets[32].probe_every + 3 * adaptive.RUN, seed=1)
    assert p.buckets[32].chosen == 3, p.table()
    first_tree = served.index(3)
    assert served[first_tree:].count(0) <= adaptive.RUN, served[first_tree:]  # one probe of no draft at most


@pytest.mark.parametrize("batch, t_none, t_tree", [(32, 0.0094, 0.0159), (1, 0.0102, 0.0140)])
def test_a_warm_probe_is_a_cold_probe_without_its_cold_drafted_step(batch, t_none, t_tree):
    """Where drafts miss, a policy with warm probes probes the tree at the same steps as one without, each probe's
    cold drafted step served as a warm no-draft step instead (``warm`` set on that step alone); and where the
    acceptance rises, the first probe after it switches to the tree as before."""
    served, warmed = {}, {}
    for warm in (False, True):
        p = TreeSizePolicy([0, 3], warm_probes=warm)
        flags, choose = [], p.choose
        p.choose = lambda b: (choose(b), flags.append(p.warm))[0]
        served[warm], warmed[warm] = simulate_overlap(p, batch, t_none, t_tree, 0.0, steps=3000), flags
    cold = [i for i, s in enumerate(served[False]) if s and i > adaptive.RUN and not served[False][i - 1]]
    assert len(cold) >= 4  # probes after the exploration (the server's first steps)
    assert [i for i, w in enumerate(warmed[True]) if w] == cold
    assert all(served[True][i] == 0 for i in cold)
    assert [i for i, s in enumerate(served[True]) if s] == [i for i, s in enumerate(served[False]) if s and i not in cold]
    assert not any(warmed[False])
    p = TreeSizePolicy([0, 3], warm_probes=True)
    simulate_overlap(p, batch, t_none, t_tree, 0.0, steps=700)
    assert p.buckets[batch].chosen == 0
    simulate_overlap(p, batch, t_none, t_tree, 1.4, steps=p.buckets[batch].probe_every + 3 * adaptive.RUN, seed=1)
    assert p.buckets[batch].chosen == 3, p.table()


@pytest.mark.parametrize("batch, t_none, t_tree, t_warm, warm_after_first", [
    (1, 0.00172, 0.00407, 0.01084, False),  # MoE shape, 12 layers, batch 1: the warm step 2.7x the drafted step
    (1, 0.00979, 0.01343, 0.01095, True),  # 27B shape, batch 1: the warm step cheaper (one H100, the servers' logs)
])
def test_a_probe_starts_warm_only_where_the_warm_step_is_measured_no_slower_than_a_drafted_one(
        batch, t_none, t_tree, t_warm, warm_after_first):
    """Where drafts miss, the first ``MIN_SAMPLES`` probes after the exploration start warm (the bucket times its warm
    step); the later ones start warm only where that warm step took no longer than a drafted step, else with a cold
    drafted step -- the same probes at about the same steps either way. And one warm step's one-off cost (a graph capture)
    does not turn a bucket whose warm step is the cheaper cold."""
    p = TreeSizePolicy([0, 3], warm_probes=True)
    flags, choose = [], p.choose
    p.choose = lambda b: (choose(b), flags.append(p.warm))[0]
    served = simulate_overlap(p, batch, t_none, t_tree, 0.0, steps=6000, t_warm=t_warm)
    warmed = [i for i, w in enumerate(flags) if w]
    # a probe opens at a warm step or at a drafted step after a no-draft one, past the exploration
    opens = [i for i in range(adaptive.RUN + 1, len(served)) if flags[i] or (served[i] and not served[i - 1] and not flags[i - 1])]
    n = adaptive.MIN_SAMPLES
    assert len(opens) > n + 1 and warmed[:n] == opens[:n], (opens, warmed)
    assert warmed == (opens if warm_after_first else opens[:n])
    assert len(p.buckets[batch].warm_times) == min(adaptive.WINDOW, len(opens) if warm_after_first else n)
    assert p.buckets[batch].chosen == 0
    # a warm step as cheap as a decode step: the same probes, at the same steps up to the floor's rounding (a cold
    # drafted step is a sample of the tree's time, a warm step is none)
    ref = _probe_opens(batch, t_none, t_tree, None)
    assert len(ref) == len(opens) and max(abs(a - b) for a, b in zip(ref, opens)) <= 2, (ref, opens)
    if warm_after_first:  # the second warm step's time holds a one-off capture (30 ms): the bucket stays warm
        q = TreeSizePolicy([0, 3], warm_probes=True)
        simulate_overlap(q, batch, t_none, t_tree, 0.0, steps=opens[0] + 3, t_warm=t_warm)
        assert len(q.buckets[batch].warm_times) == 1
        q.observe_time(batch, adaptive.WARM, 0.030)  # as if the next warm step's sample read so
        assert q.warm_pays(batch, 3)
        simulate_overlap(q, batch, t_none, t_tree, 0.0, steps=2000, t_warm=t_warm)
        assert q.warm_pays(batch, 3) and statistics.median(q.buckets[batch].warm_times) < t_tree


def _probe_opens(batch, t_none, t_tree, t_warm, steps=6000):
    p = TreeSizePolicy([0, 3], warm_probes=True)
    flags, choose = [], p.choose
    p.choose = lambda b: (choose(b), flags.append(p.warm))[0]
    served = simulate_overlap(p, batch, t_none, t_tree, 0.0, steps=steps, t_warm=t_warm)
    return [i for i in range(adaptive.RUN + 1, len(served)) if flags[i] or (served[i] and not served[i - 1] and not flags[i - 1])]


@pytest.mark.parametrize("warm", [False, True])
def test_the_first_probe_of_a_tree_whose_times_a_bucket_borrowed_times_it_and_starts_warm(warm):
    """Bucket 8 met after bucket 1 has measured both candidates borrows their times and serves no draft (drafts
    miss); its first probe of the tree times it there -- ``RUN`` steps -- and with warm probes the first of them is a
    warm no-draft step (the tree's cold drafted step before), so that every drafted step of it is counted."""
    p = TreeSizePolicy([0, 3], warm_probes=warm)
    simulate_overlap(p, 1, 0.0102, 0.0140, 0.0, steps=300)
    assert p._borrows and 8 not in p.buckets
    flags, choose = [], p.choose
    p.choose = lambda b: (choose(b), flags.append(p.warm))[0]
    served = simulate_overlap(p, 8, 0.0110, 0.0250, 0.0, steps=p.settings.probe_every + 3 * adaptive.RUN)
    first = served.index(3)
    assert 0 < first and served[first - 1] == 0
    run = served[first:].index(0)
    assert [i for i, w in enumerate(flags) if w] == ([first - 1] if warm else [])
    assert run == (adaptive.RUN - 1 if warm else adaptive.RUN)
    assert p.buckets[8].samples[3] >= adaptive.MIN_SAMPLES and p.buckets[8].chosen == 0


def test_overlap_timing_learns_each_candidate_s_own_step_time():
    """Timed by the device's clock, read two launches late, the estimates are each candidate's own."""
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 8, 0.010, 0.030, 0.0, steps=60)
    st = p.table()["buckets"][8]["step_ms"]
    assert st[0] == pytest.approx(10.0, rel=0.03) and st[3] == pytest.approx(30.0, rel=0.03), st


def bare_worker(cls, policy, overlap_consistent, clock=None):
    """A LUMOTREE worker without SGLang underneath (no GPU): only its adaptive bookkeeping, the policy
    choosing the 3-step tree on every step."""
    from lumotree.sglang.worker import StepLedger

    w = object.__new__(cls)
    w.speculative_num_steps = 3
    w.apply_runtime_state = lambda state: None
    w.tree_policy = policy
    w.tree_policy.choose = lambda batch: 3
    w._tree_states, w._step_chosen = {0: 0, 3: 3}, False
    w._ledger = StepLedger(policy, overlap_consistent, first=3, event=clock.event if clock is not None else None)
    w._overlap_consistent, w._decode_step = overlap_consistent, None
    return w


def test_acceptance_leaves_out_rows_a_step_holds_after_they_finished(monkeypatch):
    """Under the overlap scheduler a decode step still holds the requests the step before finished; their
    drafts' acceptance is not the workload's and must not enter the average (a batch ending together
    once dragged it from 1.5 to 0.8 accepted drafts, and the policy dropped a tree that paid)."""
    pytest.importorskip("sglang")
    import torch

    from lumotree.sglang.finish import FinishedRows
    from lumotree.sglang.worker import worker_class

    w = bare_worker(worker_class(), TreeSizePolicy([3, 0]), overlap_consistent=True)
    pool = SimpleNamespace(req_to_token=torch.zeros(8, 4, dtype=torch.int32))
    fin = FinishedRows.of(pool)
    fin.done[torch.tensor([2, 5])] = True  # finished by the step before
    batch = SimpleNamespace(req_to_token_pool=pool, req_pool_indices=torch.tensor([1, 2, 5, 6]),
                            seq_lens=torch.tensor([9, 9, 9, 9]))
    w.activate_step_by_batch(4)
    w._ledger.note_live_rows(pool, batch.req_pool_indices)
    w.on_verify_complete_cpu([2, 0, 0, 2])
    assert w.tree_policy.accept == 2.0
    # without the consistent overlap cache every row is the workload's
    w._ledger.consistent = False
    w.activate_step_by_batch(4)
    w._ledger.note_live_rows(pool, batch.req_pool_indices)
    w.on_verify_complete_cpu([0, 0, 0, 0])
    assert w.tree_policy.accept == pytest.approx(2.0 * (1 - adaptive.EMA))
    # a no-draft step has no acceptance sample: its rows are not copied to the host
    w._ledger.consistent = True
    w.tree_policy.choose = lambda batch: 0
    w.activate_step_by_batch(4)
    w._ledger.note_live_rows(pool, batch.req_pool_indices)
    assert w._ledger.pending[-1] == [0, False, None, (), None, None]


def test_a_drafted_step_s_live_rows_come_from_its_own_mark_into_a_ring_of_host_buffers(monkeypatch):
    """The rows of a drafted step still running after it come from the step's finish mark (one launch writes the
    marks and the rows, ``FinishedRows.step_live``), not from a gather of ``done`` after it; the host buffers they
    are copied into are a ring longer than the ledger's pending steps, so a step's rows stay its own until read."""
    pytest.importorskip("sglang")
    import torch

    from lumotree.sglang import finish
    from lumotree.sglang.finish import FinishedRows
    from lumotree.sglang.worker import worker_class

    w = bare_worker(worker_class(), TreeSizePolicy([3, 0]), overlap_consistent=True)
    pool = SimpleNamespace(req_to_token=torch.zeros(8, 4, dtype=torch.int32))
    fin = FinishedRows.of(pool)
    fin.admit([], torch.tensor([], dtype=torch.long))
    fin.max_len[:] = 100
    fin.ruled[:] = True
    fin.stop[:, 0] = 7  # token 7 ends every request
    rows = torch.tensor([1, 2, 5, 6])
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                             req_to_token_pool=pool, req_pool_indices=rows, seq_lens=torch.tensor([9] * 4))
    stride, expected = 2, []
    for step in range(12):  # more drafted steps than the ledger keeps pending, none of them read yet
        w.activate_step_by_batch(4)
        ends = step % 4  # this step ends row `ends` (token 7 accepted)
        tokens = torch.zeros(4 * stride, dtype=torch.int64)
        tokens[ends * stride] = 7
        out = SimpleNamespace(next_token_ids=tokens, accept_lens=torch.ones(4, dtype=torch.int32),
                              new_seq_lens=torch.tensor([10] * 4), speculative_num_draft_tokens=stride)
        fin.done[rows] = False  # each step's rows start unfinished (as after the slots' next admissions)
        finish.forward_marked(True, decode, lambda: out)
        assert fin.step_live.tolist() == [i != ends for i in range(4)]
        fin.done[rows] = False  # the ledger must read the mark's rows, not `done` now
        w._ledger.note_live_rows(pool, rows)
        expected.append([i != ends for i in range(4)])
    kept = list(w._ledger.pending)
    assert len(kept) == w._ledger.pending.maxlen
    assert [e[2].tolist() for e in kept] == expected[-len(kept):]
    # a step whose forward was not marked (no accept lengths) reads `done` after it, as before
    w.activate_step_by_batch(4)
    fin.done[torch.tensor([5])] = True
    finish.forward_marked(True, decode, lambda: SimpleNamespace(next_token_ids=None))
    assert fin.step_live is None
    w._ledger.note_live_rows(pool, rows)
    assert w._ledger.pending[-1][2].tolist() == [True, True, False, True]


def oracle_draws(p, levels):
    """Accepted drafts of one request as the draft oracle draws them: the leading successes of ``levels``
    Bernoulli(``p``) draws (p 0.8, 3 levels: 0 a fifth of the time)."""
    def draw(rng):
        k = 0
        while k < levels and rng.random() < p:
            k += 1
        return k
    return draw


@pytest.mark.parametrize("seed", range(40))
def test_at_batch_1_a_probe_s_decision_rests_on_several_accept_samples(seed):
    """Batch 1, decode step 7.5 ms, 3-step chain 10 ms (27B shapes cut to 32 layers, H200): a pass whose drafts
    miss (the tree is dropped), then drafts accepted as the oracle draws them at p 0.8 (1.95 per step on
    average, none a fifth of the time). Seen on the H200: a probe whose decision rested on one counted step
    (its first is cold, its last arrives after the decision) averaged with the old estimate went back to no
    draft more than a third of the time and the next probe came ~200 steps later -- a measured pass served
    no draft. The probe now runs until PROBE_ROWS accepted-draft samples are in before it decides."""
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 1, 0.0075, 0.010, 0.0, steps=128, seed=seed)
    assert p.buckets[1].chosen == 0
    served = simulate_overlap(p, 1, 0.0075, 0.010, oracle_draws(0.8, 3), steps=3 * 128, seed=seed)
    assert p.buckets[1].chosen == 3, p.table()
    assert served[-128:].count(3) >= 120, served[-128:]  # the last 128-token pass drafts


def test_worker_drops_the_step_time_of_the_decode_step_before_a_prefill(monkeypatch):
    """A decode step's time runs to the next decode step's start on the device: for the step before a prefill
    that holds the prefill, and is dropped; so is the first step after it (its interval holds the host's processing of
    the prefill's results, under the overlap scheduler); the second counts."""
    pytest.importorskip("sglang")
    import torch

    from lumotree.sglang.worker import worker_class

    dev = DeviceClock()
    w = bare_worker(worker_class(), TreeSizePolicy([0, 3]), overlap_consistent=False, clock=dev)
    monkeypatch.setattr(type(w).__mro__[1], "forward_batch_generation", lambda self, batch, *a, **k: "sglang")
    mode = SimpleNamespace(is_extend=lambda: True, is_idle=lambda: False)
    prefill = SimpleNamespace(forward_mode=mode, is_extend_in_batch=True)
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                             is_extend_in_batch=False, seq_lens=torch.full((4,), 9))

    def step(t, batch):
        dev.now = t
        out = w._forward(batch)
        w._step_chosen = False
        return out

    step(1.0, decode)
    assert step(1.01, prefill) == "sglang"  # the prefill runs 1.01 .. 1.5 on the device
    for t in (1.5, 1.51, 1.52, 1.53, 1.54):
        step(t, decode)
    # read at the launch after next: 1.51's and 1.52's, 0.01 s each; 1.0's (0.5 s, the prefill) and 1.5's dropped
    assert w.tree_policy.buckets[4].samples[3] == 2
    assert w.tree_policy.step_time(4, 3) == pytest.approx(0.01)


def test_a_small_bucket_is_never_estimated_slower_than_a_larger_one():
    """A bucket met while a pass's batch ramps up has few samples, and those a stray prefill inflates: its
    estimate is capped by the next larger measured bucket's, so it does not serve no draft on a tree step
    "slower" than the larger batch's (seen: 55 ms at bucket 4 against 13 ms at bucket 8)."""
    p = TreeSizePolicy([0, 3])
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(8, 3, 0.013)
        p.observe_time(8, 0, 0.0083)
        p.observe_time(4, 3, 0.055)
        p.observe_time(4, 0, 0.0080)
    p.accept = 1.9
    assert p.step_time(4, 3) == pytest.approx(0.013) and p.step_time(4, 0) == pytest.approx(0.0080)
    assert p.step_time(8, 3) == pytest.approx(0.013)
    p.buckets[4].chosen = 0
    assert p.choose(4) == 3


def test_a_bucket_s_candidates_are_capped_by_the_same_larger_bucket():
    """The cap comes from a larger bucket that has measured every candidate. Seen on one H100 (Qwen3-Next MoE shape,
    batch 1): bucket 2 held only the warm-up's no-draft samples (2.15 ms) when bucket 1's steps ran 1.5x slow (no
    draft 3.15 ms, the chain 6.49 ms); capping no draft alone read it at 466 tokens/s against the chain's 455 at an
    acceptance of 1.95, and the bucket served no draft through a pass whose drafts were accepted. On the bucket's
    own times the chain pays (455 against 317)."""
    p = TreeSizePolicy([0, 3])
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(2, 0, 0.00215)
        p.observe_time(1, 0, 0.00315)
        p.observe_time(1, 3, 0.00649)
    p.accept = 1.95
    assert p.step_time(1, 0) == pytest.approx(0.00315) and p.step_time(1, 3) == pytest.approx(0.00649)
    p.buckets[1].chosen = 0
    assert p.choose(1) == 3
    # once bucket 2 has measured the chain too, it caps both of bucket 1's candidates (the estimates cached before
    # are dropped)
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(2, 3, 0.0045)
    assert p.step_time(1, 0) == pytest.approx(0.00215) and p.step_time(1, 3) == pytest.approx(0.0045)


def test_every_probe_s_outcome_is_logged_once(caplog):
    """Changes are logged, and so is the decision right after each probe run, kept or not (with the rates and
    the acceptance it rests on): what a served bucket measured when it did not switch."""
    import logging

    p = TreeSizePolicy([0, 3])
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.adaptive"):
        starts = probe_starts(p, 32, 0.0094, 0.0159, 0.0, steps=3000)
    lines = [r.getMessage() for r in caplog.records if "LumoTree adaptive: batch bucket 32" in r.getMessage()]
    probes = [ln for ln in lines if ln.endswith(" after a probe")]
    assert len(starts) >= 3 and len(probes) == len(starts)  # one line per probe run, none twice
    assert all("-> no draft (0: " in ln and "; accept 0.00)" in ln for ln in probes)  # kept: the tree never paid
    assert len(lines) - len(probes) == 1  # and the one change: exploration -> no draft


def test_sim_probe_cost_reports_each_batch_s_measured_miss_pass():
    """benchmark/serving/sim_probe_cost.py: the measured miss pass's loss to no draft per batch, from the policy."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "serving", "sim_probe_cost.py")
    spec = importlib.util.spec_from_file_location("sim_probe_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for shape in mod.STEP_MS:
        rows = mod.main(["--seeds", "2", "--shape", shape])
        assert [r["batch"] for r in rows] == sorted(mod.STEP_MS[shape])
        assert all(0 <= r["mean_loss_pct"] <= r["max_loss_pct"] < 10 for r in rows), rows
    # bench_spec's passes (--sequence repeats): three measured miss passes, whose loss is their drafted steps' extra time
    shape = "qwen3-next-80b-moe-12l, H100 policy estimates"
    rows = mod.main(["--seeds", "2", "--shape", shape, "--sequence", "repeats"])
    assert [r["batch"] for r in rows] == sorted(mod.STEP_MS[shape])
    for r in rows:
        t_none, t_tree = mod.STEP_MS[shape][r["batch"]]
        assert 0 <= r["mean_loss_pct"] <= r["max_loss_pct"] < 10, r
        assert r["mean_loss_pct"] == pytest.approx(100 * r["drafted_steps"] * (t_tree / t_none - 1) / (3 * mod.PASS),
                                                   abs=0.006), r
    assert any(r["drafted_steps"] > 0 for r in rows)  # probes fall in the measured passes at some batch


def test_sim_pass_ends_runs_no_probe_again_with_the_ending_step():
    """benchmark/serving/sim_pass_ends.py: through the benchmark's passes -- the overlap scheduler's extra step after
    each, the one-token passes -- probes that start on an extra step held no running request and were run again; the
    ending step (no decision there) leaves none to repeat in the measured passes, at the same loss or less."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "serving", "sim_pass_ends.py")
    spec = importlib.util.spec_from_file_location("sim_pass_ends", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--seeds", "2"])
    assert [r["batch"] for r in rows] == sorted(mod.STEP_MS["qwen3.5-27b-32l"])
    assert sum(r["without"]["empty_probe_repeats_all_passes"] for r in rows) > 0
    for r in rows:
        assert r["ending_step"]["empty_probe_repeats"] == 0, r
        assert 0 <= r["ending_step"]["mean_loss_pct"] <= r["without"]["mean_loss_pct"] + 0.1, r
    # a pass's decode steps: 127 after its prefill's token, and the overlap scheduler's extra one
    server = mod.Server(TreeSizePolicy([0]), 0.01, {}, True, 0)
    assert len(mod.serve_pass(server, 4, mod.PASS, lambda rng: 0)) == mod.PASS
    assert len(mod.serve_pass(server, 4, 1, lambda rng: 0)) == 1


def test_the_one_node_verify_captures_few_graphs_where_decode_steps_serve_no_draft():
    """The no-draft state's one-node verify serves only batches a decode step cannot (logprobs, grammars, ...)
    where no-draft steps run as decode steps: its graphs at the powers of two and the largest size (the rest pad
    up to them); every size without the decode step; none with graphs off."""
    pytest.importorskip("sglang")
    from lumotree.sglang.worker import one_node_verify_graph_bs

    full = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48, 52, 56, 60, 64, 72, 80,
            88, 96, 104, 112, 120, 128]
    assert one_node_verify_graph_bs(full, True) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert one_node_verify_graph_bs([1, 2, 3, 4, 8, 12, 24], True) == [1, 2, 4, 8, 24]  # the largest size kept
    assert one_node_verify_graph_bs(full, False) == full
    assert one_node_verify_graph_bs(None, True) is None and one_node_verify_graph_bs([], True) == []
    for bs in range(1, 129):  # every batch still has a captured size to pad up to
        assert any(b >= bs for b in one_node_verify_graph_bs(full, True))


def test_decode_step_graphs_are_the_ones_no_speculation_captures():
    """The decode graphs that serve no-draft steps: where the server has SGLang's default speculative list, the
    list a server without speculation captures (SGLang's own generator: 20 sizes to 128, not 35); a list the user
    chose (any other) stays, and so does no list."""
    pytest.importorskip("sglang")
    from sglang.srt.server_args import ServerArgs

    from lumotree.sglang.worker import decode_step_graph_bs

    class Args:
        _generate_decode_cuda_graph_batch_sizes = ServerArgs._generate_decode_cuda_graph_batch_sizes

        def __init__(self, algorithm, padding=False):
            self.speculative_algorithm, self.disable_cuda_graph_padding = algorithm, padding

    spec_list = Args("LUMOTREE")._generate_decode_cuda_graph_batch_sizes(128)
    none_list = Args(None)._generate_decode_cuda_graph_batch_sizes(128)
    assert len(spec_list) == 35 and len(none_list) == 20
    assert decode_step_graph_bs(Args("LUMOTREE"), spec_list) == none_list
    assert none_list[:6] == [1, 2, 4, 8, 12, 16] and none_list[-1] == 128
    user = [1, 3, 5, 7, 128]
    assert decode_step_graph_bs(Args("LUMOTREE"), user) == user
    padless = Args("LUMOTREE", padding=True)  # --disable-cuda-graph-padding: every size either way
    assert decode_step_graph_bs(padless, list(range(1, 33))) == list(range(1, 33))
    assert decode_step_graph_bs(Args("LUMOTREE"), None) is None


def test_capture_sizes_reach_sglangs_graph_runner(monkeypatch):
    """The sizes LumoTree's no-draft graphs are captured at reach the function SGLang's graph runners take their
    sizes from (``get_batch_sizes_to_capture``, which reads ``server_args.cuda_graph_config``), and the server's
    own list is back afterwards -- also when the build raises. SGLang's ``_override_worker_state(cuda_graph_bs=...)``
    alone did not reach it: the runners captured the speculative list's 35 sizes."""
    pytest.importorskip("sglang")
    import types

    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
    from sglang.srt.model_executor.runner import base_cuda_graph_runner as base

    from lumotree.sglang.decode_step import capture_sizes

    monkeypatch.setattr(base, "get_cuda_graph_batch_size_alignment", lambda server_args: 1)
    monkeypatch.setattr(base, "get_cuda_graph_max_batch_size", lambda server_args, n: n)
    monkeypatch.setattr(base, "get_flags", lambda: types.SimpleNamespace(
        capture=types.SimpleNamespace(enable_torch_compile=False)))
    config = CudaGraphConfig()
    spec_list = list(range(1, 9)) + list(range(10, 33, 2))
    config.decode.bs = list(spec_list)
    args = types.SimpleNamespace(cuda_graph_config=config, enable_two_batch_overlap=False, torch_compile_max_bs=32)
    runner = types.SimpleNamespace(server_args=args, req_to_token_pool=types.SimpleNamespace(size=33))

    assert base.get_batch_sizes_to_capture(runner)[0] == spec_list
    with capture_sizes(args, [32, 1, 2, 4, 8, 16]):
        assert base.get_batch_sizes_to_capture(runner)[0] == [1, 2, 4, 8, 16, 32]
    assert base.get_batch_sizes_to_capture(runner)[0] == spec_list
    with pytest.raises(RuntimeError):
        with capture_sizes(args, [1, 32]):
            raise RuntimeError("capture failed")
    assert config.decode.bs == spec_list
    with capture_sizes(args, None):  # graphs off or nothing chosen: as configured
        assert base.get_batch_sizes_to_capture(runner)[0] == spec_list


def test_graph_sizes_start_from_the_list_sglangs_runners_read():
    """Without ``--cuda-graph-bs`` SGLang's resolved config bag holds no list (``None``); the sizes LumoTree
    chooses for its no-draft graphs then start from ``server_args.cuda_graph_config.decode.bs``, the list SGLang's
    graph runners read (a served log had the no-draft decode graphs at SGLang's speculative sizes 1-8 where no
    speculation captured 1, 2, 4, 8: the choice had started from ``None`` and kept the default)."""
    pytest.importorskip("sglang")
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
    from sglang.srt.server_args import ServerArgs

    from lumotree.sglang.worker import configured_graph_bs, decode_step_graph_bs, one_node_verify_graph_bs

    class Args:
        _generate_decode_cuda_graph_batch_sizes = ServerArgs._generate_decode_cuda_graph_batch_sizes
        speculative_algorithm, disable_cuda_graph_padding = "LUMOTREE", False
        cuda_graph_config = CudaGraphConfig()

    args, config = Args(), Args.cuda_graph_config
    config.decode.bs = args._generate_decode_cuda_graph_batch_sizes(8)
    assert config.decode.bs == list(range(1, 9))
    listed = configured_graph_bs(args, None)
    assert listed == list(range(1, 9))
    assert decode_step_graph_bs(args, listed) == [1, 2, 4, 8]
    assert one_node_verify_graph_bs(listed, True) == [1, 2, 4, 8]
    assert configured_graph_bs(args, [1, 3, 8]) == [1, 3, 8]  # --cuda-graph-bs: the user's list
    config.decode.bs = []
    assert configured_graph_bs(args, None) is None


GRAPH_SIZES = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
base = ["--model-path", sys.argv[1], "--device", "cuda"]
out = {}
for name, extra in (("none", []), ("lumotree", ["--speculative-algorithm", "LUMOTREE"]),
                    ("lumotree_32", ["--speculative-algorithm", "LUMOTREE", "--max-running-requests", "32"]),
                    ("lumotree_user", ["--speculative-algorithm", "LUMOTREE", "--cuda-graph-bs", "1", "3", "5"]),
                    ("lumotree_padless", ["--speculative-algorithm", "LUMOTREE", "--disable-cuda-graph-padding",
                                          "--cuda-graph-max-bs", "12"]),
                    ("nextn", ["--speculative-algorithm", "NEXTN"])):
    sa = prepare_server_args(base + extra)
    out[name] = sa.cuda_graph_config.decode.bs
print("RESULT " + json.dumps(out))
"""


def test_a_lumotree_server_captures_its_verify_graphs_at_no_speculations_sizes():
    """Through SGLang's own argument parsing: a LUMOTREE server's graph list (which its target-verify, draft and
    no-draft graph runners read) is no speculation's, not SGLang's speculative one, which SGLang's NEXTN keeps;
    ``--cuda-graph-bs`` and ``--disable-cuda-graph-padding`` keep theirs."""
    import os
    import subprocess
    import sys

    pytest.importorskip("sglang")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ckpt = os.path.join(root, "benchmark", "models", "tiny-hybrid")
    env = {k: v for k, v in os.environ.items() if k != "LUMOTREE_SGLANG_ACTIVE"}
    run = subprocess.run([sys.executable, "-c", GRAPH_SIZES, ckpt], capture_output=True, text=True, timeout=600,
                         cwd=root, env=env)
    lines = [ln[len("RESULT "):] for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, run.stdout[-2000:] + run.stderr[-4000:]
    out = json.loads(lines[0])
    assert len(out["nextn"]) > len(out["none"]) and out["nextn"][:8] == list(range(1, 9))  # SGLang's speculative list
    assert out["lumotree"] == out["none"] and out["lumotree"][:4] == [1, 2, 4, 8]
    assert out["lumotree_32"] == out["none"]
    assert out["lumotree_user"] == [1, 3, 5]
    assert out["lumotree_padless"] == list(range(1, 13))


def test_policy_settings_per_algorithm_and_from_the_config(tmp_path):
    """LUMOTREE keeps the module's averaging and probing; LUMOTREE_SUFFIX's follows its swinging acceptance more slowly
    and probes more often (adaptive.SUFFIX_SETTINGS); --speculative-adaptive-config may set either, within range,
    and a key LumoTree does not read fails naming the flag."""
    mtp = SimpleNamespace(speculative_algorithm="LUMOTREE", speculative_num_steps=3, speculative_adaptive_config=None)
    suf = SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_num_steps=0,
                          speculative_adaptive_config=None)
    assert adaptive.policy_settings(mtp) == adaptive.PolicySettings.current()
    assert adaptive.policy_settings(mtp).ema == adaptive.EMA and adaptive.policy_settings(mtp).probe_every == 128
    assert adaptive.policy_settings(suf) == adaptive.SUFFIX_SETTINGS
    assert adaptive.SUFFIX_SETTINGS.ema < adaptive.EMA and adaptive.SUFFIX_SETTINGS.probe_every < adaptive.PROBE_EVERY
    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"candidate_steps": [0, 1], "ema": 0.2, "probe_every": 128, "probe_max": 1024,
                               "probe_budget": adaptive.PROBE_BUDGET, "drop_z": adaptive.DROP_Z, "floor_first": False}))
    suf.speculative_adaptive_config = str(cfg)
    assert adaptive.policy_settings(suf) == adaptive.PolicySettings.current()  # the earlier settings, pinned
    assert adaptive.candidate_steps(suf) == [0, 1]
    for bad in ({"ema": 0}, {"ema": 1.5}, {"probe_every": 0}, {"probe_every": 64, "probe_max": 32},
                {"probe_budget": 1.0}, {"probe_every": 2.5}, {"ema": True}, {"drop_z": -1}, {"floor_first": 1}):
        cfg.write_text(json.dumps(dict(candidate_steps=[0, 1], **bad)))
        with pytest.raises(ValueError, match="--speculative-adaptive-config .*ema in"):
            adaptive.policy_settings(suf)
    cfg.write_text(json.dumps({"candidate_steps": [0, 1], "probe_evry": 16}))
    with pytest.raises(ValueError, match=r"--speculative-adaptive-config .*unknown keys \['probe_evry'\]"):
        adaptive.policy_settings(suf)


def test_a_policy_probes_and_averages_by_its_settings():
    """The settings reach the decisions: the first probe after a switch to no draft comes ``probe_every`` steps later
    (where the probe's cost allows), and a drafted step's acceptance moves the average by ``ema``."""
    def first_probe(settings):
        p = TreeSizePolicy([0, 1], settings=settings)
        seen = []
        for i in range(400):
            c = p.choose(1)
            seen.append(c)
            p.observe_time(1, c, 0.003 if c else 0.001)  # the tree costs 3x a decode step
            p.observe_accept(c, [0])  # and accepts nothing: no draft pays
        after = seen.index(0, seen.index(0) + 8)  # serving no draft by then
        return next(i for i in range(after, len(seen)) if seen[i] == 1) - after

    fast = adaptive.PolicySettings(ema=0.2, probe_every=16, probe_max=256, probe_budget=0.5)
    slow = adaptive.PolicySettings(ema=0.2, probe_every=128, probe_max=1024, probe_budget=0.5)
    assert 8 <= first_probe(fast) <= 24 and first_probe(slow) >= 100
    for ema in (0.05, 0.5):
        p = TreeSizePolicy([0, 1], settings=adaptive.PolicySettings(ema=ema, probe_every=16, probe_max=256,
                                                                    probe_budget=0.05))
        p.observe_accept(1, [10])
        p.observe_accept(1, [0])
        assert p.accept == pytest.approx(10 * (1 - ema))


def test_the_benchmark_s_mtp_policy_config_pins_lumotree_s_settings():
    """agents_bench's lumotree-suffix-mtp-policy serves LUMOTREE_SUFFIX with LUMOTREE's averaging and probing (the
    comparison behind adaptive.SUFFIX_SETTINGS): its file must stay equal to the module's settings."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "workloads", "mtp_policy.json")
    sa = SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_num_steps=0,
                         speculative_adaptive_config=path)
    assert adaptive.policy_settings(sa) == adaptive.PolicySettings.current() != adaptive.SUFFIX_SETTINGS
    assert adaptive.candidate_steps(sa) == [0, 1]


def test_a_chain_s_depth_candidates_parse_and_trees_refuse_them(tmp_path):
    cfg = tmp_path / "depths.json"
    cfg.write_text(json.dumps({"candidate_steps": [0, 1, 3]}))
    chain = SimpleNamespace(speculative_algorithm="LUMOTREE", speculative_num_steps=3, speculative_eagle_topk=1,
                            speculative_adaptive_config=str(cfg))
    assert adaptive.candidate_steps(chain) == [0, 1, 3]
    tree = SimpleNamespace(**{**vars(chain), "speculative_eagle_topk": 2})
    with pytest.raises(ValueError, match=r"--speculative-adaptive-config .*candidate_steps \[1\] cannot be served.*"
                                         r"--speculative-eagle-topk 1"):
        adaptive.candidate_steps(tree)
    chain.speculative_adaptive_config = None
    assert adaptive.candidate_steps(chain) == [0, 3]  # the default: the configured chain or none


def test_chain_accept_and_its_inverse():
    assert adaptive.chain_accept(0.8, 3) == pytest.approx(0.8 + 0.64 + 0.512)
    assert adaptive.chain_accept(1.0, 2) == 2 and adaptive.chain_accept(0.0, 3) == 0
    for k in (1, 2, 3, 5):
        for p in (0.1, 0.5, 0.8, 0.95):
            assert adaptive.chain_p(adaptive.chain_accept(p, k), k) == pytest.approx(p, abs=1e-6)
    assert adaptive.chain_p(0.0, 3) == 0.0 and adaptive.chain_p(3.0, 3) == 1.0 and adaptive.chain_p(-1, 3) == 0.0


def test_shallower_chains_read_their_acceptance_from_the_deepest_s():
    two = TreeSizePolicy([0, 3])
    two.observe_accept(3, [2, 1, 3])
    assert two.accept == pytest.approx(2.0) and two.tokens_per_step(3) == pytest.approx(3.0)
    p = TreeSizePolicy([0, 1, 3])
    p.observe_accept(3, [0.8 + 0.64 + 0.512] * 4)  # the deepest chain at p = 0.8
    assert p.tokens_per_step(3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert p.tokens_per_step(1) == pytest.approx(1.8) and p.tokens_per_step(0) == 1.0
    q = TreeSizePolicy([0, 1, 3])
    q.observe_accept(1, [1, 1, 1, 0, 1])  # a one-step chain accepting 0.8: as the three-step chain would have
    assert q.accept == pytest.approx(0.8 + 0.64 + 0.512) and q.tokens_per_step(1) == pytest.approx(1.8)


def leading_successes(rng, p, most):
    """The controlled acceptance of a ``most``-step chain: the leading successes of Bernoulli(``p``) draws."""
    k = 0
    while k < most and rng.random() < p:
        k += 1
    return k


@pytest.mark.parametrize("times,want", [
    pytest.param({0: 10.0, 1: 12.0, 3: 25.0}, 1, id="large-batch-shallow-chain"),  # 1.8/12 > 2.95/25 > 1/10
    pytest.param({0: 7.4, 1: 9.0, 3: 10.5}, 3, id="small-batch-deepest-chain"),   # 2.95/10.5 > 1.8/9
    pytest.param({0: 10.0, 1: 19.0, 3: 40.0}, 0, id="no-chain-pays"),            # 1/10 > 1.8/19 > 2.95/40
])
def test_a_policy_of_chain_depths_serves_the_depth_of_most_tokens_per_second(times, want):
    rng = random.Random(0)
    p = TreeSizePolicy([0, 1, 3])
    counts, prev = {0: 0, 1: 0, 3: 0}, 3
    for i in range(600):
        s = p.choose(8)
        p.observe_time(8, s, times[s] / 1e3 * (1 + 0.02 * rng.random()))
        if s and prev != 0:  # a chain right after a no-draft step drafts from zeros: not counted
            p.observe_accept(s, [leading_successes(rng, 0.8, s) for _ in range(8)])
        prev = s
        if i >= 200:
            counts[s] += 1
    assert counts[want] > 0.9 * sum(counts.values()), counts


def test_the_worker_builds_shallower_chains_with_their_own_tokens_and_attributes_their_acceptance(monkeypatch):
    pytest.importorskip("sglang")
    from lumotree.sglang.worker import candidate_tokens

    assert [candidate_tokens(s, 3, 4) for s in (0, 1, 2, 3)] == [1, 2, 3, 4]
    assert candidate_tokens(3, 3, 6) == 6 and candidate_tokens(0, 3, 6) == 1  # a tree's own size; no draft: the root
    w, switched = bookkeeping_worker([0, 1, 3], DeviceClock())
    chosen = iter([1, 3])
    w.tree_policy.choose = lambda batch: next(chosen)
    w.activate_step_by_batch(4)
    w.activate_step_by_batch(4)
    assert switched == [1, 3] and [e[0] for e in w._ledger.pending] == [1, 3]
    w.on_verify_complete_cpu([1, 1, 1, 1])  # the one-step chain's: every draft accepted -> the deepest's 3
    assert w.tree_policy.accept == pytest.approx(3.0)
    w.on_verify_complete_cpu([0, 0, 0, 0])
    assert w.tree_policy.accept == pytest.approx(3.0 * (1 - adaptive.EMA))


def _args(tmp_path, algorithm, cfg, **kw):
    """Server arguments as the adaptive checks read them, ``cfg`` the ``--speculative-adaptive-config`` (JSON)."""
    import json
    from types import SimpleNamespace

    path = None
    if cfg is not None:
        path = tmp_path / "c.json"
        path.write_text(json.dumps(cfg))
    base = dict(speculative_algorithm=algorithm, speculative_num_steps=3, speculative_adaptive_config=path,
                tp_size=2, dp_size=1, enable_dp_attention=False, enable_multi_layer_eagle=False,
                enable_deterministic_inference=False)
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("why, kw, algorithms", [
    ("data parallelism", dict(dp_size=2), ("LUMOTREE", "LUMOTREE_SUFFIX")),
    ("data parallelism", dict(enable_dp_attention=True), ("LUMOTREE", "LUMOTREE_SUFFIX")),
    ("data parallelism", dict(enable_dp_attention=True, enable_deterministic_inference=True), ("LUMOTREE",)),
    ("decode-exact", dict(enable_deterministic_inference=True), ("LUMOTREE_SUFFIX",)),
    ("multi-layer-eagle", dict(enable_multi_layer_eagle=True), ("LUMOTREE", "LUMOTREE_SUFFIX"))])
@pytest.mark.parametrize("algorithm, configured", [("LUMOTREE", 3), ("LUMOTREE_SUFFIX", 1)])
def test_a_fixed_tree_server_refuses_a_config_that_asks_it_to_choose(tmp_path, why, kw, algorithms, algorithm,
                                                                      configured):
    """A server that serves its configured tree on every step would ignore a config asking it to choose: it fails at
    start-up naming the flag and why; a config of the configured tree alone, or none, passes."""
    from types import SimpleNamespace

    if algorithm not in algorithms:
        pytest.skip(f"{algorithm} chooses there (test_a_decode_exact_lumotree_server_chooses_where_its_config_asks)")

    def sa(cfg):
        return _args(tmp_path, algorithm, cfg, **kw)

    assert not adaptive.adaptive_tree_size(sa(None))
    with pytest.raises(ValueError, match=r"--speculative-adaptive-config .*" + why + r".* drop the flag"):
        adaptive.check_fixed_tree_config(sa({"candidate_steps": [0, configured]}))
    adaptive.check_fixed_tree_config(sa({"candidate_steps": [configured]}))
    adaptive.check_fixed_tree_config(sa(None))
    # a tensor-parallel server alone chooses: nothing to refuse
    kw_tp = {k: (1 if k == "dp_size" else False) for k in kw}
    adaptive.check_fixed_tree_config(SimpleNamespace(**{**vars(sa({"candidate_steps": [0, configured]})), **kw_tp}))


def test_a_decode_exact_lumotree_server_chooses_where_its_config_asks(tmp_path):
    """The decode-exact mode serves the configured tree unless a LUMOTREE server's config lists other candidates: then
    it chooses between them (its no-draft step a decode step, its tree's verify the decode-exact one)."""
    exact = dict(enable_deterministic_inference=True)
    assert not adaptive.adaptive_tree_size(_args(tmp_path, "LUMOTREE", None, **exact))
    assert not adaptive.adaptive_tree_size(_args(tmp_path, "LUMOTREE", {"candidate_steps": [3]}, **exact))
    sa = _args(tmp_path, "LUMOTREE", {"candidate_steps": [0, 3], "probe_every": 2}, **exact)
    assert adaptive.adaptive_tree_size(sa) and adaptive.exact_choice(sa)
    adaptive.check_fixed_tree_config(sa)  # nothing to refuse
    assert adaptive.candidate_steps(sa) == [0, 3] and adaptive.policy_settings(sa).probe_every == 2
    # a config without candidates (policy settings only) leaves the exact mode's fixed tree, and is refused by name
    settings_only = _args(tmp_path, "LUMOTREE", {"probe_every": 2}, **exact)
    assert not adaptive.adaptive_tree_size(settings_only)
    with pytest.raises(ValueError, match=r"--speculative-adaptive-config .*decode-exact mode .*without candidate_steps"):
        adaptive.check_fixed_tree_config(settings_only)
    # LUMOTREE_SUFFIX's decode-exact mode keeps its tree whatever its config lists
    assert not adaptive.adaptive_tree_size(_args(tmp_path, "LUMOTREE_SUFFIX", {"candidate_steps": [0, 1]}, **exact))


def measured_policy(accept=1.0, times=None):
    """A [0, 3] policy with step times at buckets 8, 64, 128 (ms: no draft, tree): the tree pays at 8 only."""
    p = TreeSizePolicy([0, 3])
    for b, (t_none, t_tree) in (times or {8: (10.0, 12.0), 64: (15.0, 40.0), 128: (25.0, 80.0)}).items():
        for _ in range(adaptive.MIN_SAMPLES):
            p.observe_time(b, 0, t_none / 1e3)
            p.observe_time(b, 3, t_tree / 1e3)
    p.observe_accept(3, [accept])
    return p


def test_serves_answers_without_deciding():
    p = measured_policy()
    before = (p.table(), set(p.buckets))
    assert [p.serves(b) for b in (1, 8, 16, 33, 64, 128, 512)] == [3, 3, 3, 0, 0, 0, 0]
    assert (p.table(), set(p.buckets)) == before  # no bucket made, no choice, no probe counted
    # the bucket's last choice is kept within the margin, as a decision there keeps it
    p.accept = 1.64  # 64 x 2.64 / 40 ms = 4224 tok/s against 64 / 15 ms = 4267: the tree 1 % slower
    assert p.serves(64) == 0
    p.buckets[64].chosen = 3
    assert p.serves(64) == 3
    p.buckets[128].chosen = 3
    p.accept = 0.5  # 128 x 1.5 / 80 ms = 2400 against 5120: no draft, beyond any margin
    assert p.serves(128) == 0
    assert TreeSizePolicy([0]).serves(64) == 0 and TreeSizePolicy([3]).serves(64) == 3


def test_serves_knows_nothing_before_both_candidates_are_timed_and_a_draft_accepted():
    p = TreeSizePolicy([0, 3])
    assert p.serves(8) is None and p.may_draft(8, 16)
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(8, 0, 0.01)
    assert p.serves(8) is None and p.may_draft(8, 16)
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(8, 3, 0.012)
    assert p.serves(8) is None  # no drafted step's acceptance yet
    p.observe_accept(3, [0.0])
    assert p.serves(8) == 0 and not p.may_draft(8, 16)


@pytest.mark.parametrize("low, high, want", [
    (1, 1, True),        # bucket 1 borrows bucket 8's times: the tree pays
    (8, 8, True),
    (9, 40, True),       # buckets 16 (borrows 8) and 32 (borrows 64): 16 drafts
    (33, 64, False),     # buckets 64 only
    (40, 200, False),    # 64, 128; 256 is past every bucket that ran: capped at 128
    (200, 300, False),   # beyond: the largest bucket's estimates
    (4, 100, True),
])
def test_may_draft_between_the_prefill_alone_and_the_prefill_joining_the_last_batch(low, high, want):
    assert measured_policy().may_draft(low, high) is want


def test_may_draft_follows_acceptance_and_a_pinned_no_draft_never_drafts():
    assert measured_policy(accept=0.0).may_draft(1, 128) is False  # drafts that miss: no bucket drafts
    assert measured_policy(accept=3.0).may_draft(64, 128) is True  # 64 x 4 / 40 ms > 64 / 15 ms
    assert TreeSizePolicy([0]).may_draft(1, 1) is False
    assert TreeSizePolicy([0, 3]).may_draft(64, 128) is True  # nothing ran yet


def test_each_runtime_state_is_captured_at_its_own_sizes(monkeypatch, caplog):
    """At start-up the configured chain's state keeps the server's sizes (SGLang's speculative list), the no-draft
    state's one-node verify and every shallower chain capture the powers of two and the largest size (the policy times
    their padded steps as served), and the decode graphs of no-draft steps no speculation's list; the log says what
    each state's verify graphs took."""
    pytest.importorskip("sglang")
    import contextlib
    import logging

    import sglang.srt.speculative.eagle_worker_v2 as ew
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
    from sglang.srt.server_args import ServerArgs

    from lumotree.sglang import decode_step
    from lumotree.sglang.worker import worker_class

    class Args:
        _generate_decode_cuda_graph_batch_sizes = ServerArgs._generate_decode_cuda_graph_batch_sizes
        speculative_algorithm, disable_cuda_graph_padding = "LUMOTREE", False

        def __init__(self):
            self.cuda_graph_config = CudaGraphConfig()
            self.cuda_graph_config.decode.bs = self._generate_decode_cuda_graph_batch_sizes(128)

    args = Args()
    spec_list = list(args.cuda_graph_config.decode.bs)
    assert len(spec_list) == 35
    built, decode_built = {}, []
    cls = worker_class()
    w = bare_worker(cls, TreeSizePolicy([0, 1, 2, 3]), overlap_consistent=False)
    w._tree_states, w._decodes, w.server_args, w.speculative_num_draft_tokens = {}, True, args, 4
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(server_args=args, attn_backend=None,
                                                                    decode_cuda_graph_runner=None))
    w._draft_worker = SimpleNamespace(draft_tp_context=lambda group: contextlib.nullcontext(),
                                      draft_runner=SimpleNamespace(tp_group=None), draft_attn_backend=None,
                                      cuda_graph_runner=None, draft_extend_attn_backend=None,
                                      cuda_graph_runner_for_draft_extend=None, _capture_cuda_graphs=None)

    def build_state(self, steps, tokens, cuda_graph_bs=None):  # what SGLang's runners would capture now
        built[steps] = (tokens, list(cuda_graph_bs), list(args.cuda_graph_config.decode.bs))
        usage = self._additional_graph_time_usage  # SGLang adds each state's verify-graph capture time
        usage["target_verify"] = usage.get("target_verify", 0.0) + 0.25 * (steps + 1)
        return steps

    monkeypatch.setattr(ew.EAGLEWorkerV2, "init_cuda_graphs", lambda self: None)
    monkeypatch.setattr(ew.EAGLEWorkerV2, "build_adaptive_runtime_state", build_state)
    monkeypatch.setattr(ew, "check_cuda_graph_backend", lambda phase, backend: False)
    monkeypatch.setattr(ew, "get_exec", lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_bs_decode=None)))
    monkeypatch.setattr(ew, "speculative_moe_backend_context", contextlib.nullcontext)
    monkeypatch.setattr(ew, "speculative_moe_a2a_backend_context", contextlib.nullcontext)
    monkeypatch.setattr(ew, "SpecRuntimeState", lambda **kw: kw)
    monkeypatch.setattr(decode_step.DecodeStep, "build", classmethod(lambda c, worker, bs: decode_built.append(bs)))
    w._additional_graph_time_usage = {"target_verify": 6.0}  # the configured chain's, captured before
    from lumotree.sglang import warmup
    warmed = []
    monkeypatch.setattr(warmup, "warm_spec_decode_slots", warmed.append)
    monkeypatch.setattr(warmup, "warm_verify_kernels", lambda pool, tokens, widths: warmed.append((pool, tokens, widths)))
    w.req_to_token_pool = "the request pool"
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.worker"):
        cls.init_cuda_graphs(w)
    # the slot kernel compiled for every batch bucket before serving; the verify's width-specialised kernels for
    # every candidate's verify: draft tokens 1 (the one-node verify), 2, 3 and the configured 4, runs of 1-4 tokens
    assert warmed == ["the request pool", ("the request pool", [1, 2, 3, 4], [1, 2, 3, 4])]
    # each state's start-up in the log: its own verify-graph capture time, apart from the rest
    lines = [r.getMessage() for r in caplog.records if "runtime state for" in r.getMessage()]
    assert len(lines) == 3 and "runtime state for 2 draft steps" in lines[2]
    assert "target-verify graphs 0.8 s at batch sizes [1, 2, 4, 8, 16, 32, 64, 128]" in lines[2], lines

    sparse = [1, 2, 4, 8, 16, 32, 64, 128]
    assert w._tree_states[3]["speculative_num_draft_tokens"] == 4  # the configured chain: SGLang's own state
    assert built == {0: (1, sparse, sparse), 1: (2, sparse, sparse), 2: (3, sparse, sparse)}
    assert decode_built == [Args()._generate_decode_cuda_graph_batch_sizes.__func__(
        SimpleNamespace(speculative_algorithm=None, disable_cuda_graph_padding=False), 128)]
    assert args.cuda_graph_config.decode.bs == spec_list  # the server's own list is back


def test_a_no_draft_estimate_above_the_tree_s_is_timed_again():
    """A drafted step runs a no-draft step's forward and more: where the bucket's no-draft samples read slower than its
    tree's (stale samples that held a host stall: 15.0 ms against 9.5 at bucket 32, a served LUMOTREE_SUFFIX log) the
    policy serves no draft for REMEASURE_RUN steps to time it again, and with the new times chooses by them -- no
    draft where the tree's acceptance does not pay for its 3.4x step. Where no draft is truly the slower it re-times
    it at most once per probe_max decisions of the bucket."""
    p = TreeSizePolicy([0, 1], settings=adaptive.SUFFIX_SETTINGS)
    p.observe_accept(1, [0] * 32)
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(32, 0, 0.0150)
        p.observe_time(32, 1, 0.0095)
    served = [p.choose(32) for _ in range(adaptive.REMEASURE_RUN)]
    assert served == [0] * adaptive.REMEASURE_RUN
    for _ in range(adaptive.REMEASURE_RUN - 1):  # the last step of the run gives none (a steady clock)
        p.observe_time(32, 0, 0.0028)
    assert p.step_time(32, 0) == pytest.approx(0.0028)
    assert p.choose(32) == 0  # 1 token per 2.8 ms against 1 per 9.5 ms
    # truly slower no-draft steps (none known): re-timed once per probe_max decisions, not every step
    q = TreeSizePolicy([0, 1], settings=adaptive.SUFFIX_SETTINGS)
    q.observe_accept(1, [4] * 32)
    for _ in range(adaptive.MIN_SAMPLES):
        q.observe_time(32, 0, 0.0150)
        q.observe_time(32, 1, 0.0095)
    n = 3 * adaptive.SUFFIX_SETTINGS.probe_max
    served = [q.choose(32) for _ in range(n)]  # no new times: the estimates stay as they were
    remeasures = sum(1 for i in range(n) if served[i] == 0 and (i == 0 or served[i - 1] != 0))
    assert 1 <= remeasures <= n // adaptive.SUFFIX_SETTINGS.probe_max + 1, remeasures
    assert served.count(0) <= adaptive.REMEASURE_RUN * remeasures + adaptive.RUN * (n // adaptive.PROBE_EVERY + 1)
    # within MARGIN the two are noise apart (a 1-step chain's verify at batch 1 costs about a decode step): no re-timing
    r = TreeSizePolicy([0, 1], settings=adaptive.SUFFIX_SETTINGS)
    r.observe_accept(1, [4])
    for _ in range(adaptive.MIN_SAMPLES):
        r.observe_time(1, 0, 0.0100)
        r.observe_time(1, 1, 0.0099)
    assert r.remeasure(1) is None


def test_a_re_measure_that_confirms_the_slower_no_draft_step_waits_twice_as_long_before_the_next():
    """Where the estimate that calls for a re-measure is the last re-measure's own (no other no-draft sample since:
    the re-timed step still reads slower than the tree's, as a host-bound LUMOTREE_SUFFIX server's at batch 1 did 24
    times in one run), the wait to the next doubles, up to REMEASURE_BACKOFF x probe_max; where other no-draft samples
    came since (the estimate went stale again) it is probe_max again."""
    settings = adaptive.SUFFIX_SETTINGS
    p = TreeSizePolicy([0, 1], settings=settings)
    p.observe_accept(1, [4])
    for _ in range(adaptive.MIN_SAMPLES):
        p.observe_time(1, 0, 0.0030)
        p.observe_time(1, 1, 0.0025)

    def next_remeasure(retime):
        """Decisions until the next re-measure starts; its run served, with ``retime`` as its samples."""
        for i in range(1, 40 * settings.probe_max):
            if p.remeasure(1) == 0:
                for _ in range(adaptive.REMEASURE_RUN - 1):
                    assert p.run_step(1) == 0
                    p.observe_time(1, 0, retime)
                assert p.run_step(1) is None
                return i
        raise AssertionError("no re-measure")

    assert next_remeasure(0.0030) == 1
    waits = [next_remeasure(0.0030) for _ in range(6)]  # each confirms: 0.0030 > 0.0025 / (1 - MARGIN)
    want = [min(2 ** k, adaptive.REMEASURE_BACKOFF) * settings.probe_max + 1 for k in range(6)]
    assert waits == want, waits
    # stale again: no-draft samples other than the re-measure's came in (a host stall): the wait is probe_max again
    for _ in range(adaptive.WINDOW):
        p.observe_time(1, 0, 0.0050)
    assert next_remeasure(0.0010) == waits[-1]  # the wait in force runs out first
    for _ in range(adaptive.WINDOW):
        p.observe_time(1, 0, 0.0050)
    assert next_remeasure(0.0010) == settings.probe_max + 1
    # re-timed below the tree's: no re-measure while it stays so
    for _ in range(3 * settings.probe_max):
        assert p.remeasure(1) is None


def test_where_no_draft_is_served_the_probes_are_the_shallowest_chain_s():
    """Batch 1, drafts that miss, no draft served (27B shapes, one H100: decode step 10.2 ms, 1-step chain 12.0, 3-step
    chain 14.1): once every depth has its own step times, a probe serves the 1-step chain -- it measures the
    acceptance all depths share, at the least cost -- and never the 3-step one."""
    p = TreeSizePolicy([0, 1, 3])
    served = simulate_overlap(p, 1, 0.0102, {1: 0.0120, 3: 0.0141}, 0.0, steps=3000)
    assert p.buckets[1].chosen == 0
    explored = max(i for i, s in enumerate(served) if s == 3)
    assert served.count(3) <= 2 * adaptive.RUN, served.count(3)  # exploration only
    probes = [s for s in served[explored + 1:] if s]
    assert probes and set(probes) == {1}, set(probes)
    # while a chain is served, probes still go to the candidate of fewest samples (no draft's time, the other depth)
    q = TreeSizePolicy([0, 1, 3])
    simulate_overlap(q, 1, 0.0102, {1: 0.0120, 3: 0.0141}, 3, steps=3000)
    assert q.buckets[1].chosen == 3 and min(q.buckets[1].samples.values()) >= adaptive.MIN_SAMPLES


def test_a_close_call_after_a_probe_extends_the_probe(caplog):
    """Batch 8, no-draft step 2.73 ms, chain step 6.2 ms (Qwen3-Next MoE shape, 12 layers, H200): the chain pays
    from 1.27 accepted drafts. After a stretch of misses the drafts are accepted again (2 per request), but the
    probe's one counted step happens to read 1.25 (8 requests, spread 0 to 3), 1.11 with the old estimate weighing
    as one request: no draft is kept, within one standard error of the break-even. The probe is extended (a cold step
    and three counted ones), and the bucket serves the chain -- without it, no draft until the next probe."""
    caplog.set_level(logging.INFO, logger="lumotree.sglang.adaptive")
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 8, 0.00273, 0.0062, 0.0, steps=200)
    assert p.buckets[8].chosen == 0
    first = [0, 0, 0, 0, 3, 3, 3, 1]
    served = simulate_overlap(p, 8, 0.00273, 0.0062, None, steps=3000, rows_of=lambda k: first if k == 0 else [2] * 8)
    start = served.index(3)
    window = served[start:start + 12]
    assert window[:2] == [3, 3] and window[2] == 0 and window[3:7] == [3] * 4, window  # probe, settle, extension
    assert p._closed_gap is not None and p._closed_gap[2] == 32  # the probe's 8 samples and the extension's 24
    assert served[start + 8:start + 12] == [3] * 4 and p.buckets[8].chosen == 3, (window, p.table())
    # the server log says so (the decision after the extension logs as any decision after a probe)
    extended = [r.getMessage() for r in caplog.records if "a close call" in r.getMessage()]
    assert len(extended) == 1 and "batch bucket 8" in extended[0] and "extended by 3 counted steps" in extended[0]


@pytest.mark.parametrize("batch, t_none, t_tree, accept", [
    (8, 0.00273, 0.0062, 0.0), (8, 0.00273, 0.0062, 0.3), (1, 0.0074, 0.0105, 0.0), (32, 0.0094, 0.0159, 0.0)])
def test_drafts_that_miss_extend_no_probe(monkeypatch, batch, t_none, t_tree, accept):
    """Where drafts miss (or are accepted far below the chain's break-even) no probe is a close call: the steps
    served are those of a policy without extensions, step for step."""
    def run():
        p = TreeSizePolicy([0, 3])
        simulate_overlap(p, batch, t_none, t_tree, 1.9, steps=200, seed=3)
        return simulate_overlap(p, batch, t_none, t_tree, accept, steps=4000, seed=4)

    served = run()
    assert served.count(3) > 0  # it probed
    monkeypatch.setattr(TreeSizePolicy, "_close_call", lambda self, batch, rates, st: False)
    assert run() == served


def test_a_probe_that_held_no_running_request_is_run_again():
    """Batch 32, no-draft step 7.83 ms, chain step 17.8 ms (Qwen3-Next MoE shape, 12 layers, H100): no draft is
    served after a stretch of misses. The next probe falls on steps whose requests had all finished (the benchmark's
    one-token passes: every row left out of the sample), then the drafts are accepted (3 per request). The probe
    measured nothing: it is run again and the bucket serves the chain; without the repeat it decided on the old 0.00,
    doubled its interval and served no draft for hundreds of steps."""
    def run():
        p = TreeSizePolicy([0, 3])
        simulate_overlap(p, 32, 0.00783, 0.0178, 0.0, steps=300)
        assert p.buckets[32].chosen == 0
        every = p.buckets[32].probe_every
        served = simulate_overlap(p, 32, 0.00783, 0.0178, None, steps=2 * every,
                                  rows_of=lambda k: [] if k == 0 else [3] * 32)
        return p, served

    p, served = run()
    first = served.index(3)
    assert p.buckets[32].chosen == 3, p.table()
    assert served[first:first + 12].count(3) >= 6, served[first:first + 12]  # the repeat, then the chain
    assert adaptive.EMPTY_PROBE_REPEATS > 0
    with pytest.MonkeyPatch.context() as m:
        m.setattr(adaptive, "EMPTY_PROBE_REPEATS", 0)
        p, served = run()
        assert p.buckets[32].chosen == 0 and served[served.index(3) + 2:].count(3) == 0, served


def test_probes_that_keep_holding_no_running_request_give_up_and_keep_the_interval():
    """A workload whose decode steps hold only finished rows (every request ends at its prefill): each probe is
    repeated EMPTY_PROBE_REPEATS times, then the choice stands, with the probe interval unchanged."""
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 32, 0.00783, 0.0178, 0.0, steps=300)
    every = p.buckets[32].probe_every
    served = simulate_overlap(p, 32, 0.00783, 0.0178, None, steps=every + 40, rows_of=lambda k: [])
    assert p.buckets[32].chosen == 0 and p.buckets[32].probe_every == every
    runs = sum(1 for i, s in enumerate(served) if s == 3 and (i == 0 or served[i - 1] == 0))
    assert runs == 1 + adaptive.EMPTY_PROBE_REPEATS, served


def test_at_batch_1_a_served_tree_outlasts_the_dips_of_one_request_s_acceptance():
    """Batch 1, decode step 1.48 ms, 3-step chain 3.76 ms (Qwen3-Next MoE shape, 12 layers, H200): the chain pays
    from ~1.6 accepted drafts a step, the oracle's p 0.8 draws accept 1.95 on average but 0 to 3 a step (standard
    deviation ~1.2). The moving average of a few such steps dipped below the break-even now and then, and each dip
    served no draft until the next probe (the tree on 18 % of 512 steps, mean of 20 seeds); the bucket keeps the tree
    unless it would not pay even DROP_Z standard errors above the estimate."""
    def shares(settings=None):
        out = []
        for seed in range(20):
            p = TreeSizePolicy([0, 3], settings=settings)
            for k in range(8):  # until a probe has found that the tree pays
                simulate_overlap(p, 1, 0.00148, 0.00376, oracle_draws(0.8, 3), steps=64, seed=seed + 1000 * k)
                if p.buckets[1].chosen == 3:
                    break
            assert p.buckets[1].chosen == 3 or settings is not None, p.table()
            served = simulate_overlap(p, 1, 0.00148, 0.00376, oracle_draws(0.8, 3), steps=512, seed=seed + 100)
            out.append(served.count(3) / len(served))
        return statistics.mean(out)

    assert shares() >= 0.9
    # LUMOTREE_SUFFIX's settings keep both off (not served with its suffix drafts): the dips decide there
    assert adaptive.SUFFIX_SETTINGS.drop_z == 0 and adaptive.SUFFIX_SETTINGS.floor_first
    off = dataclasses.replace(adaptive.PolicySettings.current(), drop_z=0.0, floor_first=True)
    assert shares(off) < 0.5


def test_a_tree_whose_acceptance_sits_below_its_break_even_is_left():
    """The allowance's bound: the oracle at p 0.65 (1.35 accepted drafts a step, the chain's break-even ~1.6 at these
    step times, its rate 0.92 of no draft's): the bucket serves no draft on most steps."""
    shares = []
    for seed in range(10):
        p = TreeSizePolicy([0, 3])
        for k in range(8):
            simulate_overlap(p, 1, 0.00148, 0.00376, oracle_draws(0.8, 3), steps=64, seed=seed + 1000 * k)
            if p.buckets[1].chosen == 3:
                break
        served = simulate_overlap(p, 1, 0.00148, 0.00376, oracle_draws(0.65, 3), steps=1024, seed=seed + 100)
        shares.append(served[512:].count(3) / 512)
    assert statistics.mean(shares) <= 0.15, shares


def test_a_served_tree_whose_drafts_miss_is_left_within_a_few_steps():
    """Drafts that stop being accepted (0 from a step on) turn a batch-1 bucket that serves the tree to no draft
    within a few drafted steps, and a batch-32 bucket (its step's sample the mean of 32 requests: a small standard
    error) within the four it took without the allowance."""
    for batch, t_none, t_tree, most in ((1, 0.00148, 0.00376, 12), (32, 0.00582, 0.01258, 4)):
        p = TreeSizePolicy([0, 3])
        for k in range(8):
            simulate_overlap(p, batch, t_none, t_tree, oracle_draws(0.8, 3), steps=200, seed=1 + 1000 * k)
            if p.buckets[batch].chosen == 3 and p._gap is None:
                break
        assert p.buckets[batch].chosen == 3
        served = simulate_overlap(p, batch, t_none, t_tree, 0.0, steps=40, seed=2)
        assert served[:most].count(3) <= most and served[most:] == [0] * (40 - most), (batch, served)


def test_accept_se_is_the_moving_average_s_standard_error():
    """accept_se: a request's standard deviation (from the averages of squares and of values) over sqrt(batch),
    times sqrt(w / (2 - w))."""
    p = TreeSizePolicy([0, 3])
    assert p.accept_se(1) is None
    p.observe_accept(3, [2])
    p.observe_accept(3, [0])
    w = adaptive.EMA
    a, sq = (1 - w) * 2, (1 - w) * 4
    assert p.accept_se(1) == pytest.approx(math.sqrt((sq - a * a) * w / (2 - w)))
    assert p.accept_se(4) == pytest.approx(math.sqrt((sq - a * a) / 4 * w / (2 - w)))


@pytest.mark.parametrize("seed", range(10))
def test_a_tree_that_pays_is_served_in_the_pass_after_a_recording_pass_at_batch_1(seed):
    """The serving table's sequence at batch 1 (a recording pass whose drafts miss, three warm passes and a measured
    pass at p 0.8) with the step times the H100 policy estimated at the MoE shape (1.74 ms, 3.61 ms): the no-draft
    choice after the recording pass is checked by a probe PROBE_EVERY steps later; with the probe floor (~1000 steps
    at batch 1: a 5-step probe where drafts miss costs 2.3x a decode step a step) applied to it, the next probe came
    after the measured pass, which served no draft (0.73 of the chain's rate in the policy's simulation)."""
    p = TreeSizePolicy([0, 3])
    simulate_overlap(p, 1, 0.00174, 0.00361, 0.0, steps=128, seed=seed + 50)
    simulate_overlap(p, 1, 0.00174, 0.00361, oracle_draws(0.8, 3), steps=3 * 128, seed=seed)
    served = simulate_overlap(p, 1, 0.00174, 0.00361, oracle_draws(0.8, 3), steps=128, seed=seed + 300)
    assert served.count(3) >= 110, "".join(map(str, served))


def test_serves_keeps_a_tree_within_the_acceptance_s_noise_as_a_decision_would():
    """serves (what a prefill asks before skipping the MTP draft-extend) answers as the next decision would: a bucket
    that serves the tree through a dip of one request's acceptance still serves it."""
    p = TreeSizePolicy([0, 3])
    for k in range(8):
        simulate_overlap(p, 1, 0.00148, 0.00376, oracle_draws(0.8, 3), steps=64, seed=7 + 1000 * k)
        if p.buckets[1].chosen == 3 and p._gap is None:
            break
    assert p.buckets[1].chosen == 3
    p.observe_accept(3, [0])
    p.observe_accept(3, [0])  # a dip: the estimate alone would serve no draft
    rates = {c: p.rate(1, c) for c in (0, 3)}
    assert max(rates, key=rates.__getitem__) == 0, (p.accept, rates)
    assert p.serves(1) == 3 and p.choose(1) == 3


def test_a_drafted_step_never_reads_faster_than_no_draft():
    """A bucket whose own no-draft samples are slow (taken right after the start) and whose tree time is borrowed
    from a bucket where the tree is cheap does not serve the tree at acceptance 0: a drafted step runs a no-draft
    step's forward and more, so the decisions read its time as at least no draft's (the served case: 27B shape, one
    H100, bucket 2 at 32.0 ms own no-draft against the chain's 14.0 ms borrowed from bucket 1, accept 0.00). Where
    drafts are accepted the tree still serves."""
    for accept, want in ((0.0, 0), (1.5, 3)):
        p = TreeSizePolicy([0, 3])
        simulate(p, 1, 0.0102, 0.0140, accept, steps=3 * adaptive.RUN)  # bucket 1 explores and measures both
        for _ in range(adaptive.MIN_SAMPLES):
            p.observe_time(2, 0, 0.032)  # bucket 2: only its own slow no-draft samples
        assert p.step_time(2, 3) == pytest.approx(0.0140, rel=0.03)  # borrowed from bucket 1
        assert p.decision_time(2, 3) == pytest.approx(0.032) and p.decision_time(2, 0) == pytest.approx(0.032)
        assert p.choose(2) == want, (accept, p.table())
    q = TreeSizePolicy([0, 1, 3])  # chain depths: each depth at least the shallower one's
    for c, t in ((0, 0.010), (1, 0.009), (3, 0.012)):
        for _ in range(adaptive.MIN_SAMPLES):
            q.observe_time(1, c, t)
    assert [q.decision_time(1, c) for c in (0, 1, 3)] == [0.010, 0.010, 0.012]


def test_warm_probes_where_no_draft_is_a_candidate_outside_the_decode_exact_mode(tmp_path):
    """A LUMOTREE server's probes start warm by default and with a config that lists no draft (the served GPU test's
    ``[0, 3]``); not where no draft is no candidate, nor in the decode-exact mode (its no-draft step is a decode
    step)."""
    from lumotree.sglang.worker import warm_probes

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"candidate_steps": [0, 3]}))
    plain = SimpleNamespace(speculative_algorithm="LUMOTREE", speculative_num_steps=3,
                            speculative_adaptive_config=None, enable_deterministic_inference=False)
    listed = SimpleNamespace(**{**vars(plain), "speculative_adaptive_config": str(cfg)})
    exact = SimpleNamespace(**{**vars(listed), "enable_deterministic_inference": True})
    assert warm_probes(plain, [0, 3]) and warm_probes(listed, [0, 3])
    assert not warm_probes(plain, [3]) and not warm_probes(plain, [1, 3]) and not warm_probes(exact, [0, 3])
