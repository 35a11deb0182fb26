"""The concurrent-agents benchmark's client on CPU: deterministic sessions, history collapse, the
closed loop (each reply becomes the next assistant message) and the phase summary, against a fake
OpenAI endpoint."""
import importlib.util
import os
import threading

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load():
    spec = importlib.util.spec_from_file_location("agents_bench", os.path.join(ROOT, "benchmark/workloads/agents_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def serve_fakes(monkeypatch, ab, server, post):
    """Every server of an ``ab.main()`` run is ``server`` and every request goes to ``post`` (fake OpenAI endpoints);
    each configuration's flags end with its name (``--served-model-name``), so a fake server knows which it is."""
    import json

    import sglang_server as ss

    monkeypatch.setattr(ss, "sglang_server", server)
    monkeypatch.setattr(ss, "post", post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    real = ab.CONFIGS
    monkeypatch.setattr(ab, "CONFIGS", {k: v + ["--served-model-name", k] for k, v in real.items()})


def chat_reply(text):
    """A fake server's chat completion: ``text``, 3 completion tokens, 50 prompt tokens of which 25 cached."""
    return dict(choices=[dict(message=dict(content=text))],
                usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=25)))


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


def test_token_counts_are_the_tokenizers_and_computed_once_per_text(monkeypatch):
    """The client counts each message's tokens once (cached by its text): the same counts as encoding every message
    at every call, and the same collapsed histories."""
    ab = load()
    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    encode = Tokenizer.encode
    fresh = lambda msgs: sum(len(encode(tok, m["content"]).ids) + 4 for m in msgs)  # noqa: E731
    calls = []
    monkeypatch.setattr(Tokenizer, "encode",
                        lambda self, text, *a, **k: calls.append(text) or encode(self, text, *a, **k))
    count = ab.token_counter(model)
    for sess in ab.make_sessions(3, 8, seed=4):
        mine = theirs = [dict(role="system", content=sess["system"]), dict(role="user", content=sess["task"])]
        for obs in sess["observations"]:
            mine, theirs = ab.collapse(mine, count, 1500), ab.collapse(theirs, fresh, 1500)
            assert mine == theirs and count(mine) == fresh(theirs)
            mine = mine + [dict(role="assistant", content="ok"), dict(role="user", content="OBSERVATION:\n" + obs)]
            theirs = theirs + [dict(role="assistant", content="ok"), dict(role="user", content="OBSERVATION:\n" + obs)]
    assert any(m["content"].startswith("Old environment output") for m in mine)  # the limit was reached
    assert len(calls) == len(set(calls))  # no text encoded twice by the cached counter


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


def test_compare_counts_identical_turns_against_the_same_phase_of_no_speculation():
    ab = load()
    turns = lambda texts: [dict(session=s, turn=t, reply=x) for s, r in texts.items() for t, x in enumerate(r)]  # noqa: E731
    ref = ab.replies(turns({0: ["a", "b", "c"], 1: ["d", "e"]}))
    assert ref == {"0": ["a", "b", "c"], "1": ["d", "e"]}
    runs = {"none/1": ref, "none/8": ref,
            "lumotree/1": ab.replies(turns({0: ["a", "b", "c"], 1: ["d", "e"]})),
            "lumotree/8": ab.replies(turns({0: ["a", "X", "c"], 1: ["Y", "e", "extra"]}))}
    out = ab.compare(runs)
    assert set(out) == {"lumotree/1", "lumotree/8"}
    assert out["lumotree/1"] == dict(reference="none/1", identical_turns=5, turns=5, sessions_with_difference=0,
                                     first_difference=None)
    assert out["lumotree/8"] == dict(reference="none/8", identical_turns=3, turns=6, sessions_with_difference=2,
                                     first_difference=(1, 0))


def test_compare_details_the_first_difference_with_both_servers_cached_tokens():
    ab = load()
    mk = lambda texts, cached: [dict(session=s, turn=t, reply=x, prompt_tokens=100 * (t + 1),  # noqa: E731
                                     cached_tokens=cached[s][t], completion_tokens=len(x), latency=0.25 + 0.5 * t)
                                for s, r in texts.items() for t, x in enumerate(r)]
    ref = mk({0: ["abc", "def"], 1: ["g"]}, {0: [0, 90], 1: [0]})
    spec = mk({0: ["abc", "dXf"], 1: ["g"]}, {0: [0, 63], 1: [0]})
    runs = {"none/1": ab.replies(ref), "none/1" + ab.DETAILS: ab.details(ref),
            "lt/1": ab.replies(spec), "lt/1" + ab.DETAILS: ab.details(spec)}
    assert ab.details(ref) == {"0": [[100, 0, 3, 250.0], [200, 90, 3, 750.0]], "1": [[100, 0, 1, 250.0]]}
    out = ab.compare(runs)
    assert set(out) == {"lt/1"} and out["lt/1"]["first_difference"] == (0, 1)
    assert out["lt/1"]["first_difference_detail"] == dict(prompt_tokens=[200, 200], cached_tokens=[63, 90],
                                                          reply_common_prefix_chars=1)
    # without details (an older replies file) the comparison is as before
    out = ab.compare({k: v for k, v in runs.items() if ab.DETAILS not in k})
    assert "first_difference_detail" not in out["lt/1"]


def test_main_runs_every_configuration_and_phase_with_the_flags_given(tmp_path, monkeypatch):
    import contextlib
    import gzip
    import json
    import sys

    ab = load()
    import sglang_server as ss  # benchmark/serving, on the path the script set

    launched = []

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        launched.append((list(args), list(base_args), env))
        yield "http://x"

    flushed = []

    def fake_post(url, payload, timeout=600):
        if url.endswith("/flush_cache"):
            flushed.append(launched[-1][0][-1])
            return {}
        n = sum(m["role"] == "assistant" for m in payload["messages"])
        text = f"r{n}" if launched[-1][0][-1] == "none" or n < 2 else f"s{n}"  # speculative servers part at turn 2
        return dict(choices=[dict(message=dict(content=text))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=25)))

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", fake_post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    out, rep = tmp_path / "a.json", tmp_path / "r.json.gz"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "none,lumotree,lumotree-sync",
                                      "--agents", "1,2", "--sessions", "3", "--turns", "4", "--tag=-exact",
                                      "--extra=--enable-deterministic-inference", "--env", "A=1",
                                      "--out", str(out), "--replies-out", str(rep)])
    # mark each launch so the fake endpoint knows which server it is
    real = ab.CONFIGS
    monkeypatch.setattr(ab, "CONFIGS", {k: v + ["--served-model-name", k] for k, v in real.items()})
    ab.main()
    res = json.load(open(out))
    assert [(r["config"], r["agents"], r["turns"]) for r in res["rows"]] == [
        ("none-exact", 1, 12), ("none-exact", 2, 12), ("lumotree-exact", 1, 12), ("lumotree-exact", 2, 12),
        ("lumotree-sync-exact", 1, 12), ("lumotree-sync-exact", 2, 12)]
    assert all("--enable-deterministic-inference" in b for _, b, env in launched)
    assert all("--disable-piecewise-cuda-graph" in b for _, b, env in launched)  # as the recorded runs
    # --env for every server, and each server's own empty JIT caches (--jit-cache fresh, the default)
    import sglang_server

    jit = sglang_server.JIT_CACHES
    assert [{k: v for k, v in env.items() if k not in jit} for _, _, env in launched] == [{"A": "1"}] * 3
    assert len({env["TRITON_CACHE_DIR"] for _, _, env in launched}) == 3
    assert {s["jit_cache"] for s in res["servers"].values()} == {"fresh"}
    assert [("--disable-overlap-schedule" in a) for a, _, _ in launched] == [False, False, True]
    # each server warmed up on other sessions (not in the rows: 12 measured turns per phase), then flushed, and
    # flushed again before its second level
    assert flushed == ["none", "none", "lumotree", "lumotree", "lumotree-sync", "lumotree-sync"]
    assert all("warmup_s" in s for s in res["servers"].values())
    assert res["parity"]["lumotree-exact/1"]["identical_turns"] == 6  # turns 0-1 of 3 sessions
    assert res["parity"]["lumotree-exact/2"]["first_difference"] == [0, 2]  # (session, turn), through JSON
    phases = {"none-exact/1", "none-exact/2", "lumotree-exact/1", "lumotree-exact/2", "lumotree-sync-exact/1",
              "lumotree-sync-exact/2"}
    assert set(json.load(gzip.open(rep, "rt"))) == phases | {k + ab.DETAILS for k in phases}
    assert "first_difference_detail" in res["parity"]["lumotree-exact/2"]


