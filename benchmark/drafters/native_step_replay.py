"""The C++ suffix drafter alone (``lumotree._host.SuffixDrafter``, ``csrc/host/suffix_drafter.cc``) on the agent
benchmark's served token streams: every call LUMOTREE_SUFFIX's corpus makes into it during
``prepare_replay.py``'s replay (admissions, each decode step's ``step_layout``, finishes) recorded, then made again
on fresh drafters, each call timed -- without the Python around them, the background thread or the machine's other
work in between, so that two builds of the extension compare on the same calls.

The recording waits for each prefill batch's admissions before the next step (``prepare_replay.py`` without
``--background``): the calls are the same on every run and every build, and the drafts too (``digest``: a hash of
every step's tokens and masks; two builds that draft alike print the same). The replay indexes each admission inline
(``index_staged``, not the background thread) on ``--threads`` threads (default 1: what a step's requests cost one
thread). Rows per batch bucket: ``step_layout`` median / p95 / total ms, the median over ``--repeats`` replays;
``admissions_ms`` / ``finish_ms``: the replays' median totals of the admissions' indexing and of the finishes.

    python3 benchmark/drafters/native_step_replay.py \\
        --replies benchmark/results/agents_32_delayer_replies_h200.json.gz --reference none/32 --agents 32 \\
        --nodes 16 --repeats 5 --out OUT.json

Another build -- e.g. the code before a change: a worktree of it built in place (``python3 setup.py build_ext
--inplace``), this script copied into its ``benchmark/drafters/`` -- runs the same command from the worktree (the
script imports the ``python/`` beside it). A measurement of this machine's CPU.
"""
import argparse
import hashlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)


def _plain(x):
    if isinstance(x, (list, tuple)):
        return [_plain(y) for y in x]
    return x if isinstance(x, (str, float)) else int(x)


def record(per_session, agents: int, nodes: int) -> list:
    """``prepare_replay.replay`` (the served form, admissions waited for) with every call into the C++ drafter
    recorded: ``[("init", (args, kwargs)) | (method, args)]``, a staged batch as ``("staged", i)``."""
    from prepare_replay import replay

    from lumotree.drafters import suffix

    calls, cls = [], suffix.NativeSuffixDrafter
    real_init = cls.__init__

    class Recorder:
        def __init__(self, d):
            self._d, self._staged = d, []  # every staged batch, kept: an id() is an object's only while it lives

        def __getattr__(self, name):
            fn = getattr(self._d, name)
            if not callable(fn):
                return fn

            def call(*args):
                got = fn(*args)
                calls.append((name, [("staged", self._index(a)) if type(a).__name__ == "StagedStarts"
                                     else _plain(a) for a in args]))
                if name == "stage_batch":
                    self._staged.append(got)
                return got
            return call

        def _index(self, staged) -> int:
            return next(i for i, s in enumerate(self._staged) if s is staged)

    def init(self, *args, **kw):
        real_init(self, *args, **kw)
        calls.append(("init", (args, kw)))
        self._d = Recorder(self._d)

    cls.__init__ = init
    try:
        replay(per_session, agents, nodes, ("parts",))
    finally:
        cls.__init__ = real_init
    return calls


def run(calls, threads: int):
    """The recorded calls made again on fresh drafters: (per-call timings, digest of the steps' drafts)."""
    from lumotree.drafters.suffix import NativeSuffixDrafter

    d, staged, digest = None, {}, hashlib.sha1()
    steps, totals = [], {}
    for name, args in calls:
        if name == "init":
            a, kw = args
            d, staged = NativeSuffixDrafter(*a, **dict(kw, threads=threads))._d, {}
            continue
        args = [staged[a[1]] if isinstance(a, tuple) else a for a in args]
        name = "index_staged" if name == "index_async" else name  # inline: no background thread to time around
        fn = getattr(d, name)
        t0 = time.perf_counter()
        got = fn(*args)
        dt = time.perf_counter() - t0
        totals[name] = totals.get(name, 0.0) + dt
        if name == "stage_batch":
            staged[len(staged)] = got
        elif name == "step_layout":
            steps.append((len(args[0]), dt))
            digest.update(got[0].tobytes())
            digest.update(got[1].tobytes())
    return steps, totals, digest.hexdigest()[:16]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from acceptance_replay import served_turns, stream_args, write_result

    from lumotree.sglang.adaptive import bucket

    stream_args(ap, reference="none/32")
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    calls = record(served_turns(args), args.agents, args.nodes)
    reps, digests = [], set()
    for _ in range(args.repeats):
        steps, totals, digest = run(calls, args.threads)
        reps.append((steps, totals))
        digests.add(digest)
    if len(digests) != 1:
        raise RuntimeError(f"the replays drafted differently: {sorted(digests)}")
    digest = digests.pop()
    rows = []
    for b in sorted({bucket(n) for n, _ in reps[0][0]}):
        per = [sorted(dt * 1e3 for n, dt in steps if bucket(n) == b) for steps, _ in reps]
        rows.append(dict(batch_bucket=b, steps=len(per[0]),
                         step_ms=round(statistics.median(statistics.median(p) for p in per), 4),
                         step_p95_ms=round(statistics.median(p[min(len(p) - 1, int(0.95 * len(p)))] for p in per), 4),
                         step_total_ms=round(statistics.median(sum(p) for p in per), 1)))
        print(rows[-1], flush=True)
    median_total = lambda k: round(statistics.median(t.get(k, 0.0) for _, t in reps) * 1e3, 1)  # noqa: E731
    admissions = dict(calls=sum(1 for n, _ in calls if n == "stage_batch"),
                      requests=sum(len(a[0]) for n, a in calls if n == "stage_batch"),
                      stage_ms=median_total("stage_batch"), index_ms=median_total("index_staged"))
    print("admissions", admissions, "finish_ms", median_total("finish"), "digest", digest, flush=True)
    return write_result(__file__, argv, args.out, reference=args.reference, nodes=args.nodes, threads=args.threads,
                        repeats=args.repeats, calls=len(calls), digest=digest,
                        admissions=admissions, finish_ms=median_total("finish"),
                        seconds=round(time.perf_counter() - t0, 1), rows=rows)


if __name__ == "__main__":
    main()
