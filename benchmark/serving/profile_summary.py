"""Summarise torch-profiler traces of a serving step (written by ``bench_spec.py --profile-dir``):
where a speculative decode step's time goes, GPU side and host side.

    python3 benchmark/serving/profile_summary.py DIR_OR_TRACE [...] [--steps N] [--out summary.json]

Per trace: the window from the first to the last GPU activity, the time the GPU was busy (union
of kernel / memcpy / memset intervals) and so the idle share -- a step the GPU waits for is
host-bound -- the CUDA-graph launches, the heaviest kernels, the CUDA runtime calls, and the
inclusive host time of Python functions (``with_stack``) whose names match ``--focus`` (``--python-top``: of any
name; ``--compare``: two traces' functions per forward step side by side; ``--gaps``: the GPU's idle gaps, by the
operations around them and by whether the host launched late; ``--between-graphs``: the eager operations between two
CUDA-graph replays and what launched each; ``--host-waits US``: the host's CUDA calls of US or longer, where it waited
for the device).
"""
from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import statistics
import sys

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
FOCUS = ("lumotree", "verify_tree_greedy", "update_mamba_state_after_mtp_verify", "commit_after_verify",
         "eagle_sample", "forward_batch_generation", "draft", "verify", "sample", "process_batch_result",
         "prepare_for", "get_next_batch", "run_batch", "forward_decode", "forward_extend", "init_forward_metadata",
         "replay", "synchronize", "tolist", "item")


# what a step's GPU time is spent on: kernel name patterns, first match wins (the rest is "other")
PARTS = (
    ("GDN verify (LumoTree mix)", ("gdn_tree_mix",)),
    ("GDN commit (LumoTree replay)", ("gdn_tree_commit",)),
    ("GDN recurrence (SGLang)", ("fused_recurrent_gated_delta_rule", "fused_sigmoid_gating_delta_rule", "chunk_gated_delta")),
    ("conv", ("causal_conv1d",)),
    ("state / conv scatter", ("mamba_state_scatter", "conv_window_scatter")),
    ("norm", ("RMSNorm", "norm::", "rmsnorm")),
    ("attention", ("_fwd_kernel", "_fwd_grouped_kernel", "flash", "fmha", "attention")),
    ("selection", ("tree_select", "verify_tree")),
    ("dense GEMM", ("nvjet", "gemm", "cutlass", "cublas", "splitKreduce", "sm90_xmma")),
    ("torch elementwise / index", ("at::native",)),
)


def part_of(name: str) -> str:
    for part, pats in PARTS:
        if any(p in name for p in pats):
            return part
    return "other"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def busy_union(intervals):
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize(events, focus=FOCUS, top=12, steps=None, python_top=0, all_kernels=False):
    """The trace's window, GPU busy time and idle share, launches, heaviest kernels, runtime calls and
    focus functions; ``gpu_by_part``: kernel time per :data:`PARTS` entry (ms, per step when ``steps`` --
    the forward steps in the window, e.g. ``--profile-steps`` of a decode-only profile -- is given)."""
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    gpu = [e for e in xs if e.get("cat") in GPU_CATS]
    if not gpu:
        return dict(error="no GPU activity in the trace")
    t0, t1 = min(e["ts"] for e in gpu), max(e["ts"] + e["dur"] for e in gpu)
    busy = busy_union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    kern = collections.defaultdict(lambda: [0, 0.0])
    for e in gpu:
        k = kern[e["name"][:90]]
        k[0] += 1
        k[1] += e["dur"]
    rt = collections.defaultdict(lambda: [0, 0.0])
    py = collections.defaultdict(lambda: [0, 0.0])
    every = collections.defaultdict(lambda: [0, 0.0])  # every Python function (python_top)
    for e in xs:
        if e.get("cat") == "cuda_runtime" and t0 <= e["ts"] <= t1:
            r = rt[e["name"]]
            r[0] += 1
            r[1] += e["dur"]
        elif e.get("cat") == "python_function" and t0 <= e["ts"] <= t1:
            if python_top:
                a = every[e["name"][:120]]
                a[0] += 1
                a[1] += e["dur"]
            if any(f in e["name"] for f in focus):
                p = py[e["name"][:120]]
                p[0] += 1
                p[1] += e["dur"]

    parts = collections.defaultdict(float)
    for e in gpu:
        parts[part_of(e["name"])] += e["dur"]
    div = 1e3 * (steps or 1)
    by_part = {k: round(v / div, 3) for k, v in sorted(parts.items(), key=lambda x: -x[1])}

    def rows(d, n):
        return [dict(name=k, count=c, total_us=round(t, 1)) for k, (c, t) in sorted(d.items(), key=lambda x: -x[1][1])[:n]]

    return dict(window_ms=round((t1 - t0) / 1e3, 3), gpu_busy_ms=round(busy / 1e3, 3),
                gpu_idle_fraction=round(1 - busy / (t1 - t0), 4) if t1 > t0 else 0.0,
                gpu_events=len(gpu), graph_launches=rt["cudaGraphLaunch"][0] if "cudaGraphLaunch" in rt else 0,
                kernel_launches=sum(c for k, (c, _) in rt.items() if "LaunchKernel" in k),
                top_kernels=rows(kern, top), runtime_calls=rows(rt, top), python_focus=rows(py, top),
                gpu_by_part=by_part, gpu_by_part_unit="ms per step" if steps else "ms", steps=steps,
                **({"python_top": rows(every, python_top)} if python_top else {}),
                **({"kernels": rows(kern, len(kern))} if all_kernels else {}))


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch")


