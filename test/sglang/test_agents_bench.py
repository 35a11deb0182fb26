"""The concurrent-agents benchmark's client on CPU: deterministic sessions, history collapse, the
closed loop (each reply becomes the next assistant message) and the phase summary, against a fake
OpenAI endpoint."""
import importlib.util
import os
import threading

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load():
    spec = importlib.util.spec_from_file_location("agents_bench", os.path.join(ROOT, "benchmark/workloads/agents_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sessions_are_deterministic_and_varied():
    ab = load()
    a, b = ab.make_sessions(8, 10, seed=1), ab.make_sessions(8, 10, seed=1)
    assert a == b and ab.make_sessions(8, 10, seed=2) != a
    assert len({s["task"] for s in a}) > 1
    text = "\n".join(o for s in a for o in s["observations"])
    for marker in ("test session starts", "Traceback", "+++ b/", "\tdef ", "src/"):
        assert marker in text, marker


def test_collapse_replaces_the_oldest_observations_first():
    ab = load()
    count = lambda msgs: sum(len(m["content"]) for m in msgs)  # noqa: E731
    msgs = [dict(role="system", content="s" * 10), dict(role="user", content="task")]
    for i in range(6):
        msgs += [dict(role="assistant", content=f"a{i}"), dict(role="user", content=f"obs{i}\n" + "x" * 100)]
    out = ab.collapse(msgs, count, limit=400)
    assert count(out) <= 400 and out[:2] == msgs[:2] and out[-1] == msgs[-1]
    collapsed = [i for i, m in enumerate(out) if m["content"].startswith("Old environment output")]
    assert collapsed and collapsed == list(range(3, 3 + 2 * len(collapsed), 2))  # oldest first, observations only
    assert ab.collapse(msgs, count, limit=10 ** 6) == msgs


def test_closed_loop_with_concurrent_agents():
    ab = load()
    sessions = ab.make_sessions(6, 5, seed=0)
    seen, lock, active, peak = [], threading.Lock(), [0], [0]

    def send(url, msgs, max_tokens):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            seen.append([dict(m) for m in msgs])
        try:
            import time
            time.sleep(0.01)
            n = sum(m["role"] == "assistant" for m in msgs)
            return dict(choices=[dict(message=dict(content=f"reply {n} of {msgs[1]['content'][:20]}"))],
                        usage=dict(completion_tokens=7, prompt_tokens=100, prompt_tokens_details=dict(cached_tokens=60)))
        finally:
            with lock:
                active[0] -= 1

    count = lambda msgs: sum(len(m["content"]) // 4 for m in msgs)  # noqa: E731
    turns, wall = ab.run_phase("http://x", sessions, 3, 32, count, limit=10 ** 6, send=send)
    assert len(turns) == 6 * 5 and peak[0] == 3
    # the model's own replies came back as the assistant messages, in order
    last = max(seen, key=len)
    replies = [m["content"] for m in last if m["role"] == "assistant"]
    assert replies == [f"reply {i} of {last[1]['content'][:20]}" for i in range(4)]
    row = ab.summarize("cfg", 3, turns, wall, accept_length=2.5)
    assert row["turns"] == 30 and abs(row["cached_fraction"] - 0.6) < 1e-9 and row["accept_length"] == 2.5
    assert row["latency_p50"] <= row["latency_p95"] and row["tokens_per_s"] > 0
