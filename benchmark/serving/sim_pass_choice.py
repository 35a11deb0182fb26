"""What the adaptive tree size serves in a measured pass whose drafts are accepted, in the policy's simulation.

The serving table (`bench_spec.py --oracle-p 0.8`) measures, per batch, a 128-step pass after a recording pass
(the oracle knows no continuation yet: its drafts miss) and three warm passes at the controlled acceptance. This
replays that sequence through :class:`lumotree.sglang.adaptive.TreeSizePolicy` with the overlap scheduler's timing
(`test/sglang/test_adaptive.py`'s ``simulate_overlap``: each step's own time read two launches late, results one step
late, a drafted step after no-draft steps cold) and the draft oracle's draws at p 0.8 (a 3-step chain accepts the
leading successes, 1.95 drafts a request on average), with the step times the H200 serving table measured (decode step
and drafted 3-step chain step, ms, per shape and batch). Reports the measured pass's tokens per second over the better
fixed choice's (chain on every step or no draft), mean and worst over seeds, and in how many seeds the pass served
the chain on fewer than half its steps.

    python3 benchmark/serving/sim_pass_choice.py [--module path/to/adaptive.py] [--seeds 40]

``--module``: another version of ``adaptive.py`` (e.g. ``git show REV:python/lumotree/sglang/adaptive.py``) simulated
instead of the installed one. A model, not a measurement of a server.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "sglang"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test"))
sys.path.insert(0, HERE)

from sim_probe_cost import policy_module  # noqa: E402

# shape: {batch: (decode step, drafted 3-step chain step)} in ms, the H200 serving table's decode_step_ms (the MoE
# shape's batch 8 chain step is SGLang's chain's, LUMOTREE served no draft there; 7.4 ms is what its policy estimated)
STEP_MS = {
    "qwen3.5-27b-32l": {1: (7.4, 10.5), 8: (8.1, 12.6), 32: (9.4, 16.8), 64: (11.3, 25.2), 128: (14.8, 45.0)},
    "qwen3-next-80b-moe-12l": {1: (1.48, 3.76), 8: (2.73, 6.26), 32: (5.82, 12.58), 64: (8.28, 17.11),
                               128: (11.29, 22.88)},
    "qwen3-next-80b-moe-12l, chain step as estimated": {8: (2.73, 7.4)},
    # one H100 (serving_speed_moe_h100.json): the served policy's own estimates at buckets 1 and 8 (its log)
    "qwen3-next-80b-moe-12l, H100 policy estimates": {1: (1.736, 3.608), 8: (3.302, 9.941)},
}
PASS = 128
TOKENS = 1 + 0.8 + 0.8 ** 2 + 0.8 ** 3  # tokens a request gains per counted drafted step at p 0.8, 3 steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default=None, help="an adaptive.py to simulate instead of lumotree's")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import test_adaptive as sim  # simulate_overlap, oracle_draws

    mod = policy_module(args.module)
    draws = sim.oracle_draws(0.8, 3)
    rows = []
    for shape, table in STEP_MS.items():
        for batch, (t_none, t_tree) in table.items():
            rel, chain_steps = [], []
            for seed in range(args.seeds):
                p = mod.TreeSizePolicy([0, 3])
                sim.simulate_overlap(p, batch, t_none / 1e3, t_tree / 1e3, 0.0, steps=PASS, seed=seed + 50)  # recording
                sim.simulate_overlap(p, batch, t_none / 1e3, t_tree / 1e3, draws, steps=3 * PASS, seed=seed)  # warm
                served = sim.simulate_overlap(p, batch, t_none / 1e3, t_tree / 1e3, draws, steps=PASS, seed=seed + 300)
                tokens = seconds = 0.0
                for i, s in enumerate(served):
                    cold = s and i > 0 and served[i - 1] == 0
                    tokens += TOKENS if s and not cold else 1.0
                    seconds += t_tree if s else t_none
                rel.append(tokens / seconds / max(1 / t_none, TOKENS / t_tree))
                chain_steps.append(served.count(3))
            rows.append(dict(shape=shape, batch=batch, step_ms=[t_none, t_tree],
                             best_fixed="chain" if TOKENS / t_tree > 1 / t_none else "no draft",
                             mean_of_best=round(statistics.mean(rel), 4), worst_of_best=round(min(rel), 4),
                             seeds_mostly_no_draft=sum(c < PASS // 2 for c in chain_steps), seeds=args.seeds))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        json.dump(dict(command="python3 " + " ".join(sys.argv), module=args.module or "lumotree.sglang.adaptive",
                       rows=rows), open(args.out, "w"), indent=1)
    return rows


if __name__ == "__main__":
    main()