def launches_by_caller(events, steps=None, top=40):
    """Eager launches (kernels, copies, memsets, graph replays) per Python caller: ``inclusive`` counts a
    launch for every frame on its stack, ``innermost`` for the innermost frame of SGLang or LumoTree
    (torch's own frames skipped). Per step when ``steps`` is given. What a host-bound step launches
    outside its CUDA graphs, and from where."""
    per_tid = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or "ts" not in e:
            continue
        if e.get("cat") == "python_function":
            per_tid[e.get("tid")].append((e["ts"], -e["dur"], 0, e["name"][:120], e["ts"] + e["dur"]))
        elif e.get("cat") == "cuda_runtime" and e["name"] in LAUNCHES:
            per_tid[e.get("tid")].append((e["ts"], -e["dur"], 1, e["name"], e["ts"] + e["dur"]))
    incl, inner = collections.Counter(), collections.Counter()
    for evs in per_tid.values():
        stack = []
        for ts, _, kind, name, end in sorted(evs):
            while stack and stack[-1][1] <= ts:
                stack.pop()
            if kind == 0:
                stack.append((name, end))
                continue
            for frame in {f for f, _ in stack}:
                incl[frame] += 1
            own = next((f for f, _ in reversed(stack) if ("sglang/" in f or "lumotree/" in f)), "(no project frame)")
            inner[own] += 1
    div = steps or 1
    return dict(inclusive=[(k, round(v / div, 1)) for k, v in incl.most_common(top)],
                innermost=[(k, round(v / div, 1)) for k, v in inner.most_common(top)],
                unit="launches per step" if steps else "launches")


STEP_FUNCTION = ": run_batch"  # SGLang's scheduler calls it once per forward step (prefill or decode)


def forward_steps(summary: dict) -> int:
    """The forward steps in a summary's window: its scheduler's ``run_batch`` calls (from ``python_top``)."""
    steps = next((r["count"] for r in summary.get("python_top", []) if r["name"].endswith(STEP_FUNCTION)), 0)
    if not steps:
        raise ValueError("compare: a summary without the scheduler's run_batch in its python_top (--python-top)")
    return steps


def compare(a: dict, b: dict, top: int = 40) -> dict:
    """Two summaries' ``python_top`` (``--python-top``) side by side, per forward step of each window (the scheduler's
    ``run_batch`` calls): ms per step in ``a``, in ``b`` and ``b - a``, the largest differences first -- where one
    server's step spends host time the other's does not (e.g. a speculative server pinned to no draft against no
    speculation on the same sessions)."""
    def per_step(s):
        steps = forward_steps(s)
        return {r["name"]: r["total_us"] / 1e3 / steps for r in s.get("python_top", [])}, steps

    (pa, sa), (pb, sb) = per_step(a), per_step(b)
    names = sorted(set(pa) | set(pb), key=lambda n: -abs(pb.get(n, 0.0) - pa.get(n, 0.0)))
    return dict(steps=[sa, sb], unit="ms per forward step", rows=[
        dict(name=n, a=round(pa.get(n, 0.0), 4), b=round(pb.get(n, 0.0), 4), diff=round(pb.get(n, 0.0) - pa.get(n, 0.0), 4))
        for n in names[:top]])


