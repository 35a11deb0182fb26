"""Triton compiles counted per process (``lumotree.sglang.compile_watch``), and the adaptive tree size's step clock
leaving out the samples whose interval held one (``lumotree.sglang.worker.StepClock``)."""
from types import SimpleNamespace

import pytest

from lumotree.sglang import compile_watch


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(compile_watch, "_count", 0)
    monkeypatch.setattr(compile_watch, "_installed", False)
    return compile_watch


def test_the_counter_chains_onto_a_hook_set_before(fresh):
    seen = []
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=lambda *a, **k: seen.append(k["key"])))
    count = fresh.install(knobs)
    assert count is fresh.count and count() == 0
    knobs.runtime.jit_post_compile_hook(key="k1")
    knobs.runtime.jit_post_compile_hook(key="k2")
    assert count() == 2 and seen == ["k1", "k2"]
    assert fresh.install(knobs) is count  # once per process: not chained onto itself
    knobs.runtime.jit_post_compile_hook(key="k3")
    assert count() == 3


def test_no_hook_no_count(fresh):
    assert fresh.install(SimpleNamespace(runtime=SimpleNamespace())) is None
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=None))
    assert fresh.install(knobs) is fresh.count
    knobs.runtime.jit_post_compile_hook(key="k")
    assert fresh.count() == 1


def test_the_benchmark_compile_log_keeps_the_counter(fresh, monkeypatch):
    triton = pytest.importorskip("triton")
    from lumotree.sglang import jit_log

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", None)
    fresh.install(triton.knobs)
    monkeypatch.setenv(jit_log.ENV, "1")
    jit_log.install()
    triton.knobs.runtime.jit_post_compile_hook(key=("sig",), fn=None)
    assert fresh.count() == 1


def test_the_step_clock_leaves_out_a_sample_whose_interval_held_a_compile():
    """Steps of 2 ms; a 80 ms compile in the third step's interval (the fourth's preparation): the third's sample is
    left out, the others kept; without the watch it is a 82 ms sample."""
    from lumotree.sglang.worker import StepClock
    from test_adaptive import DeviceClock

    starts = [0.000, 0.002, 0.004, 0.086, 0.088, 0.090]
    compiled_at = 0.05

    def run(watch):
        dev = DeviceClock()
        clock = StepClock(dev.event, compiles=(lambda: int(dev.now > compiled_at)) if watch else None)
        for t in starts:
            dev.now = t
            clock.start(8, 3)
        dev.passed = float("inf")
        return clock, [round(x * 1e3, 3) for _, _, x in clock.samples()]

    clock, got = run(True)
    assert got == [2.0, 2.0, 2.0, 2.0] and clock.compile_drops == 1
    _, unwatched = run(False)
    assert unwatched == [2.0, 2.0, 82.0, 2.0, 2.0]
