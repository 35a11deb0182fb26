"""LUMOTREE_SUFFIX's per-request draft choice, its default (lumotree.sglang.request_choice): the batch's quantile
request decides, estimates per request from its own drafted steps, probes that back off, the config's checks, and the
ledger feeding it the rows of each step one step late."""
import json
import os
import sys
from types import SimpleNamespace

import pytest

from lumotree.sglang import adaptive
from lumotree.sglang.request_choice import (PRIOR, RequestQuantile, RequestQuantileSettings, settings_of)


def chooser(**kw):
    return RequestQuantile(RequestQuantileSettings(**kw))


def test_the_quantile_request_decides_not_the_mean():
    """Eight requests: two copy long runs (15 drafts a step), six write new text (0): the mean (3.75) pays for a
    drafted step costing twice a decode step, the 0.25 quantile (0) does not -- no draft; with five of eight
    accepting 3 the quantile pays."""
    c = chooser(quantile=0.25, weight=1.0)
    rids = list("abcdefgh")
    c.observe(rids, True, [15, 15, 0, 0, 0, 0, 0, 0])
    assert c.quantile_of(rids) == 0.0
    assert not c.decide(rids, 2.0)
    c.observe(rids, True, [15, 15, 3, 3, 3, 0, 0, 0])
    assert c.quantile_of(rids) == 0.0  # int(0.25 * 8) = the third smallest
    c.observe(rids, True, [15, 15, 3, 3, 3, 3, 0, 0])
    assert c.quantile_of(rids) == 3.0 and c.decide(rids, 2.0)
    assert chooser(quantile=0.0, weight=1.0).quantile_of(["x"]) == PRIOR  # nothing seen: the prior


def test_a_new_request_starts_from_the_running_mean_and_estimates_follow_its_weight():
    c = chooser(weight=0.5)
    c.observe(["a", "b"], True, [4, 8])
    assert c.est["a"] == pytest.approx(0.5 * PRIOR + 0.5 * 4) and c.est["b"] == pytest.approx(0.5 * PRIOR + 0.5 * 8)
    assert c.prior() == pytest.approx(6.0, rel=0.01)  # the decayed mean of the samples
    assert c.quantile_of(["new"]) == pytest.approx(c.prior())
    c.observe(["a", "b"], True, [None, 0])  # a row whose sample does not count leaves its estimate
    assert c.est["a"] == pytest.approx(0.5 * PRIOR + 0.5 * 4) and c.est["b"] == pytest.approx(0.5 * (0.5 * PRIOR + 4))


def test_no_draft_steps_drift_estimates_back_to_the_mean():
    c = chooser(weight=1.0, drift=0.5)
    c.observe(["a", "b"], True, [0, 8])
    mean = c.prior()
    c.observe(["a", "b"], False, [0, 0])
    assert c.est["a"] == pytest.approx(0.5 * mean) and c.est["b"] == pytest.approx(8 + 0.5 * (mean - 8))
    c2 = chooser(weight=1.0, drift=0.0)
    c2.observe(["a"], True, [0])
    c2.observe(["a"], False, [0])
    assert c2.est["a"] == 0.0


def test_probes_come_after_probe_every_no_draft_steps_and_back_off_while_they_find_nothing():
    c = chooser(weight=1.0, probe_every=4, probe_max=16)
    rids = ["a", "b"]
    c.observe(rids, True, [0, 0])
    c._mean = [0.0, 1.0]  # every request's drafts missed: new requests start from 0 too
    seen = []
    for _ in range(60):
        d = c.decide(rids, 2.0)
        seen.append(d)
        c.observe(rids, d, [0, 0], 2.0)  # a probe that finds nothing
    gaps = [i for i, d in enumerate(seen) if d]
    assert gaps[:4] == [4, 13, 30, 47]  # 4, then 8, then 16 (probe_max) no-draft steps between probes
    assert c.decisions == [0, 4, 56] and c.interval == 16
    # a probe that finds acceptance resets the interval, and the quantile drafts from then on
    while not c.decide(rids, 2.0):
        pass
    c.observe(rids, True, [5, 5], 2.0)
    assert c.interval == 4 and c.decide(rids, 2.0)
    # a step the quantile drafts restarts the interval even where the probe's own result has not come back yet
    # (overlap: it arrives a step late)
    c.interval = 16
    c.observe(rids, True, [5, 5], 2.0)
    assert c.decide(rids, 2.0) and c.interval == 4


