"""The benchmark-only draft-preparation timer (lumotree.sglang.draft_timing) and its reading from a server log."""
import logging
import os
import time
from types import SimpleNamespace

import pytest
from utils import load_script

from lumotree.sglang import draft_timing


@pytest.fixture(autouse=True)
def _gc_callbacks_restored():
    """The step timer's first run_batch adds its gc callback to this process: taken off again after each test."""
    import gc

    from lumotree.sglang import step_timing

    before, state = list(gc.callbacks), dict(step_timing._gc)
    yield
    gc.callbacks[:] = before
    step_timing._gc.update(state)


def test_timer_logs_a_line_per_bucket_every_n_steps_and_the_log_reader_reads_them(tmp_path):
    lines = []
    t = draft_timing.DraftTimer(every=4, log=lambda fmt, *a: lines.append(fmt % a))
    for ms in (1.0, 2.0, 3.0):
        t.add(30, ms / 1e3)  # bucket 32
    t.add(1, 0.5e-3)
    assert lines == []
    t.add(32, 10e-3)
    assert lines == ["LumoTree draft timing: batch bucket 32: median 3.000 ms, p95 10.000 ms over 4 steps, total 16.0 ms"]
    assert t.samples[32] == [] and t.samples[1] == [0.5]
    for ms in (4.0, 4.0, 4.0, 20.0):
        t.add(17, ms / 1e3)
    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-01-01 00:00:00] {ln}\n" for ln in lines) + "Decode batch, #running-req: 3\n")
    ss = load_script("serving", "sglang_server")
    got = ss.draft_timing(str(log))
    assert len(lines) == 2 and lines[1].endswith("median 4.000 ms, p95 20.000 ms over 4 steps, total 32.0 ms")
    # two lines: the median of their medians, the largest p95, the summed steps and totals
    assert got == {"32": dict(median_ms=3.5, p95_ms=20.0, steps=8, total_ms=48.0)}
    assert ss.draft_timing(str(tmp_path / "missing.log")) == {}
    # lines of an earlier server (no total) still read, without a total
    log.write_text("LumoTree draft timing: batch bucket 8: median 1.000 ms, p95 2.000 ms over 64 steps\n")
    assert ss.draft_timing(str(log)) == {"8": dict(median_ms=1.0, p95_ms=2.0, steps=64)}


def test_admission_and_wait_timer_lines_are_read_apart_from_the_draft_lines(tmp_path):
    lines = []
    adm = draft_timing.DraftTimer(every=2, log=lambda fmt, *a: lines.append(fmt % a), what="admission", unit="batches")
    drafts = draft_timing.DraftTimer(every=2, log=lambda fmt, *a: lines.append(fmt % a))
    waits = draft_timing.DraftTimer(every=1, log=lambda fmt, *a: lines.append(fmt % a), what="draft-wait")
    native = draft_timing.DraftTimer(every=1, log=lambda fmt, *a: lines.append(fmt % a), what="draft-native")
    adm.add(3, 5e-3)
    adm.add(4, 7e-3)
    drafts.add(2, 1e-3)
    drafts.add(2, 1e-3)
    waits.add(32, 4e-3)
    native.add(16, 2e-3)
    assert lines[0] == "LumoTree admission timing: batch bucket 4: median 7.000 ms, p95 7.000 ms over 2 batches, total 12.0 ms"
    log = tmp_path / "server.log"
    log.write_text("".join(ln + "\n" for ln in lines))
    ss = load_script("serving", "sglang_server")
    assert ss.draft_timing(str(log), ss.ADMISSION_TIMING_LINE) == {"4": dict(median_ms=7.0, p95_ms=7.0, steps=2,
                                                                            total_ms=12.0)}
    assert ss.draft_timing(str(log)) == {"2": dict(median_ms=1.0, p95_ms=1.0, steps=2, total_ms=2.0)}
    assert ss.draft_timing(str(log), ss.DRAFT_WAIT_TIMING_LINE) == {"32": dict(median_ms=4.0, p95_ms=4.0, steps=1,
                                                                              total_ms=4.0)}
    assert ss.draft_timing(str(log), ss.DRAFT_NATIVE_TIMING_LINE) == {"16": dict(median_ms=2.0, p95_ms=2.0, steps=1,
                                                                                total_ms=2.0)}


def test_timed_adds_the_call_only_when_on(monkeypatch):
    timer = draft_timing.DraftTimer(every=1000)
    monkeypatch.setattr(draft_timing, "_on", False)
    assert draft_timing.timed(timer, 3, lambda a, b: a + b, 1, 2) == 3 and not timer.samples
    monkeypatch.setattr(draft_timing, "_on", True)
    assert draft_timing.timed(timer, 3, lambda a, b: a + b, 1, 2) == 3 and list(timer.samples) == [4]


