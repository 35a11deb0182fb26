"""Is a serving step slow because the vCPU under it is? Times the GPU machine's vCPU that the live SGLang scheduler's
main thread runs on, beside the server's own decode windows.

``record``: every 0.1 s, read which vCPU the scheduler's main thread last ran on (``/proc/<pid>/stat``), pin this
probe there and time a fixed 10k-iteration Python loop (~0.65 ms on a fast spell: ~0.7 % of that vCPU's time;
``--loop`` sets the count). It follows each server in turn (a new ``sglang::scheduler`` process when the last one
exits). One line a sample:
``<unix time> <vcpu> <ms> <scheduler pid>``.

``report``: each second's decode windows of a server log (``Decode batch ... gen throughput``, one line per 40 steps)
beside the probe's median in that second, and per batch size the correlation of the two over the seconds.

On the GPU machine, beside a benchmark (its command in the result file)::

    python3 benchmark/serving/vcpu_follow.py record > follow.log &
    python3 benchmark/serving/bench_spec.py ... --log-dir logs ...
    python3 benchmark/serving/vcpu_follow.py report follow.log logs/bench-none.log logs/bench-lumotree-chain.log
"""
import argparse
import collections
import datetime
import glob
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_server  # noqa: E402

SCHEDULER_TITLE = b"sglang::scheduler"  # SGLang's process title for a scheduler (TP rank 0 first)
LOOP = 10000
SPELL = 1.5  # a pass ran in a slow spell where the probe's median over it exceeds the run's median this many times
DECODE_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] " + sglang_server.DECODE_LINE.pattern)  # + its time


def scheduler_pid(proc="/proc"):
    """The lowest pid whose command line starts with SGLang's scheduler title, or None."""
    pids = []
    for path in glob.glob(os.path.join(proc, "[0-9]*", "cmdline")):
        try:
            with open(path, "rb") as f:
                if f.read(len(SCHEDULER_TITLE)) == SCHEDULER_TITLE:
                    pids.append(int(path.split(os.sep)[-2]))
        except OSError:
            continue
    return min(pids) if pids else None


def last_cpu(stat_text):
    """The ``processor`` field of a ``/proc/<pid>/stat`` line (the 39th; the command name may hold spaces)."""
    return int(stat_text.rsplit(")", 1)[1].split()[36])


def record(out=sys.stdout, period=0.1, loop=LOOP, parent=None):
    """Follow and time until killed, or until the process ``parent`` is no longer this one's parent (``start``: the
    benchmark that started it ended, even by a signal that skipped its clean-up)."""
    pid = None
    while parent is None or os.getppid() == parent:
        if pid is None or not os.path.exists(f"/proc/{pid}"):
            pid = scheduler_pid()
            if pid is None:
                time.sleep(0.5)
                continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                cpu = last_cpu(f.read())
        except (OSError, IndexError, ValueError):
            pid = None
            continue
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:  # a vCPU outside this process's allowed set: no reading this time
            time.sleep(period)
            continue
        t = time.perf_counter()
        s = 0
        for i in range(loop):
            s += i
        print("%.3f %d %.4f %d" % (time.time(), cpu, 1e3 * (time.perf_counter() - t), pid), file=out, flush=True)
        time.sleep(period)


def read_probe(lines):
    """{unix second: [(ms, vcpu), ...]} from ``record``'s lines."""
    probe = collections.defaultdict(list)
    for line in lines:
        p = line.split()
        if len(p) == 4:
            probe[int(float(p[0]))].append((float(p[2]), int(p[1])))
    return probe


def window_ms(path, t0, t1):
    """The probe's readings (ms) taken between unix times ``t0`` and ``t1`` from ``record``'s file ``path``."""
    try:
        with open(path) as f:
            return [float(p[2]) for p in (line.split() for line in f) if len(p) == 4 and t0 <= float(p[0]) <= t1]
    except OSError:
        return []


def start(path, loop=LOOP):
    """``record`` in a child process writing to ``path``; stop it with ``.terminate()``."""
    import subprocess

    with open(path, "w") as f:
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "record", "--loop", str(loop),
                                 "--parent", str(os.getpid())], stdout=f, stderr=subprocess.DEVNULL)


def read_decode(lines, floor=50.0):
    """{(unix second, running requests): [tokens/s, ...]} from a server log's decode lines (UTC timestamps; windows
    under ``floor`` tokens/s are the idle gaps between passes, left out)."""
    win = collections.defaultdict(list)
    for line in lines:
        m = DECODE_LINE.match(line)
        if m and float(m.group(4)) > floor:
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
            win[(int(t.timestamp()), int(m.group(2)))].append(float(m.group(4)))
    return win


def report(probe, decode):
    """Per second: the decode windows' median beside the probe's median; per batch the correlation over seconds."""
    seconds, by_batch = [], collections.defaultdict(lambda: ([], []))
    for (t, batch), tps in sorted(decode.items()):
        samples = probe.get(t) or []
        row = dict(t=t, batch=batch, decode_tokens_per_s=round(statistics.median(tps), 1),
                   probe_ms=round(statistics.median(ms for ms, _ in samples), 4) if samples else None,
                   vcpus=sorted({c for _, c in samples}))
        seconds.append(row)
        if samples:
            by_batch[batch][0].append(row["decode_tokens_per_s"])
            by_batch[batch][1].append(row["probe_ms"])
    corr = {}
    for batch, (x, y) in sorted(by_batch.items()):
        if len(x) > 2 and len(set(x)) > 1 and len(set(y)) > 1:
            corr[batch] = dict(seconds=len(x), correlation=round(statistics.correlation(x, y), 2))
    return dict(seconds=seconds, correlation=corr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="follow the live scheduler's vCPU (runs until killed)")
    rec.add_argument("--loop", type=int, default=LOOP, help="iterations of the timed loop")
    rec.add_argument("--parent", type=int, default=None, help="stop when this pid is no longer the parent")
    rp = sub.add_parser("report", help="decode windows beside the probe, per second")
    rp.add_argument("follow_log")
    rp.add_argument("server_logs", nargs="+")
    rp.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        return record(loop=args.loop, parent=args.parent)
    with open(args.follow_log) as f:
        probe = read_probe(f)
    out = {}
    for log in args.server_logs:
        with open(log, errors="replace") as f:
            out[os.path.basename(log)] = report(probe, read_decode(f))
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for log, res in out.items():
        print("==", log)
        for r in res["seconds"]:
            pm = "%.4f" % r["probe_ms"] if r["probe_ms"] is not None else "–"
            print(f"{r['t']} batch {r['batch']:<3} decode {r['decode_tokens_per_s']:8.1f} tokens/s  probe {pm} ms  "
                  f"vCPUs {r['vcpus']}")
        for batch, c in res["correlation"].items():
            print(f"batch {batch}: {c['seconds']} s, correlation(decode tokens/s, probe ms) = {c['correlation']}")


if __name__ == "__main__":
    main()
