"""``benchmark/drafters/policy_replay.py``: the closed-loop model of LUMOTREE_SUFFIX's per-step choice on a synthetic
acceptance table -- every mode serves every token, a fixed tree wins where drafts are accepted and loses where they
are not, the per-step oracle is never worse than either, and the adaptive policy follows a workload whose acceptance
changes between turns."""
import os
import sys
from types import SimpleNamespace

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmark", "drafters"))


def args():
    return SimpleNamespace(none_ms=3.0, tree_ms=7.0, fixed_share=0.3, prefill_ms=5.0)


def workload(k_of_turn, sessions=8, turns=6, length=64):
    per_session = [[([1] * 10, list(range(length))) for _ in range(turns)] for _ in range(sessions)]
    table = {(s, t): [k_of_turn(t)] * (length - 1) for s in range(sessions) for t in range(turns)}
    return per_session, table


def two_stuck_sessions():
    """Eight sessions of six turns; two (0 and 4) never have their drafts accepted, the others accept 12 a step."""
    per_session, table = workload(lambda t: 12)
    for t in range(6):
        for s in (0, 4):
            table[(s, t)] = [0] * len(table[(s, t)])
    return per_session, table


@pytest.mark.parametrize("k, tree_wins", [(8, True), (0, False)])
def test_modes_serve_every_token_and_the_oracle_is_never_worse(k, tree_wins):
    pr = pytest.importorskip("policy_replay")
    per_session, table = workload(lambda t: k)
    rows = {m: pr.serve(table, per_session, 4, m, args()) for m in ("none", "tree", "oracle")}
    rows["policy"] = pr.serve(table, per_session, 4, "policy", args())
    assert len({r["tokens"] for r in rows.values()}) == 1 and rows["none"]["tokens"] == 8 * 6 * 64
    assert (rows["tree"]["tokens_per_s"] > rows["none"]["tokens_per_s"]) == tree_wins
    best = max(rows["tree"]["tokens_per_s"], rows["none"]["tokens_per_s"])
    assert rows["oracle"]["tokens_per_s"] >= 0.999 * best
    # the policy explores both, then serves the better: within 10 % of it
    assert rows["policy"]["tokens_per_s"] >= 0.9 * best


def test_the_policy_follows_acceptance_that_changes_between_turns():
    pr = pytest.importorskip("policy_replay")
    per_session, table = workload(lambda t: 10 if t % 2 == 0 else 0, turns=8, length=256)
    r = {m: pr.serve(table, per_session, 4, m, args()) for m in ("none", "tree", "policy")}
    assert r["policy"]["tokens_per_s"] > max(r["none"]["tokens_per_s"], r["tree"]["tokens_per_s"])


def test_the_score_gate_drafts_where_the_drafter_expects_acceptance():
    """score: each step drafts where the drafter's own expected acceptance (calibrated online) pays at the model's
    step times; with expectations that follow the turns' acceptance it serves what the oracle serves, and every mode
    reports its turns' latencies."""
    pr = pytest.importorskip("policy_replay")
    per_session, table = workload(lambda t: 10 if t % 2 == 0 else 0, turns=8, length=256)
    expected = {key: [float(k) for k in ks] for key, ks in table.items()}
    r = {m: pr.serve(table, per_session, 4, m, args(), expected=expected) for m in ("none", "oracle", "score", "policy")}
    assert r["score"]["tokens"] == r["none"]["tokens"]
    assert r["score"]["tokens_per_s"] >= 0.98 * r["oracle"]["tokens_per_s"] > r["policy"]["tokens_per_s"]
    assert r["score"]["drafted_steps"] < r["score"]["steps"]  # the missing turns are served without a draft
    assert all(0 < m["latency_p50_ms"] <= m["latency_p95_ms"] for m in r.values())
    # a drafter that over-promises is scaled down by what it delivered: the missing turns still go undrafted
    inflated = {key: [k + 20.0 if k == 0 else k for k in ks] for key, ks in expected.items()}
    s = pr.serve(table, per_session, 4, "score", args(), expected=inflated)
    assert s["tokens_per_s"] > r["none"]["tokens_per_s"] and s["drafted_steps"] > r["score"]["drafted_steps"]


def test_turn_latency_is_the_median_and_95th_percentile():
    pr = pytest.importorskip("policy_replay")
    assert pr.turn_latency([]) == {}
    assert pr.turn_latency([4.0, 1.0, 3.0, 2.0]) == dict(latency_p50_ms=2.5, latency_p95_ms=3.0)


def test_a_speculative_server_s_own_prefill_time_costs_every_mode_but_no_speculation():
    """--prefill-ms-speculative: each turn's prefill takes that long on the speculative modes' server; no speculation
    keeps --prefill-ms. Drafts never accepted: a fixed tree's serving is the same steps, each turn's prefill longer."""
    pr = pytest.importorskip("policy_replay")
    per_session, table = workload(lambda t: 0)
    base, slow = args(), args()
    slow.prefill_ms_speculative = base.prefill_ms + 4.0
    turns = 8 * 6
    for mode in ("none", "tree"):
        a, b = pr.serve(table, per_session, 4, mode, base), pr.serve(table, per_session, 4, mode, slow)
        assert a["steps"] == b["steps"] and a["tokens"] == b["tokens"]
        extra = 0.0 if mode == "none" else 4.0 * turns / 1e3
        assert b["seconds"] == pytest.approx(a["seconds"] + extra, abs=2e-3)


