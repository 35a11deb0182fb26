"""How long Triton takes to compile LumoTree's served kernels for the H200 (sm_90), without a GPU.

A server compiles its Triton kernels just in time, the first time each runs -- on a fresh machine
inside the first CUDA-graph capture, so it is part of the server's start-up. This script times that
compile for the kernels a LUMOTREE / LUMOTREE_SUFFIX verify and commit launch (GDN tree verify,
all-layer replay commit, tree verify attention, the device finish rule), through their real
launchers at a server's shapes, so each kernel is specialised as a server specialises it: Triton's
active driver is replaced by one that reports an sm_90 target and every launch becomes a warm-up
(compile, no run), so the tensors can live on the CPU. Each run compiles into an empty cache.

    python3 benchmark/kernels/compile_time.py --shapes tiny,qwen3.5-27b --batches 1,32 \
        --out benchmark/results/compile_time_cpu.json

Compile time depends on the machine's CPU (Triton's compiler and ptxas run on the host); the GPU
machine's host compiles the same kernels.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

# the shapes a server serves them at: GDN heads (Hk, Hv, K, V), attention heads (Hq, Hkv, D), GDN layers, tree nodes
SHAPES = {
    "tiny": dict(hk=2, hv=4, k=64, v=64, hq=4, hkv=2, d=64, layers=3, nodes=16),  # LUMOTREE_SUFFIX's 16-node trees
    "qwen3.5-27b": dict(hk=16, hv=48, k=128, v=128, hq=24, hkv=4, d=256, layers=24, nodes=4),  # the 3-step chain
}
OPS = ("verify", "commit", "tree_attention", "finish")


class _Sm90Driver:
    """Triton's active driver for compiling only: an sm_90 target, device 0, stream 0."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True


