"""Which tensor-core dots of the chunk tree verify need fp32 accuracy? A CPU emulation.

The served verify (``gdn_tree_chunk_verify_fwd_kernel``) runs eight kinds of ``tl.dot``; with
``tf32x3`` (three tf32 passes, fp32-accurate) everywhere it spills registers, with ``tf32`` (one
pass, 10-bit mantissa) everywhere it carries ~5e-4 relative error into the outputs. This script
replays the kernel's arithmetic in float64 on the CPU, rounding the operands of chosen dots to tf32
(round-to-nearest-even, as the tensor cores' tf32 inputs; ``tf32x3`` as hi/lo splits), and measures
the output error against the exact computation, per dot: each dot alone in tf32 (rest tf32x3), all
tf32, and the ``mixed`` setting of :func:`lumotree.ops.gdn_tree.triton.served_chunk_config`.

Inputs are Qwen3.5-like: K = V = 128, l2-normalised q/k, gates from random (a, b) through the
model's softplus/sigmoid, a committed state built by running the delta rule over a 256-token prefix,
EAGLE-like trees of 6, 16 and 64 nodes. No GPU: what it cannot show is the tensor cores' own
accumulation order (fp32), which this emulation does exactly.

    python3 benchmark/kernels/precision_emulation.py --out benchmark/results/verify_precision_emulation_cpu.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys

import torch

from lumotree.tree import ancestor_mask

D = torch.float64
DOTS = ("kk", "T", "w", "u", "wh", "qh", "qk", "pv")  # the kernel's dots, in its order
LOW_SENSITIVITY = ("kk", "T", "w", "wh")  # PRECISION_LOW in the kernel (the "mixed" setting)


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to tf32 (10 mantissa bits, round to nearest even) via the fp32 bit pattern."""
    b = x.float().view(torch.int32)
    b = (b + 0x0FFF + ((b >> 13) & 1)) & ~0x1FFF
    return b.view(torch.float32).to(D)


def mm(a, b, prec):
    if prec == "exact":
        return a @ b
    if prec == "tf32":
        return tf32(a) @ tf32(b)
    if prec == "tf32x3":  # hi*hi + hi*lo + lo*hi, as Triton's tf32x3
        ah, bh = tf32(a), tf32(b)
        al, bl = tf32(a.float().to(D) - ah), tf32(b.float().to(D) - bh)
        return ah @ bh + ah @ bl + al @ bh
    raise ValueError(prec)


def chunk_verify(q, k, v, g, beta, M, h, scale, prec):
    """The kernel's arithmetic for one request and head; ``prec[dot]`` per dot."""
    q = q / torch.sqrt((q * q).sum(1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(1, keepdim=True) + 1e-6)
    n = q.shape[0]
    G = (M.to(D) * g[None, :]).sum(1)
    zero = torch.zeros((), dtype=D)
    decay = torch.where(M, torch.exp(G[:, None] - G[None, :]), zero)
    eye = torch.eye(n, dtype=torch.bool)
    A = torch.where(eye, zero, beta[:, None] * mm(k, k.T, prec["kk"]) * decay)
    I = eye.to(D)
    T, P, p = I - A, A, 1
    dmax = int(M.sum(1).max()) - 1
    while 2 * p <= dmax:
        P = mm(P, P, prec["T"])
        T = mm(T, I + P, prec["T"])
        p *= 2
    eG = torch.exp(G)
    w = mm(T, k * (beta * eG)[:, None], prec["w"])
    u = mm(T, v * beta[:, None], prec["u"])
    vn = u - mm(w, h.T, prec["wh"])
    qh = mm(q, h.T, prec["qh"])
    pm = torch.where(M, mm(q, k.T, prec["qk"]) * decay, zero)
    return (eG[:, None] * qh + mm(pm, vn, prec["pv"])) * scale


def gate(gen):
    a, b = torch.randn((), dtype=D, generator=gen), torch.randn((), dtype=D, generator=gen)
    return -torch.exp(torch.tensor(-1.0, dtype=D)) * torch.nn.functional.softplus(a + 0.5), torch.sigmoid(b)


def case(n, rng, gen, K=128, V=128, prefix=256):
    h = torch.zeros(V, K, dtype=D)
    for _ in range(prefix):  # a committed state: the delta rule over a prefix
        kk = torch.randn(K, dtype=D, generator=gen)
        kk = kk / kk.norm()
        vv = torch.randn(V, dtype=D, generator=gen)
        g, beta = gate(gen)
        h = h * torch.exp(g)
        h = h + beta * torch.outer(vv - h @ kk, kk)
    par = [-1] + [rng.randrange(max(1, i - 3), i) if i > 1 else 0 for i in range(1, n)]  # EAGLE-like
    q, k = torch.randn(n, K, dtype=D, generator=gen), torch.randn(n, K, dtype=D, generator=gen)
    v = torch.randn(n, V, dtype=D, generator=gen)
    g, beta = (torch.stack(x) for x in zip(*[gate(gen) for _ in range(n)]))
    return q, k, v, g, beta, ancestor_mask(torch.tensor([par]))[0], h


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--trials", type=int, default=8)
    args = ap.parse_args(argv)
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    settings = {"tf32x3": {d: "tf32x3" for d in DOTS}, "tf32": {d: "tf32" for d in DOTS},
                "mixed": {d: ("tf32" if d in LOW_SENSITIVITY else "tf32x3") for d in DOTS}}
    for d in DOTS:
        settings[f"only {d} in tf32"] = {x: ("tf32" if x == d else "tf32x3") for x in DOTS}
    rows = []
    for n in (6, 16, 64):
        cases = [case(n, rng, gen) for _ in range(args.trials)]
        refs = [chunk_verify(*c, 128 ** -0.5, {d: "exact" for d in DOTS}) for c in cases]
        for name, prec in settings.items():
            errs = [float((chunk_verify(*c, 128 ** -0.5, prec) - r).norm() / r.norm()) for c, r in zip(cases, refs)]
            rows.append(dict(nodes=n, setting=name, max_rel_err=max(errs), mean_rel_err=sum(errs) / len(errs)))
            print(json.dumps(rows[-1]), flush=True)
    res = dict(command="python3 " + " ".join(sys.argv), trials=args.trials, dots=DOTS,
               low_sensitivity_dots=LOW_SENSITIVITY, rows=rows,
               note="relative Frobenius error of the verify outputs (before their bf16 rounding) vs float64")
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    return res


if __name__ == "__main__":
    main()