def test_measure_times_only_when_on(monkeypatch):
    timer = draft_timing.DraftTimer(every=1000)
    monkeypatch.setattr(draft_timing, "TIMER", timer)
    batch = SimpleNamespace(reqs=[1, 2, 3])
    fn = lambda worker, b, k=0: (worker, len(b.reqs), k)  # noqa: E731
    monkeypatch.setattr(draft_timing, "_on", False)
    assert draft_timing.measure(fn, "w", batch, k=5) == ("w", 3, 5) and not timer.samples
    monkeypatch.setattr(draft_timing, "_on", True)
    assert draft_timing.measure(fn, "w", batch) == ("w", 3, 0) and list(timer.samples) == [4]
    assert draft_timing._around(fn, "w", batch) == ("w", 3, 0) and len(timer.samples[4]) == 2
    other = draft_timing.DraftTimer(every=1000)
    assert draft_timing.measure(fn, "w", batch, timer=other) == ("w", 3, 0)
    assert len(timer.samples[4]) == 2 and list(other.samples) == [4]


def test_install_hooks_sglang_s_preparation_only_in_the_benchmark(monkeypatch):
    from lumotree.sglang import patches

    hooked = []
    monkeypatch.setattr(patches, "register_hook", lambda target, fn, kind: hooked.append((target, fn, kind)))
    monkeypatch.delenv(draft_timing.ENV, raising=False)
    draft_timing.install()
    assert hooked == [] and draft_timing._on is False
    monkeypatch.setenv(draft_timing.ENV, "1")
    try:
        draft_timing.install()
        assert hooked == [(draft_timing.TARGET, draft_timing._around, "AROUND")] and draft_timing._on is True
    finally:
        monkeypatch.delenv(draft_timing.ENV)
        draft_timing.install()
    # the target names SGLang's method, which exists
    pytest.importorskip("sglang")
    mod, cls, meth = draft_timing.TARGET.rsplit(".", 2)
    assert "def _prepare_draft_tokens" in open(os.path.join(os.path.dirname(__import__("sglang").__file__),
                                                             *mod.split(".")[1:]) + ".py").read()
    assert cls == "NGRAMWorker" and meth == "_prepare_draft_tokens"


def test_the_timer_logs_through_the_module_logger(caplog):
    t = draft_timing.DraftTimer(every=1)
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.draft_timing"):
        t.add(8, 0.002)
    assert "LumoTree draft timing: batch bucket 8: median 2.000 ms, p95 2.000 ms over 1 steps" in caplog.text


def test_step_timing_hooks_time_decode_batches_only_and_the_log_reader_reads_each_part(monkeypatch, tmp_path):
    from lumotree.sglang import step_timing

    lines = []
    timers = {p: draft_timing.DraftTimer(every=2, log=lambda fmt, *a: lines.append(fmt % a), what=f"step-{p}")
              for p in step_timing.PARTS}
    monkeypatch.setattr(step_timing, "TIMERS", timers)
    monkeypatch.setitem(step_timing._last, "start", None)
    monkeypatch.setattr(step_timing, "_interval",
                        {"start": None, "kind": None, "idle": False, "parts": {}, "tokens": 0})
    monkeypatch.setattr(step_timing, "PART_TOTALS", {})
    monkeypatch.setattr(step_timing, "TOTALS", {k: [0.0, 0] for k in step_timing.KINDS})
    monkeypatch.setattr(step_timing, "_wall", lambda: 0.0)  # no totals line in this test
    monkeypatch.setattr(step_timing, "_logged", {"at": 0.0})
    mode = lambda decode: SimpleNamespace(is_decode=lambda: decode, is_extend=lambda: not decode)  # noqa: E731
    dec = SimpleNamespace(forward_mode=mode(True), reqs=[0] * 3)
    pre = SimpleNamespace(forward_mode=mode(False), reqs=[0] * 5)
    calls = []
    run = lambda self, b, *a: calls.append(b) or "out"  # noqa: E731
    assert step_timing.run_batch(run, "sched", dec) == "out"  # first decode step: no interval yet
    assert not timers["step"].samples and len(timers["launch"].samples[4]) == 1
    step_timing.run_batch(run, "sched", dec)  # an interval
    step_timing.run_batch(run, "sched", pre)  # a prefill: not timed, and it breaks the interval
    step_timing.run_batch(run, "sched", dec)
    assert calls == [dec, dec, pre, dec]
    assert lines[0].startswith("LumoTree step-launch timing: batch bucket 4: median")
    assert timers["step"].samples[4] and len(timers["step"].samples[4]) == 1 and not timers["step"].samples[8]
    plan = lambda b: SimpleNamespace(batch_to_run=b, running_batch="running")  # noqa: E731  (SGLang's NextBatchPlan)
    got = plan(pre)
    assert step_timing.get_next_batch_to_run(lambda self, **kw: got, "sched", running_batch=1, last_batch=2) is got
    step_timing.get_next_batch_to_run(lambda self: plan(None), "sched")
    assert not timers["schedule"].samples
    step_timing.get_next_batch_to_run(lambda self: plan(dec), "sched")
    step_timing.process_batch_result(lambda self, b, r: r, "sched", dec, "res")
    step_timing.resolve_seq_lens_cpu(lambda self, b: None, "fm", pre)
    assert len(timers["schedule"].samples[4]) == 1 and len(timers["result"].samples[4]) == 1
    assert not timers["lengths"].samples
    step_timing.run_batch(run, "sched", dec)  # the second step interval: a line
    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-01-01 00:00:00] {ln}\n" for ln in lines))
    ss = load_script("serving", "sglang_server")
    got = ss.step_timing(str(log))
    assert set(got) == {"launch", "step"} and set(got["step"]) == {"4"} and got["step"]["4"]["steps"] == 2
    assert got["launch"]["4"]["steps"] == 4
    assert ss.step_timing(str(tmp_path / "missing.log")) == {}


