import importlib.util
import json
import os
import random

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_agent_sessions_are_deterministic_and_well_formed():
    gen = _load("make_agent_sessions", "benchmark/workloads/make_agent_sessions.py")
    files = gen.stdlib_files(random.Random(3), 2)
    a = [gen.session(random.Random(1), i, p) for i, p in enumerate(files)]
    b = [gen.session(random.Random(1), i, p) for i, p in enumerate(files)]
    assert a == b
    for s in a:
        roles = [m["role"] for m in s["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        assert 10 <= roles.count("assistant") - 1 <= 30
        assert all(r1 != r2 for r1, r2 in zip(roles[2:], roles[3:]))  # assistant / observation alternate


def test_committed_replay_set_loads():
    d = json.load(open(os.path.join(ROOT, "benchmark/workloads/agent_sessions.json")))
    assert len(d["sessions"]) == 20


def test_acceptance_simulation_on_one_session():
    sim = _load("sim_draft_acceptance", "benchmark/workloads/sim_draft_acceptance.py")
    d = json.load(open(os.path.join(ROOT, "benchmark/workloads/agent_sessions.json")))
    r = sim.run(d["sessions"][:1], "suffix", batch=16, max_turn_tokens=60)
    assert r["tokens"] > 0 and r["steps"] <= r["tokens"]
    assert r["tokens_per_step"] >= 1.0