def compare_kernels(a: dict, b: dict, top: int = 40) -> dict:
    """Two summaries' GPU kernels (``kernels``: every name, :func:`summarize` ``all_kernels``) per forward step of each
    window (the scheduler's ``run_batch`` calls, as :func:`compare`): launches and microseconds per step in ``a``, in
    ``b`` and ``b - a``, the largest time differences first -- which kernels make one server's device-bound step
    longer than the other's."""
    def per_step(s):
        steps = forward_steps(s)
        return {r["name"]: (r["count"] / steps, r["total_us"] / steps) for r in s["kernels"]}, steps

    (ka, sa), (kb, sb) = per_step(a), per_step(b)
    zero = (0.0, 0.0)
    names = sorted(set(ka) | set(kb), key=lambda n: -abs(kb.get(n, zero)[1] - ka.get(n, zero)[1]))
    tot = lambda k: sum(v[1] for v in k.values())  # noqa: E731
    return dict(steps=[sa, sb], unit="per forward step (launches, us)",
                total_us=[round(tot(ka), 1), round(tot(kb), 1), round(tot(kb) - tot(ka), 1)],
                launches=[round(sum(v[0] for v in ka.values()), 1), round(sum(v[0] for v in kb.values()), 1)],
                rows=[dict(name=n, a_n=round(ka.get(n, zero)[0], 2), b_n=round(kb.get(n, zero)[0], 2),
                           a_us=round(ka.get(n, zero)[1], 2), b_us=round(kb.get(n, zero)[1], 2),
                           diff_us=round(kb.get(n, zero)[1] - ka.get(n, zero)[1], 2)) for n in names[:top]])