def test_prefill_graphs_serves_with_sglang_s_default_prefill_cuda_graphs(tmp_path, monkeypatch):
    import contextlib
    import json
    import sys

    ab = load()
    import sglang_server as ss

    launched = []

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        launched.append(list(base_args))
        yield "http://x"

    def fake_post(url, payload, timeout=600):
        return chat_reply("r")

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", fake_post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "none", "--agents", "1",
                                      "--sessions", "1", "--turns", "2", "--warmup-sessions", "0", "--prefill-graphs",
                                      "--out", str(tmp_path / "a.json")])
    ab.main()
    assert len(launched) == 1 and "--disable-piecewise-cuda-graph" not in launched[0]
    assert "--enable-cache-report" in launched[0]


def test_aborted_turns_are_sent_twice_and_recorded():
    """--abort-every: the chosen turns are first sent with a request id and aborted, then sent again; the
    record is the second answer's."""
    ab = load()
    sessions = ab.make_sessions(2, 4, seed=0)
    sent, aborted, lock = [], [], threading.Lock()

    def send(url, msgs, max_tokens, rid=None):
        with lock:
            sent.append((sum(m["role"] == "assistant" for m in msgs), rid))
        reason = "abort" if rid is not None else "length"
        return dict(choices=[dict(message=dict(content="x"), finish_reason=reason)],
                    usage=dict(completion_tokens=3, prompt_tokens=10))

    turns, _ = ab.run_phase("http://x", sessions, 2, 8, lambda m: 10, 10 ** 6, send=send, abort_every=3,
                            abort_after_s=0.0, abort=lambda rid: aborted.append(rid))
    chosen = {(int(s["id"]), t) for s in sessions for t in range(len(s["observations"])) if (int(s["id"]) + t) % 3 == 2}
    assert sorted((int(t["session"]), t["turn"]) for t in turns if t["aborted"] is not None) == sorted(chosen)
    assert all(t["aborted"] is True for t in turns if t["aborted"] is not None)
    assert len(aborted) == len(chosen) == sum(rid is not None for _, rid in sent)
    assert len(sent) == len(turns) + len(chosen)
    row = ab.summarize("c", 2, turns, 1.0)
    assert row["aborted_turns"] == row["aborts_mid_run"] == len(chosen)


def test_profile_dir_profiles_one_more_session_per_level_after_the_measured_phases(tmp_path, monkeypatch):
    import contextlib
    import json
    import sys

    ab = load()
    import sglang_server as ss

    calls = []

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        yield "http://x"

    def fake_post(url, payload, timeout=600):
        if url.endswith("/start_profile"):
            calls.append(("profile", payload["num_steps"], payload["output_dir"], payload["with_stack"]))
            if payload["output_dir"].endswith("ngram-1"):  # this level's profiler stops itself: its trace is there
                open(os.path.join(payload["output_dir"], "ngram-1-TP-0.trace.json.gz"), "w").close()
            return {}
        if url.endswith("/stop_profile"):  # a profiler that stopped itself: SGLang answers 500
            calls.append(("stop",))
            return {}
        if url.endswith("/flush_cache"):
            return {}
        calls.append(("turn", payload["messages"][1]["content"][:40]))
        return dict(choices=[dict(message=dict(content="x"))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=0)))

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", fake_post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    out, prof = tmp_path / "a.json", tmp_path / "prof"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "ngram", "--agents", "1,2",
                                      "--sessions", "2", "--turns", "2", "--warmup-sessions", "0", "--profile-dir",
                                      str(prof), "--profile-steps", "7", "--out", str(out)])
    ab.main()
    starts = [i for i, c in enumerate(calls) if c[0] == "profile"]
    stops = [i for i, c in enumerate(calls) if c[0] == "stop"]
    # after both measured phases (2 sessions x 2 turns each), per level: the profiler, that level's sessions, and a
    # stop (a trace is written only when the profiler stops: sessions shorter than its steps would leave none) --
    # none where the profiler already wrote its trace (level 1: it stopped itself; a stop would be refused)
    assert starts == [8, 11] and stops == [16] and len(calls) == 8 + 1 + 2 + 1 + 4 + 1
    assert calls[8][1:] == (7, str(prof / "ngram-1"), True) and calls[11][2] == str(prof / "ngram-2")
    assert json.load(open(out))["servers"]["ngram"]["profiles"] == {"1": str(prof / "ngram-1"), "2": str(prof / "ngram-2")}


