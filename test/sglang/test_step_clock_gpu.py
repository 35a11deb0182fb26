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


def test_a_steady_step_clock_leaves_out_the_host_preparation_of_a_drafted_step():
    """A loop that drafts on the host (LUMOTREE_SUFFIX): before each drafted step the host waits for the device and
    drafts (here: synchronize, then 8 ms on the host), so the step before it ends with the device idle. The plain
    clock gives the no-draft step before a drafted one that idle time; the steady one gives samples only within runs:
    no-draft steps their device time, drafted steps theirs plus the preparation that comes with each in a run."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import time

    from lumotree.sglang.worker import StepClock

    calibrate()
    cpm = calibrate()
    plan = [0, 0, 0, 1, 1, 1, 0, 0, 0]
    got = {}
    for steady in (False, True):
        clock = StepClock(steady=steady)
        out = []
        for steps in plan:
            out += clock.samples()
            if steps:  # the host needs the last step's tokens, then drafts
                torch.cuda.synchronize()
                time.sleep(0.008)
            clock.start(8, steps)
            spin(4.0 if steps else 2.0, cpm)
        clock.interrupt()
        torch.cuda.synchronize()
        out += clock.samples()
        got[steady] = out
    plain, steady = got[False], got[True]
    assert [s for _, s, _ in plain] == plan[:-1]
    assert [s for _, s, _ in steady] == [0, 0, 1, 1, 0, 0]
    before_draft = plain[2][2] * 1e3  # the no-draft step before the first drafted one: 2 ms + the host's 8+
    assert before_draft > 8.0, plain
    for _, s, seconds in steady:
        if s == 0:
            assert seconds * 1e3 == pytest.approx(2.0, rel=0.3), steady
        else:
            assert seconds * 1e3 > 4.0 + 8.0 * 0.9, steady  # its own device time and the next one's preparation