def test_a_section_is_charged_to_the_interval_it_falls_in_even_when_it_raises(monkeypatch):
    from lumotree.sglang import step_timing

    ticks = iter([10.0, 10.25, 11.0, 11.5])
    monkeypatch.setattr(step_timing, "_clock", lambda: next(ticks))
    monkeypatch.setattr(step_timing, "_interval",
                        {"start": 9.0, "kind": "prefill", "idle": False, "parts": {}, "tokens": 0})
    hook = step_timing.section("model")
    assert hook(lambda a, b=0: a + b, 1, b=2) == 3
    with pytest.raises(ValueError):
        hook(lambda: (_ for _ in ()).throw(ValueError("x")))
    assert step_timing._interval["parts"] == {"model": pytest.approx(0.75)}
    monkeypatch.setattr(step_timing, "_interval",
                        {"start": None, "kind": None, "idle": False, "parts": {}, "tokens": 0})
    monkeypatch.setattr(step_timing, "_clock", lambda: 0.0)
    assert hook(lambda: "x") == "x" and step_timing._interval["parts"] == {}  # no interval open: nothing charged


def test_step_timing_installs_only_when_asked(monkeypatch):
    from lumotree.sglang import step_timing
    from lumotree.sglang import patches

    got = []
    monkeypatch.setattr(patches, "register_hook", lambda target, hook, kind: got.append((target, kind)))
    monkeypatch.setattr(step_timing, "_on", False)  # restored after the test
    monkeypatch.delenv(step_timing.ENV, raising=False)
    step_timing.install()
    assert got == []
    monkeypatch.setenv(step_timing.ENV, "1")
    step_timing.install()
    assert [t.rsplit(".", 1)[1] for t, _ in got] == ["get_next_batch_to_run", "run_batch", "process_batch_result",
                                                      "resolve_seq_lens_cpu", "on_idle", "process_input_requests",
                                                      "forward_batch_generation", "_prepare_for_speculative_decoding",
                                                      "eagle_sample", "commit_mamba_states_after_verify",
                                                      "move_accept_tokens_to_target_kvcache"] + [
        t.rsplit(".", 1)[1] for t, _ in step_timing.SECTIONS] + ["stash", "_resolve_spec_extras", "copy_to_cpu"]
    assert step_timing._on
    assert all(k == "AROUND" for _, k in got)
    # the targets exist in SGLang 0.5.17, and its scheduler's next batch is a plan's batch_to_run
    import pkgutil

    from sglang.srt.managers.schedule_batch import NextBatchPlan

    assert "batch_to_run" in NextBatchPlan.__struct_fields__

    for t, _ in got:
        owner, attr = t.rsplit(".", 1)
        try:
            resolved = pkgutil.resolve_name(owner)
        except (ImportError, AttributeError):  # SGLang's NGRAM worker needs sgl-kernel's CUDA ops to import
            assert _defined_in_source(owner, attr), t
            continue
        assert callable(getattr(resolved, attr))


def _defined_in_source(owner: str, attr: str) -> bool:
    """Whether ``owner.attr`` (a module's function or a module's class's method) is defined in SGLang's source,
    read without importing the module."""
    import ast
    import importlib.util

    parts = owner.split(".")
    for cut in (len(parts), len(parts) - 1):
        try:  # (finding a module's spec imports its parent package: a class's module fails as a parent)
            spec = importlib.util.find_spec(".".join(parts[:cut]))
        except (ImportError, AttributeError):
            continue
        if spec is not None and spec.origin:
            break
    tree = ast.parse(open(spec.origin).read())
    scope = tree.body
    for name in parts[cut:]:
        scope = next(n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == name)
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr for n in scope)


