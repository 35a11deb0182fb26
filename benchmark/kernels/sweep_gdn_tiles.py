"""The served GDN tree kernels' tilings, swept per cell: which V-block and warp counts make the mix verify (per layer)
and the all-layer replay commit (every GDN layer in one launch, as the SGLang backend launches it) fastest at each
batch and tree, against the tiling the launchers choose today (``verify.mix_config``, ``commit.commit_bv``); and the
commit reading each key's inverse L2 norm as the verify stored it (the ring's optional fifth buffer) instead of forming
it in every program (a fifth of its instructions by the Nsight profile; not served).

Why: on the H200 the served chain-4 verify + commit at batch 32 took 164 µs per layer against a 70 µs floor (the
states read once by the verify, read and written by the commit; ``served_forms_h200.json``): the commit ran at
1.9x its floor and the verify's state pass at 2.5x its, and the commit's tiling (BV = 16, 4 warps) was chosen by a
sweep of an earlier, one-layer form. Every config's outputs are checked against the default config's before it is
timed (relative error below 1e-5, else the config is reported as wrong and not timed). Beside them the walk verify
(one kernel, the state on-chip along each path; not served: it keeps no k / v / gates for the commit), against the
mix verify's outputs.

    python3 benchmark/kernels/sweep_gdn_tiles.py --models qwen3.5-27b --trees chain-4,topk2-depth3 \
        --batches 1,8,32,64,128 --out benchmark/results/gdn_tiles_h200.json

CPU smoke test (Triton's interpreter, the tiny shapes; timings meaningless): ``TRITON_INTERPRET=1 ... --models tiny``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_verify_forms import MODELS, bench_graph, cell_inputs, rel, trees  # noqa: E402

COMMIT_BV = (8, 16, 32, 64)
COMMIT_WARPS = (1, 2, 4, 8)
COMMIT_NORMS = ("formed", "stored")  # the key's L2 norm formed by every program (served) or the verify's stored one
VERIFY_BV = (16, 32, 64, 128)
VERIFY_WARPS = (1, 2, 4)
PREP_WARPS = (1, 2, 4)
PREP_HEADS = ("group", 1)  # value heads per pass-1 program: the key head's group (today) or one each
TOLERANCE = 1e-5
WALK_TOLERANCE = 1e-4  # the walk's fp32 recurrence against the mix's tf32x3 dots


def commit_cell(model, tree_name, B, layers, configs):
    """``{(BV, warps, norms): µs per layer or "wrong"}`` of the all-layer replay commit at one cell, and the default's
    key."""
    from lumotree.ops.gdn_tree.commit import commit_bv, gdn_tree_commit_layers_fwd

    Hk, Hv, K, V = MODELS[model]
    parents_list = trees()[tree_name]
    N = len(parents_list)
    x = cell_inputs(model, parents_list, B)
    pool, rows, parents = x["pool"], x["rows"], x["parents"]
    P, dev = pool.shape[0], pool.device
    g = torch.Generator(device=dev).manual_seed(1)

    def ring(L):
        return (torch.randn(L, P, N, Hk, K, device=dev, generator=g).to(torch.bfloat16),
                torch.randn(L, P, N, Hv, V, device=dev, generator=g).to(torch.bfloat16),
                -torch.rand(L, P, N, Hv, device=dev, generator=g), torch.rand(L, P, N, Hv, device=dev, generator=g))

    ends = torch.full((B,), N - 1, device=dev, dtype=torch.int32)
    sg_parents = torch.where(parents < 0, 0, parents).int()
    small = ring(1)
    default = (commit_bv(V), 4, "formed")

    def rnorm(rg):  # what the verify stores with a fifth ring buffer
        return (rg[0].float().pow(2).sum(-1) + 1e-6).rsqrt().contiguous()

    norms = {}

    def run(rg, st, cfg):
        r = None
        if cfg[2] == "stored":
            r = norms.get(id(rg))
            if r is None:
                r = norms[id(rg)] = rnorm(rg)
        return gdn_tree_commit_layers_fwd(*rg, st, rows, ends, sg_parents, BV=cfg[0], num_warps=cfg[1], rnorm=r)

    ref = run(small, pool.clone()[None], default)
    big, big_pool = ring(layers), pool[None].repeat(layers, 1, 1, 1, 1)
    out = {}
    for cfg in configs:
        if cfg[0] > V:
            continue
        try:
            err = rel(ref, run(small, pool.clone()[None], cfg))
        except Exception as e:  # a tiling the compiler refuses
            out[cfg] = f"failed: {type(e).__name__}: {str(e)[:120]}"
            continue
        if not err < TOLERANCE:
            out[cfg] = f"wrong: rel. err {err:.1e}"
            continue
        out[cfg] = bench_graph(lambda: run(big, big_pool, cfg)) / layers
    del big, big_pool
    return out, default


def verify_cell(model, tree_name, B, configs):
    """``{(BV, warps, prep warps, prep heads): µs or "wrong"}`` of the mix verify (one layer, as served: tf32x3, the
    ring stored) at one cell, and the default's key."""
    from lumotree.ops.gdn_tree.verify import gdn_tree_mix_verify_fwd, mix_config

    Hk, Hv, K, V = MODELS[model]
    parents_list = trees()[tree_name]
    N = len(parents_list)
    x = cell_inputs(model, parents_list, B)
    q, k, v, a, b, A_log, dt_bias, pool, rows, tree = (
        x[n] for n in "q k v a b A_log dt_bias pool rows tree".split())
    P, dev = pool.shape[0], q.device
    ring = (torch.zeros(P, N, Hk, K, device=dev, dtype=q.dtype), torch.zeros(P, N, Hv, V, device=dev, dtype=q.dtype),
            torch.zeros(P, N, Hv, device=dev), torch.zeros(P, N, Hv, device=dev))
    gate = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True, state_indices=rows,
                anc_mask=tree.mask.to(torch.int8), precision="tf32x3", ring=ring)
    BT = max(16, 1 << (N - 1).bit_length())
    default = (*mix_config(BT, V, B, Hk, dev), Hv // Hk)
    out_buf = torch.empty(B, N, Hv, V, device=dev, dtype=q.dtype)

    def run(cfg, out=None):
        return gdn_tree_mix_verify_fwd(q, k, v, pool, tree, out=out, BV=cfg[0], num_warps=cfg[1], prep_warps=cfg[2],
                                       prep_heads=cfg[3], **gate)

    ref = run(default).clone()
    res = {}
    # the default tiling also storing each key's inverse L2 norm (the ring's fifth buffer, for a commit that reads it)
    ring5 = (*ring, torch.zeros(P, N, Hk, device=dev))
    gate5 = dict(gate, ring=ring5)
    err = rel(ref, gdn_tree_mix_verify_fwd(q, k, v, pool, tree, BV=default[0], num_warps=default[1],
                                           prep_warps=default[2], prep_heads=default[3], **gate5))
    res["rnorm"] = (bench_graph(lambda: gdn_tree_mix_verify_fwd(
        q, k, v, pool, tree, out=out_buf, BV=default[0], num_warps=default[1], prep_warps=default[2],
        prep_heads=default[3], **gate5)) if err < TOLERANCE else f"wrong: rel. err {err:.1e}")
    # the walk verify (the state on-chip along each path, no pass-1 matrices; no ring stores, which the served commit
    # needs): is a one-kernel form faster at small batches?
    from lumotree.ops.gdn_tree.verify import gdn_tree_walk_verify_fwd

    slots = int(tree.depth.max().item()) + 1
    walk = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True, state_indices=rows, num_slots=slots)
    err = rel(ref, gdn_tree_walk_verify_fwd(q, k, v, pool, tree, **walk))
    res["walk"] = (bench_graph(lambda: gdn_tree_walk_verify_fwd(q, k, v, pool, tree, out=out_buf, **walk))
                   if err < WALK_TOLERANCE else f"wrong: rel. err {err:.1e}")
    for cfg in configs:
        cfg = (*cfg[:3], Hv // Hk if cfg[3] == "group" else cfg[3])
        if cfg[0] > max(16, V) or (q.is_cuda and cfg[0] < 16 * cfg[1]) or cfg in res:
            continue
        try:
            err = rel(ref, run(cfg))
        except Exception as e:
            res[cfg] = f"failed: {type(e).__name__}: {str(e)[:120]}"
            continue
        if not err < TOLERANCE:
            res[cfg] = f"wrong: rel. err {err:.1e}"
            continue
        res[cfg] = bench_graph(lambda: run(cfg, out_buf))
    return res, default


def best(times, default):
    timed = {c: t for c, t in times.items() if isinstance(t, float) and not isinstance(c, str)}
    if not timed:
        return None
    c = min(timed, key=timed.get)
    d = timed.get(tuple(default))
    return dict(config=list(c), us=timed[c], default=list(default), default_us=d,
                speedup_over_default=(d / timed[c]) if d else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3.5-27b")
    ap.add_argument("--trees", default="chain-4,topk2-depth3")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--layers", type=int, default=24,
                    help="GDN layers of the commit's one launch (the served 32-layer cut of Qwen3.5-27B: 24)")
    ap.add_argument("--ops", default="commit,verify")
    ap.add_argument("--commit-bv", default=",".join(map(str, COMMIT_BV)))
    ap.add_argument("--commit-warps", default=",".join(map(str, COMMIT_WARPS)))
    ap.add_argument("--verify-bv", default=",".join(map(str, VERIFY_BV)))
    ap.add_argument("--verify-warps", default=",".join(map(str, VERIFY_WARPS)))
    ap.add_argument("--prep-warps", default=",".join(map(str, PREP_WARPS)))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ops = args.ops.split(",")
    meta = dict(command="python3 " + " ".join(sys.argv))
    rows, t0 = [], time.time()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    commit_cfgs = list(itertools.product(ints(args.commit_bv), ints(args.commit_warps), COMMIT_NORMS))
    verify_cfgs = list(itertools.product(ints(args.verify_bv), ints(args.verify_warps), ints(args.prep_warps),
                                         PREP_HEADS))
    for model in args.models.split(","):
        for tree_name in args.trees.split(","):
            for B in map(int, args.batches.split(",")):
                row = dict(model=model, tree=tree_name, batch=B)
                if "commit" in ops:
                    times, d = commit_cell(model, tree_name, B, args.layers, commit_cfgs)
                    row["commit"] = dict(best=best(times, d), us={
                        f"BV{c[0]}-w{c[1]}" + ("-rnorm" if c[2] == "stored" else ""): t for c, t in times.items()})
                if "verify" in ops:
                    times, d = verify_cell(model, tree_name, B, verify_cfgs)
                    row["verify"] = dict(best=best(times, d), walk_us=times.pop("walk"),
                                         default_storing_rnorm_us=times.pop("rnorm"),
                                         us={f"BV{c[0]}-w{c[1]}-p{c[2]}-h{c[3]}": t for c, t in times.items()})
                rows.append(row)
                print(json.dumps({k: (v["best"] if isinstance(v, dict) else v) for k, v in row.items()}), flush=True)
                json.dump(dict(meta=dict(meta, partial=True), rows=rows), open(args.out, "w"), indent=1)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    import triton

    meta.update(device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), seconds=round(time.time() - t0, 1),
                layers=args.layers)
    json.dump(dict(meta=meta, rows=rows), open(args.out, "w"), indent=1)
    print("| model | tree | batch | commit: default µs/layer -> best (config) | verify: default µs -> best (config) "
          "| walk verify µs | verify storing key norms µs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = []
        for op in ("commit", "verify"):
            b = r.get(op, {}).get("best")
            cells.append("-" if not b else f"{b['default_us'] or float('nan'):.1f} -> {b['us']:.1f} ({b['config']})")
        for key in ("walk_us", "default_storing_rnorm_us"):
            w = r.get("verify", {}).get(key, "-")
            cells.append(f"{w:.1f}" if isinstance(w, float) else str(w))
        print(f"| {r['model']} | {r['tree']} | {r['batch']} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