def test_estimates_are_bounded():
    c = RequestQuantile(memory=3)
    for i in range(10):
        c.observe([i], True, [i])
    assert list(c.est) == [7, 8, 9]
    c.quantile_of([8])  # a request seen again moves to the end
    c.observe([10], True, [1])
    assert list(c.est) == [9, 8, 10]


def _args(tmp_path, cfg, algorithm="LUMOTREE_SUFFIX"):
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(cfg))
    return SimpleNamespace(speculative_algorithm=algorithm, speculative_adaptive_config=str(path),
                           speculative_num_steps=3)


def test_the_config_key_and_its_errors_name_the_flag(tmp_path):
    # the default of a LUMOTREE_SUFFIX server that chooses between no draft and its tree; none for any other server
    assert settings_of(SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_adaptive_config=None)) \
        == RequestQuantileSettings()
    assert settings_of(_args(tmp_path, {"candidate_steps": [0, 1]})) == RequestQuantileSettings()
    assert settings_of(_args(tmp_path, {"candidate_steps": [0]})) is None  # pinned to no draft
    assert settings_of(_args(tmp_path, {"candidate_steps": [1]})) is None  # pinned to its tree
    assert settings_of(SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_adaptive_config=None,
                                       tp_size=2)) == RequestQuantileSettings()  # tensor-parallel ranks choose alike
    assert settings_of(SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_adaptive_config=None,
                                       dp_size=2)) is None  # data parallelism: the configured tree on every step
    assert settings_of(SimpleNamespace(speculative_algorithm="LUMOTREE", speculative_adaptive_config=None,
                                       speculative_num_steps=3)) is None
    sa = _args(tmp_path, {"candidate_steps": [0, 1], "request_quantile": {}})
    assert settings_of(sa) == RequestQuantileSettings()
    assert adaptive.policy_settings(sa) == adaptive.SUFFIX_SETTINGS  # the key is known to the policy's check
    assert adaptive.candidate_steps(sa) == [0, 1]
    got = settings_of(_args(tmp_path, {"candidate_steps": [0, 1], "request_quantile": {"quantile": 0.5,
                                                                                        "probe_max": 64}}))
    assert got.quantile == 0.5 and got.probe_max == 64 and got.weight == RequestQuantileSettings().weight
    bad = [({"candidate_steps": [0, 1], "request_quantile": {"quantile": 1.0}}, "quantile in"),
           ({"candidate_steps": [0, 1], "request_quantile": {"probe_every": 8, "probe_max": 4}}, "probe_every <="),
           ({"candidate_steps": [0, 1], "request_quantile": {"weight": 0}}, "weight in"),
           ({"candidate_steps": [0, 1], "request_quantile": {"quantil": 0.5}}, "fields"),
           ({"candidate_steps": [0, 1], "request_quantile": 0.25}, "fields"),
           ({"candidate_steps": [1], "request_quantile": {}}, "candidate_steps must be")]
    for cfg, msg in bad:
        with pytest.raises(ValueError, match=f"--speculative-adaptive-config .*{msg}"):
            settings_of(_args(tmp_path, cfg))
    with pytest.raises(ValueError, match="LUMOTREE_SUFFIX's per-request draft choice; this server is "
                                         "--speculative-algorithm LUMOTREE"):
        settings_of(_args(tmp_path, {"candidate_steps": [0, 3], "request_quantile": {}}, algorithm="LUMOTREE"))


class _Policy:
    """A policy with fixed step times at every bucket (None: none measured yet)."""

    def __init__(self, times):
        self.candidates, self.times, self.chosen, self.accepts = [0, 1], times, 0, []

    def observe_time(self, *a):
        pass

    def step_time(self, batch, steps):
        return self.times.get(steps)

    def choose(self, batch):
        self.chosen += 1
        return 1

    def observe_accept(self, steps, drafts):
        self.accepts.append((steps, list(drafts)))

    def run_step(self, batch):
        return None

    def remeasure(self, batch):
        return None