def test_step_totals_account_every_interval_to_the_batch_that_started_it_or_to_idle(monkeypatch, tmp_path):
    from lumotree.sglang import step_timing

    timers = {p: draft_timing.DraftTimer(every=1000, log=lambda *a: None, what=f"step-{p}") for p in step_timing.PARTS}
    monkeypatch.setattr(step_timing, "TIMERS", timers)
    monkeypatch.setattr(step_timing, "TOTALS", {k: [0.0, 0] for k in step_timing.KINDS})
    monkeypatch.setattr(step_timing, "_interval",
                        {"start": None, "kind": None, "idle": False, "parts": {}, "tokens": 0})
    monkeypatch.setattr(step_timing, "PART_TOTALS", {})
    monkeypatch.setattr(step_timing, "TOKENS", {k: [0, 0] for k in step_timing.KINDS})
    monkeypatch.setattr(step_timing, "_last", {"start": None})
    monkeypatch.setattr(step_timing, "_logged", {"at": 0.0})
    now = [0.0]
    monkeypatch.setattr(step_timing, "_clock", lambda: now[0])
    wall = iter([100.0, 100.5, 101.0, 101.2, 102.5])
    monkeypatch.setattr(step_timing, "_wall", lambda: next(wall))
    lines = []
    monkeypatch.setattr(step_timing.TIMERS["step"], "log", lambda fmt, *a: lines.append(fmt % a))
    cpu = iter([(10.0, 1, 30.0, 5), (20.0, 1, 45.0, 6), (60.0, 4, 200.0, 9)])  # thread ms, invol., process ms, vol.
    monkeypatch.setattr(step_timing, "cpu_totals",
                        lambda: (lambda a, b, c, d: {"cpu_thread": [a, b], "cpu_process": [c, d]})(*next(cpu)))
    monkeypatch.setattr(step_timing, "_threads", {"seen": None})
    monkeypatch.setattr(step_timing.os, "listdir", lambda path: ["1", "2", "3"])
    mode = lambda decode, extend: SimpleNamespace(is_decode=lambda: decode, is_extend=lambda: extend)  # noqa: E731
    dec = SimpleNamespace(forward_mode=mode(True, False), reqs=[0] * 2)
    pre = SimpleNamespace(forward_mode=mode(False, True), reqs=[0], extend_num_tokens=300)
    def run(self, b):  # a launch of 0.25 s
        now[0] += 0.25

    def result(self, b):  # the previous batch's result: 0.5 s, charged to the interval it falls in
        now[0] += 0.5

    for t, b in ((0.0, pre), (1.0, dec), (3.0, dec), (6.0, pre), (10.0, dec)):
        # t 0: opens a prefill interval; 1: prefill 1 s, opens decode; 3: decode 2 s; (idle); 6: the decode interval
        # went idle: idle 3 s; 10: prefill 4 s
        now[0] = t
        step_timing.run_batch(run, "s", b)
        if t in (0.0, 6.0):
            step_timing.process_batch_result(result, "s", dec)
        if t == 3.0:
            step_timing.on_idle(lambda self: None, "s")
    t = step_timing.TOTALS
    assert t["prefill"] == [5000.0, 2] and t["decode"] == [2000.0, 1] and t["idle"] == [3000.0, 1]
    assert t["other"] == [0.0, 0]
    # the parts of an interval go where the interval went: the launch at t 3 to idle, the results to prefill
    assert step_timing.PART_TOTALS == {"prefill_launch": [500.0, 2], "prefill_result": [1000.0, 2],
                                       "decode_launch": [250.0, 1], "idle_launch": [250.0, 1]}
    assert timers["result"].samples[2] == [500.0, 500.0] and timers["launch"].samples[2] == [250.0] * 3  # ms
    assert len(timers["step"].samples[2]) == 1  # the decode step interval: not the one that went idle
    # logged at most once a second (wall 100, 101.0 and 102.5), cumulative; the threads once (unchanged after)
    assert [ln.split(":")[0] for ln in lines] == ["LumoTree step totals at 100.000", "LumoTree scheduler threads",
                                                  "LumoTree step totals at 101.000", "LumoTree step totals at 102.500"]
    assert lines[1] == "LumoTree scheduler threads: 3 tasks; " + ", ".join(
        sorted(t.name for t in step_timing.threading.enumerate()))
    # the prompt tokens of the batches that opened the intervals: the two prefill batches', none for decode batches
    assert step_timing.TOKENS == {"decode": [0, 0], "prefill": [600, 2], "other": [0, 0], "idle": [0, 0]}
    assert lines[-1].endswith("decode 2000.0 ms 1, prefill 5000.0 ms 2, other 0.0 ms 0, idle 3000.0 ms 1, "
                              "decode_launch 250.0 ms 1, idle_launch 250.0 ms 1, prefill_launch 500.0 ms 2, "
                              "prefill_result 1000.0 ms 2, prefill_tokens 600 tokens 2, "
                              "cpu_thread 60.0 ms 4, cpu_process 200.0 ms 9")
    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-01-01 00:00:00] {ln}\n" for ln in lines))
    ss = load_script("serving", "sglang_server")
    got = ss.step_totals(str(log), {"all": (0, 200), "late": (101.5, 103), "early": (50, 60)})
    assert got["all"]["prefill"] == dict(seconds=5.0, intervals=2) and got["all"]["idle"]["seconds"] == 3.0
    # the window opens at the last totals before it (t 101.0: prefill 1 s, decode 2 s) and ends at the last in it
    assert got["late"]["prefill"] == dict(seconds=4.0, intervals=1) and got["late"]["decode"]["seconds"] == 0.0
    assert got["late"]["idle"] == dict(seconds=3.0, intervals=1)
    assert got["all"]["prefill_result"] == dict(seconds=1.0, intervals=2)
    assert got["all"]["prefill_tokens"] == dict(tokens=600, intervals=2)
    assert got["late"]["prefill_tokens"] == dict(tokens=300, intervals=1)  # the window's difference, as for the ms
    # the CPU entries likewise: the thread's CPU seconds and involuntary switches in the window, the process's
    assert got["late"]["cpu_thread"] == dict(seconds=0.04, intervals=3)
    assert got["late"]["cpu_process"] == dict(seconds=0.155, intervals=3)
    assert got["early"] == {}
    assert ss.step_totals(str(tmp_path / "missing.log"), {"all": (0, 1)}) == {}


