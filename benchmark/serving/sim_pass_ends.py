"""What the adaptive tree size's probes cost at the benchmark's pass ends, in the policy's simulation: with and
without the ending step (a decode step after which every request has ended serves no draft without a decision,
``lumotree.sglang.finish.ends_after_step``, ``TreeSizePolicy.ending_step``).

``sim_probe_cost.py`` replays the passes of ``bench_spec.py --miss --repeats 3`` as one stream of decode steps. A
served pass is more: its requests end together, and under SGLang's overlap scheduler the decode step launched after
a batch's last one still holds the finished requests (their rows finished: no acceptance sample); before each
measured pass the benchmark sends three one-token passes (``--prefill-samples``: a prefill, then that extra step);
a prefill between two decode steps leaves the step before it without a time sample (``worker.StepClock``). A probe
of the tree that starts on such an extra step measures nothing and is run again (``EMPTY_PROBE_REPEATS``). This
replays those passes -- per request its tokens (``max_new_tokens`` 128), each drafted step accepting what the
oracle draws at p 0.8 or nothing where drafts miss, the host seeing a step's tokens one step late -- through
:class:`lumotree.sglang.adaptive.TreeSizePolicy` with warm probes (the served default), timed as
``sim_probe_cost.py`` times steps (its ``STEP_MS``; a warm step as a decode step), and reports per batch, over the
three measured miss passes: their decode steps' time over no speculation's (the same steps, each a decode step),
the drafted steps among them, and the probes run again for want of a running request (there and over all the passes).

    python3 benchmark/serving/sim_pass_ends.py [--shape ...] [--seeds 20]

A model, not a measurement of a server: prefills take no time here, and every request of a pass ends at its
``max_new_tokens``.
"""
import argparse
import json
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "sglang"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test"))

from sim_probe_cost import PASS, STEP_MS  # noqa: E402

PREFILL_SAMPLES = 3  # one-token passes before each measured pass (bench_spec.py's default)


class Server:
    """One policy served through passes: the overlap scheduler's extra step, prefills, results one step late."""

    def __init__(self, policy, t_none, t_tree, ending, seed):
        self.p, self.t_none, self.t_tree, self.ending = policy, t_none, t_tree, ending
        self.rng = random.Random(seed)
        self.timed = []  # [candidate, seconds, counts] of decode steps whose time is not read yet
        self.pending = None  # (candidate, accepted drafts of the rows still running after the step) of the last step
        self.prev = None  # the last decode step's candidate (-1: warm)
        self.after_decode = False
        self.empty_repeats = 0  # tree probes run again because they held no running request

    def prefill(self):
        if self.timed:  # the step before a prefill gives no time sample
            self.timed[-1][2] = False
        self.after_decode = False

    def step(self, batch, out, host, limit, accept):
        """One decode step of ``batch`` rows: ``out`` their tokens, ``host`` those the host has seen; returns the
        candidate served and whether it was warm."""
        lag = 1 if self.after_decode else 0
        ends = all(h + lag + 1 >= limit for h in host)
        before = sum(self.p.buckets[b].empty_probes for b in self.p.buckets)
        if ends and self.ending:
            s = self.p.ending_step()
        else:
            s = self.p.choose(batch)
        self.empty_repeats += max(0, sum(self.p.buckets[b].empty_probes for b in self.p.buckets) - before)
        warm = bool(getattr(self.p, "warm", False)) and s == 0
        if len(self.timed) >= 2:  # read two launches late (the device's clock); a warm step is no candidate's
            s0, t0, counts = self.timed.pop(0)
            if counts and s0 >= 0:
                self.p.observe_time(batch, s0, t0)
        if self.pending is not None:
            s1, rows = self.pending
            if rows:
                self.p.observe_accept(s1, rows)
        cold = s > 0 and self.prev == 0
        live = [i for i in range(batch) if out[i] < limit]
        drafts = {}
        for i in live:
            a = min(s, accept(self.rng)) if s > 0 and not cold else 0
            drafts[i] = a
            out[i] = min(limit, out[i] + 1 + a)
        still = [drafts[i] for i in live if out[i] < limit]  # rows the step finished leave the sample
        self.pending = None if (cold or s == 0) else (s, still)
        t = self.t_tree[s] if s else self.t_none
        self.timed.append([-1 if warm else s, t * (1 + 0.02 * self.rng.random()), True])
        self.prev = -1 if warm else s
        self.after_decode = True
        return s, warm, t


def serve_pass(server, batch, limit, accept):
    """A pass: its prefill (one token per request), decode steps until every request has ``limit`` tokens, and the
    overlap scheduler's extra step after the last. Returns [(candidate, warm, seconds)] of its decode steps."""
    server.prefill()
    out = [1] * batch  # the prefill's token
    seen = [0] * batch  # what the host has processed: the prefill's token arrives with the first decode step
    steps = []
    while True:
        done = all(o >= limit for o in out)
        prev = list(out)
        s, warm, t = server.step(batch, out, seen, limit, accept)
        steps.append((s, warm, t))
        seen = prev  # the host processes the step before this one
        if done:  # this was the extra step: it held the finished requests
            return steps


def run(mod, batch, t_none, t_tree, seed, ending):
    import test_adaptive as sim  # oracle_draws

    p = mod.TreeSizePolicy([0, 3], warm_probes=True)
    server = Server(p, t_none / 1e3, {3: t_tree / 1e3}, ending, seed)
    hit, miss = sim.oracle_draws(0.8, 3), (lambda rng: 0)

    def passes(accept, n):
        got = []
        for _ in range(n):
            for _ in range(PREFILL_SAMPLES):
                serve_pass(server, batch, 1, accept)
            got.append(serve_pass(server, batch, PASS, accept))
        return got

    passes(miss, 1)  # the recording pass
    passes(hit, 6)  # three warm and three measured passes at p 0.8
    passes(miss, 3)  # warm passes whose drafts miss
    repeats = server.empty_repeats
    measured = passes(miss, 3)
    steps = [x for ps in measured for x in ps]
    return dict(loss=sum(t for _, _, t in steps) / (len(steps) * t_none / 1e3) - 1,
                drafted=sum(1 for s, _, _ in steps if s), empty_repeats=server.empty_repeats - repeats,
                all_empty_repeats=server.empty_repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3.5-27b-32l", choices=sorted(STEP_MS))
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    from lumotree.sglang import adaptive

    rows = []
    for batch, (t_none, t_tree) in STEP_MS[args.shape].items():
        row = dict(batch=batch)
        for ending in (False, True):
            got = [run(adaptive, batch, t_none, t_tree, seed, ending) for seed in range(args.seeds)]
            key = "ending_step" if ending else "without"
            row[key] = dict(mean_loss_pct=round(100 * statistics.mean(g["loss"] for g in got), 2),
                            max_loss_pct=round(100 * max(g["loss"] for g in got), 2),
                            drafted_steps=round(statistics.mean(g["drafted"] for g in got), 1),
                            empty_probe_repeats=round(statistics.mean(g["empty_repeats"] for g in got), 2),
                            empty_probe_repeats_all_passes=round(statistics.mean(g["all_empty_repeats"] for g in got), 2))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