def compile_only(times: dict, counts: collections.Counter):
    """Every Triton launch compiles and returns without running; compile seconds per kernel into ``times``."""
    from triton.runtime import driver, jit

    driver.set_active(_Sm90Driver())
    compile_ = jit.JITFunction._do_compile
    run = jit.JITFunction.run

    def timed(self, key, signature, device, constexprs, options, attrs, warmup):
        t0 = time.perf_counter()
        kernel = compile_(self, key, signature, device, constexprs, options, attrs, warmup)
        times[self.fn.__name__] += time.perf_counter() - t0
        counts[self.fn.__name__] += 1
        return kernel

    def warm(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    jit.JITFunction._do_compile = timed
    jit.JITFunction.run = warm


def launch(op: str, shape: dict, bs: int) -> None:
    """Call ``op``'s launcher as a LUMOTREE server does, on CPU tensors of ``shape`` for ``bs`` requests."""
    import torch

    n, hk, hv, k_, v_ = shape["nodes"], shape["hk"], shape["hv"], shape["k"], shape["v"]
    rows = torch.arange(bs, dtype=torch.int32)
    anc = torch.ones(bs, n, n, dtype=torch.int8)
    layers, slots = shape["layers"], bs + 8
    ring = [torch.zeros(layers, bs + 1, n, hk, k_, dtype=torch.bfloat16),
            torch.zeros(layers, bs + 1, n, hv, v_, dtype=torch.bfloat16),
            torch.zeros(layers, bs + 1, n, hv), torch.zeros(layers, bs + 1, n, hv)]
    if op == "verify":
        from lumotree.ops.gdn_tree.verify import gdn_tree_mix_verify_fwd

        q = torch.zeros(bs, n, hk, k_, dtype=torch.bfloat16)
        a = torch.zeros(bs, n, hv, dtype=torch.bfloat16)
        gdn_tree_mix_verify_fwd(q, q.clone(), torch.zeros(bs, n, hv, v_, dtype=torch.bfloat16),
                                torch.zeros(slots, hv, v_, k_), None, A_log=torch.zeros(hv), a=a,
                                dt_bias=torch.zeros(hv), b=a.clone(), scale=k_ ** -0.5, use_qk_l2norm=True,
                                state_indices=rows, anc_mask=anc, num_nodes=torch.full((bs,), n),
                                precision="tf32x3", ring=tuple(t[0] for t in ring), ring_rows=rows)
    elif op == "commit":
        from lumotree.ops.gdn_tree.commit import gdn_tree_commit_layers_fwd

        gdn_tree_commit_layers_fwd(*ring, torch.zeros(layers, slots, hv, v_, k_), rows,
                                   torch.zeros(bs, dtype=torch.int64), torch.zeros(bs, n, dtype=torch.int64),
                                   use_qk_l2norm=True, ring_rows=rows)
    elif op == "tree_attention":
        from lumotree.ops.tree_attention.triton import tree_verify_attention

        hq, hkv, d = shape["hq"], shape["hkv"], shape["d"]
        kv = torch.zeros(bs * n, hkv, d, dtype=torch.bfloat16)
        pool = torch.zeros(bs * 64, hkv, d, dtype=torch.bfloat16)
        tree_verify_attention(torch.zeros(bs * n, hq, d, dtype=torch.bfloat16), kv, kv.clone(), pool, pool.clone(),
                              torch.arange(bs + 1, dtype=torch.int32) * 64, torch.arange(bs * 64, dtype=torch.int32),
                              anc if n > 1 else None)
    elif op == "finish":
        from lumotree.ops.finish.triton import clamp_run, mark_finished

        stop = torch.zeros(slots, 4, dtype=torch.int64)
        max_len = torch.zeros(slots, dtype=torch.int64)
        ruled = torch.zeros(slots, dtype=torch.bool)
        lens = torch.zeros(bs, dtype=torch.int64)
        mark_finished(torch.zeros(slots, dtype=torch.bool), stop, max_len, ruled, rows, torch.zeros(bs * n, dtype=torch.int64),
                      lens, lens.clone(), n)
        clamp_run(stop, max_len, ruled, rows, lens, torch.zeros(bs * n, dtype=torch.int64), lens.clone(),
                  torch.zeros(bs, n, dtype=torch.int64))
    else:
        raise ValueError(f"unknown op {op!r}: one of {OPS}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny,qwen3.5-27b", help=f"comma-separated, from {sorted(SHAPES)}")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {s!r}; one of {sorted(SHAPES)}")
    ops = args.ops.split(",")
    for op in ops:
        if op not in OPS:
            raise SystemExit(f"--ops: unknown op {op!r}; one of {list(OPS)}")
    cache = tempfile.mkdtemp(prefix="lumotree-compile-time-")
    os.environ["TRITON_CACHE_DIR"] = cache  # every kernel compiled here, none read from an earlier run
    times, counts = collections.defaultdict(float), collections.Counter()
    compile_only(times, counts)
    rows = []
    for s in shapes:
        for bs in (int(b) for b in args.batches.split(",")):
            for op in ops:
                times.clear()
                counts.clear()
                t0 = time.perf_counter()
                launch(op, SHAPES[s], bs)
                row = dict(shape=s, batch=bs, op=op, wall_s=round(time.perf_counter() - t0, 3),
                           compile_s=round(sum(times.values()), 3),
                           kernels={name: dict(compiles=counts[name], seconds=round(sec, 3)) for name, sec in times.items()})
                rows.append(row)
                print(json.dumps(row), flush=True)
    per_shape = {s: round(sum(r["compile_s"] for r in rows if r["shape"] == s), 3) for s in shapes}
    import triton

    res = dict(what="Triton compile time of LumoTree's served kernels for sm_90, through their launchers at server "
                    "shapes, on this machine's CPU, each kernel variant compiled once (an empty cache; a batch "
                    "size that specialises a kernel differently -- batch 1 -- compiles it again)",
               command="python3 " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])),
               triton=triton.__version__, cpu=_cpu(), rows=rows, compile_s_per_shape=per_shape)
    print(json.dumps(dict(compile_s_per_shape=per_shape)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
