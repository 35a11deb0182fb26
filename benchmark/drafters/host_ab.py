"""Two builds of the C++ suffix drafter (``lumotree._host``) against each other on a noisy machine, paired step by
step (CPU).

On a shared 2-core virtual machine the same build's median step time at batch 32 moved 0.8-1.6 ms between runs a
minute apart, so builds timed one after the other, or even alternated run by run, could not show a 5 % change. Here
both builds live in one process with identical state: two drafters made the same way (``--threads A,B``: each
build's host threads), the same earlier outputs in their global caches, the same ``--batch`` requests admitted (each
prompt into both, in alternating order), then every decode step's appends, drafts and their layout as SGLang's NGRAM
worker takes them (``step_layout``, the served call; ``--nodes``) on one and at once on the other, the order alternating -- so a swing of the machine falls on both sides of a pair.
Reported: each side's median, and the median of the per-step ratios B / A (and of the admissions'); the two builds'
drafts are checked to be equal step by step. A build against itself reads 1.00 +- 0.01 (steps) here.

    python3 benchmark/drafters/host_ab.py OLD_HOST_SO python/lumotree/_host.cpython-311-x86_64-linux-gnu.so \\
        --batch 32 --out ...

Contexts: ``suffix_host_cost.contexts`` (the agent replay sessions' text as token ids), ``--context`` tokens of
prompt, ``--accept`` tokens appended per request per step.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


_LOADED: list = []  # the builds loaded, in order
_COPIES: list = []  # the folder of their copies


def load(path: str):
    """A build of ``lumotree._host`` from its file (torch first: the build links its libraries), as a module of its
    own: under a name no other build has (Python keeps one extension module per name -- two builds loaded as
    ``lumotree._host`` were one module, the first, and every pair timed that build against itself) and with its
    own classes (the build's pybind11 types are module-local; a build from before that registered them for the
    whole process, and a second such build cannot load beside it). Loaded from a copy of the file: the same file
    twice -- a build against itself, the pairing's own noise -- would be one library to the dynamic loader."""
    import shutil
    import tempfile

    import torch  # noqa: F401

    if not _COPIES:
        _COPIES.append(tempfile.TemporaryDirectory(prefix="host_ab"))  # removed with the process
    copy = os.path.join(_COPIES[0].name, f"{len(_LOADED)}-{os.path.basename(path)}")
    shutil.copy2(path, copy)
    spec = importlib.util.spec_from_file_location(f"lumotree_host_ab{len(_LOADED)}._host", copy)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except ImportError as e:
        if "already registered" in str(e):
            raise RuntimeError(f"{path}: this build registers its classes for the whole process, as another loaded "
                               "build does; one of the two must be a build with module-local classes") from e
        raise
    if any(m.SuffixDrafter is mod.SuffixDrafter for m in _LOADED):
        raise RuntimeError(f"{path}: its SuffixDrafter is an earlier build's class")
    _LOADED.append(mod)
    return mod


def drafter(ext, threads: int, nodes: int):
    """The served drafter's settings (``SuffixCorpus``) over build ``ext`` (it binds its build when made)."""
    from lumotree.drafters import suffix as S
    from lumotree.sglang.suffix import SuffixCorpus

    installed = S._host_extension
    S._host_extension = lambda: ext
    try:
        return S.NativeSuffixDrafter(threads=threads, **SuffixCorpus(nodes).kw)
    finally:
        S._host_extension = installed


def paired(a, b, batch: int, nodes: int, context: int, accept: int, steps: int, global_outputs: int) -> dict:
    """Drafters ``a`` and ``b`` driven alike, each step timed on both back to back (the order alternating)."""
    import numpy as np
    from suffix_host_cost import contexts

    texts = contexts(batch + global_outputs, context)
    for i in range(global_outputs):  # earlier turns' outputs in the global caches
        for d in (a, b):
            d.start(f"g{i}", texts[batch + i][:context])
            d.finish(f"g{i}", texts[batch + i][context:context + 512])
    rids = [f"r{i}" for i in range(batch)]
    times = {"admission": ([], []), "step": ([], [])}

    def timed(kind, k, fn, *args):
        sides = (0, 1) if k % 2 == 0 else (1, 0)
        out = [None, None]
        for s in sides:
            t0 = time.perf_counter()
            out[s] = fn((a, b)[s], *args)
            times[kind][s].append(time.perf_counter() - t0)
        return out

    for k, (rid, t) in enumerate(zip(rids, texts)):
        timed("admission", k, lambda d: d.start(rid, t[:context]))
    span = max(1, (len(texts[0]) - context) // accept)
    for k in range(steps):
        j = k % span
        app = [t[context + j * accept:context + (j + 1) * accept] for t in texts[:batch]]
        da, db = timed("step", k, lambda d: d.step_layout(rids, app, nodes))
        if not all(np.array_equal(x, y) for x, y in zip(da, db)):
            raise RuntimeError(f"step {k}: the two builds drafted differently")
    out = {}
    for kind, (ta, tb) in times.items():
        out[kind] = dict(a_median_ms=round(statistics.median(ta) * 1e3, 3),
                         b_median_ms=round(statistics.median(tb) * 1e3, 3),
                         b_over_a_median=round(statistics.median(y / x for x, y in zip(ta, tb)), 3), count=len(ta))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="build A of lumotree._host (a .so file)")
    ap.add_argument("b", help="build B")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--accept", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--global-outputs", type=int, default=32, help="finished outputs in the global caches first")
    ap.add_argument("--threads", default="1,1", help="A,B: each build's host threads")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ta, tb = (int(x) for x in args.threads.split(","))
    a = drafter(load(args.a), ta, args.nodes)
    b = drafter(load(args.b), tb, args.nodes)
    res = paired(a, b, args.batch, args.nodes, args.context, args.accept, args.steps, args.global_outputs)
    res = dict(a=args.a, b=args.b, threads=[ta, tb], batch=args.batch, nodes=args.nodes, **res)
    print(json.dumps(res), flush=True)
    from acceptance_replay import write_result

    return write_result(__file__, argv, args.out, **res)


if __name__ == "__main__":
    main()
