"""The served verify forms side by side, per GDN layer, on the same inputs as SGLang 0.5.17's native
tree path (a quick companion of ``bench_gdn_tree.py``, which also times the older forms).

Per cell (model shapes, tree, batch): SGLang's tree verify with per-node snapshots + its post-verify
state scatter; LumoTree's ``chunk`` verify (one kernel), ``split`` (``form="wy"``: pass 1 per
request x value head leaves ``Q``/``C``; pass 2 one dot per state tile) and ``mix`` (pass 1 per
request x key head leaves only the ``[BT, BT]`` mixing matrices; pass 2 forms ``q h^T``/``k h^T``
itself) -- all with the served tf32x3 dots and the ring stores -- and the served all-layer replay
commit (one layer). Every op is captured in a CUDA graph and timed with
``triton.testing.do_bench_cudagraph``; outputs are checked against SGLang's before timing.

    python3 benchmark/kernels/bench_verify_forms.py --out benchmark/results/verify_forms_h200.json

Floors: ``read_floor_us`` = the committed states read once (``B Hv V K 4`` bytes at 4.3 TB/s),
``commit_floor_us`` = read + write.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_gdn_tree import COPY_BW, MODELS, bench_graph, cell_inputs, trees  # noqa: E402


def rel(a, b):
    return float((a.float() - b.float()).norm() / a.float().norm())


def _derived(r, B, Hv, V, K):
    """Floors, totals and ratios of a cell's core columns (``--served-only``: of the served forms)."""
    state_bytes = B * Hv * V * K * 4
    r["read_floor_us"] = state_bytes / COPY_BW * 1e6
    r["commit_floor_us"] = 2 * r["read_floor_us"]
    r["native_total_us"] = r["native_verify_us"] + r["native_commit_us"]
    r["served_total_us"] = r["mix_verify_us"] + r["commit_us"]
    r["served_speedup_vs_native"] = r["native_total_us"] / r["served_total_us"]
    r["served_total_over_floor"] = r["served_total_us"] / (r["read_floor_us"] + r["commit_floor_us"])
    r["mix_verify_over_read_floor"] = r["mix_verify_us"] / r["read_floor_us"]
    if "chunk_verify_us" not in r:
        return
    best = min(r["chunk_verify_us"], r["split_verify_us"], r["mix_verify_us"])
    r["best_total_us"] = best + min(r["commit_us"], r["dot_commit_us"], r["gather_commit_us"])
    r["speedup_vs_native"] = r["native_total_us"] / r["best_total_us"]
    r["fused_step_speedup_vs_native"] = r["native_total_us"] / r["mix_fused_step_us"]


