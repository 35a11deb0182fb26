"""What the adaptive tree size's probes cost a measured pass whose drafts miss, in the policy's simulation.

The serving table's miss rows (`bench_spec.py --miss`) measure a 128-step pass right after the acceptance
fell; a probe of the tree that falls in it costs its drafted steps. This replays that sequence through
:class:`lumotree.sglang.adaptive.TreeSizePolicy` with the overlap scheduler's timing
(`test/sglang/test_adaptive.py`'s ``simulate_overlap``: each step's own time read two launches late, results
one step late, a drafted step after no-draft steps cold): two passes whose drafts are accepted as the draft oracle draws them at p 0.8, four passes whose
drafts miss (the recording pass and three warm passes), then the measured miss pass; per batch the step
times of the serving table (27B shapes, 32 layers, H200: decode step and drafted step, ms). Reports the
measured pass's time over 128 no-draft steps, mean and worst over seeds.

    python3 benchmark/serving/sim_probe_cost.py [--module path/to/adaptive.py]

``--module``: another version of ``adaptive.py`` (e.g. ``git show REV:python/lumotree/sglang/adaptive.py``)
simulated instead of the installed one.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "sglang"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test"))

# batch: (decode step, drafted 3-step chain step) in ms, client, without the one-token pass (serving table)
STEP_MS = {8: (8.1, 12.7), 32: (9.5, 17.0), 64: (11.2, 25.5), 128: (14.9, 45.0)}
PASS = 128


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default=None, help="an adaptive.py to simulate instead of lumotree's")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    import test_adaptive as sim  # simulate_overlap, oracle_draws

    if args.module:
        spec = importlib.util.spec_from_file_location("adaptive_under_test", args.module)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
    else:
        from lumotree.sglang import adaptive as mod
    rows = []
    for batch, (t_none, t_tree) in STEP_MS.items():
        losses = []
        for seed in range(args.seeds):
            p = mod.TreeSizePolicy([0, 3])
            sim.simulate_overlap(p, batch, t_none / 1e3, t_tree / 1e3, sim.oracle_draws(0.8, 3), steps=2 * PASS, seed=seed)
            sim.simulate_overlap(p, batch, t_none / 1e3, t_tree / 1e3, 0.0, steps=4 * PASS, seed=seed + 100)
            served = sim.simulate_overlap(p, batch, t_none / 1e3, t_tree / 1e3, 0.0, steps=PASS, seed=seed + 200)
            losses.append(sum(t_tree if s else t_none for s in served) / (PASS * t_none) - 1)
        rows.append(dict(batch=batch, mean_loss_pct=round(100 * statistics.mean(losses), 2),
                         max_loss_pct=round(100 * max(losses), 2)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
