"""GPU: the adaptive worker's step clock (:class:`lumotree.sglang.worker.StepClock`) on real CUDA events --
steps of known device time, launched ahead of the device as SGLang's overlap scheduler launches them, read
back without waiting; a step followed by other device work (a prefill) gives no sample."""
import pytest
import torch

pytestmark = pytest.mark.gpu


def spin(ms: float, cycles_per_ms: float) -> None:
    torch.cuda._sleep(int(ms * cycles_per_ms))


def calibrate() -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    return 10_000_000 / a.elapsed_time(b)


def test_step_clock_reads_each_step_s_device_time():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from lumotree.sglang.worker import StepClock

    cpm = calibrate()
    clock = StepClock()
    plan = [(8, 0, 4.0), (8, 0, 4.0), (8, 3, 12.0), (8, 3, 12.0), (8, 0, 4.0)]
    got = []
    for batch, steps, ms in plan:  # all launched before the device ran the first: the host runs ahead
        got += clock.samples()
        clock.start(batch, steps)
        spin(ms, cpm)
    clock.interrupt()
    spin(20.0, cpm)  # a "prefill" after the last step: its interval holds it, so it gives no sample
    clock.start(8, 0)
    torch.cuda.synchronize()
    got += clock.samples()
    assert [(b, s) for b, s, _ in got] == [(b, s) for b, s, _ in plan[:-1]]
    for (_, _, ms), (_, _, seconds) in zip(plan, got):
        assert seconds * 1e3 == pytest.approx(ms, rel=0.15), got
