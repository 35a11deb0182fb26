"""What a finished request costs LUMOTREE_SUFFIX's C++ drafter once its global cache of recent outputs is full, on
the CPU: the drafter's ``finish`` (the request's output joins the global trie, the oldest outputs leave it), per
finish, while the window fills and after.

Outputs are ``--output`` random tokens of a ``--vocab``-token vocabulary (little shared structure: the most nodes
per token, the worst case for the trie). ``--extension PATH``: another build of ``lumotree._host`` (e.g. from an
earlier commit's ``csrc/host/suffix_drafter.cc``) timed instead.

    python3 benchmark/drafters/global_window_cost.py --global-tokens 16384,65536,262144 \
        --out benchmark/results/global_window_cost_cpu.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def host_module(path=None):
    if path is None:
        from lumotree import _host

        return _host
    importlib.import_module("torch")  # the extension links against torch's libraries

    spec = importlib.util.spec_from_file_location("_host", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(host, global_tokens: int, args):
    from lumotree.sglang.suffix import SuffixCorpus

    kw = dict(SuffixCorpus(16).kw, global_tokens=global_tokens)  # the served settings but the window
    d = host.SuffixDrafter(kw["max_match"], kw["max_spec"], kw["global_tokens"], kw["min_prob"], kw["retired_tokens"])
    rng = random.Random(0)
    out = lambda: [rng.randrange(args.vocab) for _ in range(args.output)]  # noqa: E731
    n = global_tokens // args.output
    filling = []
    for i in range(n):
        o = out()
        t0 = time.perf_counter()
        d.finish(f"x{i}", o)
        filling.append((time.perf_counter() - t0) * 1e3)
    full = []
    t_end = time.perf_counter() + args.max_seconds
    for i in range(args.finishes):
        o = out()
        t0 = time.perf_counter()
        d.finish(f"y{i}", o)
        full.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() > t_end:
            break
    s = sorted(full)
    return dict(global_tokens=global_tokens, filling_median_ms=round(statistics.median(filling), 3),
                full_finishes=len(s), full_median_ms=round(statistics.median(s), 3),
                full_p99_ms=round(s[min(len(s) - 1, int(0.99 * len(s)))], 3), full_max_ms=round(s[-1], 3))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--global-tokens", default="16384,65536,262144")
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--finishes", type=int, default=512, help="finishes timed once the window is full")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="per window size, for the full-window finishes")
    ap.add_argument("--extension", default=None, help="another build of lumotree._host to time")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    host = host_module(args.extension)
    rows = []
    for g in (int(x) for x in args.global_tokens.split(",")):
        rows.append(run(host, g, args))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        cmd = "python3 benchmark/drafters/global_window_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out, "w") as f:
            json.dump(dict(command=cmd.strip(), machine=f"{os.cpu_count()} CPU cores", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