def gaps(events, top: int = 20, steps=None, min_us: float = 1.0) -> dict:
    """The GPU's idle gaps (``min_us`` or longer) between one GPU operation's end and the next one's start, whole
    and by the pair of operations around them, and whether the host was late: the launch call of the operation
    after the gap (its CUDA runtime call, matched by correlation id) began after the gap opened -- the device waited
    for the host -- or before it (the wait was the device's own: a stream or event dependency, a graph's start).
    Per step when ``steps`` is given. Read from a trace written without Python stacks (``bench_spec.py
    --profile-no-stack``), whose host runs at its own speed."""
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    gpu = sorted((e for e in xs if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    launch = {e.get("args", {}).get("correlation"): e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    pairs = collections.defaultdict(lambda: [0, 0.0, 0.0])  # count, idle us, of it host-late us
    total = late = 0.0
    n = 0
    end, prev = None, None
    for e in gpu:
        if end is not None and e["ts"] - end >= min_us:
            gap = e["ts"] - end
            call = launch.get(e.get("args", {}).get("correlation"))
            host_late = call is not None and call["ts"] > end
            key = (prev["name"][:60], e["name"][:60], call["name"] if call is not None else "?")
            row = pairs[key]
            row[0] += 1
            row[1] += gap
            row[2] += gap if host_late else 0.0
            total += gap
            late += gap if host_late else 0.0
            n += 1
        if end is None or e["ts"] + e["dur"] > end:
            end, prev = e["ts"] + e["dur"], e
    div = steps or 1
    return dict(unit="us per step" if steps else "us", gaps=round(n / div, 2), idle_us=round(total / div, 2),
                host_late_us=round(late / div, 2),
                pairs=[dict(before=k[0], after=k[1], launched_by=k[2], count=round(c / div, 2),
                            idle_us=round(t / div, 2), host_late_us=round(h / div, 2))
                       for k, (c, t, h) in sorted(pairs.items(), key=lambda x: -x[1][1])[:top]])


def between_graphs(events, top: int = 40) -> dict:
    """What the GPU runs between two CUDA-graph replays (a decode step's graph and the next one's), outside any
    graph: per interval its span (the earlier graph's last operation's end to the next graph's first operation's
    start), its eager operations and their GPU time, medians over the window's intervals; and the operations of the
    median interval in order, each with its GPU start, its gap to the operation before, its duration and what
    launched it on the host (the outermost ``cpu_op`` / ``user_annotation`` events around its launch call: the
    scheduler's section, the aten op). A graph's operations are those whose launch call is a ``cudaGraphLaunch``
    (correlation ids). Why: a device-bound decode step's eager launches run one after another between the graphs,
    ~1.2 µs apart even when the host launched them milliseconds earlier, so each one lengthens the step."""
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    gpu = sorted((e for e in xs if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    calls = {e.get("args", {}).get("correlation"): e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    graph_ids = {c for c, e in calls.items() if e["name"] == "cudaGraphLaunch"}
    spans = {}
    for e in gpu:
        c = e.get("args", {}).get("correlation")
        if c in graph_ids:
            s = spans.setdefault(c, [e["ts"], e["ts"] + e["dur"]])
            s[0], s[1] = min(s[0], e["ts"]), max(s[1], e["ts"] + e["dur"])
    graphs = sorted(spans.values())
    if len(graphs) < 2:
        return dict(error="fewer than two CUDA-graph replays in the trace")
    intervals = []
    for (_, end), (start, _) in zip(graphs, graphs[1:]):
        intervals.append((end, [e for e in gpu if end <= e["ts"] < start
                                and e.get("args", {}).get("correlation") not in graph_ids], start))
    host = [e for e in xs if e.get("cat") in ("cpu_op", "user_annotation")]

    def source(call):
        around = sorted((e for e in host
                         if e.get("tid") == call.get("tid") and e["ts"] <= call["ts"] <= e["ts"] + e["dur"]),
                        key=lambda e: -e["dur"])
        return " / ".join(e["name"][:60] for e in around[:3])

    med = lambda v: round(statistics.median(v), 2)  # noqa: E731
    end, ops, start = sorted(intervals, key=lambda iv: iv[2] - iv[0])[len(intervals) // 2]
    rows, t = [], end
    for o in ops[:top]:
        call = calls.get(o.get("args", {}).get("correlation"))
        rows.append(dict(at_us=round(o["ts"] - end, 1), gap_us=round(o["ts"] - t, 1), dur_us=round(o["dur"], 1),
                         name=o["name"][:70], launched_by=source(call) if call is not None else "?"))
        t = max(t, o["ts"] + o["dur"])
    return dict(graphs=len(graphs), graph_span_us=med([b - a for a, b in graphs]),
                span_us=med([s - e for e, _, s in intervals]), ops=med([len(o) for _, o, _ in intervals]),
                ops_gpu_us=med([sum(x["dur"] for x in o) for _, o, _ in intervals]),
                median_interval=dict(span_us=round(start - end, 1), ops=rows))


def host_waits(events, min_us: float = 100.0, top: int = 20) -> dict:
    """Where the host waited for the device: CUDA runtime / driver calls of ``min_us`` or longer (a synchronize, a
    blocking copy, an event wait -- a launch call that long is the host stalled too), in time order, each with its
    start (from the window's first GPU operation), duration, thread, the outermost ``cpu_op`` / ``user_annotation``
    events around it (what the host was doing) and the last GPU operation that ended while it ran (what it waited
    for). Totals per call name. Why: a one-token request's reply waits for whatever the scheduler's thread does
    before it processes the prefill's result -- under SGLang's overlap scheduler, the launch of the decode step
    after the prefill -- and a wait on the device inside that launch shows here as a long call. Read from a trace
    written without Python stacks (``bench_spec.py --profile-no-stack``)."""
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    gpu = sorted((e for e in xs if e.get("cat") in GPU_CATS), key=lambda e: e["ts"] + e["dur"])
    t0 = min((e["ts"] for e in gpu), default=0.0)
    host = [e for e in xs if e.get("cat") in ("cpu_op", "user_annotation")]
    long_calls = sorted((e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["dur"] >= min_us),
                        key=lambda e: e["ts"])
    ends = [e["ts"] + e["dur"] for e in gpu]
    totals = collections.defaultdict(lambda: [0, 0.0])
    rows = []
    for c in long_calls:
        lo, hi = c["ts"], c["ts"] + c["dur"]
        i = bisect.bisect_right(ends, hi) - 1  # the last GPU operation to end by the call's end: inside it, or none
        waited = gpu[i] if i >= 0 and ends[i] >= lo else None
        around = sorted((e for e in host if e.get("tid") == c.get("tid") and e["ts"] <= lo and hi <= e["ts"] + e["dur"]),
                        key=lambda e: -e["dur"])
        totals[c["name"]][0] += 1
        totals[c["name"]][1] += c["dur"]
        rows.append(dict(at_us=round(lo - t0, 1), dur_us=round(c["dur"], 1), call=c["name"], tid=c.get("tid"),
                         inside=" / ".join(e["name"][:60] for e in around[:3]),
                         waited_for=waited["name"][:70] if waited is not None else None))
    return dict(min_us=min_us, calls=len(rows), wait_us=round(sum(r["dur_us"] for r in rows), 1),
                by_call={k: dict(count=n, us=round(t, 1)) for k, (n, t) in sorted(totals.items(), key=lambda x: -x[1][1])},
                waits=sorted(sorted(rows, key=lambda r: -r["dur_us"])[:top], key=lambda r: r["at_us"]))


def traces(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                for f in sorted(files):
                    if ".json" in f:
                        yield os.path.join(root, f)
        else:
            yield p


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out", default=None)
    ap.add_argument("--top", type=int, default=12, help="rows per table")
    ap.add_argument("--steps", type=int, default=None,
                    help="forward steps in each trace's window (a decode-only profile's --profile-steps): GPU time "
                         "per part is then per step")
    ap.add_argument("--python-top", type=int, default=0,
                    help="also the N Python functions of most inclusive host time (any name; traces written with_stack)")
    ap.add_argument("--callers", action="store_true",
                    help="also count eager launches per Python caller (traces written with_stack)")
    ap.add_argument("--gaps", action="store_true",
                    help="also the GPU's idle gaps by the operations around them, and how much of each the host "
                         "was late for (traces written with bench_spec.py --profile-no-stack)")
    ap.add_argument("--between-graphs", action="store_true",
                    help="also what the GPU runs between consecutive CUDA-graph replays, outside the graphs: spans, "
                         "eager operations and, for the median interval, each operation and what launched it")
    ap.add_argument("--host-waits", type=float, default=None, metavar="US",
                    help="also the host's CUDA calls of US microseconds or longer (its waits for the device), in time "
                         "order, with what the host was doing and what the device finished meanwhile")
    ap.add_argument("--compare", action="store_true",
                    help="two traces: their Python functions' host time per forward step side by side, under "
                         "'comparison', and their GPU kernels per step, under 'kernel_comparison' (needs --python-top)")
    args = ap.parse_args(argv)
    res = {}
    for t in traces(args.paths):
        events = load(t)
        res[t] = summarize(events, top=args.top, steps=args.steps, python_top=args.python_top, all_kernels=args.compare)
        if args.callers:
            res[t]["launches_by_caller"] = launches_by_caller(events, steps=args.steps)
        if args.gaps:
            res[t]["gpu_gaps"] = gaps(events, top=args.top, steps=args.steps)
        if args.between_graphs:
            res[t]["between_graphs"] = between_graphs(events)
        if args.host_waits is not None:
            res[t]["host_waits"] = host_waits(events, min_us=args.host_waits, top=args.top)
        s = res[t]
        print(f"{t}: window {s.get('window_ms')} ms, GPU busy {s.get('gpu_busy_ms')} ms "
              f"(idle {100 * s.get('gpu_idle_fraction', 0):.0f}%), graph launches {s.get('graph_launches')}, "
              f"kernel launches {s.get('kernel_launches')}", file=sys.stderr)
    if args.compare:
        if len(res) != 2 or not args.python_top:
            raise SystemExit("--compare takes two traces and --python-top")
        a, b = res.values()
        res["comparison"] = dict(traces=list(res)[:2], **compare(a, b, top=args.python_top))
        res["kernel_comparison"] = dict(traces=list(res)[:2], **compare_kernels(a, b, top=args.python_top))
        for t in list(res)[:2]:  # every kernel was for the comparison; the summaries keep their top ones
            res[t].pop("kernels", None)
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    else:
        print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
