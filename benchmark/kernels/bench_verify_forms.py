"""LumoTree's served GDN tree verify and commit beside SGLang 0.5.17's native tree path, per GDN
layer, on the same inputs.

Per cell (model shapes, tree, batch): SGLang's tree verify writing per-node snapshots
(``fused_sigmoid_gating_delta_rule_update`` in target-verify mode) + its post-verify state scatter;
LumoTree's mix verify (tf32x3 dots, keeping k / v / gates for the commit) + the all-layer replay
commit (one layer) -- exactly what the SGLang backend launches. Every op is captured in a CUDA graph
and timed with ``triton.testing.do_bench_cudagraph`` (serving replays graphs, so launch overhead is
excluded for both); outputs and the committed state are checked against SGLang's before timing.

    python3 benchmark/kernels/bench_verify_forms.py --served-only --models qwen3.5-27b \
        --out benchmark/results/served_forms_h200.json

Floors: ``read_floor_us`` = the committed states read once (``B Hv V K 4`` bytes at 4.3 TB/s),
``commit_floor_us`` = read + write.
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
          "tiny": (1, 2, 16, 16)}  # (Hk, Hv, K, V); tiny: CPU smoke tests of the scripts (Triton's interpreter)


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
    """One cell's inputs (the same for every op timed on it): q/k/v and the raw gates, a pool of
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


def served_ops(model, tree_name, B):
    """``(ops, check)``: the cell's ops ``{name: fn}`` on one set of inputs, and a function returning
    the relative errors of the served outputs / committed state vs SGLang's (run before timing)."""
    from lumotree.ops.gdn_tree.commit import gdn_tree_commit_layers_fwd
    from lumotree.ops.gdn_tree.native import NativeTreeVerify
    from lumotree.ops.gdn_tree.verify import gdn_tree_mix_verify_fwd

    Hk, Hv, K, V = MODELS[model]
    parents_list = trees()[tree_name]
    N = len(parents_list)
    x = cell_inputs(model, parents_list, B)
    q, k, v, a, b, A_log, dt_bias, pool, rows, parents, tree = (
        x[n] for n in "q k v a b A_log dt_bias pool rows parents tree".split())
    P, dev = pool.shape[0], q.device
    nat = NativeTreeVerify(B, N, Hv, V, K, dev)
    ends = torch.full((B,), N - 1, device=dev, dtype=torch.int32)  # accept the deepest-numbered node's path
    ring = (torch.zeros(P, N, Hk, K, device=dev, dtype=q.dtype), torch.zeros(P, N, Hv, V, device=dev, dtype=q.dtype),
            torch.zeros(P, N, Hv, device=dev), torch.zeros(P, N, Hv, device=dev))
    sg_parents = torch.where(parents < 0, 0, parents).int()
    gate = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, use_qk_l2norm=True, state_indices=rows,
                anc_mask=tree.mask.to(torch.int8), precision="tf32x3", ring=ring)
    pool_n, pool_t, pool_c = pool.clone(), pool.clone(), pool.clone()  # the timed commits write pool_c
    out = torch.empty(B, N, Hv, V, device=dev, dtype=q.dtype)
    ops = {
        "native_verify": lambda: nat.verify(q, k, v, A_log, a, dt_bias, b, pool_n, rows, parents.int()),
        "native_commit": lambda: nat.commit(pool_n, rows, ends),
        "mix_verify": lambda: gdn_tree_mix_verify_fwd(q, k, v, pool_t, tree, out=out, **gate),
        "replay_commit": lambda: gdn_tree_commit_layers_fwd(*(t[None] for t in ring), pool_c[None], rows, ends,
                                                            sg_parents),
    }

    def check():
        o_nat = nat.verify(q, k, v, A_log, a, dt_bias, b, pool.clone(), rows, parents.int())
        o = gdn_tree_mix_verify_fwd(q, k, v, pool, tree, **gate)
        p_nat, p_our = pool.clone(), pool.clone()
        nat.commit(p_nat, rows, ends)
        gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_our[None], rows, ends, sg_parents)
        return dict(mix=rel(o_nat, o), commit_state=rel(p_nat, p_our))

    return ops, check


def rel(a, b):
    return float((a.float() - b.float()).norm() / a.float().norm())


