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


def gdn():
    rows = [r for r in json.load(open(os.path.join(RES, "gdn_tree_h200.json")))["rows"] if r["model"] == "qwen3.5-27b"]
    trees = list(dict.fromkeys(r["tree"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for tree in trees:
        rr = [r for r in rows if r["tree"] == tree]
        bs = [r["batch"] for r in rr]
        axes[0].plot(bs, [(r["native_verify_us"] + r["native_commit_us"]) / (r["ours_verify_us"] + r["replay_commit_us"])
                          for r in rr], marker="o", label=f"{tree} ({rr[0]['nodes']})")
        axes[1].plot(bs, [r["ours_verify_us"] + r["replay_commit_us"] for r in rr], marker="o", label=tree)
        axes[1].plot(bs, [r["native_verify_us"] + r["native_commit_us"] for r in rr], ls="--", color="grey", lw=0.8)
    axes[0].set(xscale="log", xlabel="batch", ylabel="speedup (verify + commit)",
                title="LumoTree vs SGLang 0.5.17 native tree path\nQwen3.5-27B GDN layer (Hv=48), H200")
    axes[0].axhline(1, color="k", lw=0.5)
    axes[0].legend(fontsize=8)
    axes[1].set(xscale="log", yscale="log", xlabel="batch", ylabel="µs per GDN layer",
                title="verify + commit time (solid: LumoTree, dashed: native)")
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "gdn_tree_h200.png"), dpi=110)


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


def bars(ax, series, labels):
    """Grouped bars: one group per label, one bar per ``(name, values, colour)`` series."""
    w = 0.8 / len(series)
    for i, (name, ys, c) in enumerate(series):
        ax.bar([x + (i - len(series) / 2 + 0.5) * w for x in range(len(labels))], ys, w, label=name, color=c)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)


def split():
    """The served verify forms, one GDN layer (Qwen3.5-27B heads), session 5's run."""
    rows = json.load(open(os.path.join(RES, "gdn_tree_split_h200.json")))["rows"]
    labels = [f"{r['tree']}\nbs {r['batch']}" for r in rows]
    series = [("SGLang native verify", [r["native_verify_us"] for r in rows], "0.6"),
              ("chunk, tf32x3 (served until session 5)", [r["serving_verify_us"] for r in rows], "C0"),
              ("split, tf32x3 (served default now)", [r["split"]["verify_us"] for r in rows], "C2"),
              ("split, mixed precision", [r["split"]["mixed_verify_us"] for r in rows], "C3"),
              ("read-once floor", [r["floor_us"] for r in rows], "k")]
    fig, ax = plt.subplots(figsize=(12, 4.2))
    bars(ax, series, labels)
    ax.set(yscale="log", ylabel="µs per GDN layer (CUDA graph)",
           title="Tree verify, served forms vs SGLang 0.5.17's kernel, Qwen3.5-27B GDN layer, H200")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "gdn_split_h200.png"), dpi=110)