def test_resume_keeps_the_finished_configurations_and_runs_the_rest(tmp_path, monkeypatch):
    import contextlib
    import json
    import sys

    ab = load()

    launched, fail = [], {"ngram"}

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        name = args[-1]
        launched.append(name)
        if name in fail:
            raise RuntimeError("server did not start")
        yield "http://x"

    def fake_post(url, payload, timeout=600):
        if url.endswith("/flush_cache"):
            return {}
        return dict(choices=[dict(message=dict(content=f"{launched[-1]}-{len(payload['messages'])}"))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=0)))

    serve_fakes(monkeypatch, ab, fake_server, fake_post)
    import sglang_server as ss

    here = ["GPU-a"]
    monkeypatch.setattr(ss, "machine", lambda: here[0])
    out, rep = tmp_path / "a.json", tmp_path / "r.json.gz"
    argv = ["agents_bench.py", "--model", str(tmp_path), "--configs", "none,ngram", "--agents", "1,2", "--sessions", "2",
            "--turns", "2", "--warmup-sessions", "0", "--out", str(out), "--replies-out", str(rep), "--resume"]
    monkeypatch.setattr(sys, "argv", argv)
    ab.main()
    first = json.load(open(out))
    assert "error" in first["servers"]["ngram"] and [r["config"] for r in first["rows"]] == ["none", "none"]
    fail.clear()
    ab.main()  # the same command again: none is kept, ngram runs
    res = json.load(open(out))
    assert launched == ["none", "ngram", "ngram"]
    assert [(r["config"], r["agents"]) for r in res["rows"]] == [("none", 1), ("none", 2), ("ngram", 1), ("ngram", 2)]
    assert res["rows"][:2] == first["rows"] and "error" not in res["servers"]["ngram"]
    assert res["parity"]["ngram/2"]["turns"] == 4  # against the kept no-speculation replies
    assert {s["machine"] for s in res["servers"].values()} == {"GPU-a"}
    here[0] = "GPU-b"  # the same command on another machine: nothing is kept, both run again there
    ab.main()
    assert launched == ["none", "ngram", "ngram", "none", "ngram"]
    assert {s["machine"] for s in json.load(open(out))["servers"].values()} == {"GPU-b"}
    here[0] = "GPU-c"  # unless the run compares replies, not speeds: the same command with the flag keeps them
    monkeypatch.setattr(sys, "argv", argv + ["--resume-across-machines"])
    ab.main()
    assert launched == ["none", "ngram", "ngram", "none", "ngram"]
    assert {s["machine"] for s in json.load(open(out))["servers"].values()} == {"GPU-b"}
    monkeypatch.setattr(sys, "argv", argv[:-1] + ["--agents", "1", "--resume"])
    with pytest.raises(SystemExit, match="another command"):
        ab.main()


def test_draft_timing_turns_the_timer_on_in_every_server_and_reads_it_from_the_logs(tmp_path, monkeypatch):
    import contextlib
    import json
    import sys

    ab = load()
    import sglang_server as ss

    envs = []

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        envs.append(dict(env or {}))
        yield "http://x"

    def fake_post(url, payload, timeout=600):
        if url.endswith("/flush_cache"):
            return {}
        return dict(choices=[dict(message=dict(content="x"))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=0)))

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", fake_post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    (tmp_path / "agents-ngram.log").write_text(
        "[t] LumoTree draft timing: batch bucket 8: median 0.700 ms, p95 1.200 ms over 64 steps\n")
    out = tmp_path / "a.json"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "ngram", "--agents", "1",
                                      "--sessions", "1", "--turns", "1", "--warmup-sessions", "0", "--draft-timing",
                                      "--log-dir", str(tmp_path), "--out", str(out)])
    ab.main()
    assert envs[0]["LUMOTREE_BENCH_DRAFT_TIMING"] == "1"
    assert json.load(open(out))["servers"]["ngram"]["draft_timing"] == {"8": dict(median_ms=0.7, p95_ms=1.2, steps=64)}


def test_warm_up_runs_each_level_at_its_concurrency(tmp_path, monkeypatch):
    """Before the measured phases each server serves K other sessions at once at every level K (at most
    --warmup-sessions): the batch sizes the phases meet compile there (with 2 sessions at every level, SGLang's
    prefill and cache kernels compiled 3.4 s inside a measured 8-agent phase, --jit-log on the H200)."""
    import contextlib
    import json
    import sys

    ab = load()
    import sglang_server as ss

    calls = []

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        yield "http://x"

    def fake_phase(url, sessions, agents, *a, **k):
        calls.append((len(sessions), agents))
        return [], 1.0

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", lambda *a, **k: {})
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    monkeypatch.setattr(ab, "run_phase", fake_phase)
    monkeypatch.setattr(ab, "summarize", lambda *a: dict(config=a[0], agents=a[1]))
    monkeypatch.setattr(ab, "replies", lambda turns: [])
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "none", "--agents",
                                      "1,3,8", "--sessions", "8", "--turns", "2", "--warmup-sessions", "4",
                                      "--log-dir", str(tmp_path), "--out", str(tmp_path / "a.json")])
    ab.main()
    warm, measured = calls[:3], calls[3:]
    assert warm == [(1, 1), (3, 3), (4, 4)]
    assert measured == [(8, 1), (8, 3), (8, 8)]


