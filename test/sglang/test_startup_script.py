"""benchmark/serving/startup.py's own logic: the log's phases and one JIT cache per configuration (fake servers)."""
import contextlib
import json
import os

from utils import load_script

LOG = """[2026-12-05 17:11:22] server_args=ServerArgs(model_path='m')
[2026-12-05 17:11:50] Init torch distributed begin.
[2026-12-05 17:11:52] Load weight begin. avail mem=139.09 GB
[2026-12-05 17:11:54] Capture target verify CUDA graph begin. backend=full
  0%|   | 0/35 [00:00<?, ?it/s][2026-12-05 17:11:58] LumoTree: first GDN verify call (layer 0, 512 tokens) took 3.2 s on the host
[2026-12-05 17:12:11] Capture target verify CUDA graph end. elapsed=16.93 s, mem usage=0.98 GB, avail mem=36.06 GB.
[2026-12-05 17:12:15] Capture draft decode CUDA graph end. elapsed=4.53 s, mem usage=0.39 GB
[2026-12-05 17:12:17] Capture draft extend CUDA graph end. elapsed=1.48 s, mem usage=0.50 GB
[2026-12-05 17:12:20] Capture draft decode CUDA graph end. elapsed=1.00 s, mem usage=0.39 GB
[2026-12-05 17:12:22] LumoTree adaptive: runtime state for 0 draft steps built in 5.2 s (target-verify graphs 4.0 s)
[2026-12-05 17:12:25] LumoTree: no-draft steps run as decode steps (decode CUDA graphs for batch sizes [1, 2]) -- built in 3.1 s
[2026-12-05 17:12:25] Engine startup timings (s): load_weight=0.19, scheduler_e2e=35.58
[2026-12-05 17:12:31] The server is fired up and ready to roll!
"""


def fake_startup(monkeypatch):
    """startup.py with its servers faked (each writes :data:`LOG` as its log) on machine ``GPU-test``; ``seen``
    collects each server's ``(args, env)``."""
    su = load_script("serving", "startup")
    seen = []

    @contextlib.contextmanager
    def fake_server(model, args, log=None, env=None, **kw):
        seen.append((list(args), dict(env)))
        with open(log, "w") as f:
            f.write(LOG)
        yield "http://x"

    monkeypatch.setattr(su, "sglang_server", fake_server)
    monkeypatch.setattr(su, "generate", lambda *a, **k: [{}])
    monkeypatch.setattr(su, "machine", lambda: "GPU-test")
    return su, seen


def test_log_phases_reads_marks_captures_and_lumotree_states():
    su = load_script("serving", "startup")
    p = su.log_phases(LOG)
    assert p["in_server_s"] == 69.0
    assert (p["args_to_init_s"], p["init_to_weights_s"], p["weights_to_graphs_s"], p["graphs_to_ready_s"]) == \
        (28.0, 2.0, 2.0, 37.0)
    assert p["captures_s"] == {"target verify": 16.93, "draft decode": 5.53, "draft extend": 1.48}
    assert p["lumotree_states_s"] == {0: 5.2}
    assert p["lumotree_decode_graphs_s"] == 3.1 and p["lumotree_first_verify_s"] == 3.2
    assert p["engine_timings"].startswith("load_weight=0.19")
    # a log that never got ready: no in-server time, the marks it has
    cut = su.log_phases(LOG.split("[2026-12-05 17:12:31]")[0])
    assert "in_server_s" not in cut and "graphs_to_ready_s" not in cut and cut["args_to_init_s"] == 28.0


def test_each_configuration_starts_cold_then_warm_on_a_cache_of_its_own(tmp_path, monkeypatch):
    su, seen = fake_startup(monkeypatch)
    out = tmp_path / "s.json"
    monkeypatch.setattr("sys.argv", ["startup.py", "--configs", "lumotree-chain,nextn-chain", "--starts", "2",
                                     "--log-dir", str(tmp_path), "--out", str(out)])
    su.main()
    res = json.load(open(out))
    assert [(r["config"], r["start"], r["cache"]) for r in res["rows"]] == [
        ("lumotree-chain", 1, "cold"), ("lumotree-chain", 2, "warm"), ("nextn-chain", 1, "cold"),
        ("nextn-chain", 2, "warm")]
    caches = [env["TRITON_CACHE_DIR"] for _, env in seen]
    assert caches[0] == caches[1] and caches[2] == caches[3] and caches[0] != caches[2]
    assert all(env["LUMOTREE_BENCH_JIT_LOG"] == "1" for _, env in seen)
    assert not any(os.path.exists(c) for c in caches)  # each configuration's cache removed after its starts
    assert all(r["in_server_s"] == 69.0 and "ready_s" in r and "error" not in r for r in res["rows"])
    assert "| lumotree-chain | 2 (warm) |" in su.table(res["rows"])


def test_resume_keeps_finished_configurations_of_the_same_machine(tmp_path, monkeypatch):
    su, seen = fake_startup(monkeypatch)
    out = tmp_path / "s.json"
    old = {"machine": "GPU-test", "shape": "qwen3.5-27b-32l", "tp": 1, "rows": [
        {"config": "lumotree-chain", "start": 1, "cache": "cold", "ready_s": 1.0},
        {"config": "lumotree-chain", "start": 2, "cache": "warm", "ready_s": 2.0},
        {"config": "nextn-chain", "start": 1, "cache": "cold", "error": "TimeoutError()"}]}
    out.write_text(json.dumps(old))
    argv = ["startup.py", "--configs", "lumotree-chain,nextn-chain", "--starts", "2", "--log-dir", str(tmp_path),
            "--out", str(out), "--resume"]
    monkeypatch.setattr("sys.argv", argv)
    su.main()
    res = json.load(open(out))
    # lumotree-chain kept (both starts, no error); nextn-chain's failed start reruns whole, cold then warm
    assert [(r["config"], r["start"], r.get("ready_s")) for r in res["rows"]][:2] == [
        ("lumotree-chain", 1, 1.0), ("lumotree-chain", 2, 2.0)]
    assert [(r["config"], r["start"]) for r in res["rows"][2:]] == [("nextn-chain", 1), ("nextn-chain", 2)]
    assert len(seen) == 2 and all("NEXTN" in a for a, _ in seen)
    # another machine's file: nothing kept
    old["machine"] = "GPU-other"
    out.write_text(json.dumps(old))
    seen.clear()
    su.main()
    assert len(seen) == 4
