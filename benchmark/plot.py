"""Plots for docs/performance.md from benchmark/results/*.json (needs matplotlib).

    python3 benchmark/plot.py
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "results")
DOCS = os.path.join(HERE, "..", "docs")


def select():
    rows = json.load(open(os.path.join(RES, "select_h200.json")))["rows"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for n in sorted({r["nodes"] for r in rows}):
        rr = [r for r in rows if r["nodes"] == n]
        ax.plot([r["batch"] for r in rr], [r["sglang_us"] for r in rr], ls="--", marker="x", label=f"SGLang, {n} nodes")
        ax.plot([r["batch"] for r in rr], [r["ours_graph_us"] for r in rr], marker="o", label=f"LumoTree (graph), {n} nodes")
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="µs per decode step (wall, synced)",
           title="Tree acceptance + commit bookkeeping, H200")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "select_h200.png"), dpi=110)


def served():
    """The served forms (mix verify + replay commit) vs SGLang's native tree path, every cell,
    and where the served kernels' time goes against the floors (Nsight Compute)."""
    rows = json.load(open(os.path.join(RES, "served_forms_h200.json")))["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    for ax, model in zip(axes[:2], ("qwen3.5-27b", "qwen3-next-80b")):
        mr = [r for r in rows if r["model"] == model]
        for tree in dict.fromkeys(r["tree"] for r in sorted(mr, key=lambda r: r["nodes"])):
            rr = sorted((r for r in mr if r["tree"] == tree), key=lambda r: r["batch"])
            ax.plot([r["batch"] for r in rr], [r["served_speedup_vs_native"] for r in rr], marker="o",
                    label=f"{tree} ({rr[0]['nodes']})")
        ax.axhline(10, color="grey", ls="--", lw=0.8)
        ax.axhline(3, color="grey", ls=":", lw=0.8)
        ax.set(xscale="log", xticks=[1, 8, 32, 64], xticklabels=["1", "8", "32", "64"], xlabel="batch",
               ylabel="speedup, verify + commit", ylim=(0, 11),
               title=f"served forms vs SGLang native, {model}\n(targets: 10x at 16-64 nodes, 3x at 4-8)")
        ax.legend(fontsize=7)
    r = next(r for r in rows if r["model"] == "qwen3.5-27b" and r["tree"] == "eagle-16" and r["batch"] == 32)
    labels = ["SGLang native", "served", "floor:\nverify + commit", "floor:\nfused step"]
    segs = [("SGLang verify (per-node snapshots)", [r["native_verify_us"], 0, 0, 0], "C0"),
            ("SGLang commit (snapshot copy)", [r["native_commit_us"], 0, 0, 0], "C9"),
            ("mix pass 1", [0, r["mix_prep_us"], 0, 0], "C1"),
            ("mix pass 2", [0, r["mix_apply_us"], 0, 0], "C3"),
            ("replay commit", [0, r["commit_us"], 0, 0], "C2"),
            ("state read once (4.3 TB/s)", [0, 0, r["read_floor_us"], r["read_floor_us"]], "0.45"),
            ("state read + write / write", [0, 0, r["commit_floor_us"], r["read_floor_us"]], "0.75")]
    bottom = [0.0] * 4
    for name, vals, c in segs:
        axes[2].bar(range(4), vals, bottom=bottom, color=c, label=name)
        bottom = [b_ + v for b_, v in zip(bottom, vals)]
    for i, tot in enumerate(bottom):
        axes[2].text(i, tot, f"{tot:.0f}", ha="center", va="bottom", fontsize=8)
    axes[2].set(xticks=range(4), xticklabels=labels, ylabel="µs per GDN layer", ylim=(0, 1.12 * max(bottom)),
                title="eagle-16, bs 32, Qwen3.5-27B heads (one layer)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "served_forms_h200.png"), dpi=110)


def agents():
    """Concurrent agents: tokens/s and p95 turn latency per server, one group per (run, concurrency), every server in
    the mode its flags alone give (LUMOTREE_SUFFIX: its default prefill delayer and the delayer's hooks, its adaptive
    choice of no draft, prefill graphs on), the median of 3 flushed repeats with the servers up at once and served in
    turn: 1 agent from run "1-agent-idle-hook" (the code before the full verify mask's layout was skipped; SGLang's
    NGRAM at 8 and 16 draft tokens beside), 8 and 32 agents from runs "8-agents-slot-trigger" and
    "32-agents-slot-trigger" (one machine; their "lumotree-suffix-slot-trigger" rows are the default's delayer, given
    by its flags; the variant without the slot trigger, removed, is left out), and 32 agents again from run
    "32-agents-full-mask-skip" (another machine). Ratios compare within a group, not across groups (machines of the
    pool differ up to 1.8x)."""
    runs = {r["name"]: r for r in json.load(open(os.path.join(RES, "agents_h200.json")))["runs"]}
    default = {"lumotree-suffix-slot-trigger": "lumotree-suffix", "lumotree-suffix-queue-only": None}
    groups = [("1-agent-idle-hook", 1, "1 agent", {}),
              ("8-agents-slot-trigger", 8, "8 agents", default),
              ("32-agents-slot-trigger", 32, "32 agents", default),
              ("32-agents-full-mask-skip", 32, "32 agents\n(another machine)", {})]
    rows = [dict(r, agents=label, config=rename.get(r["config"], r["config"])) for name, level, label, rename in groups
            if name in runs for r in runs[name]["rows"] if r["agents"] == level and rename.get(r["config"], 1)]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    levels = list(dict.fromkeys(r["agents"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(14, 3.8))
    w = 0.8 / len(configs)
    for i, c in enumerate(configs):
        got = {r["agents"]: r for r in rows if r["config"] == c}
        xs = [j + (i - (len(configs) - 1) / 2) * w for j in range(len(levels))]
        for ax, key in zip(axes, ("tokens_per_s", "latency_p95")):
            vals = [got[a][key] if a in got else 0 for a in levels]
            ax.bar(xs, vals, width=w, label=c)
            for x, v, a in zip(xs, vals, levels):
                label = ("not run" if a not in got else f"{v:.0f}" if key == "tokens_per_s" else f"{v:.2f}")
                ax.text(x, v, label, ha="center", va="bottom", fontsize=7, rotation=90 if a not in got else 0)
    for ax, ylabel in zip(axes, ("completion tokens/s", "p95 turn latency (s)")):
        ax.set(xticks=range(len(levels)), xticklabels=levels, ylabel=ylabel)
    axes[0].set_title("SWE-agent-style sessions, tiny model, H200")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "agents_h200.png"), dpi=110)


# the stacked parts of a decode step (medians per bucket; they need not add up to the step's median exactly)
NONE_PARTS = [("schedule", lambda t: t["schedule"]), ("forward: init + forward + sample", lambda t: t["forward"]),
              ("run_batch's rest", lambda t: t["launch"] - t["forward"]), ("result", lambda t: t["result"]),
              ("loop's rest", lambda t: t["step"] - t["launch"] - t["schedule"] - t["result"])]
NODRAFT_PARTS = [("schedule", lambda t: t["schedule"]), ("lengths (SGLang's wait)", lambda t: t["lengths"]),
                 ("worker's bookkeeping", lambda t: t["worker"] - t["nodraft"]), ("nd_prep", lambda t: t["nd_prep"]),
                 ("nd_init", lambda t: t["nd_init"]), ("nd_forward", lambda t: t["nd_forward"]),
                 ("nd_sample", lambda t: t["nd_sample"]), ("nd_result", lambda t: t["nd_result"]),
                 ("run_batch's rest", lambda t: t["launch"] - t["worker"] - t["lengths"]),
                 ("result", lambda t: t["result"]),
                 ("loop's rest", lambda t: t["step"] - t["launch"] - t["schedule"] - t["result"])]


def step_timing():
    """Served decode steps at 32 agents (run "32-agents-step-parts"): each server's median wall time per decode step on
    the scheduler's thread per batch bucket, the part of it in ``Scheduler.run_batch`` (the worker's launch), and the
    no-draft step's parts stacked beside no speculation's decode step."""
    run = next(r for r in json.load(open(os.path.join(RES, "agents_h200.json")))["runs"]
               if r["name"] == "32-agents-step-parts")
    servers = [n for n in ("none", "ngram", "lumotree-suffix", "lumotree-suffix-nodraft") if n in run["servers"]]
    buckets = ["1", "2", "4", "8", "16", "32"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 3.8), gridspec_kw=dict(width_ratios=[3, 3, 2.2]))
    w = 0.8 / len(servers)
    for ax, part, title in zip(axes, ("step", "launch"), ("decode step (run_batch to run_batch)",
                                                         "its Scheduler.run_batch (launch)")):
        for i, n in enumerate(servers):
            got = run["servers"][n]["step_timing"].get(part, {})
            xs = [j + (i - (len(servers) - 1) / 2) * w for j in range(len(buckets))]
            vals = [got[b]["median_ms"] if b in got else 0 for b in buckets]
            ax.bar(xs, vals, width=w, label=n)
        ax.set(xticks=range(len(buckets)), xticklabels=buckets, xlabel="batch bucket (running requests, next power of 2)",
               title=title, ylabel="median ms")
    axes[0].legend(fontsize=7)
    ax, labels, x = axes[2], [], 0
    colors = {}
    for b in ("1", "8", "32"):
        for n, parts in (("none", NONE_PARTS), ("lumotree-suffix-nodraft", NODRAFT_PARTS)):
            t = {p: v[b]["median_ms"] for p, v in run["servers"][n]["step_timing"].items() if b in v}
            bottom = 0.0
            for name, f in parts:
                v = max(0.0, f(t))
                c = colors.setdefault(name, plt.get_cmap("tab20")(len(colors) % 20))
                ax.bar(x, v, bottom=bottom, color=c, label=name if name not in labels else None,
                       hatch="//" if name == "loop's rest" else None)
                labels.append(name)
                bottom += v
            ax.text(x, bottom, f"{t['step']:.2f}", ha="center", va="bottom", fontsize=7)
            x += 1
        x += 0.5
    ticks = [i + 0.5 * (i // 2) for i in range(6)]
    ax.set(xticks=ticks, xticklabels=["none\nb1", "no-draft\nb1", "none\nb8", "no-draft\nb8", "none\nb32",
                                      "no-draft\nb32"], ylabel="median ms (stacked parts)",
           title="no-draft step against no speculation's decode step")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("32 SWE-agent-style sessions, tiny model, H200 (LUMOTREE_SUFFIX mixes drafted and no-draft steps)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "step_timing_h200.png"), dpi=110)


# where a 32-agent phase's scheduler time goes, per server: the decode intervals, then the prefill intervals split
PREFILL_PARTS = [("prefill: the target's forward", lambda t: t["prefill_forward"]),
                 ("prefill: run_batch beyond it (the speculative worker's own)",
                  lambda t: t["prefill_launch"] - t["prefill_forward"]),
                 ("prefill: scheduling", lambda t: t["prefill_schedule"]),
                 ("prefill: result processing", lambda t: t["prefill_result"]),
                 ("prefill: the loop's rest", lambda t: t["prefill"] - t["prefill_launch"] - t["prefill_schedule"]
                  - t["prefill_result"])]


def intervals():
    """32 agents (run "32-agents-sections"): each server's scheduler time over the phase's three repeats, its decode
    intervals and its prefill intervals split by the step timer's parts: the target's forward, the rest of
    ``run_batch`` (a speculative worker's own prefill work), scheduling, result processing, the loop's rest."""
    run = next(r for r in json.load(open(os.path.join(RES, "agents_h200.json")))["runs"]
               if r["name"] == "32-agents-sections")
    servers = [n for n in ("none", "ngram", "lumotree-suffix") if n in run["servers"]]
    totals = {n: {k: v["seconds"] for k, v in run["servers"][n]["step_totals"]["32 agents"].items()} for n in servers}
    fig, ax = plt.subplots(figsize=(12, 3.2))
    parts = [("decode intervals", lambda t: t["decode"])] + PREFILL_PARTS
    left = [0.0] * len(servers)
    for name, fn in parts:
        vals = [max(0.0, fn(totals[n])) for n in servers]
        ax.barh(range(len(servers)), vals, left=left, label=name)
        left = [a + v for a, v in zip(left, vals)]
    for i, tot in enumerate(left):
        ax.text(tot, i, f" {tot:.1f} s", va="center", fontsize=8)
    ax.set(yticks=range(len(servers)), yticklabels=servers,
           xlabel="scheduler seconds in decode and prefill intervals, three 32-agent phases",
           xlim=(0, 1.15 * max(left)), title="32 agents: where the scheduler's time goes (one H200)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "agents32_intervals_h200.png"), dpi=110)


if __name__ == "__main__":
    select()
    served()
    agents()
    step_timing()
    intervals()
