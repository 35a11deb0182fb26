"""Start and stop an SGLang server for benchmarks (used on the GPU machine).

    with sglang_server(model_dir, ["--speculative-algorithm", "NEXTN", ...], log="server.log") as url:
        generate(url, texts, max_new_tokens=256)
"""
from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

BASE_ARGS = ["--attention-backend", "triton", "--disable-piecewise-cuda-graph", "--cuda-graph-max-bs", "16",
             "--mem-fraction-static", "0.3", "--log-level", "warning"]


REQUEST_TIMEOUT_S = 600  # a request's limit where the caller gives none (a script may lower it: a hung server)


def post(url, payload, timeout=None):
    timeout = timeout or REQUEST_TIMEOUT_S
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    if not body.strip():
        return {}  # e.g. /abort_request answers 200 with no body
    try:
        return json.loads(body)
    except json.JSONDecodeError:  # e.g. /start_profile answers 200 with plain text
        return {"text": body.decode(errors="replace")}


def stop_profile(url, post_fn=None):
    """End a torch-profiler window whose requests finished in fewer forward steps than it was started for
    (a server that accepts many tokens per step takes few): SGLang writes the trace only when the profiler
    stops. SGLang answers an error when the profiler already stopped after its steps; then nothing is done
    (returns False). ``post_fn``: the caller's :func:`post` (default this module's)."""
    try:
        (post_fn or post)(url + "/stop_profile", {})
        return True
    except urllib.error.HTTPError:
        return False


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def port_is_free(port, host="127.0.0.1"):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Terminated(SystemExit):
    """SIGTERM (e.g. from ``timeout``) while a server runs: unwinds, so that the server is stopped."""


