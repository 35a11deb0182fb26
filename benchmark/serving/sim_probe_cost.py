"""What the adaptive tree size's probes cost a measured pass whose drafts miss, in the policy's simulation.

The serving table's miss rows (`bench_spec.py --miss`) measure a 128-step pass right after the acceptance
fell; a probe of the tree that falls in it costs its drafted steps. This replays that sequence through
:class:`lumotree.sglang.adaptive.TreeSizePolicy` with the overlap scheduler's timing
(`test/sglang/test_adaptive.py`'s ``simulate_overlap``: each step's own time read two launches late, results
one step late, a drafted step after no-draft steps cold): two passes whose drafts are accepted as the draft oracle draws them at p 0.8, four passes whose
drafts miss (the recording pass and three warm passes), then the measured miss pass; per batch the step
times of the serving table (27B shapes, 32 layers, H200: decode step and drafted step, ms). Reports the
measured pass's time over 128 no-draft steps, mean and worst over seeds.

``--sequence repeats``: the passes ``bench_spec.py --miss`` now runs per batch instead -- the recording pass (drafts
miss), three warm and three measured passes at p 0.8, three warm passes whose drafts miss, then three measured ones
(``--repeats 3``) --, the three measured miss passes' time over 3 x 128 no-draft steps and how many of their steps
drafted (``drafted_steps``, mean over seeds): what the policy's probes cost a drafts-miss row of the serving table.

    python3 benchmark/serving/sim_probe_cost.py [--module path/to/adaptive.py] [--sequence repeats] \
        [--warm-probes --warm-ms MS]

``--warm-probes``: the policy as a LUMOTREE server serves it, each probe of the tree after no-draft steps starting with
a warm no-draft step instead of a cold drafted one; ``--warm-ms``: that step's time over a decode step's (not measured
yet: 0 gives the warm probes' lower bound). ``benchmark/results/probe_cost_repeats_cpu.json``: both shapes, cold and
warm (0 ms) probes.

``--module``: another version of ``adaptive.py`` (e.g. ``git show REV:python/lumotree/sglang/adaptive.py``)
simulated instead of the installed one. ``--candidates 0,1,3``: a chain that may also serve shallower depths (opt-in,
``--speculative-adaptive-config``); a ``k``-step chain's step time is *estimated* as ``t_decode + (t_3step - t_decode)
x k / 3`` (the table has the 3-step chain's only), its acceptance the oracle's leading successes cut at ``k``. That
estimate is optimistic: served on one H100 a 1-step chain's step cost 56 % of the 3-step chain's extra time over a
decode step at batch 64 and 46 % at batch 1, not 33 % (``benchmark/results/chain_depth_h100.json``).
"""
import argparse
import collections
import importlib.util
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "sglang"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test"))

# shape: {batch: (decode step, drafted 3-step chain step)} in ms: the 27B serving table's client step times without
# the one-token pass (H200); the MoE shape's, the served policy's own step-time estimates on one H100 (its log in the
# serving table's run, serving_speed_moe_h100.json)
STEP_MS = {
    "qwen3.5-27b-32l": {8: (8.1, 12.7), 32: (9.5, 17.0), 64: (11.2, 25.5), 128: (14.9, 45.0)},
    "qwen3-next-80b-moe-12l, H100 policy estimates": {1: (1.736, 3.608), 8: (3.302, 9.941), 32: (7.728, 13.263),
                                                      64: (11.344, 16.625), 128: (15.03, 26.24)},
}
PASS = 128


def policy_module(path=None):
    """The adaptive policy's module: the installed one, or the ``adaptive.py`` at ``path`` (``--module``)."""
    if not path:
        from lumotree.sglang import adaptive

        return adaptive
    spec = importlib.util.spec_from_file_location("adaptive_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default=None, help="an adaptive.py to simulate instead of lumotree's")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--candidates", default="0,3", help="the policy's candidates (draft steps; 0 = no draft)")
    ap.add_argument("--shape", default="qwen3.5-27b-32l", choices=sorted(STEP_MS), help="whose step times")
    ap.add_argument("--sequence", default="table", choices=("table", "repeats"),
                    help="table: two accepted passes, four whose drafts miss, the measured one; repeats: bench_spec's "
                         "passes with --repeats 3 (module docstring)")
    ap.add_argument("--warm-probes", action="store_true",
                    help="probes of the tree after no-draft steps start with a warm no-draft step (the served default "
                         "of a LUMOTREE server, TreeSizePolicy(warm_probes=True)); needs --warm-ms")
    ap.add_argument("--warm-ms", type=float, default=None,
                    help="with --warm-probes: the warm step's time over a decode step's, ms -- not measured yet, so "
                         "given (0: as a decode step; the drafted step's extra: no cheaper than a cold probe)")
    args = ap.parse_args(argv)
    if args.warm_probes and args.warm_ms is None:
        ap.error("--warm-probes needs --warm-ms (the warm step's extra time is not measured)")
    import test_adaptive as sim  # simulate_overlap, oracle_draws

    mod = policy_module(args.module)
    cands = [int(c) for c in args.candidates.split(",")]
    rows = []
    for batch, (t_none, t_tree) in STEP_MS[args.shape].items():
        t = {k: (t_none + (t_tree - t_none) * k / 3) / 1e3 for k in cands if k}  # seconds per drafting candidate
        losses, accepted, drafted = [], [], []
        for seed in range(args.seeds):
            p = mod.TreeSizePolicy(cands, warm_probes=True) if args.warm_probes else mod.TreeSizePolicy(cands)
            warm, choose = [], p.choose
            p.choose = lambda b, choose=choose, p=p, warm=warm: (choose(b), warm.append(getattr(p, "warm", False)))[0]
            if args.sequence == "repeats":  # recording pass, 3 + 3 accepted, 3 warm misses, the 3 measured
                sim.simulate_overlap(p, batch, t_none / 1e3, t, 0.0, steps=PASS, seed=seed + 300)
                hit = sim.simulate_overlap(p, batch, t_none / 1e3, t, sim.oracle_draws(0.8, 3), steps=6 * PASS,
                                           seed=seed)
                sim.simulate_overlap(p, batch, t_none / 1e3, t, 0.0, steps=3 * PASS, seed=seed + 100)
                n = len(warm)
                served = sim.simulate_overlap(p, batch, t_none / 1e3, t, 0.0, steps=3 * PASS, seed=seed + 200)
            else:
                hit = sim.simulate_overlap(p, batch, t_none / 1e3, t, sim.oracle_draws(0.8, 3), steps=2 * PASS,
                                           seed=seed)
                sim.simulate_overlap(p, batch, t_none / 1e3, t, 0.0, steps=4 * PASS, seed=seed + 100)
                n = len(warm)
                served = sim.simulate_overlap(p, batch, t_none / 1e3, t, 0.0, steps=PASS, seed=seed + 200)
            warmed = warm[n:]
            losses.append(sum(t[s] * 1e3 if s else t_none + (args.warm_ms if w else 0.0) for s, w in zip(served, warmed))
                          / (len(served) * t_none) - 1)
            drafted.append(sum(1 for s in served if s))
            accepted.append(collections.Counter(hit[-PASS:]))  # what the last accepted pass served
        rows.append(dict(batch=batch, candidates=cands, warm_ms=args.warm_ms if args.warm_probes else None,
                         mean_loss_pct=round(100 * statistics.mean(losses), 2),
                         max_loss_pct=round(100 * max(losses), 2), drafted_steps=round(statistics.mean(drafted), 1),
                         accepted_pass_served={k: sum(c[k] for c in accepted) for k in cands}))
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
