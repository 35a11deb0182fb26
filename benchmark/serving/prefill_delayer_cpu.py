"""SGLang's prefill delayer on one rank with and without LumoTree's hooks, on the CPU: the same verdicts on a random
stream of scheduler passes, and what a pass costs.

Two delayers on a one-rank gloo group (as a one-GPU server has): one with SGLang 0.5.17's ``_gather_info`` (a gloo
all-gather per pass) and its negotiation, one through ``lumotree.sglang.patches.prefill_delayer_gather`` and
``prefill_delayer_idle``. Each pass asks the delayer as SGLang's prefill adder does (``PrefillDelayerSinglePassExecutor``:
negotiate, then finalize), with random running batches, waiting queues, largest recent prefill batches, KV usage and
passes with nothing prefillable; the verdicts, reasons, status, counts, delay counts and the waits carried must be
equal pass by pass (the script exits non-zero where not). Timed: the gather alone, a whole held pass and a whole pass
with nothing waiting (the scheduler's usual pass), per call.

    python3 benchmark/serving/prefill_delayer_cpu.py --out benchmark/results/prefill_delayer_cpu.json

What the early ask (``prefill_delayer_early``) saves -- SGLang's ranking of the waiting queue on each held pass -- needs
a server; ``docs/performance.md`` has it served.
"""
import argparse
import json
import os
import random
import sys
import time
import types
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def delayers(max_delay_passes: int):
    """``(SGLang's, gather hook only, hooked)``: PrefillDelayers on a one-rank gloo group, the first with SGLang's
    gather and negotiation bound to it, the second with SGLang's negotiation and LumoTree's gather hook, the third
    through both of LumoTree's hooks (applied with SGLang's HookRegistry, as at a server's start)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.new_group([0], backend="gloo")
    from sglang.srt.managers import prefill_delayer as pdm
    from sglang.srt.plugins.hook_registry import HookRegistry

    # in a list: the registry rebinds module-level names of the originals
    sglangs = [pdm.PrefillDelayer._gather_info, pdm.PrefillDelayer._negotiate_should_allow_prefill]
    args = SimpleNamespace(prefill_delayer_queue_min_ratio=0.1, prefill_delayer_max_delay_ms=1e9,
                           enable_dp_attention=False, disable_overlap_schedule=False)

    def make():
        return pdm.PrefillDelayer(dp_size=1, attn_tp_size=1, cpu_group=group, server_args=args,
                                  max_delay_passes=max_delay_passes, token_usage_low_watermark=0.05)

    ref = make()
    ref._gather_info = types.MethodType(sglangs[0], ref)
    ref._negotiate_should_allow_prefill = types.MethodType(sglangs[1], ref)
    from lumotree.sglang.patches import prefill_delayer_gather, prefill_delayer_idle

    prefill_delayer_gather.install()
    prefill_delayer_idle.install()
    HookRegistry.apply_hooks()
    if (pdm.PrefillDelayer._gather_info is sglangs[0]
            or pdm.PrefillDelayer._negotiate_should_allow_prefill is sglangs[1]):
        raise RuntimeError("the delayer hooks were not applied")
    gather_only = make()  # the gather hook alone: what the idle-pass hook adds to it
    gather_only._negotiate_should_allow_prefill = types.MethodType(sglangs[1], gather_only)
    return ref, gather_only, make()


def same_verdicts(ref, hooked, passes: int, seed: int = 0) -> dict:
    """Both delayers on one random stream of passes: ``{"same": bool, "reasons": {reason: passes}}``."""
    rng = random.Random(seed)
    reasons, same = {}, True
    for _ in range(passes):
        kw = dict(local_prefillable=rng.random() < 0.8, token_usage=rng.choice([0.01, 0.5]),
                  running_batch=rng.randint(0, 40), max_prefill_bs=rng.randint(0, 32), max_running_requests=32,
                  waiting_queue_len=rng.randint(0, 6))
        a, b = ref._negotiate_should_allow_prefill(**kw), hooked._negotiate_should_allow_prefill(**kw)
        key = lambda o: (o.output_allow, o.output_reason, o.next_state and o.next_state.delayed_count,  # noqa: E731
                         o.num_prefillable, o.input_estimation, o.num_token_watermark_force_allow,
                         o.wait_forward_passes, o.wait_seconds > 0)
        same = same and key(a) == key(b)
        reasons[a.output_reason or "none prefillable"] = reasons.get(a.output_reason or "none prefillable", 0) + 1
    return dict(same=same, reasons=dict(sorted(reasons.items())))


def per_call_us(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return round((time.perf_counter() - t0) / calls * 1e6, 1)


def held_pass(delayer):
    """One scheduler pass that the delayer holds (31 running, one waiting, as the adder asks it)."""
    from sglang.srt.managers.prefill_delayer import PrefillDelayerSinglePassExecutor

    def run():
        sp = PrefillDelayerSinglePassExecutor(delayer, token_usage=0.5)
        sp.negotiate_should_allow_prefill(local_prefillable=True, running_batch=31, max_prefill_bs=4,
                                          max_running_requests=32, waiting_queue_len=1)
        sp.finalize(actual_prefill=False)
        delayer._curr_state = None  # every pass a first hold (no pass cap reached)
    return run


def idle_pass(delayer):
    """One scheduler pass with nothing to prefill (SGLang's finalize negotiates it as not prefillable), most often
    right after a held one (its wait carried into the verdict)."""
    from sglang.srt.managers.prefill_delayer import PrefillDelayerSinglePassExecutor, _State

    def run():
        delayer._curr_state = _State(delayed_count=2)
        PrefillDelayerSinglePassExecutor(delayer, token_usage=0.5).finalize(actual_prefill=False)
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passes", type=int, default=3000, help="random passes whose verdicts are compared")
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per measurement")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ref, gather_only, hooked = delayers(max_delay_passes=3)  # a short pass cap: its timeout verdicts show up in the stream
    check = same_verdicts(ref, hooked, args.passes)
    gather = lambda d: lambda: d._gather_info(True, False, running_batch=31, max_prefill_bs=4,  # noqa: E731
                                              waiting_queue_len=1)
    timing = dict(gather_us=dict(sglang=per_call_us(gather(ref), args.calls),
                                 hooked=per_call_us(gather(hooked), args.calls)),
                  held_pass_us=dict(sglang=per_call_us(held_pass(ref), args.calls),
                                    hooked=per_call_us(held_pass(hooked), args.calls)),
                  idle_pass_us=dict(sglang=per_call_us(idle_pass(ref), args.calls),
                                    gather_hook_only=per_call_us(idle_pass(gather_only), args.calls),
                                    hooked=per_call_us(idle_pass(hooked), args.calls)))
    cmd = [os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])
    res = dict(command="python3 " + " ".join(cmd), passes=args.passes, calls=args.calls, **check, **timing)
    print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if check["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
