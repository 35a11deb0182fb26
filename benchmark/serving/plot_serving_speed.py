"""docs/<name>.png from benchmark/results/<name>.json (default name serving_speed_<device>; needs matplotlib):
client tokens/s relative to no speculation (pass by pass where both rows kept their passes), per batch, for every
configuration of each run, one row of panels per model shape (the rows' ``shape``) and one panel per controlled
acceptance (``accept_p``; 0.0: drafts that miss). A run without no-speculation rows at a batch takes them from the
runs its ``none_from`` names.

    python3 benchmark/serving/plot_serving_speed.py [--device h200|h100] [--name serving_speed_moe_h100]

A result of one run (``bench_spec.py --out``: its ``rows`` at the top) is plotted as that run.
"""
import argparse
import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_spec import paired_ratio, row_prompts  # noqa: E402

DEVICES = {"h200": "one H200", "h100": "one H100 80GB"}


def ratios(runs):
    """``{(accept_p, label): [(batch, tokens/s ÷ no speculation, accept length)]}`` over all runs."""
    by_name = {run.get("run"): run for run in runs}
    out = {}
    for i, run in enumerate(runs):
        none = {}  # the run's own no-speculation rows; batches it lacks from the runs it names
        for src in reversed([run] + [by_name[n] for n in run.get("none_from", []) if n in by_name]):
            none.update({(r["batch"], row_prompts(r)): r for r in src["rows"] if r["config"] == "none"})
        for r in run["rows"]:
            # against no speculation on the same prompts (fresh ones where drafts miss), else on the known ones;
            # pass by pass where both kept their passes (bench_spec.paired_ratio)
            base = none.get((r["batch"], row_prompts(r)), none.get((r["batch"], "known")))
            if r["config"] == "none" or base is None:
                continue
            same = row_prompts(base) == row_prompts(r)
            ratio = paired_ratio(r, base)[0] if same else r["tokens_per_s"] / base["tokens_per_s"]
            tag = [f"run {run.get('run', i + 1)}"] if len(runs) > 1 else []
            tag += [run["tag"]] if run.get("tag") else []
            if r.get("accept_p") is None:  # no oracle: its rows on known and on fresh prompts are two series
                tag += [row_prompts(r) + " prompts"]
            if r.get("step_timing"):  # taken with the step-timing hooks (host work on each step): a series apart
                tag += ["timing hooks"]
            key = (r.get("accept_p"), r["config"] + (f" ({', '.join(tag)})" if tag else ""))
            out.setdefault(key, []).append((r["batch"], ratio, r.get("accept_length") or 1.0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=sorted(DEVICES), default="h200")
    ap.add_argument("--name", default=None, help="the result file's name without .json (default serving_speed_<device>)")
    args = ap.parse_args()
    device, name = args.device, args.name or f"serving_speed_{args.device}"
    res = json.load(open(os.path.join(HERE, "..", "results", f"{name}.json")))
    out = os.path.join(HERE, "..", "..", "docs", f"{name}.png")
    runs = res["runs"] if "runs" in res else [res]
    shapes = list(dict.fromkeys(r["rows"][0].get("shape", "") for r in runs))
    grid = {shape: ratios([r for r in runs if r["rows"][0].get("shape", "") == shape]) for shape in shapes}
    panels = sorted({p for series in grid.values() for p, _ in series}, key=lambda p: (p is None, -(p or 0.0)))
    fig, axes = plt.subplots(len(shapes), len(panels), figsize=(6.2 * len(panels), 4.6 * len(shapes)), squeeze=False)
    for row, shape in zip(axes, shapes):
        series = grid[shape]
        batches = sorted({b for pts in series.values() for b, _, _ in pts})
        for ax, p in zip(row, panels):
            for (q, label), pts in sorted(series.items(), key=lambda kv: kv[0][1]):
                if q != p:
                    continue
                acc = sum(a for _, _, a in pts) / len(pts)
                ax.plot([b for b, _, _ in pts], [x for _, x, _ in pts], marker="o",
                        ls="-" if label.startswith("lumotree") else ":", label=f"{label}, mean accept {acc:.2f}")
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set(xscale="log", xlabel="batch", ylabel="tokens/s ÷ no speculation",
                   title=f"{shape}: " + ("no oracle: the server's own drafts" if p is None else
                                         "drafts that miss" if not p else f"controlled acceptance p = {p}"))
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.legend(fontsize=7)
    fig.suptitle(f"Serving speed vs no speculation, {DEVICES[device]}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
