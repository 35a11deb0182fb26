"""A chain verify's full attention: SGLang's prefill kernel (``extend_attention_fwd``, what SGLang's Triton
backend runs for a target verify on NVIDIA) against SGLang's split-KV verify kernel (``verify_splitkv_fwd``,
what a LUMOTREE chain runs when its start-up check passes: ``lumotree/sglang/verify_attention.py``), in one
process on the same inputs: Qwen3.5-27B's attention heads (24 query, 4 KV, head dim 256), bf16, a causal
chain of ``--draft-tokens`` per request after a prefix of ``--contexts`` keys at scattered pool slots. Each
kernel timed from a CUDA graph of 10 calls (no launch gaps); max |difference| between the two outputs.

    python3 benchmark/kernels/bench_verify_attention.py --out benchmark/results/verify_attention_h200.json
"""
import argparse
import json
import sys

import torch


def measure(batch, context, n, h_q=24, h_kv=4, head_dim=256):
    from lumotree.sglang.verify_attention import ChainProblem, graph_ms

    dev = torch.device("cuda")
    p = ChainProblem(h_q, h_kv, head_dim, head_dim, torch.bfloat16, dev, n, prefixes=(context,) * batch)
    p.prefill()
    if not p.split_kv(p.out):
        return dict(batch=batch, context=context, draft_tokens=n, error="the split-KV kernel declined the problem")
    gap = float((p.out.float() - p.ref.float()).abs().max())
    t_prefill, t_split = graph_ms(p.prefill, dev), graph_ms(lambda: p.split_kv(p.out), dev)
    return dict(batch=batch, context=context, draft_tokens=n, prefill_kernel_us=round(t_prefill * 1e3, 1),
                split_kv_us=round(t_split * 1e3, 1), speedup=round(t_prefill / t_split, 2), max_gap=gap)


def table(rows):
    out = ["| batch | prefix keys | prefill kernel (us) | split-KV (us) | speed-up | max gap |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['batch']} | {r['context']} | – | – | {r['error']} | – |")
        else:
            out.append(f"| {r['batch']} | {r['context']} | {r['prefill_kernel_us']} | {r['split_kv_us']} | "
                       f"{r['speedup']}x | {r['max_gap']:.1e} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--contexts", default="256,1024,4096")
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from lumotree.sglang.patches.verify_splitkv_scratch import alloc_finite
    import sglang.kernels.ops.attention.verify_splitkv as vsk

    alloc = vsk.VerifySplitKV._alloc  # as a LUMOTREE server runs it: scratch made finite at allocation
    vsk.VerifySplitKV._alloc = lambda self, *a, **k: alloc_finite(alloc, self, *a, **k)
    rows = [measure(b, c, args.draft_tokens) for b in map(int, args.batches.split(","))
            for c in map(int, args.contexts.split(","))]
    res = dict(command="python3 " + " ".join(sys.argv), device=torch.cuda.get_device_name(), rows=rows)
    json.dump(res, open(args.out, "w"), indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