@contextlib.contextmanager
def _stop_on_sigterm():
    """SIGTERM raises :class:`Terminated` in the main thread while the block runs (Python's default is to
    die without unwinding, which leaves the server -- a process group of its own -- holding the GPU and
    the port for every later run)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# what a server compiles just in time lands there: Triton and inductor; flashinfer's modules (without its
# prebuilt-kernel packages, as on the GPU machine, nvcc builds them at first use: the first server on a machine
# paid that in its start-up, the servers after it did not), tvm-ffi's and torch's extension builds, the driver's
# PTX cache
JIT_CACHES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "TVM_FFI_CACHE_DIR",
              "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH")


@contextlib.contextmanager
def jit_cache_env(mode, env=None, base=None):
    """``env`` for a server under ``--jit-cache mode``: ``"shared"``, as given (the machine's caches);
    ``"fresh"``, with every just-in-time compile cache (:data:`JIT_CACHES`) pointed at a new empty directory,
    removed afterwards. Why fresh: servers run one after the other on one machine share Triton's cache, so
    each later server starts with the kernels the earlier ones compiled (SGLang's own, at the same shapes) --
    its ready time is not its first start's. With a fresh cache each server's start-up is a first start."""
    import shutil
    import tempfile

    if mode == "shared":
        yield dict(env or {})
        return
    if mode != "fresh":
        raise ValueError(f"--jit-cache must be fresh or shared, got {mode!r}")
    root = tempfile.mkdtemp(prefix="jit-cache-", dir=base)
    try:
        yield dict(env or {}, **{k: os.path.join(root, k.lower()) for k in JIT_CACHES})
    finally:
        shutil.rmtree(root, ignore_errors=True)


# how often the client asks whether a starting server answers: a start's ready_s is late by up to this much (a poll
# every second made ready times multiples of one second plus the first poll's, 48.1 / 58.1 s: a 1.2x start-up
# target read at one-second resolution)
READY_POLL_S = 0.1


@contextlib.contextmanager
def sglang_server(model, extra_args=(), port=30000, log=None, timeout=300, base_args=BASE_ARGS, env=None):
    # A server left on the port (e.g. by a killed run) would answer the health check of this one,
    # which then fails to bind and exits: every measurement would come from the wrong server.
    if not port_is_free(port):
        raise RuntimeError(f"port {port} is already in use: another server is running there")
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port),
           "--host", "127.0.0.1", *base_args, *extra_args]
    out = open(log, "w") if log else subprocess.DEVNULL
    t0 = time.time()
    with _stop_on_sigterm():  # a SIGTERM to this process unwinds to the finally below
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, **env) if env else None)
        url = f"http://127.0.0.1:{port}"
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)} (see {log})")
                if time.time() - t0 > timeout:
                    raise TimeoutError(f"server not ready after {timeout} s (see {log})")
                try:
                    get(url + "/get_model_info")
                    if proc.poll() is None:  # it is this process that answers
                        break
                except (urllib.error.URLError, ConnectionError, OSError):
                    time.sleep(READY_POLL_S)
            print(json.dumps(dict(server_ready_s=round(time.time() - t0, 1), cmd=" ".join(cmd))), flush=True)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            gone = wait_group_gone(proc.pid)
            if gone > 1.0:  # (said where it took a while: the next server's start waited for it)
                print(json.dumps(dict(server_group_exit_s=round(gone, 1))), flush=True)
            if log:
                out.close()


GROUP_WAIT_S = 30.0  # how long a stopped server's other processes get to exit before they are killed


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running: not exited and not a zombie (an exited process a
    container's init has not reaped still answers a signal 0). From ``/proc`` where there is one, else a signal 0."""
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def wait_group_gone(pgid: int, timeout: float = GROUP_WAIT_S, poll: float = 0.2) -> float:
    """Wait until no process of the server's process group ``pgid`` is left (its scheduler and detokenizer outlive
    the launcher's exit while they free the GPU); after ``timeout`` kill them. Returns the seconds waited. Why: the
    next server's start and ``host_speed`` probe ran beside them -- the probe before a LUMOTREE server that followed
    no speculation's read 18.9-21.8 ms against 11.9-12.7 ms before the first server (Qwen3-Next MoE shape, H100)."""
    t0, killed = time.time(), False
    while group_alive(pgid):
        waited = time.time() - t0
        if not killed and waited > timeout:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            killed = True
        elif killed and waited > timeout + 10:
            break
        time.sleep(poll)
    return time.time() - t0


def without_configs(command: str) -> str:
    """``command`` without its ``--configs`` list (``--configs X`` or ``--configs=X``) and ``--resume-across-machines``
    (what a resumed run keeps, not what it runs)."""
    words, out, skip = command.split(), [], False
    for w in words:
        if skip:
            skip = False
        elif w == "--configs":
            skip = True
        elif not w.startswith("--configs=") and w != "--resume-across-machines":
            out.append(w)
    return " ".join(out)


def earlier_run(out, command):
    """``--resume``: the result file ``out`` of an earlier run of the same ``command``, or ``None`` when there is
    none. The command may differ in its ``--configs`` list (and ``--resume-across-machines``) alone (a table grown
    by configurations: the callers keep the finished ones it still names); a file another command made is refused
    (``SystemExit``)."""
    if not os.path.exists(out):
        return None
    old = json.load(open(out))
    if without_configs(old.get("command") or "") != without_configs(command):
        raise SystemExit(f"--resume: {out} was made by another command ({old.get('command')!r}); "
                         "resume with the same command (its --configs may differ) or write to another --out")
    return old


def log_health(log):
    """What a server log says went wrong, for the result file: SGLang's "invalid eagle tree" warnings (a
    draft-tree node selected without its parent: its tree builder can then hang) and Python tracebacks
    (with the last line of the first), and which kernel a LUMOTREE server verifies its full attention with."""
    try:
        text = open(log, errors="replace").read()
    except (OSError, TypeError):
        return dict(invalid_eagle_trees=None, tracebacks=None, first_traceback=None, verify_attention=None)
    tb = text.split("Traceback (most recent call last):")
    first = None
    if len(tb) > 1:
        lines = [ln for ln in tb[1].splitlines() if ln.strip() and not ln.startswith((" ", "\t"))]
        first = lines[0][:300] if lines else None
    va = [ln.split("LumoTree: ", 1)[1].strip() for ln in text.splitlines() if "LumoTree: verify attention by" in ln]
    return dict(invalid_eagle_trees=text.count("invalid eagle tree"), tracebacks=len(tb) - 1, first_traceback=first,
                verify_attention=va[0] if va else None)


def machine() -> str:
    """Which machine a benchmark's servers run on: the GPUs' UUIDs (``nvidia-smi``), else the kernel's boot id. Recorded
    per server by ``agents_bench.py`` and ``bench_spec.py``, so that a ``--resume`` that continued on another machine
    shows in the result (their tables draw no comparison across machines)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        uuids = [u.strip() for u in out.stdout.splitlines() if u.strip()]
        if out.returncode == 0 and uuids:
            return ",".join(uuids)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return "boot " + f.read().strip()
    except OSError:
        return "unknown"


def host_speed(repeats: int = 5) -> dict:
    """How fast this machine's host runs the work a host-bound server does, in ms (median of ``repeats``): ``python``,
    a fixed pure-Python loop; ``torch``, 2,000 small CPU tensor ops (the dispatch overhead a scheduler pays per launch).
    Recorded per server beside :func:`machine`, taken before the server starts: machines of one pool served the same
    tiny-model benchmark up to 1.8x apart, and the probe says how far two runs' machines differ before their figures are
    set side by side. Not with a server up: on one H200 host (16 cores) the probe's loop took 11 to 21 ms from one probe
    to the next with a server up, and the server's scheduler thread, the only one of its threads using the CPU, was
    sampled (/proc) at 16 to 100 % of a core while the server had no request."""
    import torch

    def python():
        return sum(i * i % 7 for i in range(200_000))

    a, b = torch.ones(8), torch.ones(8)

    def ops():
        for _ in range(1000):
            torch.add(a, b, out=a)
            torch.mul(a, 0.5, out=a)

    out = {}
    for key, fn in (("python", python), ("torch", ops)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        out[f"{key}_ms"] = round(statistics.median(times), 2)
    return out


def machines_note(servers, consequence: str) -> list:
    """Where a result's servers (``{name: entry}``, entries with :func:`machine`'s ``machine``) ran on more than one
    machine: a line naming which ran where, then ``consequence``, and an empty line; else ``[]``."""
    where = {n: s["machine"] for n, s in (servers or {}).items() if s.get("machine")}
    machines = sorted(set(where.values()), key=list(where.values()).index)
    if len(machines) < 2:
        return []
    return [f"(the servers ran on {len(machines)} machines -- " + "; ".join(
        f"{i + 1}: " + ", ".join(n for n, m in where.items() if m == one) for i, one in enumerate(machines))
        + f" -- {consequence})", ""]


def kept_on(srv, name: str, here: str, across: bool = False) -> bool:
    """``--resume``: whether an earlier run's server entry ``srv`` (a finished configuration ``name``) is kept beside
    the servers this invocation starts on machine ``here`` (:func:`machine`). A server recorded on another machine
    runs again -- a table's ratios are one machine's -- unless ``across`` (``--resume-across-machines``: runs whose
    replies, not speeds, are compared); one recorded before machines were is kept."""
    there = srv.get("machine")
    if across or there is None or there == here:
        return True
    print(f"--resume: {name} ran on another machine ({there}, this is {here}): it runs again here "
          "(--resume-across-machines keeps it)", file=sys.stderr, flush=True)
    return False


DRAFT_TIMING_LINE = re.compile(r"LumoTree draft timing: batch bucket (\d+): median ([\d.]+) ms, p95 ([\d.]+) ms "
                               r"over (\d+) steps(?:, total ([\d.]+) ms)?")
DRAFT_WAIT_TIMING_LINE = re.compile(r"LumoTree draft-wait timing: batch bucket (\d+): median ([\d.]+) ms, p95 ([\d.]+) "
                                    r"ms over (\d+) steps, total ([\d.]+) ms")
DRAFT_NATIVE_TIMING_LINE = re.compile(r"LumoTree draft-native timing: batch bucket (\d+): median ([\d.]+) ms, p95 "
                                      r"([\d.]+) ms over (\d+) steps, total ([\d.]+) ms")
DRAFT_HELD_TIMING_LINE = re.compile(r"LumoTree draft-held timing: batch bucket (\d+): median ([\d.]+) ms, p95 "
                                    r"([\d.]+) ms over (\d+) steps, total ([\d.]+) ms")
ADMISSION_LEFT_TIMING_LINE = re.compile(r"LumoTree admission-left timing: batch bucket (\d+): median ([\d.]+) ms, p95 "
                                        r"([\d.]+) ms over (\d+) admissions, total ([\d.]+) ms")
ADMISSION_TIMING_LINE = re.compile(r"LumoTree admission timing: batch bucket (\d+): median ([\d.]+) ms, p95 ([\d.]+) "
                                   r"ms over (\d+) batches, total ([\d.]+) ms")

STEP_TIMING_LINE = re.compile(r"LumoTree step-(\w+) timing: batch bucket (\d+): median ([\d.]+) ms, p95 ([\d.]+) ms "
                              r"over (\d+) steps, total ([\d.]+) ms")


def step_timing(log):
    """Where a server run with ``LUMOTREE_BENCH_STEP_TIMING=1`` spent its decode steps on the scheduler's thread
    (:mod:`lumotree.sglang.step_timing`): per part (``step``, ``launch``, ``worker``, ... : that module's ``PARTS``)
    what :func:`draft_timing` reads per batch bucket. ``{}`` when the log has none."""
    try:
        text = open(log, errors="replace").read()
    except (OSError, TypeError):
        return {}
    parts = collections.defaultdict(lambda: collections.defaultdict(list))
    for m in STEP_TIMING_LINE.finditer(text):
        parts[m.group(1)][int(m.group(2))].append((float(m.group(3)), float(m.group(4)), int(m.group(5)),
                                                    float(m.group(6))))
    return {part: _per_bucket(buckets) for part, buckets in sorted(parts.items())}


STEP_TOTALS_LINE = re.compile(r"LumoTree step totals at ([\d.]+): (.*)")
STEP_TOTALS_PART = re.compile(r"(\w+) ([\d.]+) ms (\d+)")
STEP_TOTALS_TOKENS = re.compile(r"(\w+) (\d+) tokens (\d+)")


def step_totals(log, windows):
    """Where the scheduler's time went inside each named ``(start, end)`` unix-time window, from the cumulative
    totals a server run with ``LUMOTREE_BENCH_STEP_TIMING=1`` logged (:mod:`lumotree.sglang.step_timing`): per
    window and kind (``decode``, ``prefill``, ``other``, ``idle``) the seconds and intervals between the last totals
    logged at or before its start (none: zero) and the last at or before its end. The totals are logged at most once
    a second, so a window's edges are that coarse. ``<kind>_tokens``: the prompt tokens the batches that opened those
    intervals computed, ``dict(tokens, intervals)``. ``cpu_thread`` / ``cpu_process``: the scheduler thread's and its
    process's CPU seconds in the window, their ``intervals`` the thread's involuntary / voluntary context switches.
    ``{}`` when the log has none."""
    try:
        text = open(log, errors="replace").read()
    except (OSError, TypeError):
        return {}
    points = [(float(m.group(1)), {**{k: (float(ms), int(n)) for k, ms, n in STEP_TOTALS_PART.findall(m.group(2))},
                                   **{k: (int(t), int(n)) for k, t, n in STEP_TOTALS_TOKENS.findall(m.group(2))}})
              for m in STEP_TOTALS_LINE.finditer(text)]
    if not points:
        return {}

    def at(t):
        got = [p for when, p in points if when <= t]
        return got[-1] if got else {}

    out = {}
    for name, (t0, t1) in windows.items():
        a, b = at(t0), at(t1)
        out[name] = {}
        for k, (v, n) in b.items():
            v0, n0 = a.get(k, (0, 0))
            out[name][k] = (dict(tokens=v - v0) if k.endswith("_tokens") else dict(seconds=round((v - v0) / 1e3, 3)))
            out[name][k]["intervals"] = n - n0
    return out


def draft_timing(log, pattern=DRAFT_TIMING_LINE):
    """The draft preparation's host time per step that a server run with ``LUMOTREE_BENCH_DRAFT_TIMING=1``
    logged (:mod:`lumotree.sglang.draft_timing`), per batch bucket: the median of its lines' medians, the
    largest p95, the steps they cover and (lines that give it) their total ms. ``{}`` when the log has none.
    ``pattern=ADMISSION_TIMING_LINE``: the same for LUMOTREE_SUFFIX's prefill admissions (``steps`` counts
    prefill batches); ``pattern=DRAFT_WAIT_TIMING_LINE``: the wait for the last step's GPU work that the timed
    preparations began with (not in the draft lines of servers that logged it); ``pattern=DRAFT_NATIVE_TIMING_LINE``:
    LUMOTREE_SUFFIX's call into its C++ drafter inside them; ``pattern=ADMISSION_LEFT_TIMING_LINE``: per admission batch
    a step found still indexing, how much longer its indexing ran (``steps`` counts admission batches)."""
    try:
        text = open(log, errors="replace").read()
    except (OSError, TypeError):
        return {}
    lines = collections.defaultdict(list)
    for m in pattern.finditer(text):
        total = float(m.group(5)) if m.group(5) is not None else None
        lines[int(m.group(1))].append((float(m.group(2)), float(m.group(3)), int(m.group(4)), total))
    return _per_bucket(lines)


def _per_bucket(lines):
    """``{bucket: [(median, p95, steps, total or None), ...]}`` (a timer's logged lines) as per bucket the median of
    the lines' medians, the largest p95, the steps they cover and (lines that all give it) their total ms."""
    out = {}
    for b, got in sorted(lines.items()):
        out[str(b)] = dict(median_ms=statistics.median(x[0] for x in got), p95_ms=max(x[1] for x in got),
                           steps=sum(x[2] for x in got))
        if all(x[3] is not None for x in got):
            out[str(b)]["total_ms"] = round(sum(x[3] for x in got), 1)
    return out


JIT_LINE = re.compile(r"LumoTree JIT: ([\d.]+) ([\d.]+|nan) ms (\S+)")


def jit_compiles(log, windows):
    """The Triton compiles a server run with ``LUMOTREE_BENCH_JIT_LOG=1`` logged (:mod:`lumotree.sglang.jit_log`)
    inside each named ``(start, end)`` unix-time window: per window the count, the total ms and the kernels by
    total ms (the 8 largest). ``{}`` when the log has none."""
    try:
        text = open(log, errors="replace").read()
    except (OSError, TypeError):
        return {}
    events = [(float(m.group(1)), float(m.group(2)), m.group(3)) for m in JIT_LINE.finditer(text)]
    out = {}
    for name, (t0, t1) in windows.items():
        inside = [(ms, k) for t, ms, k in events if t0 <= t <= t1 and not math.isnan(ms)]  # nan: start unseen
        per = collections.Counter()
        for ms, k in inside:
            per[k] += ms
        out[name] = dict(count=len(inside), total_ms=round(sum(ms for ms, _ in inside), 1),
                         kernels={k: round(v, 1) for k, v in per.most_common(8)})
    return out


# SGLang's decode log line (every 40 decode steps): running requests, accept length (speculative servers), tokens/s
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+),.*?(?:accept len: ([\d.]+),.*?)?"
                         r"gen throughput \(token/s\): ([\d.]+)")