def test_cpu_totals_count_the_calling_thread_s_work_and_the_process_s():
    from lumotree.sglang import step_timing

    a = step_timing.cpu_totals()
    if not a:
        pytest.skip("no per-thread CPU usage on this platform")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:  # busy on this thread
        pass
    busy = step_timing.cpu_totals()
    assert busy["cpu_thread"][0] - a["cpu_thread"][0] > 50  # ms of CPU on this thread (0.2 s busy)
    assert busy["cpu_process"][0] - a["cpu_process"][0] >= busy["cpu_thread"][0] - a["cpu_thread"][0] - 5
    time.sleep(0.2)  # waiting: no CPU on this thread
    idle = step_timing.cpu_totals()
    assert idle["cpu_thread"][0] - busy["cpu_thread"][0] < 50
    assert idle["cpu_process"][1] > busy["cpu_process"][1]  # the sleep was a voluntary switch


def test_forward_and_worker_parts_time_decode_steps_by_batch_or_forward_batch(monkeypatch):
    from lumotree.sglang import step_timing

    timers = {p: draft_timing.DraftTimer(every=1000, log=lambda *a: None, what=f"step-{p}") for p in step_timing.PARTS}
    monkeypatch.setattr(step_timing, "TIMERS", timers)
    mode = lambda decode: SimpleNamespace(is_decode=lambda: decode, is_extend=lambda: not decode,  # noqa: E731
                                          is_target_verify=lambda: False)
    dec = SimpleNamespace(forward_mode=mode(True), reqs=[0] * 5)
    fb = SimpleNamespace(forward_mode=mode(True), batch_size=3)
    seen = []
    original = lambda self, batch, forward_batch=None, is_verify=False: seen.append((batch, forward_batch)) or "r"  # noqa
    assert step_timing.forward_batch_generation(original, "w", dec) == "r"  # no speculation: its decode batch
    assert step_timing.forward_batch_generation(original, "w", batch=None, forward_batch=fb, is_verify=True) == "r"
    pre_fb = SimpleNamespace(forward_mode=mode(False), batch_size=9)
    step_timing.forward_batch_generation(original, "w", None, pre_fb)  # a prefill's forward batch: not timed
    assert seen == [(dec, None), (None, fb), (None, pre_fb)]
    assert len(timers["forward"].samples[8]) == 1 and len(timers["forward"].samples[4]) == 1
    assert not timers["forward"].samples[16]
    # measure: a no-op unless installed
    monkeypatch.setattr(step_timing, "_on", False)
    assert step_timing.measure("worker", dec, lambda a, k=0: a + k, 1, k=2) == 3 and not timers["worker"].samples
    monkeypatch.setattr(step_timing, "_on", True)
    assert step_timing.measure("worker", dec, lambda a, k=0: a + k, 1, k=2) == 3
    assert len(timers["worker"].samples[8]) == 1


