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
    the mode its flags alone give (LUMOTREE_SUFFIX: its per-request choice of no draft, its default prefill delayer
    and the delayer's hooks, prefill graphs on), the median of 3 flushed repeats with the servers up at once and served
    in turn: 1, 8 and 32 agents from runs "1-agent-flags-alone", "8-agents-flags-alone" and "32-agents-flags-alone"
    (one H100, a fresh machine), and 32 agents again from run "32-agents-request-choice" (an H200, earlier code; the
    same choice through its settings file). Ratios compare within a group, not across groups (machines of the pool differ up to 1.8x)."""
    runs = {r["name"]: r for r in json.load(open(os.path.join(RES, "agents_h200.json")))["runs"]}
    groups = [("1-agent-flags-alone", 1, "1 agent"),
              ("8-agents-flags-alone", 8, "8 agents"),
              ("32-agents-flags-alone", 32, "32 agents"),
              ("32-agents-request-choice", 32, "32 agents\n(an H200, earlier code, the\nchoice by its settings file)")]
    names = {"lumotree-suffix-request-quantile": "LUMOTREE_SUFFIX (flags alone / its default written out)",
             "lumotree-suffix": "LUMOTREE_SUFFIX (flags alone / its default written out)", "none": "no speculation",
             "ngram16": "SGLang NGRAM, 16 tokens"}
    rows = [dict(r, agents=label, config=names.get(r["config"], r["config"])) for name, level, label in groups
            if name in runs for r in runs[name]["rows"] if r["agents"] == level
            # the H200 run's lumotree-suffix row is the batch-wide choice since removed
            and not (name == "32-agents-request-choice" and r["config"] == "lumotree-suffix")]
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
    axes[0].set_title("SWE-agent-style sessions, tiny model, one H100 (last group an H200, earlier code)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "agents_h200.png"), dpi=110)


# where a decode step's time goes at 32 requests: per bar (label, server, the part that is the whole, [(part,
# f(medians))]). Medians of each part over the steps that had it, so the parts need not add up to the whole's median
# exactly; LUMOTREE_SUFFIX's loop parts are over its drafted and no-draft steps together, its worker's over one kind
STEP_RUN = "32-agents-node-records"
STEP_BARS = [
    ("no speculation:\ndecode step", "none", "step",
     [("schedule", lambda t: t["schedule"]), ("the target's forward (init + forward + sample)", lambda t: t["forward"]),
      ("run_batch's rest", lambda t: t["launch"] - t["forward"]), ("result processing", lambda t: t["result"]),
      ("the loop's rest", lambda t: t["step"] - t["launch"] - t["schedule"] - t["result"])]),
    ("LUMOTREE_SUFFIX:\ndecode step (both kinds)", "lumotree-suffix", "step",
     [("schedule", lambda t: t["schedule"]), ("SGLang's wait for the lengths", lambda t: t["lengths"]),
      ("LumoTree's worker", lambda t: t["worker"]),
      ("run_batch's rest", lambda t: t["launch"] - t["worker"] - t["lengths"]),
      ("result processing", lambda t: t["result"]),
      ("the loop's rest", lambda t: t["step"] - t["launch"] - t["schedule"] - t["result"])]),
    ("LUMOTREE_SUFFIX:\nits drafted step\n(in the worker)", "lumotree-suffix", "drafted",
     [("draft preparation (drafter + SGLang's inputs)", lambda t: t["dv_prepare"]),
      ("the verify's launch", lambda t: t["verify"]), ("the post-verify CUDA graph", lambda t: t["post_verify"]),
      ("lengths' publish, corpus, result", lambda t: t["dv_tail"]),
      ("the drafted step's rest", lambda t: t["drafted"] - t["dv_prepare"] - t["verify"] - t["post_verify"]
       - t["dv_tail"])]),
    ("LUMOTREE_SUFFIX:\nits no-draft step\n(in the worker)", "lumotree-suffix", "nodraft",
     [("no-draft: batch from the speculative one", lambda t: t["nd_prep"]),
      ("no-draft: forward batch", lambda t: t["nd_init"]),
      ("no-draft: decode graph launch", lambda t: t["nd_forward"]), ("no-draft: sampler", lambda t: t["nd_sample"]),
      ("no-draft: result", lambda t: t["nd_result"])]),
    ("SGLang NGRAM\n(16 tokens):\ndecode step", "ngram16", "step",
     [("schedule", lambda t: t["schedule"]), ("SGLang's wait for the lengths", lambda t: t["lengths"]),
      ("NGRAM: draft preparation", lambda t: t["spec_prep"]), ("the verify's launch", lambda t: t["verify"]),
      ("NGRAM: sampler + state commit + KV move", lambda t: t["sample"] + t["state_commit"] + t["kv_move"]),
      ("run_batch's rest", lambda t: t["launch"] - t["lengths"] - t["spec_prep"] - t["verify"] - t["sample"]
       - t["state_commit"] - t["kv_move"]),
      ("result processing", lambda t: t["result"]),
      ("the loop's rest", lambda t: t["step"] - t["launch"] - t["schedule"] - t["result"])]),
]


def step_timing(bucket="32"):
    """Where a served decode step's time goes at 32 requests (run ``STEP_RUN``, the step timer's medians on the
    scheduler's thread): no speculation's decode step, LUMOTREE_SUFFIX's (drafted and no-draft steps together) and its
    two kinds of step inside its worker, SGLang's NGRAM at 16 tokens."""
    run = next(r for r in json.load(open(os.path.join(RES, "agents_h200.json")))["runs"] if r["name"] == STEP_RUN)
    fig, ax = plt.subplots(figsize=(13, 4.2))
    colors, right = {}, 0.0
    for y, (label, server, whole, parts) in enumerate(STEP_BARS):
        t = {p: v[bucket]["median_ms"] for p, v in run["servers"][server]["step_timing"].items() if bucket in v}
        left = 0.0
        for name, f in parts:
            v = max(0.0, f(t))
            new = name not in colors
            c = colors.setdefault(name, plt.get_cmap("tab20")(len(colors) % 20))
            ax.barh(y, v, left=left, color=c, label=name if new else None)
            left += v
        ax.text(left, y, f" median {t[whole]:.2f} ms", va="center", fontsize=8)
        right = max(right, left)
    ax.set_xlim(0, 1.18 * right)
    ax.set(yticks=range(len(STEP_BARS)), yticklabels=[b[0] for b in STEP_BARS], xlabel="median ms (stacked parts)",
           title=f"32 SWE-agent-style sessions, tiny model, H200: a decode step at {bucket} requests (run {STEP_RUN})")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
    """32 agents (run ``STEP_RUN``): each server's scheduler time over the phase's three repeats, its decode
    intervals and its prefill intervals split by the step timer's parts: the target's forward, the rest of
    ``run_batch`` (a speculative worker's own prefill work), scheduling, result processing, the loop's rest."""
    run = next(r for r in json.load(open(os.path.join(RES, "agents_h200.json")))["runs"] if r["name"] == STEP_RUN)
    servers = [n for n in ("none", "ngram16", "lumotree-suffix") if n in run["servers"]]
    totals = {n: {k: v["seconds"] for k, v in run["servers"][n]["step_totals"]["32 agents"].items() if "seconds" in v}
              for n in servers}
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
           xlim=(0, 1.15 * max(left)), title=f"32 agents: where the scheduler's time goes (one H200, run {STEP_RUN})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "agents32_intervals_h200.png"), dpi=110)


def mtp_holes():
    """The MTP layer's missing entries (``benchmark/drafters/mtp_holes.py``): accept length x a fully written cache
    per scenario and per way a hole is served, on the file's own text and on the model's greedy tokens."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    fills = [("stale", "stale (a finished request's)"), ("zero", "zeroed (LumoTree's no-draft step, not yet served)"),
             ("masked", "left out of the attention")]
    for ax, (name, title) in zip(axes, [("text", "the file's own text"), ("greedy", "the model's greedy tokens")]):
        res = json.load(open(os.path.join(RES, f"mtp_holes_{name}_cpu.json")))
        scen = [sc for sc in dict.fromkeys(r["scenario"] for r in res["rows"]) if sc != "full"]
        for j, (fill, label) in enumerate(fills):
            vals = [next(r["vs_full"] for r in res["rows"] if r["scenario"] == sc and r["fill"] == fill) for sc in scen]
            ax.bar([i + (j - 1) * 0.27 for i in range(len(scen))], vals, width=0.27, label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xticks=range(len(scen)), ylim=(0.8, 1.02), title=f"{title} (full: accept length "
               f"{next(r['accept_length'] for r in res['rows'] if r['scenario'] == 'full'):.2f})",
               xticklabels=[sc.replace("stretch-", "") + ("\nno-draft steps" if sc.startswith("stretch") else
                                                            "'s entries\n(no draft-extend)") for sc in scen])
    axes[0].set_ylabel("accept length x every entry written")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3)
    fig.suptitle("Missing MTP entries: the tiny model's trained MTP head, 3-step chain, CPU", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(os.path.join(DOCS, "mtp_holes_cpu.png"), dpi=110)


if __name__ == "__main__":
    select()
    served()
    agents()
    step_timing()
    intervals()
    mtp_holes()
