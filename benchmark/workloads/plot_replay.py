"""Plot the agent-replay runs of a suite result (``benchmark/serving/suite.py``): per turn of the
replayed sessions, the prompt tokens served from the radix cache and the decode speed of every
configuration.

    python3 benchmark/workloads/plot_replay.py benchmark/results/serving_suite_h200.json docs/replay_h200.png
"""
from __future__ import annotations

import json
import sys


def main(src, dst):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {k: v for k, v in json.load(open(src))["replay"]["runs"].items() if v.get("turns")}
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    base = next(iter(runs.values()))["turns"]
    x = list(range(len(base)))
    ax.bar(x, [t["prompt_tokens"] for t in base], color="0.85", label="prompt tokens")
    ax.bar(x, [t["cached_tokens"] for t in base], color="C2", label="served from the radix cache (no-spec run)")
    for i, t in enumerate(base):
        if t["turn"] == 0 and i:
            ax.axvline(i - 0.5, color="k", lw=0.5)
            ax2.axvline(i - 0.5, color="k", lw=0.5)
    ax.set_ylabel("tokens")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Agent replay (tiny trained hybrid model, H200): sessions of growing contexts, one per block")
    for name, r in runs.items():
        s = r["summary"]
        acc = f", accept {s['accept_length']:.2f}" if s.get("accept_length") else ""
        same = f", {s['greedy_identical_turns']}/{s['turns_compared']} turns = no-spec" if "greedy_identical_turns" in s \
            else ""
        ax2.plot(x[:len(r["turns"])], [t["completion_tokens"] / t["seconds"] for t in r["turns"]], marker=".",
                 label=f"{name}: {s['tokens_per_s']:.0f} tok/s{acc}{same}")
    ax2.set_ylabel("tokens/s (per turn, batch 1)")
    ax2.set_xlabel("turn")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