def _open_decode_interval(monkeypatch, clock: float):
    """Fresh step timers, a decode interval open and a settable clock (``now[0]``)."""
    from lumotree.sglang import step_timing

    timers = {p: draft_timing.DraftTimer(every=1000, log=lambda *a: None, what=f"step-{p}") for p in step_timing.PARTS}
    monkeypatch.setattr(step_timing, "TIMERS", timers)
    monkeypatch.setattr(step_timing, "_interval",
                        {"start": 0.0, "kind": "decode", "idle": False, "parts": {}, "tokens": 0})
    now = [clock]
    monkeypatch.setattr(step_timing, "_clock", lambda: now[0])
    return step_timing, timers, now


def test_step_timing_laps_verify_forwards_and_sized_measures(monkeypatch):
    step_timing, timers, now = _open_decode_interval(monkeypatch, 10.0)
    mode = lambda **m: SimpleNamespace(**{k: (lambda v=m.get(k, False): v)  # noqa: E731
                                          for k in ("is_decode", "is_extend", "is_target_verify")})
    dec = SimpleNamespace(forward_mode=mode(is_decode=True), reqs=[0] * 4)
    monkeypatch.setattr(step_timing, "_on", False)
    assert step_timing.lap(None, None, 0.0) == 0.0 and step_timing.lap("nd_prep", dec, 0.0) == 0.0
    assert step_timing.measure_size("commit", 4, lambda x: x + 1, 1) == 2
    assert not timers["nd_prep"].samples and not timers["commit"].samples
    monkeypatch.setattr(step_timing, "_on", True)
    t = step_timing.lap(None, None, 0.0)
    assert t == 10.0 and not any(tm.samples for tm in timers.values())
    now[0] = 10.5
    assert step_timing.lap("nd_prep", dec, t) == 10.5 and timers["nd_prep"].samples[4] == [500.0]

    def slow(x):
        now[0] += 0.25
        return x

    assert step_timing.measure_size("commit", 3, slow, "r") == "r" and timers["commit"].samples[4] == [250.0]
    # a speculative step's section keyed by the request count its caller gives (its batch changes mode inside it)
    t = step_timing.lap_size(None, 0, 0.0)
    now[0] += 0.125
    assert step_timing.lap_size("dv_tail", 16, t) == now[0] and timers["dv_tail"].samples[16] == [125.0]
    monkeypatch.setattr(step_timing, "_on", False)
    assert step_timing.lap_size("dv_tail", 16, t) == 0.0 and timers["dv_tail"].samples[16] == [125.0]
    monkeypatch.setattr(step_timing, "_on", True)
    step_timing._interval["parts"].pop("dv_tail")
    # the target's forward: a decode batch's is "forward", a TARGET_VERIFY forward batch's "verify", keyed by its size
    verify_fb = SimpleNamespace(forward_mode=mode(is_target_verify=True), batch_size=2)
    step_timing.forward_batch_generation(lambda self, b, *a, **k: slow(None), "w", None, forward_batch=verify_fb)
    step_timing.forward_batch_generation(lambda self, b, *a, **k: slow(None), "w", dec)
    verify_batch = SimpleNamespace(forward_mode=mode(is_target_verify=True), reqs=[0] * 8)
    step_timing.forward_batch_generation(lambda self, b, *a, **k: None, "w", verify_batch, is_verify=True)
    assert timers["verify"].samples[2] == [250.0] and timers["forward"].samples[4] == [250.0]
    assert timers["verify"].samples[8] == [0.0]
    assert step_timing._interval["parts"] == {"nd_prep": 0.5, "commit": 0.25, "verify": 0.25, "forward": 0.25}
    assert not timers["forward"].samples[8]


def test_loop_parts_time_sglang_s_ngram_loop_by_its_batch(monkeypatch):
    step_timing, timers, now = _open_decode_interval(monkeypatch, 0.0)
    batch = SimpleNamespace(reqs=[0] * 6)

    def original(*args, **kwargs):
        now[0] += 0.001
        return args, kwargs

    hooks = {part: step_timing.loop_part(part, at) for _, part, at in step_timing.LOOP_PARTS}
    assert hooks["spec_prep"](original, "worker", batch) == (("worker", batch), {})
    assert hooks["sample"](original, "verify_input", batch, "logits", None) == (("verify_input", batch, "logits", None), {})
    assert hooks["kv_move"](original, batch, "index", k=1) == ((batch, "index"), {"k": 1})
    assert hooks["state_commit"](original, "target_worker", batch, "lens", "index", 4) == (
        ("target_worker", batch, "lens", "index", 4), {})
    hooks["kv_move"](original)  # no batch: the interval's total only
    assert {p: timers[p].samples[8] for p in hooks} == {"spec_prep": [1.0], "sample": [1.0], "state_commit": [1.0],
                                                        "kv_move": [1.0]}
    assert step_timing._interval["parts"]["kv_move"] == 0.002