def run_cell(model, tree_name, parents_list, B, variants=True, on_core=None, served_only=False, only_variants=None):
    """One cell. ``on_core(row)`` is called once the core columns are timed, before the variants:
    a variant that faults takes the CUDA context (and the process) with it (seen on the H200).
    ``served_only``: SGLang's native path and the forms the server runs (mix verify, replay commit)."""
    from lumotree.ops.gdn_tree import triton as tri
    from lumotree.ops.gdn_tree.native import NativeTreeVerify

    Hk, Hv, K, V = MODELS[model]
    N = len(parents_list)
    x = cell_inputs(model, parents_list, B)
    q, k, v, a, b, A_log, dt_bias, pool, rows, parents, tree = (
        x[n] for n in "q k v a b A_log dt_bias pool rows parents tree".split())
    P = pool.shape[0]
    dev = q.device
    nat = NativeTreeVerify(B, N, Hv, V, K, dev)
    ends = torch.full((B,), N - 1, device=dev, dtype=torch.int32)  # accept the deepest-numbered node's path
    anc = tree.mask.to(torch.int8)
    ring = (torch.zeros(P, N, Hk, K, device=dev, dtype=q.dtype), torch.zeros(P, N, Hv, V, device=dev, dtype=q.dtype),
            torch.zeros(P, N, Hv, device=dev), torch.zeros(P, N, Hv, device=dev))
    sg_parents = torch.where(parents < 0, 0, parents).int()
    BT = max(16, 1 << (N - 1).bit_length())
    cBV, cwarps, prec, low = tri.served_chunk_config(BT, V, "tf32x3")
    gate = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True, state_indices=rows, anc_mask=anc,
                precision=prec, precision_low=low, ring=ring)
    pool_t, pool_c = pool.clone(), pool.clone()  # verifies read pool_t; the timed commits write pool_c
    outs = {f: torch.empty(B, N, Hv, V, device=dev, dtype=q.dtype) for f in ("chunk", "wy", "mix")}
    mix_scr = (torch.empty(B * Hv * (2 * BT * BT + BT), device=dev),)

    def chunk():
        tri.gdn_tree_chunk_verify_fwd(q, k, v, pool_t, tree, BV=cBV, num_warps=cwarps, out=outs["chunk"], **gate)

    def split(form, **kw):
        return lambda: tri.gdn_tree_split_verify_fwd(q, k, v, pool_t, tree, out=outs[form], form=form, **gate, **kw)

    def commit(BV=None, num_warps=4, form="replay"):
        return lambda: tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), pool_c[None], rows, ends, sg_parents,
                                                      BV=BV, num_warps=num_warps, form=form)

    o_nat = nat.verify(q, k, v, A_log, a, dt_bias, b, pool, rows, parents.int())
    split("mix")()
    if served_only:
        del outs["chunk"], outs["wy"]
    else:
        chunk()
        split("wy")()
    errs = {f: rel(o_nat, o) for f, o in outs.items()}
    p_nat, p_our = pool.clone(), pool.clone()
    nat.commit(p_nat, rows, ends)
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_our[None], rows, ends, sg_parents)
    errs["commit_state"] = rel(p_nat, p_our)
    # the replay dividing by the key norms the mix verify kept (measured slower, not served)
    knorm = torch.zeros(P, N, Hk, device=dev)
    tri.gdn_tree_split_verify_fwd(q, k, v, pool_t, tree, out=outs["mix"], form="mix", ring_knorm=knorm, **gate)
    p_kn = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_kn[None], rows, ends, sg_parents, k_norm=knorm[None])
    errs["knorm_commit_state"] = rel(p_nat, p_kn)

    def commit_knorm():
        tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), pool_c[None], rows, ends, sg_parents,
                                       k_norm=knorm[None])
    if served_only:
        pool_n = pool.clone()
        r = dict(model=model, tree=tree_name, nodes=N, batch=B, rel_err=errs, served_only=True)
        r["native_verify_us"] = bench_graph(lambda: nat.verify(q, k, v, A_log, a, dt_bias, b, pool_n, rows,
                                                               parents.int()))
        r["native_commit_us"] = bench_graph(lambda: nat.commit(pool_n, rows, ends))
        r["mix_verify_us"] = bench_graph(split("mix", scratch=mix_scr))
        r["mix_prep_us"] = bench_graph(split("mix", scratch=mix_scr, passes="prep"))
        r["mix_apply_us"] = bench_graph(split("mix", scratch=mix_scr, passes="apply"))
        r["commit_us"] = bench_graph(commit())
        r["commit_knorm_us"] = bench_graph(commit_knorm)
        _derived(r, B, Hv, V, K)
        return r
    p_dot = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_dot[None], rows, ends, sg_parents, form="dot")
    errs["dot_commit_state"] = rel(p_nat, p_dot)
    p_gat = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_gat[None], rows, ends, sg_parents, form="gather")
    errs["gather_commit_state"] = rel(p_nat, p_gat)
    # the fused step in mix form: this commit (from `ring`) inside the next verify's pass 2, which keeps
    # its own k/v/g/beta in a second ring (the two alternate between steps) == commit, then verify
    ring2 = tuple(torch.zeros_like(t) for t in ring)
    pre = dict(ring=ring, rows=rows, last=ends, parents=sg_parents)
    out_f = torch.empty_like(outs["mix"])

    def fused_step(pool_=pool_c):
        tri.gdn_tree_split_verify_fwd(q, k, v, pool_, tree, out=out_f, form="mix", pre_commit=pre,
                                      **dict(gate, ring=ring2))

    p_f = pool.clone()
    fused_step(p_f)
    o_seq = tri.gdn_tree_split_verify_fwd(q, k, v, p_our, tree, form="mix", **dict(gate, ring=ring2))
    errs["fused_step_state_vs_commit"] = rel(p_our, p_f)
    errs["fused_step_o_vs_sequential"] = rel(o_seq, out_f)
    pool_n = pool.clone()
    r = dict(model=model, tree=tree_name, nodes=N, batch=B, rel_err=errs)
    r["native_verify_us"] = bench_graph(lambda: nat.verify(q, k, v, A_log, a, dt_bias, b, pool_n, rows, parents.int()))
    r["native_commit_us"] = bench_graph(lambda: nat.commit(pool_n, rows, ends))
    r["chunk_verify_us"] = bench_graph(chunk)
    r["split_verify_us"] = bench_graph(split("wy"))
    r["split_rows_verify_us"] = bench_graph(split("wy", apply_t=False))  # pass 2 untransposed
    r["mix_verify_us"] = bench_graph(split("mix", scratch=mix_scr))
    split("mix", scratch=mix_scr, passes="prep")()
    r["mix_prep_us"] = bench_graph(split("mix", scratch=mix_scr, passes="prep"))
    r["mix_apply_us"] = bench_graph(split("mix", scratch=mix_scr, passes="apply"))
    # the commits replay onto pool_c again and again (the same work on drifting values)
    r["commit_us"] = bench_graph(commit())
    r["commit_knorm_us"] = bench_graph(commit_knorm)  # the replay with the verify's key norms
    r["dot_commit_us"] = bench_graph(commit(form="dot"))  # the accepted path in chunk form (tensor cores)
    r["gather_commit_us"] = bench_graph(commit(form="gather"))  # the replay, path rows loaded up front
    r["mix_fused_step_us"] = bench_graph(fused_step)  # previous commit + this verify, one state read + write
    pre_r = dict(pre, gather=False)  # the previous path's rows loaded per step (the served commit's way)
    r["mix_fused_step_replay_us"] = bench_graph(lambda: tri.gdn_tree_split_verify_fwd(
        q, k, v, pool_c, tree, out=out_f, form="mix", pre_commit=pre_r, **dict(gate, ring=ring2)))
    _derived(r, B, Hv, V, K)
    if on_core is not None:
        on_core(r)
    if variants:
        r["mix_variants_us"] = {}
        # (pass 2 transposed needs BV >= 16 warps: BV=64 with 8 warps faulted on the H200)
        for name, kw in (("BV32-w2", dict(BV=32, num_warps=2)), ("BV128-w8", dict(BV=128, num_warps=8)),
                         ("BV128-w4", dict(BV=128, num_warps=4)), ("BV16-w1", dict(BV=16, num_warps=1)),
                         ("prep-w2", dict(prep_warps=2)), ("prep-w4", dict(prep_warps=4)),
                         ("prep-w8", dict(prep_warps=8)), ("prep-1head", dict(prep_heads=1)),
                         ("prep-1head-w2", dict(prep_heads=1, prep_warps=2)),
                         ("low-tf32", dict(precision_low="tf32")), ("rows", dict(apply_t=False)),
                         ("fma", dict(apply_fma=True)), ("fma-BV32-w2", dict(apply_fma=True, BV=32, num_warps=2)),
                         ("persistent1", dict(apply_persistent=1)), ("persistent2", dict(apply_persistent=2)),
                         ("persistent2-fma", dict(apply_persistent=2, apply_fma=True)),
                         ("maxnreg128", dict(apply_maxnreg=128)),
                         ("maxnreg128-BV32-w2", dict(apply_maxnreg=128, BV=32, num_warps=2))):
            if only_variants and name not in only_variants:
                continue
            kw_ = dict(kw)
            if "precision_low" in kw_:
                g_ = dict(gate, precision_low=kw_.pop("precision_low"))
                fn = lambda g_=g_, kw_=kw_: tri.gdn_tree_split_verify_fwd(  # noqa: E731
                    q, k, v, pool_t, tree, out=outs["mix"], form="mix", scratch=mix_scr, **g_, **kw_)
            else:
                fn = split("mix", scratch=mix_scr, **kw_)
            try:
                fn()
                r["mix_variants_us"][name] = bench_graph(fn)
                r.setdefault("mix_variants_rel_err", {})[name] = rel(o_nat, outs["mix"])
            except Exception as e:  # noqa: BLE001  (a config that does not compile)
                print(f"mix variant {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if variants and not only_variants:
        r["commit_variants_us"] = {f"BV{bv}-w{w}": bench_graph(commit(bv, w)) for bv, w in ((32, 4), (8, 2), (16, 2))}
        r["commit_variants_us"].update({f"dot-BV{bv}-w{w}": bench_graph(commit(bv, w, "dot"))
                                        for bv, w in ((128, 8), (128, 4), (32, 2))})
        r["commit_variants_us"].update({f"gather-BV{bv}-w{w}": bench_graph(commit(bv, w, "gather"))
                                        for bv, w in ((32, 4), (8, 2))})
    return r


def scratch_bytes(model, nodes, batch):
    """Speculative scratch per GDN layer: LumoTree's (the ring of raw k / v (bf16) and gates (fp32)
    per request and node, plus the mix form's ``[BT, BT]`` matrices) vs SGLang's per-node fp32
    state snapshots (``intermediate_ssm``)."""
    Hk, Hv, K, V = MODELS[model]
    BT = max(16, 1 << (nodes - 1).bit_length())
    ours = batch * nodes * (Hk * K * 2 + Hv * V * 2 + 2 * Hv * 4) + batch * Hv * (2 * BT * BT + BT) * 4
    return ours, batch * nodes * Hv * V * K * 4


def served_table(rows):
    out = ["| model | tree (nodes) | B | native verify | native commit | mix verify (pass 1 + pass 2) | replay commit | "
           "verify + commit | speedup | read-once floor | (verify + commit) / (read + read-write floor) | "
           "effective GB/s (3 state passes) | scratch MiB: ours / native | max rel. err vs SGLang | "
           "replay commit with kept key norms |", "|" + "---|" * 15]
    for r in rows:
        ours, native = scratch_bytes(r["model"], r["nodes"], r["batch"])
        gbps = 3 * r["read_floor_us"] * COPY_BW / r["served_total_us"] / 1e9
        out.append(f"| {r['model']} | {r['tree']} ({r['nodes']}) | {r['batch']} | {r['native_verify_us']:.1f} | "
                   f"{r['native_commit_us']:.1f} | {r['mix_verify_us']:.1f} ({r['mix_prep_us']:.1f} + "
                   f"{r['mix_apply_us']:.1f}) | {r['commit_us']:.1f} | {r['served_total_us']:.1f} | "
                   f"**{r['served_speedup_vs_native']:.1f}x** | {r['read_floor_us']:.1f} | "
                   f"{r['served_total_over_floor']:.1f} | {gbps:.0f} | {ours / 2**20:.1f} / {native / 2**20:.0f} | "
                   f"{max(r['rel_err'].values()):.1e} | "
                   + (f"{r['commit_knorm_us']:.1f} |" if r.get("commit_knorm_us") else "– |"))
    return "\n".join(out)


def table(rows):
    out = ["| model | tree (nodes) | B | native verify + commit µs | chunk verify µs | split (wy) µs | mix µs "
           "(pass 1 + pass 2) | commit µs: replay / gather / dot | best verify + commit µs | speedup | "
           "mix fused step µs | speedup | read floor µs | mix / floor |", "|" + "---|" * 14]
    for r in rows:
        out.append(f"| {r['model']} | {r['tree']} ({r['nodes']}) | {r['batch']} | {r['native_verify_us']:.1f} + "
                   f"{r['native_commit_us']:.1f} | {r['chunk_verify_us']:.1f} | {r['split_verify_us']:.1f} | "
                   f"{r['mix_verify_us']:.1f} ({r['mix_prep_us']:.1f} + {r['mix_apply_us']:.1f}) | "
                   f"{r['commit_us']:.1f} / {r['gather_commit_us']:.1f} / {r['dot_commit_us']:.1f} | "
                   f"{r['best_total_us']:.1f} | {r['speedup_vs_native']:.1f}x | {r['mix_fused_step_us']:.1f} | "
                   f"{r['fused_step_speedup_vs_native']:.1f}x | {r['read_floor_us']:.1f} | "
                   f"{r['mix_verify_over_read_floor']:.1f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmark/results/verify_forms_h200.json")
    ap.add_argument("--models", default="qwen3.5-27b")
    ap.add_argument("--trees", default="topk2-depth3,topk4-n8,eagle-16,eagle-32,eagle-64")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--variants", default=None, help="only these mix variants (comma-separated names), no commit variants")
    ap.add_argument("--served-only", action="store_true",
                    help="only SGLang's native path and the served forms (mix verify + replay commit)")
    args = ap.parse_args()
    T = trees()
    rows, t0 = [], time.time()
    meta = dict(command="python3 " + " ".join(sys.argv))
    for model in args.models.split(","):
        for tree_name in args.trees.split(","):
            for B in map(int, args.batches.split(",")):
                def save(row):
                    json.dump(dict(meta=dict(meta, partial=True), rows=rows + [row]), open(args.out, "w"), indent=1)

                r = run_cell(model, tree_name, T[tree_name], B, variants=not (args.no_variants or args.served_only),
                             on_core=save, served_only=args.served_only,
                             only_variants=set(args.variants.split(",")) if args.variants else None)
                rows.append(r)
                print(json.dumps(r), flush=True)
                json.dump(dict(meta=dict(meta, partial=True), rows=rows), open(args.out, "w"), indent=1)
                torch.cuda.empty_cache()
    import sglang
    import triton

    meta.update(device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", torch=torch.__version__,
                triton=triton.__version__, sglang=sglang.__version__, python=platform.python_version(), seconds=time.time() - t0,
                copy_bandwidth_Bps=COPY_BW)
    json.dump(dict(meta=meta, rows=rows), open(args.out, "w"), indent=1)
    print(served_table(rows) if args.served_only else table(rows))


if __name__ == "__main__":
    main()
