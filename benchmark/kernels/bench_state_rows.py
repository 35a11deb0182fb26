"""The prefill's prompt-state copy: LumoTree's one launch (``lumotree.ops.copy_state_rows``) vs SGLang 0.5.17's copy
of tracked chunk states (``HybridLinearAttnBackend._track_mamba_state_extend``: ``ssm_states[dst] =
h[src].to(ssm_states.dtype)`` -- a gather, a cast, a scatter), on the same inputs in the same process: one GDN layer's
chunk states of an 8192-token prefill (bf16 ``[chunks, Hv, V, K]``) into its fp32 pool of 192 slots, ``n`` tracked
prompts. Device time per layer (CUDA events around 50 launches, median of 20), both outputs compared.

    python3 benchmark/kernels/bench_state_rows.py --out benchmark/results/state_rows_h100.json
"""
import argparse
import json
import statistics

import torch

from report import emit


def device_us(fn, launches=50, repeats=20):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(launches):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / launches)
    return statistics.median(out)


SHAPES = {"qwen3.5-27b": (48, 128, 128), "qwen3-next-80b": (32, 128, 128)}  # (Hv, V, K) per GDN layer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tracked", default="1,8,32")
    args = ap.parse_args()
    from lumotree.ops.state_rows import triton as tri

    rows = []
    for name, state in SHAPES.items():
        chunks, slots = 8192 // 64, 192
        h = torch.randn(chunks, *state, device="cuda").to(torch.bfloat16)
        pool = torch.zeros(slots, *state, device="cuda")
        for n in (int(x) for x in args.tracked.split(",")):
            src = torch.randperm(chunks, device="cuda")[:n]
            dst = torch.randperm(slots, device="cuda")[:n]
            ref, got = pool.clone(), pool.clone()

            def sglang():
                ref[dst] = h[src].to(ref.dtype, copy=False)

            def lumotree():
                tri.copy_state_rows(h, src, got, dst)

            t_sg, t_lt = device_us(sglang), device_us(lumotree)
            assert torch.equal(ref, got), (name, n)
            moved = n * h[0].numel() * (h.element_size() + pool.element_size())
            row = dict(shape=name, state=list(state), tracked=n, sglang_us=round(t_sg, 2), lumotree_us=round(t_lt, 2),
                       speedup=round(t_sg / t_lt, 2), lumotree_gbps=round(moved / t_lt / 1e3, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    emit(rows, [("shape", "shape"), ("tracked prompts", "tracked"), ("SGLang copy (us / layer)", "sglang_us"),
                ("LumoTree copy (us / layer)", "lumotree_us"), ("x", "speedup"), ("LumoTree GB/s", "lumotree_gbps")],
         args.out)

if __name__ == "__main__":
    main()
