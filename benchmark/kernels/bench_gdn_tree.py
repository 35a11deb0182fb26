"""LumoTree GDN tree verify + replay commit vs SGLang 0.5.17's native tree path, per GDN layer.

One process, the same inputs for both; each op is captured in a CUDA graph and timed with
``triton.testing.do_bench_cudagraph`` (serving replays graphs, so launch overhead is excluded
for both). Native = ``fused_sigmoid_gating_delta_rule_update`` in target-verify mode writing the
per-node ``intermediate_ssm`` snapshots + ``fused_mamba_state_scatter_with_mask`` (its
post-verify state update). Ours = ``gdn_tree_verify_fwd`` (path-parallel, boundary states) +
``gdn_tree_commit_fwd`` (accepted-path replay). Both fuse the gating (A_log, a, dt_bias, b).
``serving_*`` columns: the form the SGLang backend runs — the chunk verify with fp32-accurate dots
that also stores k/v/g/beta per state slot, then ``gdn_tree_commit_layers_fwd`` from those buffers.
``split``: the two-pass verify (``gdn_tree_split_verify_fwd``: the state-independent WY algebra once
per request and head, then one dot per state tile) with the same dot precisions, a few configs.

    python3 benchmark/kernels/bench_gdn_tree.py --out benchmark/results/gdn_tree_h200.json

Columns: verify/commit/total µs, speedup, speculative scratch bytes, achieved GB/s (bytes of
committed state read by verify + read/written by commit, over the time), and the read-once floor
(state bytes / 4.3 TB/s).
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

import torch

COPY_BW = 4.3e12  # measured device-to-device copy bandwidth of the H200 (bytes/s)

MODELS = {"qwen3.5-27b": (16, 48, 128, 128), "qwen3-next-80b": (16, 32, 128, 128),
          "tiny": (1, 2, 16, 16)}  # tiny: CPU smoke tests of the scripts (Triton's interpreter)


def trees():
    from lumotree import tree_shapes as ts

    rng = random.Random(0)
    return {
        "chain-4": ts.chain(4),
        "topk2-depth3": ts.eagle(2, 3, 6, rng),
        "topk4-n8": ts.eagle(4, 3, 8, rng),
        "eagle-16": ts.eagle(4, 5, 16, rng),
        "eagle-32": ts.eagle(4, 7, 32, rng),
        "eagle-64": ts.eagle(8, 8, 64, rng),
    }


def bench_graph(fn, rep=50):
    import triton

    if not torch.cuda.is_available():  # CPU smoke test (TRITON_INTERPRET=1): one call, wall time
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    return triton.testing.do_bench_cudagraph(fn, rep=rep) * 1e3  # µs


def cell_inputs(model, parents_list, B, dtype=torch.bfloat16, seed=0):
    """One cell's inputs (the same for every form timed on it): q/k/v and the raw gates, a pool of
    ``B + 8`` fp32 states with the requests at random rows, the tree ``B`` times."""
    from lumotree import TreeDescriptor

    Hk, Hv, K, V = MODELS[model]
    N = len(parents_list)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(seed)
    x = dict(q=torch.randn(B, N, Hk, K, device=dev, dtype=dtype, generator=g),
             k=torch.randn(B, N, Hk, K, device=dev, dtype=dtype, generator=g),
             v=torch.randn(B, N, Hv, V, device=dev, dtype=dtype, generator=g),
             a=torch.randn(B, N, Hv, device=dev, dtype=dtype, generator=g),
             b=torch.randn(B, N, Hv, device=dev, dtype=dtype, generator=g),
             A_log=torch.randn(Hv, device=dev, generator=g) * 0.5,
             dt_bias=torch.randn(Hv, device=dev, generator=g) * 0.5,
             pool=torch.randn(B + 8, Hv, V, K, device=dev, generator=g) * 0.05)
    x["rows"] = torch.randperm(B + 8, device=dev, generator=g)[:B].int()
    x["parents"] = torch.tensor([parents_list] * B, device=dev)
    x["tree"] = TreeDescriptor.from_parents(x["parents"])
    return x


def run_cell(model, tree_name, parents_list, B, cfg, chunk_cfg=(None, None, None), dtype=torch.bfloat16):
    from lumotree.ops.gdn_tree import triton as tri
    from lumotree.ops.gdn_tree.native import NativeTreeVerify

    Hk, Hv, K, V = MODELS[model]
    N = len(parents_list)
    dev = "cuda"
    x = cell_inputs(model, parents_list, B, dtype)
    q, k, v, a, b, A_log, dt_bias, pool, rows, parents, tree = (
        x[n] for n in "q k v a b A_log dt_bias pool rows parents tree".split())
    P = pool.shape[0]
    ka = tri.tree_kernel_args(tree)
    slots = tree.num_slots()
    ends = torch.tensor([N - 1] * B, device=dev)  # accept the deepest-numbered node's root path
    an = tree.root_path(ends).int()
    al = (an >= 0).sum(-1).int()
    BV, warps, pps = cfg
    out = torch.empty(B, N, Hv, V, device=dev, dtype=dtype)
    BK = 128
    nprog = max(1, min(B * Hv * (V // BV), torch.cuda.get_device_properties(0).multi_processor_count * pps))
    scratch = torch.empty(nprog * slots * BV * BK, device=dev, dtype=torch.float32)
    nat = NativeTreeVerify(B, N, Hv, V, K, dev)
    par32 = parents.int()
    pool_n, pool_o = pool.clone(), pool.clone()

    def nat_verify():
        nat.verify(q, k, v, A_log, a, dt_bias, b, pool_n, rows, par32)

    def nat_commit():
        nat.commit(pool_n, rows, ends.int())

    def our_verify():
        tri.gdn_tree_verify_fwd(q, k, v, pool_o, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                use_qk_l2norm=True, state_indices=rows, num_slots=slots, kernel_args=ka,
                                BV=BV, num_warps=warps, programs_per_sm=pps, out=out, scratch=scratch)

    anc = tree.mask.to(torch.int8)
    out_c = torch.empty_like(out)
    vnew = torch.empty(B, N, Hv, V, device=dev, dtype=torch.float32)
    cBV, cwarps, cprec = chunk_cfg

    def our_chunk_verify():
        tri.gdn_tree_chunk_verify_fwd(q, k, v, pool_o, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                      use_qk_l2norm=True, state_indices=rows, anc_mask=anc, BV=cBV,
                                      num_warps=cwarps, precision=cprec, out=out_c, vnew_out=vnew)

    def our_vnew_commit():
        tri.gdn_tree_commit_vnew_fwd(k, vnew, pool_o, an, al, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                     use_qk_l2norm=True, state_indices=rows)

    def our_commit():
        # replay from a fixed committed state each time (restored outside the timed region would
        # need a copy; replaying repeatedly is the same work on drifting values)
        tri.gdn_tree_commit_fwd(k, v, pool_o, an, al, A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True,
                                state_indices=rows)

    # the serving form (what the SGLang backend runs): fp32-accurate chunk verify that also keeps
    # k/v/g/beta per state slot, then the all-layer commit (one layer here) from those buffers
    ring = (torch.zeros(P, N, Hk, K, device=dev, dtype=dtype), torch.zeros(P, N, Hv, V, device=dev, dtype=dtype),
            torch.zeros(P, N, Hv, device=dev), torch.zeros(P, N, Hv, device=dev))
    sBT = max(16, 1 << (N - 1).bit_length())
    sBV, swarps, sprec, _ = tri.served_chunk_config(sBT, V, "tf32x3")
    mBV, mwarps, mprec, mlow = tri.served_chunk_config(sBT, V, "mixed")
    sg_parents = torch.where(parents < 0, 0, parents).int()
    out_s = torch.empty_like(out)

    def serving_verify(pool_=pool_o):
        tri.gdn_tree_chunk_verify_fwd(q, k, v, pool_, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                      use_qk_l2norm=True, state_indices=rows, anc_mask=anc, BV=sBV,
                                      num_warps=swarps, precision=sprec, out=out_s, ring=ring)

    out_m = torch.empty_like(out)

    def serving_verify_mixed(pool_=pool_o):
        tri.gdn_tree_chunk_verify_fwd(q, k, v, pool_, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                      use_qk_l2norm=True, state_indices=rows, anc_mask=anc, BV=mBV,
                                      num_warps=mwarps, precision=mprec, precision_low=mlow, out=out_m, ring=ring)

    out_sp = torch.empty_like(out)

    def split_verify(pool_=pool_o, BV_=None, warps_=None, low=None, **kw):
        tri.gdn_tree_split_verify_fwd(q, k, v, pool_, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                      use_qk_l2norm=True, state_indices=rows, anc_mask=anc, BV=BV_, num_warps=warps_,
                                      precision="tf32x3", precision_low=low, out=out_sp, ring=ring, **kw)

    def serving_commit(pool_=pool_o):
        tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), pool_[None], rows, ends.int(), sg_parents)

    # the fused step: the previous step's commit (from `ring`) inside this step's verify, which keeps
    # its own k/v/g/beta in a second set of buffers (the two alternate between steps)
    ring2 = tuple(torch.zeros_like(t) for t in ring)
    pre = dict(ring=ring, rows=rows, last=ends.int(), parents=sg_parents)

    def fused_step(pool_=pool_o):
        tri.gdn_tree_chunk_verify_fwd(q, k, v, pool_, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                                      use_qk_l2norm=True, state_indices=rows, anc_mask=anc, BV=sBV,
                                      num_warps=swarps, precision=sprec, out=out_s, ring=ring2, pre_commit=pre)

    # correctness on these very inputs before timing
    o_nat = nat.verify(q, k, v, A_log, a, dt_bias, b, pool, rows, par32)
    our_verify()
    our_chunk_verify()
    err = float((o_nat.float() - out.float()).norm() / o_nat.float().norm())
    err_chunk = float((o_nat.float() - out_c.float()).norm() / o_nat.float().norm())
    p1, p2 = pool.clone(), pool.clone()
    nat.commit(p1, rows, ends.int())
    tri.gdn_tree_commit_fwd(k, v, p2, an, al, A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True,
                            state_indices=rows, BV=BV, num_warps=warps)
    err_c = float((p1 - p2).norm() / p1.norm())
    p3 = pool.clone()
    tri.gdn_tree_chunk_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True,
                                  state_indices=rows, anc_mask=anc, out=out_c, vnew_out=vnew)
    tri.gdn_tree_commit_vnew_fwd(k, vnew, p3, an, al, A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True,
                                 state_indices=rows)
    err_vn = float((p1 - p3).norm() / p1.norm())
    p4 = pool.clone()
    serving_verify(p4)
    serving_commit(p4)
    err_serving = float((p1 - p4).norm() / p1.norm())
    err_serving_o = float((o_nat.float() - out_s.float()).norm() / o_nat.float().norm())
    try:  # the newest form: a failure here must not cost the row's other columns
        serving_verify_mixed(pool.clone())
        err_mixed_o = float((o_nat.float() - out_m.float()).norm() / o_nat.float().norm())
    except Exception as e:  # noqa: BLE001
        print(f"mixed precision verify failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        err_mixed_o, serving_verify_mixed = None, None
    split = {}
    try:  # the split verify (pass 1 state-independent, pass 2 one dot per state tile), a few configs
        split_verify(pool.clone())
        split["rel_err_o"] = float((o_nat.float() - out_sp.float()).norm() / o_nat.float().norm())
        split["rel_err_o_vs_serving"] = float((out_s.float() - out_sp.float()).norm() / out_s.float().norm())
    except Exception as e:  # noqa: BLE001
        print(f"split verify failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        split = None
    # fused: after the ring holds this step's inputs, the fused kernel commits them and verifies the
    # same tree again from the committed state == commit, then verify
    p5, p6 = pool.clone(), pool.clone()
    serving_verify(p5)
    serving_commit(p5)
    serving_verify(p5)
    o_seq = out_s.clone()
    serving_verify(p6)
    fused_step(p6)
    err_fused = float((p5 - p6).norm() / p5.norm())
    err_fused_o = float((o_seq.float() - out_s.float()).norm() / o_seq.float().norm())

    t_nv, t_nc = bench_graph(nat_verify), bench_graph(nat_commit)
    t_ow, t_rc = bench_graph(our_verify), bench_graph(our_commit)
    t_ov, t_oc = bench_graph(our_chunk_verify), bench_graph(our_vnew_commit)
    t_sv, t_sc = bench_graph(serving_verify), bench_graph(serving_commit)
    t_fs = bench_graph(fused_step)
    t_sm = bench_graph(serving_verify_mixed) if serving_verify_mixed is not None else None
    if split is not None:
        split["config"] = dict(zip(("BV", "num_warps", "prep_warps"), tri.split_config(sBT, V)))
        split["verify_us"] = bench_graph(split_verify)
        split["mixed_verify_us"] = bench_graph(lambda: split_verify(low="tf32"))
        split["variants_us"] = {f"BV{bv}-w{w}": bench_graph(lambda bv=bv, w=w: split_verify(BV_=bv, warps_=w))
                                for bv, w in ((32, 2), (128, 8), (16, 1))}  # pass 2 transposed: BV >= 16 warps
        split["variants_us"]["rows"] = bench_graph(lambda: split_verify(apply_t=False))
        # the passes apart, through preallocated Q / C
        sBTs = max(16, 1 << (N - 1).bit_length())
        scr = (torch.empty(B * Hv * sBTs * 128, device=dev), torch.empty(B * Hv * sBTs * V, device=dev))
        split_verify(scratch=scr, passes="prep")
        split["prep_us"] = bench_graph(lambda: split_verify(scratch=scr, passes="prep"))
        split["apply_us"] = bench_graph(lambda: split_verify(scratch=scr, passes="apply"))
        # pass 1 variants : M = P T first; capped registers
        for name, kw in (("factored", dict(factored=True)), ("factored-maxnreg168", dict(factored=True, prep_maxnreg=168)),
                         ("factored-maxnreg128", dict(factored=True, prep_maxnreg=128)), ("maxnreg128", dict(prep_maxnreg=128))):
            try:
                split_verify(pool.clone(), **kw)
                err = float((o_nat.float() - out_sp.float()).norm() / o_nat.float().norm())
                split["variants_us"][name] = bench_graph(lambda kw=kw: split_verify(**kw))
                split.setdefault("variants_rel_err_o", {})[name] = err
            except Exception as e:  # noqa: BLE001
                print(f"split variant {name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        split["total_us"] = split["verify_us"] + t_sc
        split["speedup"] = (t_nv + t_nc) / split["total_us"]
    state_bytes = B * Hv * V * K * 4
    accepted = int(al[0])
    return dict(
        model=model, tree=tree_name, nodes=N, batch=B, depth=int(tree.depth.max()), paths=int(tree.num_paths[0]),
        boundaries=int(tree.num_boundaries[0]), slots=slots, accepted=accepted,
        walk_config=dict(BV=BV, num_warps=warps, programs_per_sm=pps),
        chunk_config=dict(BV=cBV, num_warps=cwarps, precision=cprec),
        walk_verify_us=t_ow, replay_commit_us=t_rc, walk_total_us=t_ow + t_rc,
        serving_verify_us=t_sv, serving_commit_us=t_sc, serving_total_us=t_sv + t_sc,
        serving_speedup=(t_nv + t_nc) / (t_sv + t_sc), rel_err_state_serving=err_serving,
        rel_err_o_serving=err_serving_o,
        serving_mixed_verify_us=t_sm, serving_mixed_total_us=t_sm + t_sc if t_sm is not None else None,
        rel_err_o_serving_mixed=err_mixed_o,
        serving_mixed_config=dict(BV=mBV, num_warps=mwarps, precision=mprec, precision_low=mlow),
        split=split,
        fused_step_us=t_fs, fused_speedup=(t_nv + t_nc) / t_fs, rel_err_state_fused=err_fused,
        rel_err_o_fused=err_fused_o,
        fused_note="one kernel per step: the previous step's replay commit + this verify (state read once, "
                   "written once); not yet used by the SGLang backend (deferred commit)",
        walk_speedup=(t_nv + t_nc) / (t_ow + t_rc),
        native_verify_us=t_nv, native_commit_us=t_nc, native_total_us=t_nv + t_nc,
        ours_verify_us=t_ov, ours_commit_us=t_oc, ours_total_us=t_ov + t_oc,
        speedup=(t_nv + t_nc) / (t_ov + t_oc),
        native_scratch_bytes=nat.intermediate.numel() * 4, ours_scratch_bytes=vnew.numel() * 4,
        walk_scratch_bytes=scratch.numel() * 4,
        floor_us=state_bytes / COPY_BW * 1e6,
        ours_verify_GBps=state_bytes / (t_ov * 1e-6) / 1e9,
        ours_total_GBps=3 * state_bytes / ((t_ov + t_oc) * 1e-6) / 1e9,
        ours_scratch_note="chunk verify materialises no state; it stores u (vnew) [B, N, Hv, V] fp32 for the commit",
        vnew_bytes=vnew.numel() * 4,
        rel_err_o=err_chunk, rel_err_o_walk=err, rel_err_state=err_vn, rel_err_state_replay=err_c,
    )


def sweep(T, out_path, budget_s=100):
    """Time our kernels alone over a few configs; one JSON line per measurement, written as it goes."""
    from lumotree import TreeDescriptor
    from lumotree.ops.gdn_tree import triton as tri

    t_end = time.time() + budget_s
    Hk, Hv, K, V = MODELS["qwen3.5-27b"]
    with open(out_path, "w") as f:
        for tree_name, B in (("chain-4", 32), ("eagle-16", 8), ("eagle-64", 32), ("topk4-n8", 64)):
            p = T[tree_name]
            N = len(p)
            g = torch.Generator(device="cuda").manual_seed(0)
            rnd = lambda *sh: torch.randn(*sh, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
            q, k, v, a, b = rnd(B, N, Hk, K), rnd(B, N, Hk, K), rnd(B, N, Hv, V), rnd(B, N, Hv), rnd(B, N, Hv)
            A_log, dt_bias = torch.zeros(Hv, device="cuda"), torch.zeros(Hv, device="cuda")
            pool = torch.randn(B + 8, Hv, V, K, device="cuda", generator=g) * 0.05
            rows = torch.arange(B, device="cuda", dtype=torch.int32)
            tree = TreeDescriptor.from_parents(torch.tensor([p] * B, device="cuda"))
            anc, ka, slots = tree.mask.to(torch.int8), tri.tree_kernel_args(tree), tree.num_slots()
            an = tree.root_path(torch.full((B,), N - 1, device="cuda")).int()
            al = (an >= 0).sum(-1).int()
            out = torch.empty(B, N, Hv, V, device="cuda", dtype=torch.bfloat16)
            gate = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True, state_indices=rows)
            trials = [("chunk", c) for c in ((64, 4, "tf32"), (128, 8, "tf32"), (32, 4, "tf32"), (64, 8, "tf32"),
                                              (32, 2, "tf32"), (64, 4, "tf32x3"))]
            trials += [("walk", c) for c in ((16, 2, 8), (16, 2, 16), (8, 1, 16), (32, 4, 8), (16, 4, 8))]
            trials += [("commit", c) for c in ((16, 4), (32, 4), (64, 4), (32, 2), (64, 8), (128, 8))]
            for kind, c in trials:
                if time.time() > t_end:
                    return
                if kind == "chunk":
                    fn = lambda c=c: tri.gdn_tree_chunk_verify_fwd(  # noqa: E731
                        q, k, v, pool, tree, anc_mask=anc, BV=c[0], num_warps=c[1], precision=c[2], out=out, **gate)
                elif kind == "walk":
                    scr = torch.empty(132 * c[2] * max(slots, 1) * c[0] * 128, device="cuda")
                    fn = lambda c=c, scr=scr: tri.gdn_tree_verify_fwd(  # noqa: E731
                        q, k, v, pool, tree, num_slots=slots, kernel_args=ka, BV=c[0], num_warps=c[1],
                        programs_per_sm=c[2], out=out, scratch=scr, **gate)
                else:
                    fn = lambda c=c: tri.gdn_tree_commit_fwd(k, v, pool, an, al, BV=c[0], num_warps=c[1],  # noqa
                                                             **gate)
                try:
                    us = bench_graph(fn, rep=20)
                except Exception as e:  # a config that does not compile (registers, shared memory)
                    us = None
                    print(f"{kind} {c}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                line = json.dumps(dict(tree=tree_name, batch=B, kind=kind, config=c, us=us))
                print(line, flush=True)
                f.write(line + "\n")
                f.flush()


def table(rows):
    hdr = ("| model | tree (nodes) | B | native verify µs | native commit µs | ours verify µs (chunk) | "
           "ours commit µs | speedup | walk verify µs | walk speedup | floor µs | total/floor | ours GB/s | "
           "scratch MiB: chunk (u) / walk (boundary) / native (snapshots) |")
    out = [hdr, "|" + "---|" * 14]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['tree']} ({r['nodes']}) | {r['batch']} | {r['native_verify_us']:.1f} | "
            f"{r['native_commit_us']:.1f} | {r['ours_verify_us']:.1f} | {r['ours_commit_us']:.1f} | "
            f"{r['speedup']:.1f}x | {r['walk_verify_us']:.1f} | {r['walk_speedup']:.1f}x | {r['floor_us']:.1f} | "
            f"{r['ours_total_us'] / r['floor_us']:.1f} | {r['ours_total_GBps']:.0f} | "
            f"{r['ours_scratch_bytes'] / 2**20:.1f} / {r['walk_scratch_bytes'] / 2**20:.1f} / "
            f"{r['native_scratch_bytes'] / 2**20:.0f} MiB |")
    serving = [r for r in rows if "serving_total_us" in r]
    if serving:  # the forms the SGLang backend runs, and the fused step
        out += ["", "| model | tree (nodes) | B | native verify + commit µs | serving verify + commit µs | speedup | "
                "serving, mixed precision µs | speedup | fused step µs (commit of the previous step + verify) | "
                "speedup | split verify + commit µs | speedup | floor µs (1 read + 1 write) |",
                "|" + "---|" * 13]
        for r in serving:
            fused = (f"{r['fused_step_us']:.1f} | {r['fused_speedup']:.1f}x" if "fused_step_us" in r else "– | –")
            sp = r.get("split")
            split = f"{sp['total_us']:.1f} | {sp['speedup']:.1f}x" if sp and "total_us" in sp else "– | –"
            mixed = (f"{r['serving_mixed_total_us']:.1f} | {r['native_total_us'] / r['serving_mixed_total_us']:.1f}x"
                     if r.get("serving_mixed_total_us") else "– | –")
            out.append(f"| {r['model']} | {r['tree']} ({r['nodes']}) | {r['batch']} | {r['native_total_us']:.1f} | "
                       f"{r['serving_total_us']:.1f} | {r['serving_speedup']:.1f}x | {mixed} | {fused} | "
                       f"{split} | {2 * r['floor_us']:.1f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmark/results/gdn_tree_h200.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--trees", default="chain-4,topk2-depth3,topk4-n8,eagle-16,eagle-32,eagle-64")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--sweep", action="store_true", help="time kernel configs on a few cells and exit")
    args = ap.parse_args()
    from lumotree.ops.gdn_tree.triton import default_config

    T = trees()
    if args.sweep:
        sweep(T, args.out)
        return
    rows = []
    t0 = time.time()
    for model in args.models.split(","):
        for tree_name in args.trees.split(","):
            for B in map(int, args.batches.split(",")):
                cfg = default_config(MODELS[model][3], B * MODELS[model][1])
                r = run_cell(model, tree_name, T[tree_name], B, cfg)
                rows.append(r)
                print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
                json.dump(dict(meta=dict(command="python3 " + " ".join(sys.argv), partial=True), rows=rows),
                          open(args.out, "w"), indent=1)  # keep what is measured if the run is cut short
                torch.cuda.empty_cache()
    import sglang
    import triton

    meta = dict(command="python3 " + " ".join(sys.argv), device=torch.cuda.get_device_name(0),
                torch=torch.__version__, triton=triton.__version__, sglang=sglang.__version__,
                python=platform.python_version(), seconds=time.time() - t0, copy_bandwidth_Bps=COPY_BW)
    json.dump(dict(meta=meta, rows=rows), open(args.out, "w"), indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
