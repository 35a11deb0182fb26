"""lumotree.sglang.shared_times: tensor-parallel ranks whose clocks differ choose the same candidate at every step,
because their policies take rank 0's step times at the same steps; ranks that differ anyway are caught at the next
exchange, on every rank alike; the exchange runs over a real gloo group."""
import threading

import pytest

from lumotree.sglang import adaptive
from lumotree.sglang.adaptive import TreeSizePolicy
from lumotree.sglang.shared_times import RanksDiverged, SharedStepTimes


class Exchange:
    """An all-gather between ``world`` threads (one per simulated rank)."""

    def __init__(self, world):
        self.world, self.barrier, self.slots = world, threading.Barrier(world), [None] * world

    def gather_of(self, rank):
        def gather(payload):
            self.slots[rank] = payload
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out

        return gather


def _event_class(now):
    class Event:
        def __init__(self):
            self.t = None

        def record(self):
            self.t = now[0]

        def query(self):
            return self.t is not None

        def elapsed_time(self, later):
            return (later.t - self.t) * 1e3

    return Event


def _serve(rank, world, exchange, slow_decode, times, batches, accepts, out, ledgers):
    """Rank ``rank``'s StepLedger serving ``batches``; its device takes ``slow_decode`` x the no-draft step times."""
    from lumotree.sglang.worker import StepLedger

    now = [0.0]
    shared = SharedStepTimes(rank=rank, world=world, gather=exchange.gather_of(rank))
    led = ledgers[rank] = StepLedger(TreeSizePolicy([0, 3]), first=3, event=_event_class(now), shared=shared)
    for i, bs in enumerate(batches):
        steps = led.choose(bs)
        out.append(steps)
        if steps is None:
            continue
        led.launched(bs, steps, cold=False)
        led.accepted([accepts[i] if steps else 0] * bs, 3)
        now[0] += times[(bs, steps)] * (slow_decode if steps == 0 else 1.0)


@pytest.mark.parametrize("slow_decode", [1.0, 0.5, 3.0])
def test_ranks_whose_devices_time_steps_differently_choose_alike_at_every_step(slow_decode):
    pytest.importorskip("sglang")
    # rank 0: the tree pays at batch 8 (8 vs 12 ms, ~2.1 tokens a step), not at 64 (15 vs 40 ms); rank 1's device
    # takes slow_decode x as long for a no-draft step (at 3x the tree would pay at 64 by its own clock)
    times = {(8, 0): 0.008, (8, 3): 0.012, (64, 0): 0.015, (64, 3): 0.040}
    batches = [8] * 300 + [0] * 3 + [64] * 300 + [8] * 200
    accepts = [1 + (i % 3) * 0.1 for i in range(len(batches))]
    ex = Exchange(2)
    outs, ledgers = [[], []], [None, None]
    threads = [threading.Thread(target=_serve, args=(r, 2, ex, 1.0 if r == 0 else slow_decode, times, batches,
                                                     accepts, outs[r], ledgers)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert outs[0] == outs[1] and len(outs[0]) == len(batches)
    assert all(led.pinned is None for led in ledgers)
    assert ledgers[0].shared.exchanges == ledgers[1].shared.exchanges == (len(batches) - 3) // 8
    # both decide as rank 0's clock says: the tree at 8, no draft at 64 by the end of each phase
    assert outs[0][299] == 3 and outs[0][302 + 300] == 0 and outs[0][-1] == 3


def test_without_sharing_ranks_whose_devices_time_steps_differently_choose_differently():
    """The premise: fed their own clocks, two ranks' policies part (so the sharing is what keeps them equal). Rank
    1's device takes 3x as long for a no-draft step as rank 0's (an unequal host or GPU), drafted steps alike."""
    pytest.importorskip("sglang")
    from lumotree.sglang.worker import StepLedger

    times = {0: 0.008, 3: 0.020}  # at 1 accepted draft: no draft pays at 8 ms, the tree at 24
    outs = []
    for slow_decode in (1.0, 3.0):
        now = [0.0]
        led = StepLedger(TreeSizePolicy([0, 3]), first=3, event=_event_class(now))
        got = []
        for _ in range(200):
            s = led.choose(8)
            got.append(s)
            led.launched(8, s)
            led.accepted([1] * 8 if s else [0] * 8, 3)
            now[0] += times[s] * (slow_decode if s == 0 else 1.0)
        outs.append(got)
    assert outs[0] != outs[1]


def test_a_divergence_is_seen_by_every_rank_at_the_next_exchange_and_pins_the_configured_tree(caplog):
    pytest.importorskip("sglang")
    ex = Exchange(2)
    shared = [SharedStepTimes(rank=r, world=2, gather=ex.gather_of(r), every=4) for r in range(2)]
    results = [[], []]

    def run(r):
        for i in range(8):
            shared[r].chose(8, 3 if (r == 0 or i != 5) else 0)  # rank 1 chose differently at step 5
            try:
                results[r].append(shared[r].take([(8, 3, 0.01)], 1.0))
            except RanksDiverged as e:
                results[r].append(str(e))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    # the first exchange (step 4) hands rank 0's samples to both; the second (step 8) finds the difference on both
    assert results[0][3] == results[1][3] == [(8, 3, 0.01)] * 4
    assert all("chose differently" in r[7] for r in results)
    assert all(x == [] for r in results for x in r[:3] + r[4:7])


def test_the_ledger_serves_the_configured_tree_after_a_divergence():
    pytest.importorskip("sglang")
    from lumotree.sglang.worker import StepLedger

    def gather(payload):
        raise RanksDiverged("test")

    led = StepLedger(TreeSizePolicy([0, 3]), first=3, shared=SharedStepTimes(gather=gather, every=1))
    assert led.choose(8) == 3 and led.pinned == 3
    led.policy.choose = lambda bs: 0
    assert [led.choose(8) for _ in range(5)] == [3] * 5 and led.choose(0) is None


def _gloo_rank(rank, port, q):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    s = SharedStepTimes(dist.group.WORLD, rank, 2, every=2)
    got = []
    for i in range(6):
        s.chose(4, 3)
        got.append(s.take([(4, 3, 0.001 * (rank + 1) * (i + 1))], 0.5))
    dist.destroy_process_group()
    q.put((rank, got))


def test_the_exchange_over_a_real_gloo_group():
    import multiprocessing as mp
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert res[0] == res[1]
    assert res[0] == [[], [(4, 3, 0.001), (4, 3, 0.002)], [], [(4, 3, 0.003), (4, 3, 0.004)], [],
                      [(4, 3, 0.005), (4, 3, 0.006)]]


def test_tensor_parallel_servers_are_adaptive_and_data_parallel_ones_are_not():
    from types import SimpleNamespace

    def sa(**kw):
        base = dict(speculative_algorithm="LUMOTREE", enable_multi_layer_eagle=False, tp_size=1, dp_size=1,
                    enable_dp_attention=False, enable_deterministic_inference=False)
        base.update(kw)
        return SimpleNamespace(**base)

    pytest.importorskip("sglang")
    assert adaptive.adaptive_tree_size(sa()) and adaptive.adaptive_tree_size(sa(tp_size=2))
    assert not adaptive.adaptive_tree_size(sa(tp_size=2, dp_size=2))
    assert not adaptive.adaptive_tree_size(sa(tp_size=2, enable_dp_attention=True))