def test_measure_times_the_wait_for_the_last_step_apart_from_the_drafting(monkeypatch):
    waits, drafts = draft_timing.DraftTimer(every=1000), draft_timing.DraftTimer(every=1000)
    monkeypatch.setattr(draft_timing, "WAIT", waits)
    monkeypatch.setattr(draft_timing, "TIMER", drafts)
    monkeypatch.setattr(draft_timing, "_on", True)
    now = [0.0]
    monkeypatch.setattr(draft_timing.time, "perf_counter", lambda: now[0])
    synced = []

    class Stream:
        def synchronize(self):
            synced.append(1)
            now[0] += 0.004  # the last step's GPU work: 4 ms

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())

    def draft(worker, batch):
        now[0] += 0.001  # the host's drafting: 1 ms
        return "drafts"

    on_gpu = SimpleNamespace(reqs=[0] * 3, spec_info=SimpleNamespace(accept_tokens=SimpleNamespace(is_cuda=True,
                                                                                                  device="cuda:0")))
    assert draft_timing.measure(draft, "w", on_gpu) == "drafts"
    assert synced == [1] and waits.samples[4] == [4.0] and drafts.samples[4] == [1.0]
    # the tokens on the host (no GPU step behind them) or no speculative input: nothing to wait for, nothing logged apart
    on_host = SimpleNamespace(reqs=[0] * 3, spec_info=SimpleNamespace(accept_tokens=torch.zeros(2)))
    draft_timing.measure(draft, "w", on_host)
    draft_timing.measure(draft, "w", SimpleNamespace(reqs=[0] * 3))
    assert synced == [1] and waits.samples[4] == [4.0] and drafts.samples[4] == [1.0, 1.0, 1.0]
    # an admission (its own timer) never waits
    adm = draft_timing.DraftTimer(every=1000)
    draft_timing.measure(draft, "w", on_gpu, timer=adm)
    assert synced == [1] and adm.samples[4] == [1.0]


def test_measure_times_the_preparation_s_waits_for_admissions_apart(monkeypatch, tmp_path):
    """Every timed preparation adds its waits for background admissions (add_held, zero where none) to HELD; a wait
    outside a preparation, or with timing off, is not counted; the log reader reads the HELD lines apart."""
    held, drafts = draft_timing.DraftTimer(every=1000), draft_timing.DraftTimer(every=1000)
    monkeypatch.setattr(draft_timing, "HELD", held)
    monkeypatch.setattr(draft_timing, "TIMER", drafts)
    monkeypatch.setattr(draft_timing, "_on", True)
    batch = SimpleNamespace(reqs=[0] * 20)

    def waits(worker, b):
        draft_timing.add_held(0.003)
        draft_timing.add_held(0.002)
        return "drafts"

    draft_timing.add_held(0.5)  # between preparations: not this step's
    assert draft_timing.measure(waits, "w", batch) == "drafts"
    assert draft_timing.measure(lambda w, b: "none", "w", batch) == "none"
    assert [round(x, 6) for x in held.samples[32]] == [5.0, 0.0] and len(drafts.samples[32]) == 2
    draft_timing.measure(waits, "w", batch, timer=draft_timing.DraftTimer(every=1000))  # an admission: not a step
    assert len(held.samples[32]) == 2
    lines = []
    line = draft_timing.DraftTimer(every=1, log=lambda fmt, *a: lines.append(fmt % a), what="draft-held")
    line.add(32, 5e-3)
    log = tmp_path / "server.log"
    log.write_text(lines[0] + "\nLumoTree draft timing: batch bucket 32: median 1.000 ms, p95 1.000 ms over 1 steps, "
                   "total 1.0 ms\n")
    ss = load_script("serving", "sglang_server")
    assert ss.draft_timing(str(log), ss.DRAFT_HELD_TIMING_LINE) == {"32": dict(median_ms=5.0, p95_ms=5.0, steps=1,
                                                                              total_ms=5.0)}
    assert ss.draft_timing(str(log))["32"]["median_ms"] == 1.0


def test_a_corpus_wait_for_an_admission_is_reported_as_held(monkeypatch):
    """SuffixCorpus._wait_for reports the time it blocked on a request still admitting, and nothing otherwise."""
    from lumotree.sglang.suffix import SuffixCorpus

    got = []
    monkeypatch.setattr(draft_timing, "add_held", got.append)
    c = SuffixCorpus(8)
    c._wait_for("nobody")
    assert got == []
    c.admit_batch([("a", [1, 2, 3, 4], 4)])
    assert "a" in c._admitting  # until a drafter call commits it, whatever the background thread has done by now
    c._wait_for("a")
    assert len(got) == 1 and got[0] >= 0 and "a" not in c._admitting