def _fake_servers(monkeypatch, ab, events, run_phase):
    """Every server a fake whose /flush_cache appends "flush" to ``events`` (a chat request: "turn"), and
    ``run_phase`` in place of the script's."""
    import contextlib
    import json

    import sglang_server as ss

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        yield "http://x"

    def fake_post(url, payload, timeout=600):
        if url.endswith("/flush_cache"):
            events.append("flush")
            return {}
        events.append("turn")
        return chat_reply("r")

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", fake_post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    monkeypatch.setattr(ab, "run_phase", run_phase)
    return fake_post


def test_repeats_run_each_phase_again_from_a_flushed_cache_and_report_the_median_run(tmp_path, monkeypatch):
    import json
    import sys

    ab = load()
    events = []
    walls = iter([5.0, 1.0, 3.0])  # the three runs' wall times: 3 s is the median run

    def fake_run_phase(url, sessions, agents, *a, **kw):
        turns = [dict(session=0, turn=0, latency=0.1, prompt_tokens=50, cached_tokens=25, completion_tokens=30,
                      reply="r")]
        fake_post(url + "/v1/chat/completions", dict(messages=[]))
        return turns, next(walls)

    fake_post = _fake_servers(monkeypatch, ab, events, fake_run_phase)
    import sglang_server as ss

    accepts = iter([2.0, 3.0, 4.0])  # the server's average read after each run (each run's own: flushed before it)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(
        dict(internal_states=[dict(avg_spec_accept_length=next(accepts))])).encode())
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "none", "--agents", "1",
                                      "--sessions", "1", "--turns", "1", "--warmup-sessions", "0", "--repeats", "3",
                                      "--out", str(tmp_path / "a.json")])
    ab.main()
    assert events == ["turn", "flush", "turn", "flush", "turn"]
    (row,) = json.load(open(tmp_path / "a.json"))["rows"]
    assert row["repeats"] == [6.0, 30.0, 10.0] and row["tokens_per_s"] == 10.0 and row["seconds"] == 3.0
    assert row["accept_length"] == 4.0  # the median run's
    monkeypatch.setattr(sys, "argv", sys.argv[:-3] + ["0", "--out", str(tmp_path / "b.json")])
    with pytest.raises(SystemExit):
        ab.main()


def test_repeats_keep_every_runs_tail_and_the_tail_of_all_their_turns():
    """The median-speed run's row, and beside it each run's p95 turn latency and the p95 over all runs' turns: a tail
    that one run's few slowest turns would hide or show."""
    ab = load()

    def turns(lats):
        return [dict(session=i, turn=0, latency=x, prompt_tokens=10, cached_tokens=5, completion_tokens=10, reply="r")
                for i, x in enumerate(lats)]

    phases = [(turns([0.1] * 20), 4.0),                 # 50 tokens/s, p95 0.1
              (turns([0.1] * 18 + [0.9, 0.9]), 2.0),    # 100 tokens/s (the median run), p95 0.9
              (turns([0.3] * 20), 1.0)]                 # 200 tokens/s, p95 0.3
    row = ab.repeated("none", 8, phases)
    assert row["tokens_per_s"] == 100.0 and row["latency_p95"] == 0.9
    assert row["repeats"] == [50.0, 100.0, 200.0]
    assert row["repeats_latency_p95"] == [0.1, 0.9, 0.3]
    assert row["latency_p95_all"] == 0.3  # 60 turns: 38 of 0.1, 20 of 0.3, 2 of 0.9 -> the 57th is 0.3
    text = ab.markdown(dict(rows=[row]))
    assert "none 0.100 / 0.900 / 0.300; 0.300" in text
    assert "repeats_latency_p95" not in ab.repeated("none", 8, phases[:1])


def test_a_run_stopped_between_repeats_keeps_a_partial_row_that_resume_runs_again(tmp_path, monkeypatch):
    """Each repeat but the last is saved as it stands (``partial``); a run that stops after the first of three repeats
    leaves that row, marked and listed in the tables, and --resume does not keep the configuration."""
    import json
    import sys

    ab = load()
    events, walls = [], iter([2.0])

    def fake_run_phase(url, sessions, agents, *a, **kw):
        fake_post(url + "/v1/chat/completions", dict(messages=[]))
        wall = next(walls, None)
        if wall is None:
            raise KeyboardInterrupt  # the run is stopped in its second repeat
        return [dict(session=0, turn=0, latency=0.1, prompt_tokens=50, cached_tokens=25, completion_tokens=30,
                     reply="r")], wall

    fake_post = _fake_servers(monkeypatch, ab, events, fake_run_phase)
    argv = ["agents_bench.py", "--model", str(tmp_path), "--configs", "none", "--agents", "1", "--sessions", "1",
            "--turns", "1", "--warmup-sessions", "0", "--repeats", "3", "--out", str(tmp_path / "a.json"), "--resume"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(KeyboardInterrupt):
        ab.main()
    res = json.load(open(tmp_path / "a.json"))
    (row,) = res["rows"]
    assert row["partial"] == "1 of 3 repeats" and row["tokens_per_s"] == 15.0
    assert "none at 1 (1 of 3 repeats)" in ab.markdown(res)
    assert not (tmp_path / "a.json.tmp").exists()
    walls = iter([1.0, 1.0, 1.0])
    ab.main()  # resumed: the partial configuration runs again, in full
    (row,) = json.load(open(tmp_path / "a.json"))["rows"]
    assert "partial" not in row and len(row["repeats"]) == 3


def test_each_level_serves_sessions_of_its_own_from_a_flushed_server(tmp_path, monkeypatch):
    """A drafter's corpus lives until /flush_cache and the greedy model repeats its replies: a level that replayed an
    earlier level's sessions without a flush would draft from memory. Each level gets its own sessions (the same for
    every server; the first level --seed's) and every measured phase starts from a flush; repeats serve their level's
    sessions again."""
    import json
    import sys

    ab = load()
    events = []

    def fake_run_phase(url, sessions, agents, *a, **kw):
        events.append((agents, tuple(s["task"] for s in sessions)))
        return [dict(session=0, turn=0, latency=0.1, prompt_tokens=50, cached_tokens=25, completion_tokens=30,
                     reply="r")], 1.0

    _fake_servers(monkeypatch, ab, events, fake_run_phase)
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "none,lumotree-suffix",
                                      "--agents", "1,4", "--sessions", "4", "--turns", "2", "--warmup-sessions", "0",
                                      "--repeats", "2", "--seed", "7", "--out", str(tmp_path / "a.json"), "--resume"])
    ab.main()
    first = [ab.make_sessions(4, 2, 7), ab.make_sessions(4, 2, 8)]
    t1, t4 = (tuple(s["task"] for s in ss_) for ss_ in first)
    assert t1 != t4
    per_server = [(1, t1), "flush", (1, t1), "flush", (4, t4), "flush", (4, t4)]
    assert events == per_server * 2  # the same phases for both servers, each after a flush but the server's first
    res = json.load(open(tmp_path / "a.json"))
    assert res["session_seeds"] == {"1": 7, "4": 8}
    # a file written before (without these seeds) is not resumed: its later levels replayed the first's sessions
    del res["session_seeds"]
    json.dump(res, open(tmp_path / "a.json", "w"))
    events.clear()
    ab.main()
    assert events == per_server * 2
    events.clear()
    ab.main()  # the file of now is resumed
    assert events == []