def test_the_ledger_lets_the_chooser_decide_once_both_step_times_are_measured():
    from lumotree.sglang.worker import HostEvent, StepLedger

    c = chooser(weight=1.0)
    p = _Policy({1: 0.004})
    ledger = StepLedger(p, first=1, event=HostEvent, chooser=c)
    assert ledger.choose(2, ["a", "b"]) == 1 and p.chosen == 1  # no no-draft time yet: the policy explores
    p.times[0] = 0.002
    ledger.launched(2, 1, rids=["a", "b"])
    assert ledger.pending[-1][4:] == [["a", "b"], None]
    ledger.accepted([0, 0], 1)  # both missed: the quantile (0) does not pay a step twice a decode step's
    assert c.est == {"a": 0.0, "b": 0.0}
    assert ledger.choose(2, ["a", "b"]) == 0 and p.chosen == 1
    assert ledger._ratio == pytest.approx(2.0)
    ledger.launched(2, 0, rids=["a", "b"])
    assert ledger.pending[-1][5] == pytest.approx(2.0)
    ledger.accepted([0, 0], 1)
    assert p.accepts[-1] == (0, [0, 0])  # the policy still sees every step
    # without request ids (the LUMOTREE worker) the policy decides
    assert ledger.choose(2) == 1 and p.chosen == 2


def test_the_ledger_hands_the_chooser_no_sample_for_finished_or_undrafted_rows():
    import torch

    from lumotree.sglang.worker import HostEvent, StepLedger

    c = chooser(weight=1.0)
    ledger = StepLedger(_Policy({0: 0.002, 1: 0.004}), first=1, event=HostEvent, chooser=c)
    ledger.choose(3, ["a", "b", "c"])
    ledger.launched(3, 1, rids=["a", "b", "c"])
    ledger.pending[-1][2] = torch.tensor([True, False, True])  # b finished in the step (note_live_rows)
    ledger.note_undrafted([2])  # c's admission was still indexing: it drafted nothing
    ledger.accepted([5, 9, 0], 1)
    assert c.est == {"a": 5.0}
    assert ledger.policy.accepts[-1] == (1, [5])


def test_the_ledger_times_a_stale_no_draft_step_again_before_the_chooser_decides():
    """The per-request choice reads the policy's step times: where the bucket's no-draft time is stale-high (15.0 ms
    against the tree's 9.5, as a served LUMOTREE_SUFFIX server kept it at bucket 32 through a 32-agent run) the tree
    looks cheaper than no draft and every step drafted -- second turns that no draft foresees advanced a token per
    drafted step. The ledger serves the policy's re-timing run of no draft first; with the new times the chooser
    serves no draft to requests whose drafts miss."""
    from lumotree.sglang.adaptive import MIN_SAMPLES, REMEASURE_RUN, SUFFIX_SETTINGS, TreeSizePolicy
    from lumotree.sglang.worker import HostEvent, StepLedger

    p = TreeSizePolicy([0, 1], settings=SUFFIX_SETTINGS)
    for _ in range(MIN_SAMPLES):
        p.observe_time(32, 0, 0.0150)
        p.observe_time(32, 1, 0.0095)
    p.observe_accept(1, [0] * 32)
    c = chooser(weight=1.0)
    rids = [f"r{i}" for i in range(32)]
    c.observe(rids, True, [0] * 32)  # every request's drafts missed
    ledger = StepLedger(p, first=1, event=HostEvent, chooser=c)
    assert [ledger.choose(32, rids) for _ in range(REMEASURE_RUN)] == [0] * REMEASURE_RUN
    assert ledger._ratio is None  # the policy's run, not the chooser's decision
    for _ in range(REMEASURE_RUN - 1):
        p.observe_time(32, 0, 0.0028)
    assert ledger.choose(32, rids) == 0 and ledger._ratio == pytest.approx(0.0095 / 0.0028)
    # the old times (what the ledger served before): the chooser took the tree as cheaper and drafted
    stale = TreeSizePolicy([0, 1], settings=SUFFIX_SETTINGS)
    for _ in range(MIN_SAMPLES):
        stale.observe_time(32, 0, 0.0150)
        stale.observe_time(32, 1, 0.0095)
    assert c.decide(rids, stale.step_time(32, 1) / stale.step_time(32, 0))