def test_criteria_that_weigh_each_request_protect_the_one_whose_drafts_miss():
    """Two of eight sessions never have their drafts accepted, the others accept 12 a step. A fixed tree makes the
    stuck turns wait for drafted steps (p95 above no speculation's); maxmin drafts only where every request gains at
    least a decode step's rate, so no turn is slower than without speculation; harmonic and the per-request average
    still draft where it pays and stay faster than no speculation, their tail below the fixed tree's."""
    pr = pytest.importorskip("policy_replay")
    per_session, table = two_stuck_sessions()
    a = args()
    r = {m: pr.serve(table, per_session, 4, m, a) for m in ("none", "tree") + pr.CRITERIA[:3]}
    r["request"] = pr.serve(table, per_session, 4, "request_harmonic", a, weight=0.8, drift=0.05, probe_every=16)
    assert len({x["tokens"] for x in r.values()}) == 1
    assert r["tree"]["latency_p95_ms"] > r["none"]["latency_p95_ms"]
    assert r["maxmin"]["latency_p95_ms"] <= r["none"]["latency_p95_ms"]
    assert r["maxmin"]["drafted_steps"] < r["harmonic"]["drafted_steps"]
    for m in ("fair", "harmonic", "request"):
        assert r[m]["tokens_per_s"] > r["none"]["tokens_per_s"]
        assert r[m]["latency_p95_ms"] < r["tree"]["latency_p95_ms"]
    # score_harmonic reads the drafter's expectation: exact expectations serve as the true acceptance does
    expected = {key: [float(k) for k in ks] for key, ks in table.items()}
    sh = pr.serve(table, per_session, 4, "score_harmonic", a, expected=expected)
    assert sh["tokens"] == r["none"]["tokens"] and sh["tokens_per_s"] > r["none"]["tokens_per_s"]


def test_uncached_tokens_follow_the_radix_cache_and_cost_their_prefill():
    """A turn's uncached prompt tokens: the prompt less its common prefix with the session's previous context (a
    collapsed history parts early), a first turn less the prefix it shares with the first session's first prompt;
    --prefill-ms-per-1k charges them to the turn's prefill, so no speculation's turns are no longer all alike."""
    pr = pytest.importorskip("policy_replay")
    system = [7] * 100
    per_session = [
        [(system + [1, 2], [3, 4]), (system + [1, 2, 3, 4, 5, 6], [8]), (system + [9] * 50, [1])],
        [(system + [5], [6])],
    ]
    got = pr.uncached_tokens(per_session)
    assert got == {(0, 0): 102, (0, 1): 2, (0, 2): 50, (1, 0): 1}
    per_session, table = workload(lambda t: 0)
    per_session = [[(list(range(1000 * (t % 2))), out) for t, (_, out) in enumerate(turns)] for turns in per_session]
    a = args()
    a.prefill_ms_per_1k = 0.0
    flat = pr.serve(table, per_session, 4, "none", a)
    a.prefill_ms_per_1k = 20.0
    costed = pr.serve(table, per_session, 4, "none", a)
    assert costed["seconds"] > flat["seconds"] and costed["tokens"] == flat["tokens"]
    # per turn index the median latency: the turns with 1,000 uncached prompt tokens (odd ones) wait for their prefill
    by_turn = costed["latency_p50_ms_by_turn"]
    assert len(by_turn) == len(per_session[0]) and min(by_turn[1::2]) > max(by_turn[0::2])
    assert costed["latency_p95_ms"] - costed["latency_p50_ms"] > flat["latency_p95_ms"] - flat["latency_p50_ms"]


def test_the_per_request_choice_protects_the_requests_whose_drafts_miss():
    """LUMOTREE_SUFFIX's per-request choice (lumotree.sglang.request_choice, the served class) on the workload
    above: two of eight sessions never have their drafts accepted. It serves every token, faster than no
    speculation, with a tail below the fixed tree's; where no draft is ever accepted its probes back off and it
    costs under 2 % against no speculation (probes every 16 no-draft steps without backing off cost more)."""
    pr = pytest.importorskip("policy_replay")
    per_session, table = two_stuck_sessions()
    a = args()
    r = {m: pr.serve(table, per_session, 4, m, a) for m in ("none", "tree", "request_quantile")}
    assert len({x["tokens"] for x in r.values()}) == 1
    assert r["request_quantile"]["tokens_per_s"] > r["none"]["tokens_per_s"]
    assert r["request_quantile"]["latency_p95_ms"] < r["tree"]["latency_p95_ms"]
    missed = {key: [0] * len(ks) for key, ks in table.items()}
    none = pr.serve(missed, per_session, 4, "none", a)["tokens_per_s"]
    backoff = pr.serve(missed, per_session, 4, "request_quantile", a)["tokens_per_s"]
    flat = pr.serve(missed, per_session, 4, "request_quantile", a, probe_max=16)["tokens_per_s"]
    assert 0.98 * none < backoff < none and flat < backoff
