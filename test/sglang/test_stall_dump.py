"""The benchmark-only stall dump (lumotree.sglang.stall_dump): thread stacks of a scheduler call that runs too long."""
import threading
import time

import pytest

from lumotree.sglang import stall_dump


def slow_scheduler_call(self, release):
    release.wait(5)
    return "done"


def test_a_call_over_the_threshold_dumps_every_threads_stack_once_per_threshold(tmp_path, monkeypatch):
    monkeypatch.setattr(stall_dump.Watch, "start", lambda self: self)  # the test looks itself: no watchdog thread
    now = [0.0]
    out = tmp_path / "dump.txt"
    with open(out, "w") as f:
        watch = stall_dump.Watch(2.0, file=f, clock=lambda: now[0])
        release, got = threading.Event(), []
        t = threading.Thread(target=lambda: got.append(watch.hook("run_batch")(slow_scheduler_call, None, release)))
        t.start()
        while watch.call is None:
            time.sleep(0.001)
        now[0] = 1.9
        assert watch.check() is False  # under the threshold
        now[0] = 2.1
        assert watch.check() is True
        now[0] = 3.0
        assert watch.check() is False  # one dump per threshold
        now[0] = 4.2
        assert watch.check() is True
        release.set()
        t.join()
        assert got == ["done"] and watch.call is None
        now[0] = 9.0
        assert watch.check() is False  # nothing in progress
    text = out.read_text()
    assert text.count("LumoTree stall dump: run_batch running") == 2
    assert "running 2.1 s" in text and "running 4.2 s" in text
    assert "slow_scheduler_call" in text  # the stalled thread's frame


def test_the_mark_is_cleared_when_the_call_raises_and_nested_calls_restore_the_outer():
    watch = stall_dump.Watch(1.0, clock=lambda: 5.0)

    def fails(self):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        watch.hook("process_batch_result")(fails, None)
    assert watch.call is None

    def outer(self):
        assert watch.call == ("run_batch", 5.0)
        watch.hook("process_batch_result")(lambda s: None, None)
        return watch.call

    assert watch.hook("run_batch")(outer, None) == ("run_batch", 5.0)
    assert watch.call is None


def test_the_watchdog_thread_starts_at_the_first_hooked_call_and_dumps_a_real_stall(tmp_path):
    out = tmp_path / "dump.txt"
    with open(out, "w") as f:
        watch = stall_dump.Watch(0.2, file=f, poll=0.02)
        assert watch._thread is None
        watch.hook("run_batch")(lambda self: time.sleep(0.5), None)
        assert watch._thread is not None and watch._thread.is_alive()
        time.sleep(0.1)
    text = out.read_text()
    assert "LumoTree stall dump: run_batch running" in text and "Thread 0x" in text


def test_threshold_reads_the_variable_and_names_it_when_wrong():
    assert stall_dump.threshold({}) is None
    assert stall_dump.threshold({stall_dump.ENV: ""}) is None
    assert stall_dump.threshold({stall_dump.ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "two", "nan"):
        with pytest.raises(ValueError, match=stall_dump.ENV):
            stall_dump.threshold({stall_dump.ENV: bad})


def test_install_registers_both_hooks_only_with_the_variable(monkeypatch):
    from lumotree.sglang import patches

    seen = []
    monkeypatch.setattr(patches, "register_hook", lambda target, fn, kind: seen.append((target, kind)))
    started = []
    monkeypatch.setattr(stall_dump.Watch, "start", lambda self: started.append(self) or self)  # no thread left behind
    assert stall_dump.install({}) is False
    assert seen == []
    assert stall_dump.install({stall_dump.ENV: "2"}) is True
    assert started == []  # no thread in a process that never runs a scheduler call
    assert seen == [(f"{stall_dump.SCHEDULER}.run_batch", "AROUND"),
                    (f"{stall_dump.SCHEDULER}.process_batch_result", "AROUND")]


def _dump(call, seconds, inner):
    """One dump as the server log holds it: the line, then each thread's stack (faulthandler's format)."""
    other = ('Thread 0x00007fba03fff6c0 (most recent call first):\n'
             '  File "/tmp/site/sglang/srt/utils/watchdog.py", line 147 in _watchdog_once\n'
             '  File "/usr/lib/python3.12/threading.py", line 1010 in run\n')
    dumper = ('Current thread 0x00007fc98dc2c6c0 (most recent call first):\n'
              '  File "/tmp/site/lumotree/sglang/stall_dump.py", line 83 in check\n')
    sched = ('Thread 0x00007fcd40b00140 (most recent call first):\n'
             '  File "/usr/lib/python3.12/subprocess.py", line 2115 in _communicate\n'
             + "".join(f'  File "{p}", line {n} in {fn}\n' for p, n, fn in inner)
             + '  File "/tmp/site/lumotree/sglang/stall_dump.py", line 65 in around\n'
             '  File "/tmp/site/sglang/srt/managers/scheduler.py", line 4947 in run_scheduler_process\n'
             '  File "/usr/lib/python3.12/multiprocessing/process.py", line 108 in run\n')
    return f"LumoTree stall dump: {call} running {seconds} s\n{other}\n{dumper}\n{sched}\n"


def test_stall_dumps_reads_one_entry_per_stalled_call_with_the_scheduler_threads_frames(tmp_path):
    from utils import load_script

    ss = load_script("serving", "sglang_server")
    compile_ = [("/tmp/site/tvm_ffi/cpp/extension.py", 592, "build_ninja"),
                ("/tmp/site/sglang/kernels/ops/attention/clamp_position.py", 17, "_jit_clamp_position_module")]
    triton = [("/opt/torch/.venv/lib/python3.12/site-packages/triton/compiler/compiler.py", 324, "compile")]
    log = tmp_path / "server.log"
    log.write_text("[2026-12-07 16:09:51] INFO: Started server process\n" + _dump("run_batch", 2.2, triton)
                   + _dump("run_batch", 4.3, triton) + "[2026-12-07 16:10:16] Switch adaptive runtime state\n"
                   + _dump("run_batch", 2.2, compile_) + _dump("run_batch", 4.2, compile_)
                   + _dump("run_batch", 6.2, compile_) + _dump("process_batch_result", 2.1, triton))
    got = ss.stall_dumps(str(log))
    assert [(s["call"], s["seconds"], s["dumps"]) for s in got] == [
        ("run_batch", 4.3, 2), ("run_batch", 6.2, 3), ("process_batch_result", 2.1, 1)]
    assert got[0]["where"][:1] == ["triton/compiler/compiler.py:324 compile"]
    # innermost first, the standard library's and the dump's own frames left out
    assert got[1]["where"] == ["tvm_ffi/cpp/extension.py:592 build_ninja",
                               "sglang/kernels/ops/attention/clamp_position.py:17 _jit_clamp_position_module",
                               "sglang/srt/managers/scheduler.py:4947 run_scheduler_process"]
    assert ss.stall_dumps(str(tmp_path / "missing.log")) == []
