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
    samples, steps = pr.replay(per_session, agents, 8, ("parts", "views"))
    assert len(samples["parts"]) == len(samples["views"]) == steps > 0
    # every decode step of a turn advances each running request by at least one token: no more steps than tokens
    assert steps <= sum(len(reply) for turns in per_session for _, reply in turns)
    assert [n for n, _, _ in samples["parts"]] == [n for n, _, _ in samples["views"]]
    assert max(n for n, _, _ in samples["parts"]) == agents
    rows = pr.rows(samples)
    assert {r["form"] for r in rows} == {"parts", "views"}
    assert all(r["prepare_ms"] >= 0 and r["steps"] > 0 for r in rows)