def test_the_scheduler_s_garbage_collections_are_charged_to_the_interval_they_fall_in(monkeypatch):
    """The first run_batch adds the gc callback (once); a collection inside an interval is charged to it as ``gc`` and
    goes to ``<kind>_gc`` when the interval closes; a collection with no interval open is not counted."""
    import gc

    from lumotree.sglang import step_timing

    monkeypatch.setattr(step_timing, "TIMERS", {p: draft_timing.DraftTimer(every=1000, log=lambda *a: None)
                                                for p in step_timing.PARTS})
    monkeypatch.setattr(step_timing, "TOTALS", {k: [0.0, 0] for k in step_timing.KINDS})
    monkeypatch.setattr(step_timing, "_interval", {"start": None, "kind": None, "idle": False, "parts": {}, "tokens": 0})
    monkeypatch.setattr(step_timing, "PART_TOTALS", {})
    monkeypatch.setattr(step_timing, "TOKENS", {k: [0, 0] for k in step_timing.KINDS})
    monkeypatch.setattr(step_timing, "_last", {"start": None})
    monkeypatch.setattr(step_timing, "_logged", {"at": 1e18})
    monkeypatch.setattr(step_timing, "_gc", {"t0": None, "on": False})
    now = [0.0]
    monkeypatch.setattr(step_timing, "_clock", lambda: now[0])
    before, enabled = list(gc.callbacks), gc.isenabled()
    gc.disable()  # no collection of the test process's own between the stand-in ones
    try:
        step_timing.gc_callback("start", {"generation": 0})  # before any interval: not counted
        now[0] += 0.5
        step_timing.gc_callback("stop", {"generation": 0})
        mode = SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)
        dec = SimpleNamespace(forward_mode=mode, reqs=[0] * 4)

        def collect_inside(self, b):  # a launch during which a full collection takes 30 ms
            step_timing.gc_callback("start", {"generation": 2})
            now[0] += 0.03
            step_timing.gc_callback("stop", {"generation": 2})

        for t in (1.0, 2.0, 3.0):
            now[0] = t
            step_timing.run_batch(collect_inside, "s", dec)
        assert gc.callbacks.count(step_timing.gc_callback) == 1
        got = step_timing.PART_TOTALS["decode_gc"]
        assert round(got[0], 6) == 60.0 and got[1] == 2  # two closed decode intervals, 30 ms each (ms)
    finally:
        gc.callbacks[:] = before
        if enabled:
            gc.enable()


def test_the_admission_left_line_is_read_back_per_bucket(tmp_path):
    """``draft_timing.LEFT``'s line (admissions, not steps) reads back through ``sglang_server.draft_timing`` with its
    own pattern, and not as a draft line."""
    lines = []
    left = draft_timing.DraftTimer(every=2, log=lambda fmt, *a: lines.append(fmt % a), what="admission-left",
                                   unit="admissions")
    left.add(3, 1e-3)
    left.add(4, 3e-3)
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    ss = load_script("serving", "sglang_server")
    assert ss.draft_timing(str(log), ss.ADMISSION_LEFT_TIMING_LINE) == {
        "4": dict(median_ms=3.0, p95_ms=3.0, steps=2, total_ms=4.0)}
    assert ss.draft_timing(str(log)) == {}


def test_the_relay_parts_are_keyed_by_the_steps_request_count(monkeypatch):
    """The overlap scheduler's relay (FutureMap.stash, its draft-input gather, the result's copy to the host): each
    timed per batch bucket of the step's requests, read from the call's own arguments."""
    from types import SimpleNamespace

    import torch

    from lumotree.sglang import step_timing

    timers = {p: draft_timing.DraftTimer(every=100, log=lambda fmt, *a: None, what=f"step-{p}") for p in step_timing.PARTS}
    monkeypatch.setattr(step_timing, "TIMERS", timers)
    hooks = {part: step_timing.sized_part(part, size_of) for _, part, size_of in step_timing.RELAY_PARTS}
    assert hooks["stash"](lambda fm, idx, payload: "stashed", "fm", torch.arange(3), "payload") == "stashed"
    hooks["extras"](lambda fm, batch: None, "fm", SimpleNamespace(reqs=[1, 2, 3, 4, 5]))
    hooks["copy_out"](lambda res, **kw: None, SimpleNamespace(accept_lens=torch.ones(2), next_token_ids=torch.ones(8)),
                      return_logprob=False)
    hooks["copy_out"](lambda res, **kw: None, SimpleNamespace(accept_lens=None, next_token_ids=torch.ones(7)),
                      return_logprob=False)
    assert set(timers["stash"].samples) == {4} and set(timers["extras"].samples) == {8}
    assert set(timers["copy_out"].samples) == {2, 8}