def _row(config, agents, tps, acc=None):
    return dict(config=config, agents=agents, tokens_per_s=tps, latency_p50=0.5, latency_p95=1.0, accept_length=acc)


def test_markdown_gives_no_ratio_between_servers_of_different_machines(monkeypatch):
    ab = load()
    rows = [_row("none", 1, 500.0), _row("lumotree-suffix", 1, 1200.0, 8.0), _row("ngram", 1, 900.0, 5.0)]
    one = dict(rows=rows, servers={n: dict(machine="GPU-a") for n in ("none", "lumotree-suffix", "ngram")})
    lines = ab.markdown(one).splitlines()
    assert "| lumotree-suffix | 1200 (2.40x) | 0.50 / 1.00 | 8.00 |" in lines
    assert not any("machines" in ln for ln in lines)
    two = dict(rows=rows, servers=dict(one["servers"], ngram=dict(machine="GPU-b")))  # a --resume on a fresh machine
    lines = ab.markdown(two).splitlines()
    assert lines[0] == ("(the servers ran on 2 machines -- 1: none, lumotree-suffix; 2: ngram -- so no ratio is given "
                        "between servers of different machines)")
    assert "| ngram | 900 (other machine) | 0.50 / 1.00 | 5.00 |" in lines
    assert "| lumotree-suffix | 1200 (2.40x) | 0.50 / 1.00 | 8.00 |" in lines
    # the host probe each server recorded (sglang_server.host_speed): one line
    probed = dict(rows=rows, servers={n: dict(machine="GPU-a", host=dict(python_ms=20.0 + i, torch_ms=5.0))
                                      for i, n in enumerate(("none", "ngram"))})
    assert ("Host probe before each server started, ms (a Python loop / 2,000 small torch CPU ops): none 20.0 / 5.0; "
            "ngram 21.0 / 5.0") in ab.markdown(probed).splitlines()
    # servers recorded before machines were: as before
    plain = ab.markdown(dict(rows=rows, servers={})).splitlines()
    assert plain[5] == "| lumotree-suffix | 1200 (2.40x) | 0.50 / 1.00 | 8.00 |"
    # where the machine comes from (sglang_server.machine): the GPUs' UUIDs, else the boot id
    import subprocess

    import sglang_server as ss

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "GPU-1\nGPU-2\n", ""))
    assert ss.machine() == "GPU-1,GPU-2"

    def no_smi(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    got = ss.host_speed(repeats=1)
    assert set(got) == {"python_ms", "torch_ms"} and all(v > 0 for v in got.values())
    monkeypatch.setattr(subprocess, "run", no_smi)
    got = ss.machine()
    assert got.startswith("boot ") or got == "unknown"


def test_markdown_tables_relate_each_row_to_the_server_without_speculation_of_its_tag_and_level():
    ab = load()
    res = dict(rows=[_row("none", 8, 2000.0), _row("lumotree-suffix", 8, 3000.0, 7.0), _row("none-exact", 8, 1000.0),
                     _row("lumotree-suffix-nodraft-exact", 8, 900.0, 1.0), _row("ngram", 1, 500.0, 5.0)],
               servers={"none": dict(step_timing={"step": {"8": dict(median_ms=1.6)}, "launch": {"8": dict(median_ms=1.1)}}),
                        "ngram": dict(step_timing={"step": {"1": dict(median_ms=3.0)}, "launch": {}})})
    text = ab.markdown(res)
    lines = text.splitlines()
    assert "| lumotree-suffix | 3000 (1.50x) | 0.50 / 1.00 | 7.00 |" in lines
    assert "| lumotree-suffix-nodraft-exact | 900 (0.90x) | 0.50 / 1.00 | 1.00 |" in lines  # against none-exact
    assert "| none | 2000 | 0.50 / 1.00 | - |" in lines
    assert "| ngram | 500 | 0.50 / 1.00 | 5.00 |" in lines  # no reference at its level: no ratio
    assert lines.index("1 agent:") < lines.index("8 agents:")
    assert "| server | 1 | 8 |" in lines
    assert "| none | - | 1.60 / 1.10 |" in lines and "| ngram | - | - |" in lines
    assert not any(ln.startswith("| none: ") for ln in lines)
    res["servers"]["none"]["step_timing"]["forward"] = {"8": dict(median_ms=0.9)}
    assert "| none: forward | - | 0.90 |" in ab.markdown(res).splitlines()
    assert "step_timing" not in ab.markdown(dict(rows=res["rows"], servers={})) and "--step-timing" not in \
        ab.markdown(dict(rows=res["rows"], servers={}))
    res["servers"]["none"]["step_totals"] = {"warm-up": {"decode": dict(seconds=9.0, intervals=9)},
                                             "8 agents": {"decode": dict(seconds=2.5, intervals=1000),
                                                          "prefill": dict(seconds=4.0, intervals=200)}}
    lines = ab.markdown(res).splitlines()
    assert "Scheduler time in the measured phase (8 agents; --step-timing): seconds (intervals)" in lines
    assert "| none | 2.50 (1000) | 4.00 (200) | - | - |" in lines and "| ngram | - | - | - | - |" not in lines
    assert not any("warm-up" in ln for ln in lines)
    assert not any(ln.startswith("Inside those intervals") for ln in lines)  # no parts logged: no table
    res["servers"]["none"]["step_totals"]["8 agents"].update(
        prefill_schedule=dict(seconds=0.5, intervals=200), prefill_launch=dict(seconds=2.0, intervals=200),
        prefill_result=dict(seconds=1.0, intervals=150), prefill_input=dict(seconds=0.25, intervals=10),
        prefill_forward=dict(seconds=1.5, intervals=200))
    lines = ab.markdown(res).splitlines()
    assert lines[lines.index("| server: kind | " + " | ".join(ab.INTERVAL_PARTS) + " | rest |") + 2] == \
        "| none: prefill | 0.50 | 0.25 | 2.00 | - | - | 1.50 | - | - | - | - | - | 1.00 | 0.25 |"  # rest 4.0 - 3.75
    assert not any(ln.startswith("| none: decode |") for ln in lines)
    assert not any(ln.startswith("Sections inside") for ln in lines)  # no section logged: no table
    res["servers"]["none"]["step_totals"]["8 agents"].update(prefill_model=dict(seconds=1.25, intervals=200),
                                                            decode_event_sync=dict(seconds=0.5, intervals=90))
    lines = ab.markdown(res).splitlines()
    assert "| server: kind | model | event_sync |" in lines
    assert "| none: decode | - | 0.50 |" in lines and "| none: prefill | 1.25 | - |" in lines
    assert not any(ln.startswith("Prompt tokens") for ln in lines)  # none logged: no line
    res["servers"]["none"]["step_totals"]["8 agents"]["prefill_tokens"] = dict(tokens=500_000, intervals=200)
    lines = ab.markdown(res).splitlines()
    assert ("Prompt tokens the prefill intervals computed, and the target's forward (the model section) per 1,000 of "
            "them: none 500,000, 2.50 ms") in lines  # 1.25 s over 500 thousand tokens
    assert "| server: kind | model | event_sync |" in lines  # not a section: no column of its own


def test_render_prints_a_run_of_a_file_of_runs_and_refuses_a_missing_one(tmp_path, monkeypatch, capsys):
    import json
    import sys

    ab = load()
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(dict(runs=[dict(name="a", rows=[_row("none", 32, 4000.0)], servers={})])))
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--render", f"{path}:a"])
    ab.main()
    assert "| none | 4000 | 0.50 / 1.00 | - |" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--render", f"{path}:b"])
    with pytest.raises(SystemExit):
        ab.main()
    assert "no run 'b'" in capsys.readouterr().err


