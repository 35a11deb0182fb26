"""docs/serving_speed_h200.png from benchmark/results/serving_speed_h200.json (needs matplotlib):
client tokens/s relative to no speculation, per batch, for every configuration of each run (a run without
no-speculation rows at a batch takes them from the runs its ``none_from`` names).

    python3 benchmark/serving/plot_serving_speed.py
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "..", "results", "serving_speed_h200.json")
OUT = os.path.join(HERE, "..", "..", "docs", "serving_speed_h200.png")


def main():
    runs = json.load(open(RES))["runs"]
    by_name = {run.get("run"): run for run in runs}
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, run in enumerate(runs):
        # the run's own no-speculation rows; batches it lacks from the runs it names (``none_from``)
        none = {}
        for src in reversed([run] + [by_name[n] for n in run.get("none_from", []) if n in by_name]):
            none.update({r["batch"]: r["tokens_per_s"] for r in src["rows"] if r["config"] == "none"})
        for cfg in dict.fromkeys(r["config"] for r in run["rows"]):
            if cfg == "none" or not none:
                continue
            rows = [r for r in run["rows"] if r["config"] == cfg and r["batch"] in none]
            if not rows:
                continue
            acc = sum(r.get("accept_length") or 1.0 for r in rows) / len(rows)
            ax.plot([r["batch"] for r in rows], [r["tokens_per_s"] / none[r["batch"]] for r in rows], marker="o",
                    ls="-" if cfg.startswith("lumotree") else ":",
                    label=f"{cfg}, accept {acc:.2f} (run {run.get('run', i + 1)})")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xscale="log", xlabel="batch", ylabel="tokens/s ÷ no speculation",
           title="Serving speed vs no speculation, Qwen3.5-27B shapes, 32 layers, H200")
    ax.set_xticks([1, 8, 32, 64], ["1", "8", "32", "64"])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(OUT)


if __name__ == "__main__":
    main()
