"""The benchmark-only stall dump (lumotree.sglang.stall_dump): thread stacks of a scheduler call that runs too long."""
import time

import pytest

from lumotree.sglang import stall_dump


def slow_scheduler_call(self, seconds):
    time.sleep(seconds)
    return "done"


def _run(tmp_path, sleep_s, threshold_s):
    out = tmp_path / "dump.txt"
    with open(out, "w") as f:
        hook = stall_dump.armed("run_batch", threshold_s, file=f)
        got = hook(slow_scheduler_call, None, sleep_s)
        time.sleep(threshold_s * 2)  # a dump armed past the call would land here
    return got, out.read_text()


def test_a_call_over_the_threshold_dumps_its_stack(tmp_path):
    got, text = _run(tmp_path, 0.6, 0.15)
    assert got == "done"
    assert "Timeout (" in text
    assert "slow_scheduler_call" in text  # the stalled thread's frame


def test_a_call_in_time_dumps_nothing_and_the_timer_is_cancelled(tmp_path):
    got, text = _run(tmp_path, 0.0, 0.3)
    assert got == "done"
    assert text == ""


def test_the_timer_is_cancelled_when_the_call_raises(tmp_path):
    out = tmp_path / "dump.txt"

    def fails(self):
        raise RuntimeError("boom")

    with open(out, "w") as f:
        hook = stall_dump.armed("process_batch_result", 0.2, file=f)
        with pytest.raises(RuntimeError):
            hook(fails, None)
        time.sleep(0.5)
    assert out.read_text() == ""


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
    assert stall_dump.install({}) is False
    assert seen == []
    assert stall_dump.install({stall_dump.ENV: "2"}) is True
    assert seen == [(f"{stall_dump.SCHEDULER}.run_batch", "AROUND"),
                    (f"{stall_dump.SCHEDULER}.process_batch_result", "AROUND")]
