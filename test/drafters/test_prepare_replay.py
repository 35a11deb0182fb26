"""``benchmark/drafters/prepare_replay.py``: LUMOTREE_SUFFIX's draft preparation replayed closed-loop in both of its
forms -- the served one (each request's context as its parts, ``HostCorpus.step_get``) and the one before it (views +
``batch_get``) -- drafts the same trees step by step, serves every turn to its end, and reports both forms per batch
bucket."""
import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmark", "drafters"))


def sessions(n=6, turns=3, seed=0):
    """Repetitive agent-like turns: each prompt holds the earlier turns, each reply repeats a phrase of its prompt."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        context, turns_of = [rng.randrange(50) for _ in range(40)], []
        for _ in range(turns):
            start = rng.randrange(len(context) - 8)
            reply = (context[start:start + 8] * 6)[:rng.randrange(10, 40)]
            turns_of.append((list(context), reply))
            context = context + reply + [rng.randrange(50) for _ in range(12)]
        out.append(turns_of)
    return out


@pytest.mark.parametrize("agents", [1, 4])
def test_both_forms_draft_the_same_and_serve_every_turn(agents):
    pytest.importorskip("sglang")
    pr = pytest.importorskip("prepare_replay")
    per_session = sessions()
    samples, steps, drafting = pr.replay(per_session, agents, 8, ("parts", "views"))
    assert drafting["request_steps"] >= steps and drafting["undrafted"] == 0  # admissions waited for
    assert len(samples["parts"]) == len(samples["views"]) == steps > 0
    # every decode step of a turn advances each running request by at least one token: no more steps than tokens
    assert steps <= sum(len(reply) for turns in per_session for _, reply in turns)
    assert [n for n, _, _ in samples["parts"]] == [n for n, _, _ in samples["views"]]
    assert max(n for n, _, _ in samples["parts"]) == agents
    rows = pr.rows(samples)
    assert {r["form"] for r in rows} == {"parts", "views"}
    assert all(r["prepare_ms"] >= 0 and r["steps"] > 0 for r in rows)


def test_the_background_replay_serves_every_turn_and_doubles_tokens_after_a_prefill(monkeypatch):
    """--background: admissions left indexing, and the step after a prefill hands the requests that ran before it the
    last round's tokens twice (so the corpus rewinds them the step after); every turn is still served to its end."""
    pytest.importorskip("sglang")
    pr = pytest.importorskip("prepare_replay")
    from lumotree.sglang.suffix import HostCorpus

    seen = []
    real = HostCorpus.step_get

    def spy(self, req_ids, parts, depth):
        seen.append([len(p) + len(o) + len(e) for p, o, e in parts])
        return real(self, req_ids, parts, depth)

    monkeypatch.setattr(HostCorpus, "step_get", spy)
    per_session = sessions(n=5, turns=3, seed=1)
    samples, steps, _ = pr.replay(per_session, 3, 8, ("parts",), background=True, gpu_ms=0.5)
    assert len(samples["parts"]) == steps == len(seen) > 0
    assert all(r["prepare_p95_ms"] <= r["prepare_max_ms"] for r in pr.rows(samples))
    monkeypatch.setattr(HostCorpus, "step_get", real)
    import lumotree.sglang.suffix as sx

    rewinds, twice = [], []
    # without --background nothing is doubled; with it the corpus takes each doubled splice once (no rewinds either way)
    for background in (False, True):
        made = []
        real_init = sx.SuffixCorpus.__init__

        def init(self, *a, **k):
            real_init(self, *a, **k)
            made.append(self)

        monkeypatch.setattr(sx.SuffixCorpus, "__init__", init)
        _, _, drafting = pr.replay(per_session, 3, 8, ("parts",), background=background)
        rewinds.append(sum(c.stats["rewinds"] for c in made))
        assert drafting["corpus_stats"] == made[0].stats
        twice.append(sum(c.stats["spliced_twice"] for c in made))
        monkeypatch.setattr(sx.SuffixCorpus, "__init__", real_init)
    assert rewinds == [0, 0] and twice[0] == 0 and twice[1] > 0, (rewinds, twice)


def test_native_step_replay_makes_the_recorded_calls_again_and_drafts_alike():
    """``benchmark/drafters/native_step_replay.py``: the C++ drafter's calls during the replay are recorded (admissions
    staged and indexed, one ``step_layout`` per decode step, finishes) and made again on fresh drafters: the same drafts
    on every replay and on any number of threads, as the corpus drafted them in the replay itself."""
    pytest.importorskip("sglang")
    from lumotree.drafters import suffix as S

    if S._host_extension() is None:
        pytest.skip("lumotree._host is not built")
    import hashlib

    nsr = pytest.importorskip("native_step_replay")
    from lumotree.sglang import suffix as LS

    drafted, real = hashlib.sha1(), LS.prepare_draft_tokens

    def spy(worker, batch):  # what the replay's corpus drafted, step by step (prepare_replay imports it per replay)
        tokens, mask = real(worker, batch)
        drafted.update(tokens.tobytes())
        drafted.update(mask.tobytes())
        return tokens, mask

    LS.prepare_draft_tokens = spy
    try:
        calls = nsr.record(sessions(), 4, 8)
    finally:
        LS.prepare_draft_tokens = real
    names = [n for n, _ in calls]
    assert names[0] == "init" and {"stage_batch", "index_async", "commit_staged", "step_layout", "finish"} <= set(names)
    one = nsr.run(calls, threads=1)
    again, two = nsr.run(calls, threads=1), nsr.run(calls, threads=2)
    assert one[2] == again[2] == two[2] == drafted.hexdigest()[:16]  # the corpus's own drafts, step for step
    steps = [n for n, _ in one[0]]
    assert len(steps) == names.count("step_layout") and max(steps) <= 4
    assert set(one[1]) >= {"index_staged", "step_layout"} and "index_async" not in one[1]
