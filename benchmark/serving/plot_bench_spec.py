"""Plot a bench_spec result: the server-logged decode throughput per configuration and batch, and
the speculative memory each configuration reserves.

    python3 benchmark/serving/plot_bench_spec.py benchmark/results/bench_spec_h200.json docs/bench_spec_h200.png
"""
from __future__ import annotations

import json
import sys


def main(src, dst):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.load(open(src))
    rows = [r for r in d["rows"] if r.get("logged_decode_tokens_per_s")]
    order = ["none", "nextn-chain", "nextn-topk2", "lumotree-topk2", "nextn-topk4", "lumotree-topk4", "ngram-oracle",
             "lumotree-oracle"]  # each SGLang baseline beside its LumoTree counterpart
    configs = sorted(dict.fromkeys(r["config"] for r in rows), key=lambda c: order.index(c) if c in order else 99)
    batches = sorted({r["batch"] for r in rows})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw=dict(width_ratios=[2.2, 1]))
    w = 0.8 / len(configs)
    for i, c in enumerate(configs):
        ys = [next((r["logged_decode_tokens_per_s"] for r in rows if r["config"] == c and r["batch"] == b), 0)
              for b in batches]
        acc = next((r["accept_length"] for r in rows if r["config"] == c and r["accept_length"]), None)
        label = c + (f" (accept {acc:.2f})" if acc else "")
        ax.bar([j + i * w for j in range(len(batches))], ys, w, label=label,
               hatch="//" if c.startswith("lumotree") else None)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_ylabel("decode tokens/s (SGLang's log)")
    ax.set_yscale("log")
    ax.set_title("Qwen3.5-27B shapes, 8 layers, dummy weights, H200")
    ax.legend(fontsize=7, ncol=2)
    mem = {c: d["servers"][c]["speculative_bytes"]["total"] / 2**20 for c in configs
           if "speculative_bytes" in d["servers"].get(c, {}) and c != "none"}
    ax2.barh(list(mem), list(mem.values()), color=["C1" if c.startswith("lumotree") else "C0" for c in mem])
    ax2.set_xscale("log")
    ax2.set_xlabel("speculative memory reserved at start-up (MiB)")
    for y, v in enumerate(mem.values()):
        ax2.text(v, y, f" {v:.0f}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