def test_flags_alone_serve_the_choice_the_benchmark_s_config_writes_out():
    """A LUMOTREE_SUFFIX server with its flags alone chooses each step as agents_bench's
    lumotree-suffix-request-quantile (the config the served runs *-request-choice passed): the per-request choice at
    its defaults, the same candidates and the policy's own settings (for its step times)."""
    workloads = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "workloads")
    path = os.path.join(workloads, "request_quantile.json")
    written = SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_num_steps=0,
                              speculative_adaptive_config=path)
    alone = SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_num_steps=0,
                            speculative_adaptive_config=None)
    for sa in (written, alone):
        assert settings_of(sa) == RequestQuantileSettings()
        assert adaptive.policy_settings(sa) == adaptive.SUFFIX_SETTINGS and adaptive.candidate_steps(sa) == [0, 1]
        assert adaptive.adaptive_tree_size(sa)
    sys.path.insert(0, workloads)
    import agents_bench

    assert agents_bench.CONFIGS["lumotree-suffix-request-quantile"][-1] == os.path.abspath(path)


def _serve_one_request(ledger, steps_n, drafted_s, none_s, accepted):
    """``steps_n`` decode steps of one request through ``ledger`` on a device clock that advances by each step's time
    (``drafted_s`` / ``none_s``); each step's acceptance reported a step late (overlap), ``accepted`` drafts when it
    drafted. Returns the candidates served."""
    clock = {"now": 0.0}

    class Event:
        def record(self):
            self.t = clock["now"]

        def query(self):
            return self.t <= clock["now"]

        def elapsed_time(self, later):
            return (later.t - self.t) * 1e3

    ledger.clock._event = Event
    served = []
    for _ in range(steps_n):
        steps = ledger.choose(1, ["r"])
        ledger.launched(1, steps, rids=["r"])
        if len(ledger.pending) > 1:
            ledger.accepted([accepted if ledger.pending[0][0] else 0], 1)
        clock["now"] += drafted_s if steps else none_s
        served.append(steps)
    return served


def test_a_probe_on_a_steady_clock_times_the_tree_again_so_an_inflated_estimate_heals():
    """A tree estimate inflated once (a fresh H100's first drafted steps compiled while serving: 95.7 ms at bucket 1
    against a 2.2 ms no-draft step) made the per-request choice serve no draft; its probes were single drafted steps,
    each followed by a no-draft step, which a steady clock does not time -- so the estimate never moved and a 1-agent
    run was served without drafting (0.67x no speculation). A probe on a steady clock drafts two steps: the first is
    timed within its run, and after a few probes the window holds true times and the request drafts again."""
    from lumotree.sglang.adaptive import MIN_SAMPLES, SUFFIX_SETTINGS, TreeSizePolicy
    from lumotree.sglang.worker import StepLedger

    def policy():
        p = TreeSizePolicy([0, 1], settings=SUFFIX_SETTINGS)
        for _ in range(MIN_SAMPLES):
            p.observe_time(1, 0, 0.0022)
            p.observe_time(1, 1, 0.0957)
        p.observe_accept(1, [8])
        return p

    healed = StepLedger(policy(), first=1, chooser=chooser(), steady=True)
    served = _serve_one_request(healed, 1500, drafted_s=0.0025, none_s=0.0022, accepted=8)
    assert healed.policy.step_time(1, 1) == pytest.approx(0.0025)
    assert served[-500:].count(1) == 500  # drafting pays (8 accepted per 1.14 decode steps' time) and is served
    assert served.index(1) < SUFFIX_SETTINGS.probe_every + 2  # the first probe comes as the chooser's interval says
    # one-step probes (what the ledger served before): the estimate stays, no draft through the run
    stuck = StepLedger(policy(), first=1, chooser=chooser(), steady=True)
    stuck.STEADY_PROBE_RUN = 1
    served = _serve_one_request(stuck, 1500, drafted_s=0.0025, none_s=0.0022, accepted=8)
    assert stuck.policy.step_time(1, 1) == pytest.approx(0.0957)
    assert served[-500:].count(1) <= 3