def test_lanes_serve_configurations_at_once_each_with_its_port_and_memory_share(tmp_path, monkeypatch):
    """--lanes 2: two servers at a time on the GPU, each on its own port with half the memory fraction; the rows come
    in the command's order and the parity against no speculation is the same as one server at a time."""
    import contextlib
    import json
    import sys
    import time

    ab = load()

    lock, live, peak, launched = threading.Lock(), {}, [0], []

    @contextlib.contextmanager
    def fake_server(model, args, port=30000, base_args=(), env=None, **kw):
        name = args[-1]
        with lock:
            assert port not in live.values(), "two live servers on one port"
            live[name] = port
            peak[0] = max(peak[0], len(live))
            launched.append((name, port, list(base_args)))
        time.sleep(0.05)
        try:
            yield f"http://x:{port}/{name}"
        finally:
            with lock:
                del live[name]

    def fake_post(url, payload, timeout=600):
        if url.endswith("/flush_cache"):
            return {}
        server = url.split("/")[3]
        n = sum(m["role"] == "assistant" for m in payload["messages"])
        text = f"r{n}" if server == "none" or n < 2 else f"s{n}"  # the others part from no speculation at turn 2
        time.sleep(0.002)
        return dict(choices=[dict(message=dict(content=text))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=25)))

    serve_fakes(monkeypatch, ab, fake_server, fake_post)
    out = tmp_path / "a.json"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs",
                                      "none,lumotree-suffix,ngram,lumotree",
                                      "--agents", "1,2", "--sessions", "3", "--turns", "4", "--lanes", "2",
                                      "--warmup-sessions", "0", "--log-dir", str(tmp_path), "--out", str(out)])
    ab.main()
    res = json.load(open(out))
    assert peak[0] == 2 and res["lanes"] == 2
    assert {p for _, p, _ in launched} <= {30000, 30010}
    # fixed pools per lane (SGLang's fraction is of the memory free at each start: concurrent starts race)
    assert all(b[b.index("--mem-fraction-static") + 1] == "0.85" and b[b.index("--max-total-tokens") + 1] ==
               str(ab.LANE_TOKENS) and b[b.index("--max-mamba-cache-size") + 1] == str(ab.LANE_STATES)
               for _, _, b in launched)
    assert [(r["config"], r["agents"]) for r in res["rows"]] == [
        ("none", 1), ("none", 2), ("lumotree-suffix", 1), ("lumotree-suffix", 2), ("ngram", 1), ("ngram", 2),
        ("lumotree", 1), ("lumotree", 2)]
    assert res["parity"]["lumotree-suffix/1"]["identical_turns"] == res["parity"]["ngram/2"]["identical_turns"] == 6
    assert set(res["servers"]) == {"none", "lumotree-suffix", "ngram", "lumotree"}
    assert "--lanes 2" in ab.markdown(res)