def forms():
    """Session 6: the verify forms and the served 24-layer decode speed."""
    quick = json.load(open(os.path.join(RES, "apply_t_quick_h200.json")))["rows"]
    rows = {(r["tree"], r["batch"]): r
            for r in json.load(open(os.path.join(RES, "verify_forms_rows_h200.json")))["rows"]}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.4), gridspec_kw=dict(width_ratios=[1.3, 1]))
    labels = [f"{q['tree']}\nbs {q['batch']}" for q in quick]
    series = [("SGLang native verify (call 13)", [rows.get((q["tree"], q["batch"]), {}).get("native_verify_us", 0)
                                                for q in quick], "0.6"),
              ("split (session-5 default)", [q["wy_rows"] for q in quick], "C2"),
              ("split, pass 2 transposed", [q["wy_T"] for q in quick], "C8"),
              ("mix, untransposed", [q["mix_rows"] for q in quick], "C1"),
              ("mix, pass 2 transposed (served now)", [q["mix_T"] for q in quick], "C3")]
    bars(ax, series, labels)
    ax.set(yscale="log", ylabel="µs per GDN layer (CUDA graph)", title="Tree verify forms, Qwen3.5-27B heads, H200")
    ax.legend(fontsize=7)
    spec = json.load(open(os.path.join(RES, "bench_spec_27b_32l_h200.json")))["rows"]
    tps = {(r["config"], r["batch"]): r["logged_decode_tokens_per_s"] for r in spec}
    batches = [1, 8, 32]
    for name, label, c, m in (("nextn-topk2", "NEXTN topk 2", "0.5", "o--"),
                              ("lumotree-topk2-split", "LUMOTREE topk 2 (split)", "C2", "o-"),
                              ("nextn-topk4", "NEXTN topk 4", "0.2", "s--"),
                              ("lumotree-topk4-mix", "LUMOTREE topk 4 (mix)", "C3", "s-"),
                              ("none", "no speculation", "k", ":")):
        bx.plot(batches, [tps[(name, b)] for b in batches], m, color=c, label=label)
    bx.set(xscale="log", yscale="log", xticks=batches, xticklabels=[str(b) for b in batches], xlabel="batch",
           ylabel="decode tokens/s (server log)", title="Served, 24 GDN layers, dummy weights (acceptance 1)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "verify_forms_h200.png"), dpi=110)


def served():
    """Session 7: the served forms (mix verify + replay commit) vs SGLang's native tree path, every cell,
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


def served24():
    """Session 8: LUMOTREE vs SGLang's own hybrid path served at 24 GDN layers (Qwen3.5-27B shapes,
    dummy weights): client tokens/s per batch at controlled acceptance (~2.2) and at acceptance 1."""
    rows = json.load(open(os.path.join(RES, "bench_spec_27b_32l_h200.json")))["rows"]

    def pick(config, output_lens):  # {batch: row}, the longest run per batch among output_lens
        out = {}
        for r in rows:
            if r["config"] == config and r.get("output_len") in output_lens:
                if r["batch"] not in out or r["output_len"] > out[r["batch"]]["output_len"]:
                    out[r["batch"]] = r
        return out

    pairs = [("controlled acceptance ~2.2 (oracle trees, 6 nodes)", pick("lumotree-oracle", (384, 512)),
              pick("ngram-oracle", (384, 512))),
             ("acceptance 1, topk 2 (6 nodes)", {**pick("lumotree-topk2-mix-rows", (256,)), **pick("lumotree-topk2", (256,))},
              pick("nextn-topk2", (256,))),
             ("acceptance 1, chain (4 nodes)", pick("lumotree-chain", (256,)), pick("nextn-chain", (256,)))]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    for i, (name, ours, theirs) in enumerate(pairs):
        bs = sorted(set(ours) & set(theirs))
        c = f"C{i}"
        axes[0].plot(bs, [ours[b]["tokens_per_s"] for b in bs], marker="o", color=c, label=f"LUMOTREE, {name}")
        axes[0].plot(bs, [theirs[b]["tokens_per_s"] for b in bs], marker="s", ls="--", color=c,
                     label=f"SGLang (NGRAM oracle / NEXTN), {name}")
        ratio = [ours[b]["tokens_per_s"] / theirs[b]["tokens_per_s"] for b in bs]
        axes[1].plot(bs, ratio, marker="o", color=c, label=name)
        for b, x in zip(bs, ratio):
            capped = theirs[b].get("logged_max_running") and theirs[b]["logged_max_running"] < b
            axes[1].annotate(f"{x:.2f}" + ("*" if capped else ""), (b, x), textcoords="offset points", xytext=(0, 6),
                             ha="center", fontsize=7, color=c)
    for ax in axes:
        ax.set(xscale="log", xticks=[1, 8, 32, 64, 128], xticklabels=["1", "8", "32", "64", "128"], xlabel="batch")
    axes[0].set(yscale="log", ylabel="tokens/s (client)", title="24 GDN layers, Qwen3.5-27B shapes, dummy weights, H200")
    axes[0].legend(fontsize=6)
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[1].set(ylabel="LUMOTREE / SGLang (client tokens/s)",
                title="* SGLang runs only 49-51 requests at a time there\n(its per-node snapshots use up the state slots)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "served_24l_h200.png"), dpi=110)


if __name__ == "__main__":
    gdn()
    select()
    split()
    forms()
    served()
    served24()
