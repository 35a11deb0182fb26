"""A verify's full attention, per layer: SGLang's prefill kernel (``extend_attention_fwd`` with the verify's
custom mask, what SGLang's Triton backend runs for a target verify) against LumoTree's tree verify attention
(``lumotree.ops.tree_attention``: split prefix + tree merge), one process, the same inputs: Qwen3.5-27B's
attention heads (24 query, 4 KV, head dim 256), bf16, ``--nodes`` verify tokens per request (a chain, or an
EAGLE-shaped tree) after prefixes of ``--contexts`` keys at scattered pool slots. Each kernel timed from a
CUDA graph (``triton.testing.do_bench_cudagraph``); outputs compared with each other and with the fp32
reference before timing.

    python3 benchmark/kernels/bench_tree_attention.py --out benchmark/results/tree_attention_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_verify_forms import bench_graph  # noqa: E402


def inputs(batch, context, nodes, tree, heads=(24, 4, 256), dtype=torch.bfloat16, device="cuda", seed=0):
    """The verify's tensors, its ancestor mask (``None`` for a chain) and SGLang's custom mask / indptrs."""
    from lumotree import tree_shapes
    from lumotree.tree import ancestor_mask

    hq, hkv, d = heads
    g = torch.Generator().manual_seed(seed)
    pool = batch * context + 64
    kb = torch.randn(pool, hkv, d, generator=g).to(device, dtype)
    vb = torch.randn(pool, hkv, d, generator=g).to(device, dtype)
    kv_indices = (torch.randperm(pool - 1, generator=g)[:batch * context] + 1).to(device)
    kv_indptr = torch.arange(0, (batch + 1) * context, context, dtype=torch.int32, device=device)
    T = batch * nodes
    q, k, v = (torch.randn(T, h, d, generator=g).to(device, dtype) for h in (hq, hkv, hkv))
    rng = random.Random(seed)
    par = [tree_shapes.chain(nodes) if tree == "chain" else tree_shapes.eagle(4, max(1, nodes // 2), nodes, rng)
           for _ in range(batch)]
    anc = ancestor_mask(torch.tensor(par)).to(device)
    rows = torch.cat([torch.ones(batch, nodes, context, dtype=torch.bool, device=device), anc], dim=2)
    mask = rows.reshape(-1)  # per request: nodes x (context + nodes), request after request
    mask_indptr = torch.arange(0, (batch + 1) * nodes * (context + nodes), nodes * (context + nodes),
                               dtype=torch.int64, device=device)
    qo = torch.arange(0, (batch + 1) * nodes, nodes, dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, k_buffer=kb, v_buffer=vb, kv_indptr=kv_indptr, kv_indices=kv_indices), \
        (None if tree == "chain" else anc.to(torch.int8)), (mask, mask_indptr, qo)


def measure(batch, context, nodes, tree):
    from lumotree.ops.tree_attention import naive, triton as tri
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    p, anc, (mask, mask_indptr, qo) = inputs(batch, context, nodes, tree)
    ours, sg = torch.empty_like(p["q"]), torch.empty_like(p["q"])

    def run_ours():
        tri.tree_verify_attention(**p, anc=anc, out=ours)

    def run_sglang():
        extend_attention_fwd(p["q"], p["k"], p["v"], sg, p["k_buffer"], p["v_buffer"], qo, p["kv_indptr"],
                             p["kv_indices"], mask, True, mask_indptr, nodes, 1.0, 1.0)

    run_ours()
    run_sglang()
    row = dict(batch=batch, context=context, nodes=nodes, tree=tree,
               max_gap_vs_sglang=float((ours.float() - sg.float()).abs().max()))
    if batch * context <= 8 * 1024:  # the fp32 reference loops over requests and heads
        ref = naive.tree_verify_attention(**p, anc=anc).float()
        row.update(max_gap_ours_vs_ref=float((ours.float() - ref).abs().max()),
                   max_gap_sglang_vs_ref=float((sg.float() - ref).abs().max()))
    t_sg, t_ours = bench_graph(run_sglang), bench_graph(run_ours)
    row.update(sglang_us=round(t_sg, 1), lumotree_us=round(t_ours, 1), speedup=round(t_sg / t_ours, 2),
               splits=tri.tree_attention_config(batch, nodes, 24, 4, torch.cuda.get_device_properties(0).multi_processor_count)[2])
    return row


def table(rows):
    out = ["| tree | nodes | batch | prefix keys | SGLang prefill kernel (µs) | LumoTree (µs) | speed-up | max gap |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['tree']} | {r['nodes']} | {r['batch']} | {r['context']} | {r['sglang_us']} | {r['lumotree_us']} | "
                   f"{r['speedup']}× | {r['max_gap_vs_sglang']:.1e} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--contexts", default="256,1024,4096")
    ap.add_argument("--trees", default="chain:4,eagle:8,eagle:16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = []
    for spec in args.trees.split(","):
        tree, nodes = spec.split(":")
        for b in map(int, args.batches.split(",")):
            for c in map(int, args.contexts.split(",")):
                rows.append(measure(b, c, int(nodes), tree))
                print(json.dumps(rows[-1]), flush=True)
    json.dump(dict(command="python3 " + " ".join(sys.argv), device=torch.cuda.get_device_name(), rows=rows),
              open(args.out, "w"), indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