def run_cell(model, tree_name, B):
    Hk, Hv, K, V = MODELS[model]
    ops, check = served_ops(model, tree_name, B)
    r = dict(model=model, tree=tree_name, nodes=len(trees()[tree_name]), batch=B, rel_err=check())
    r["native_verify_us"] = bench_graph(ops["native_verify"])
    r["native_commit_us"] = bench_graph(ops["native_commit"])
    r["mix_verify_us"] = bench_graph(ops["mix_verify"])
    r["commit_us"] = bench_graph(ops["replay_commit"])  # replays onto the same rows again and again
    state_bytes = B * Hv * V * K * 4
    r["read_floor_us"] = state_bytes / COPY_BW * 1e6
    r["commit_floor_us"] = 2 * r["read_floor_us"]
    r["native_total_us"] = r["native_verify_us"] + r["native_commit_us"]
    r["served_total_us"] = r["mix_verify_us"] + r["commit_us"]
    r["served_speedup_vs_native"] = r["native_total_us"] / r["served_total_us"]
    r["served_total_over_floor"] = r["served_total_us"] / (r["read_floor_us"] + r["commit_floor_us"])
    r["mix_verify_over_read_floor"] = r["mix_verify_us"] / r["read_floor_us"]
    return r


def scratch_bytes(model, nodes, batch):
    """Speculative scratch per GDN layer: LumoTree's (raw k / v (bf16) and gates (fp32) per request
    and node, plus the mix verify's ``[BT, BT]`` matrices) vs SGLang's per-node fp32 state snapshots."""
    Hk, Hv, K, V = MODELS[model]
    BT = max(16, 1 << (nodes - 1).bit_length())
    ours = batch * nodes * (Hk * K * 2 + Hv * V * 2 + 2 * Hv * 4) + batch * Hv * (2 * BT * BT + BT) * 4
    return ours, batch * nodes * Hv * V * K * 4


def table(rows):
    out = ["| model | tree (nodes) | B | native verify | native commit | mix verify | replay commit | "
           "verify + commit | speedup | read-once floor | (verify + commit) / (read + read-write floor) | "
           "scratch MiB: ours / native | max rel. err vs SGLang |", "|" + "---|" * 13]
    for r in rows:
        ours, native = scratch_bytes(r["model"], r["nodes"], r["batch"])
        out.append(f"| {r['model']} | {r['tree']} ({r['nodes']}) | {r['batch']} | {r['native_verify_us']:.1f} | "
                   f"{r['native_commit_us']:.1f} | {r['mix_verify_us']:.1f} | {r['commit_us']:.1f} | "
                   f"{r['served_total_us']:.1f} | **{r['served_speedup_vs_native']:.1f}x** | {r['read_floor_us']:.1f} | "
                   f"{r['served_total_over_floor']:.1f} | {ours / 2**20:.1f} / {native / 2**20:.0f} | "
                   f"{max(r['rel_err'].values()):.1e} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmark/results/served_forms_h200.json")
    ap.add_argument("--models", default="qwen3.5-27b")
    ap.add_argument("--trees", default="topk2-depth3,topk4-n8,eagle-16,eagle-32,eagle-64")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--served-only", action="store_true",
                    help="the served forms beside SGLang's native path (the only mode; the flag is accepted so "
                         "that the recorded commands rerun)")
    args = ap.parse_args()
    rows, t0 = [], time.time()
    meta = dict(command="python3 " + " ".join(sys.argv))
    for model in args.models.split(","):
        for tree_name in args.trees.split(","):
            for B in map(int, args.batches.split(",")):
                rows.append(run_cell(model, tree_name, B))
                print(json.dumps(rows[-1]), flush=True)
                json.dump(dict(meta=dict(meta, partial=True), rows=rows), open(args.out, "w"), indent=1)
                torch.cuda.empty_cache()
    import sglang
    import triton

    meta.update(device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", torch=torch.__version__,
                triton=triton.__version__, sglang=sglang.__version__, python=platform.python_version(),
                seconds=time.time() - t0, copy_bandwidth_Bps=COPY_BW)
    json.dump(dict(meta=meta, rows=rows), open(args.out, "w"), indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
