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

    calibrate()  # the first spins run while the GPU's clock still ramps up
    cpm = calibrate()
    clock = StepClock()
    plan = [(8, 0, 4.0), (8, 0, 4.0), (8, 3, 12.0), (8, 3, 12.0), (8, 0, 4.0)]
    got, marks = [], []
    for batch, steps, ms in plan:  # all launched before the device ran the first: the host runs ahead
        got += clock.samples()
        clock.start(batch, steps)
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()  # an independent reference, recorded where the step's device work starts
        spin(ms, cpm)
    clock.interrupt()
    spin(20.0, cpm)  # a "prefill" after the last step: its interval holds it, so it gives no sample
    clock.start(8, 0)
    torch.cuda.synchronize()
    got += clock.samples()
    assert [(b, s) for b, s, _ in got] == [(b, s) for b, s, _ in plan[:-1]]
    ref = [marks[i].elapsed_time(marks[i + 1]) for i in range(len(plan) - 1)]  # ms
    for r, (_, _, seconds) in zip(ref, got):
        assert seconds * 1e3 == pytest.approx(r, rel=0.1, abs=0.05), (got, ref)
    # the spins are real device work of the planned proportions (3 x longer drafted steps)
    assert got[2][2] / got[0][2] == pytest.approx(3.0, rel=0.25), got