def test_take_turns_starts_the_servers_at_once_and_serves_one_at_a_time_round_robin(tmp_path, monkeypatch):
    """--lanes 3 --take-turns: the three servers are up together, but requests reach one server at a time: the
    warm-ups first, then each level's repeats in turn over the servers (A1 B1 C1 A2 B2 C2); a server that fails to
    start gives up its turns and the others still finish."""
    import contextlib
    import json
    import sys
    import time

    ab = load()
    lock, live, peak, busy, seen = threading.Lock(), set(), [0], {}, []

    @contextlib.contextmanager
    def fake_server(model, args, port=30000, base_args=(), env=None, **kw):
        name = args[-1]
        if name == "lumotree":
            raise RuntimeError("server did not start")
        with lock:
            live.add(name)
            peak[0] = max(peak[0], len(live))
        time.sleep(0.1)  # every server is up before any turn is over
        try:
            yield f"http://x:{port}/{name}"
        finally:
            with lock:
                live.discard(name)

    def fake_post(url, payload, timeout=600):
        server = url.split("/")[3]
        if url.endswith("/flush_cache"):
            with lock:
                seen.append((server, "flush"))
            return {}
        with lock:
            busy[server] = busy.get(server, 0) + 1
            assert sum(1 for v in busy.values() if v) == 1, f"two servers served at once: {busy}"
            if not seen or seen[-1] != (server, "turn"):
                seen.append((server, "turn"))
        time.sleep(0.001)
        with lock:
            busy[server] -= 1
        n = sum(m["role"] == "assistant" for m in payload["messages"])
        return dict(choices=[dict(message=dict(content=f"r{n}"))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=25)))

    serve_fakes(monkeypatch, ab, fake_server, fake_post)
    out = tmp_path / "a.json"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs",
                                      "none,lumotree,lumotree-suffix,ngram", "--agents", "2", "--sessions", "2",
                                      "--turns", "3", "--repeats", "2", "--lanes", "4", "--take-turns",
                                      "--warmup-sessions", "1", "--log-dir", str(tmp_path), "--out", str(out)])
    ab.main()
    res = json.load(open(out))
    assert peak[0] == 3 and res["take_turns"] is True
    assert "error" in res["servers"]["lumotree"]
    assert [(r["config"], len(r["repeats"])) for r in res["rows"]] == [
        ("none", 2), ("lumotree-suffix", 2), ("ngram", 2)]
    order = [s for s, what in seen if what == "turn"]  # each server's stretch of requests, in the order served
    # (the warm-up's flush ends its turn; the first repeat of the level starts without one)
    assert order == ["none", "lumotree-suffix", "ngram"] * 3
    assert "--take-turns" in ab.markdown(res)


def test_take_turns_needs_lanes(tmp_path, monkeypatch):
    import sys

    ab = load()
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--take-turns",
                                      "--out", str(tmp_path / "a.json")])
    with pytest.raises(SystemExit):
        ab.main()


def test_the_clients_own_time_between_a_reply_and_the_next_send_is_measured():
    """Each turn after a session's first records the agent's own time from the last reply to this send (its history
    collapse's token counts, the request built); the row gives its median and p95 in ms."""
    import time

    ab = load()
    sessions = ab.make_sessions(2, 4, seed=0)

    def slow_count(msgs):
        time.sleep(0.02)  # the client's work before each send
        return 0

    def send(url, msgs, max_tokens):
        return dict(choices=[dict(message=dict(content="ok"))],
                    usage=dict(completion_tokens=1, prompt_tokens=10, prompt_tokens_details=dict(cached_tokens=0)))

    turns, wall = ab.run_phase("http://x", sessions, 2, 8, slow_count, limit=10 ** 6, send=send)
    firsts = [t for t in turns if t["turn"] == 0]
    assert all(t["client_s"] is None for t in firsts)
    assert all(t["client_s"] >= 0.02 for t in turns if t["turn"] > 0)
    row = ab.summarize("cfg", 2, turns, wall)
    assert 20.0 <= row["client_ms_p50"] <= row["client_ms_p95"]
    assert "Client time between a reply and the next send" in ab.markdown(dict(rows=[row]))