STALL_LINE = re.compile(r"LumoTree stall dump: (\w+) running ([\d.]+) s")
STACK_FRAME = re.compile(r'  File "([^"]+)", line (\d+) in (\S+)')
SCHEDULER_ENTRY = "run_scheduler_process"  # the scheduler thread's outermost SGLang frame


def stall_dumps(log, frames: int = 12):
    """The stalls a server run with ``LUMOTREE_BENCH_STALL_DUMP_S`` dumped (:mod:`lumotree.sglang.stall_dump`), one
    per stalled call: ``{"call", "seconds"`` (the last dump's), ``"dumps"``, ``"where"``: the scheduler thread's
    innermost ``frames`` frames outside the standard library and the dump itself, as ``"path:line fn"`` with the
    path from its package on, innermost first}``. A call's dumps follow each other with growing seconds; a new call
    starts when the seconds fall. ``[]`` when the log has none."""
    try:
        text = open(log, errors="replace").read()
    except (OSError, TypeError):
        return []
    out = []
    marks = list(STALL_LINE.finditer(text))
    for i, m in enumerate(marks):
        body = text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        where = []
        for block in body.split("\n\n"):  # one thread's stack per block, innermost frame first
            if SCHEDULER_ENTRY in block:
                for f in STACK_FRAME.finditer(block):
                    path = f.group(1)
                    if "/python3." in path and "site-packages" not in path or "stall_dump.py" in path:
                        continue
                    short = path.split("site-packages/")[-1].split("/site/")[-1]
                    where.append(f"{short}:{f.group(2)} {f.group(3)}")
                break
        seconds = float(m.group(2))
        if out and out[-1]["call"] == m.group(1) and seconds > out[-1]["seconds"]:
            out[-1].update(seconds=seconds, dumps=out[-1]["dumps"] + 1, where=where[:frames] or out[-1]["where"])
        else:
            out.append(dict(call=m.group(1), seconds=seconds, dumps=1, where=where[:frames]))
    return out


def generate(url, prompts, max_new_tokens, temperature=0.0, key="text", extra=None):
    """One /generate call with a batch of prompts (texts or token-id lists); returns SGLang's list.
    ``extra``: more top-level request fields (e.g. ``return_logprob``)."""
    res = post(url + "/generate", {key: prompts, **(extra or {}), "sampling_params": dict(
        temperature=temperature, max_new_tokens=max_new_tokens, ignore_eos=True)})
    return res if isinstance(res, list) else [res]


def accept_stats(outputs):
    toks = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    steps = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)
    return dict(completion_tokens=toks, verify_steps=steps,
                accept_length=(toks / steps) if steps else None)
