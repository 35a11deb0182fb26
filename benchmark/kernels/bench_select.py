"""Fused selection + commit plan (LumoTree CUDA op) vs SGLang 0.5.17's greedy tree verify path.

SGLang: ``sgl_kernel.verify_tree_greedy`` followed by the bookkeeping its EAGLE verify does with
the result (accepted-token gather by boolean mask, eviction mask and rejected-slot list for the
allocator, ``accept_length.tolist()``): several launches and host synchronisations.
LumoTree: ``torch.ops.lumotree.tree_select`` writes acceptance, bonus tokens, conv-gather indices,
accepted KV slots and the compacted free list in one launch; nothing leaves the GPU.

Both start from the target's argmax (excluded: both need it). Wall-clock per step, with one
``torch.cuda.synchronize()`` at the end of each step (SGLang's path syncs inside), median of 200;
LumoTree also replayed as a CUDA graph.

    python3 benchmark/kernels/bench_select.py --out benchmark/results/select_h200.json
"""
import argparse
import json
import platform
import random
import statistics
import sys
import time

import torch


def time_wall(fn, iters=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmark/results/select_h200.json")
    args = ap.parse_args()
    from sgl_kernel import verify_tree_greedy

    from lumotree import TreeDescriptor, tree_shapes
    from lumotree.ops.select import cuda

    assert cuda.available(), "build the extension first (pip install --no-build-isolation .)"
    rows = []
    for N, (topk, steps) in ((8, (4, 3)), (16, (4, 5)), (32, (4, 7)), (64, (8, 8))):
        p = tree_shapes.eagle(topk, steps, N, random.Random(N))
        for B in (1, 8, 32, 64, 128, 256):
            dev = "cuda"
            parents = torch.tensor([p] * B, device=dev)
            tree = TreeDescriptor.from_parents(parents)
            g = torch.Generator(device=dev).manual_seed(0)
            draft = torch.randint(0, 4, (B, N), device=dev, generator=g)
            target = torch.randint(0, 4, (B, N), device=dev, generator=g)
            out_cache_loc = torch.arange(B * N, device=dev)
            e = tree.to_eagle(torch.zeros(B, dtype=torch.long, device=dev))
            depth = int(tree.depth.max()) + 1
            r_idx, r_nt, r_ns = e["retrieve_index"], e["retrieve_next_token"], e["retrieve_next_sibling"]

            def sglang_path():
                predict = torch.zeros(B * N, dtype=torch.int32, device=dev)
                accept_index = torch.full((B, depth), -1, dtype=torch.int32, device=dev)
                accept_len = torch.empty(B, dtype=torch.int32, device=dev)
                verify_tree_greedy(predicts=predict, accept_index=accept_index, accept_token_num=accept_len,
                                   candidates=draft, retrive_index=r_idx, retrive_next_token=r_nt,
                                   retrive_next_sibling=r_ns, target_predict=target)
                acc = accept_index[accept_index != -1]  # host sync (boolean mask)
                verified = predict[acc]
                evict = torch.ones(B * N, dtype=torch.bool, device=dev)
                evict[acc] = False
                free = out_cache_loc[evict]  # host sync
                lens = accept_len.tolist()  # host sync
                return verified, free, lens

            def ours():
                return cuda.tree_select_and_plan(draft, target, tree, greedy=True, cache_slots=out_cache_loc.view(B, N),
                                                 conv_width=4)

            # agreement on the accepted nodes (SGLang's accept_index is flat b * N + node)
            predict = torch.zeros(B * N, dtype=torch.int32, device=dev)
            ai = torch.full((B, depth), -1, dtype=torch.int32, device=dev)
            al = torch.empty(B, dtype=torch.int32, device=dev)
            verify_tree_greedy(predicts=predict, accept_index=ai, accept_token_num=al, candidates=draft,
                               retrive_index=r_idx, retrive_next_token=r_nt, retrive_next_sibling=r_ns,
                               target_predict=target)
            _, plan = ours()
            ours_flat = torch.where(plan.accept_nodes[:, :depth] >= 0,
                                    plan.accept_nodes[:, :depth] + N * torch.arange(B, device=dev)[:, None], -1)
            agree = bool(torch.equal(ours_flat.int(), ai)) and bool(torch.equal(plan.accept_len.int() - 1, al))
            t_sgl = time_wall(sglang_path)
            t_ours = time_wall(ours)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                ours()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                ours()
            t_graph = time_wall(graph.replay)
            r = dict(nodes=N, batch=B, sglang_us=t_sgl, ours_us=t_ours, ours_graph_us=t_graph,
                     speedup=t_sgl / t_ours, speedup_graph=t_sgl / t_graph, agree=agree)
            rows.append(r)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    import sglang

    meta = dict(command="python3 " + " ".join(sys.argv), device=torch.cuda.get_device_name(0), torch=torch.__version__,
                sglang=sglang.__version__, python=platform.python_version())
    json.dump(dict(meta=meta, rows=rows), open(args.out, "w"), indent=1)
    print("| nodes | B | SGLang verify_tree_greedy + bookkeeping µs | LumoTree µs | LumoTree graph µs | speedup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['batch']} | {r['sglang_us']:.1f} | {r['ours_us']:.1f} | {r['ours_graph_us']:.1f} | "
              f"{r['speedup_graph']:.1f}x |")


if __name__ == "__main__":
    main()