def test_messages_at_rebuilds_the_prompt_each_turn_sent_from_the_replies_before_it():
    """The margin queries ask a turn again: its prompt, rebuilt from the earlier replies through the same collapse,
    is the one the closed loop sent."""
    ab = load()
    sessions = ab.make_sessions(3, 6, seed=1)
    seen, lock = {}, threading.Lock()

    def send(url, msgs, max_tokens):
        n = sum(m["role"] == "assistant" for m in msgs)
        with lock:
            seen[(msgs[1]["content"], n)] = [dict(m) for m in msgs]
        return dict(choices=[dict(message=dict(content=f"reply {n} {len(msgs)}"))], usage={})

    count = lambda msgs: sum(len(m["content"]) // 4 for m in msgs)  # noqa: E731
    turns, _ = ab.run_phase("http://x", sessions, 2, 8, count, limit=1500, send=send)
    rep = ab.replies(turns)
    collapsed = 0
    for s in sessions:
        for t in range(6):
            msgs = ab.messages_at(s, rep[str(s["id"])][:t], count, 1500)
            assert msgs == seen[(s["task"], t)]
            collapsed += any(m["content"].startswith("Old environment output") for m in msgs)
    assert collapsed > 0  # the limit collapsed some histories: the rebuild follows the collapse too
    with pytest.raises(ValueError, match="6 turns"):
        ab.messages_at(sessions[0], ["x"] * 6, count, 1500)


def _logprob_reply(tokens, seconds):
    """A chat answer with per-token top-2 log-probabilities: ``tokens`` chosen, ``seconds`` the runner-up each."""
    content = [dict(token=t, logprob=-0.1 * (i + 1), top_logprobs=[dict(token=t, logprob=-0.1 * (i + 1)),
                                                                   dict(token=u, logprob=-0.1 * (i + 1) - 0.05 * i)])
               for i, (t, u) in enumerate(zip(tokens, seconds))]
    return dict(choices=[dict(message=dict(content="".join(tokens)), logprobs=dict(content=content))])


def test_first_token_margin_is_the_reference_s_top_two_gap_where_the_reply_parts():
    ab = load()
    asked = []

    def send(body):
        asked.append(body)
        return _logprob_reply(["def", " f", "(x", "):"], ["class", " g", "(y", ")"])

    m = ab.first_token_margin("http://ref", [dict(role="user", content="q")], "def f(y): pass", 16, send=send)
    assert asked[0]["logprobs"] is True and asked[0]["top_logprobs"] == 2 and asked[0]["temperature"] == 0
    assert m["token_index"] == 2 and m["token"] == "(x" and m["second"] == "(y" and m["took_second"]
    assert m["margin"] == pytest.approx(0.1)  # -0.3 against -0.3 - 0.1
    m = ab.first_token_margin("http://ref", [], "def f(z", 16, send=send)
    assert m["token_index"] == 2 and not m["took_second"]
    m = ab.first_token_margin("http://ref", [], "def f(x): and more", 16, send=send)
    assert m["token_index"] is None and m["margin"] is None  # the regenerated reply never parts from it


def test_margins_serve_the_reference_last_and_ask_it_at_each_differing_session_s_first_difference(
        tmp_path, monkeypatch):
    """--margins: the no-speculation server is queued after the others (here with two lanes, the others first) and,
    kept up until every other server has finished, answers the first differing turn of each differing session; the
    result and its table carry the margins. (Which lane enters its server first is the threads' race: a lane freed
    early may start the reference while another lane's server is still serving, so the order asserted is that of the
    queries: every margin query after every other server's last turn.)"""
    import contextlib
    import json
    import sys
    import time

    ab = load()

    order, asked, served = [], [], []

    @contextlib.contextmanager
    def fake_server(model, args, port=30000, base_args=(), env=None, **kw):
        order.append(args[-1])
        yield f"http://x:{port}/{args[-1]}"

    def fake_post(url, payload, timeout=600):
        if url.endswith("/flush_cache"):
            return {}
        server = url.split("/")[3]
        n = sum(m["role"] == "assistant" for m in payload["messages"])
        if payload.get("logprobs"):
            asked.append((server, n))
            served.append("margin")
            return _logprob_reply(["s", "y"], ["r", f"{n}"])  # parts from the speculative "s2" at its 2nd token
        if server == "lumotree-suffix":
            time.sleep(0.02)  # the slowest server: the reference, on the other lane, finishes its turns first
        served.append(server)
        text = f"r{n}" if server == "none" or n < 2 else f"s{n}"  # the speculative ones part at turn 2
        return dict(choices=[dict(message=dict(content=text))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=25)))

    serve_fakes(monkeypatch, ab, fake_server, fake_post)
    out = tmp_path / "a.json"
    argv = ["agents_bench.py", "--model", str(tmp_path), "--configs", "none,lumotree-suffix,lumotree", "--agents", "1",
            "--sessions", "3", "--turns", "4", "--lanes", "2", "--margins", "2", "--warmup-sessions", "0",
            "--log-dir", str(tmp_path), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    ab.main()
    res = json.load(open(out))
    assert sorted(order) == ["lumotree", "lumotree-suffix", "none"]
    last_other = max(i for i, s in enumerate(served) if s not in ("none", "margin"))
    assert served.index("margin") > last_other  # the margin queries wait for every other server's replies
    assert [r["config"] for r in res["rows"]] == ["none", "lumotree-suffix", "lumotree"]  # the command's order
    assert sorted(asked) == [("none", 2)] * 4  # 2 sessions per differing phase, their turn 2, the reference alone
    for key in ("lumotree-suffix/1", "lumotree/1"):
        m = res["margins"][key]
        assert [s["session"] for s in m["sessions"]] == [0, 1] and all(s["turn"] == 2 for s in m["sessions"])
        assert all(s["token_index"] == 1 and s["took_second"] and s["token"] == "y" for s in m["sessions"])
        assert m["summary"]["measured"] == 2 and m["summary"]["margin_min"] == pytest.approx(0.05)
    assert "2 of 2" in ab.markdown(res)
    # the reference kept from an earlier run cannot answer: refused at once
    monkeypatch.setattr(sys, "argv", argv + ["--resume"])
    with pytest.raises(SystemExit):
        ab.main()


def test_a_collapse_limit_the_model_s_context_cannot_hold_is_refused(tmp_path, monkeypatch):
    """Prompts collapsed at --collapse-tokens plus --max-tokens new ones must fit the checkpoint's context: else every
    long turn is an HTTP 400 (the tiny model's 8,192 tokens against a limit of 8,000 and 128 new tokens)."""
    import json
    import sys

    ab = load()
    (tmp_path / "config.json").write_text(json.dumps(dict(max_position_embeddings=8192)))
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--collapse-tokens", "8000",
                                      "--out", str(tmp_path / "a.json")])
    with pytest.raises(SystemExit):
        ab.main()
    assert ab.context_room(str(tmp_path), 7800, 128) > 0 > ab.context_room(str(tmp_path), 8000, 128)
    assert ab.context_room(str(tmp_path / "none"), 10 ** 6, 128) is None  # no config: nothing to check


def test_every_repeat_s_turn_details_are_kept_and_resumed(tmp_path, monkeypatch):
    """The replies file keeps each repeat's per-turn details (the first under ``CONFIG/AGENTS#turns``, later ones under
    ``#turns@2``, ``@3``): a tail in a later repeat is then found by turn too. A resumed configuration keeps them."""
    import gzip
    import json
    import sys

    ab = load()
    events, lat = [], iter([0.1, 0.2, 0.3, 0.4])

    def fake_run_phase(url, sessions, agents, *a, **kw):
        return [dict(session=0, turn=0, latency=next(lat), prompt_tokens=50, cached_tokens=25, completion_tokens=30,
                     reply="r")], 1.0

    _fake_servers(monkeypatch, ab, events, fake_run_phase)
    rep = tmp_path / "r.json.gz"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "none", "--agents", "1",
                                      "--sessions", "1", "--turns", "1", "--warmup-sessions", "0", "--repeats", "3",
                                      "--out", str(tmp_path / "a.json"), "--replies-out", str(rep), "--resume"])
    ab.main()
    got = json.load(gzip.open(rep, "rt"))
    assert got["none/1#turns"] == {"0": [[50, 25, 30, 100.0]]}
    assert got["none/1#turns@2"] == {"0": [[50, 25, 30, 200.0]]} and got["none/1#turns@3"] == {"0": [[50, 25, 30, 300.0]]}
    ab.main()  # resumed: nothing runs again, every repeat's details stay
    assert json.load(gzip.open(rep, "rt")) == got
