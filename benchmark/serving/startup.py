"""Start-up benchmark: how long each server takes from its launch to ready, cold and warm, and where the time goes
(GPU machine).

    python3 benchmark/serving/startup.py --shape qwen3.5-27b-32l --configs lumotree-chain,nextn-chain \
        --starts 2 --out startup.json

Each configuration starts ``--starts`` times in a row with one just-in-time compile cache of its own (Triton,
inductor, flashinfer, ...: :data:`sglang_server.JIT_CACHES`), empty before its first start: start 1 is a first
start on the machine (*cold*: every kernel it meets is compiled), later ones find the kernels the first compiled
(*warm*: what every restart of a deployed server sees). ``--resume`` keeps the configurations an earlier run of the same
``--out`` on the same machine finished, so the table can be spread over calls shorter than all its starts. Why a cache per configuration: with one shared cache a
server started after another reuses that one's kernels, so ready times depend on the start order. The servers run
as bench_spec runs them (same shape, dummy weights, CUDA graphs up to ``--cuda-graph-max-bs``, flags alone).

Per start: ``ready_s`` (launch to the first answer of ``/get_model_info``, the client's clock -- SGLang's own
warm-up request may still be running then), ``first_request_s`` (an 8-token request sent at that moment: it waits for
that warm-up), the server log's own phases (``in_server_s`` from its ``server_args`` line to "ready to roll", which
comes after the warm-up; each CUDA-graph capture's ``elapsed``; LumoTree's runtime states), and with ``LUMOTREE_BENCH_JIT_LOG=1`` set for every server here, the Triton compiles inside the
start-up (count, total ms, the largest kernels).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_spec import CONFIGS, SHAPES, config_env, write_config  # noqa: E402
from sglang_server import generate, jit_cache_env, jit_compiles, log_health, machine, sglang_server  # noqa: E402

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] ", re.M)
CAPTURE = re.compile(r"Capture (.+?) CUDA graph end\. elapsed=([\d.]+) s")
LUMOTREE_STATE = re.compile(r"LumoTree adaptive: runtime state for (\d+) draft steps built in ([\d.]+) s")
DECODE_STEP = re.compile(r"LumoTree: no-draft steps run as decode steps .*? built in ([\d.]+) s")
FIRST_VERIFY = re.compile(r"LumoTree: first GDN verify call .*? took ([\d.]+) s")
ENGINE = re.compile(r"Engine startup timings \(s\): (.*)")
MARKS = {  # the first line of each, by its timestamp
    "args": "server_args=",
    "init": "Init torch distributed begin",
    "weights": "Load weight begin",
    "graphs": "CUDA graph begin",
    "ready": "The server is fired up and ready to roll",
}


def _stamp_of(text: str, needle: str):
    """The log timestamp (seconds since the epoch, the log's local time) of the first line containing ``needle``."""
    i = text.find(needle)
    if i < 0:
        return None
    line_start = text.rfind("\n", 0, i) + 1
    m = STAMP.match(text, line_start)
    if m is None:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()


def log_phases(text: str) -> dict:
    """Where a server's start-up went, read from its log: seconds between its marks (1 s resolution),
    each CUDA-graph capture's own ``elapsed`` (summed per kind), LumoTree's runtime states and SGLang's engine
    timings line."""
    t = {k: _stamp_of(text, v) for k, v in MARKS.items()}
    out = {}
    if t["args"] is not None and t["ready"] is not None:
        out["in_server_s"] = t["ready"] - t["args"]
    for a, b in (("args", "init"), ("init", "weights"), ("weights", "graphs"), ("graphs", "ready")):
        if t[a] is not None and t[b] is not None:
            out[f"{a}_to_{b}_s"] = t[b] - t[a]
    captures = {}
    for kind, sec in CAPTURE.findall(text):
        captures[kind] = round(captures.get(kind, 0.0) + float(sec), 2)
    out["captures_s"] = captures
    states = {int(s): float(sec) for s, sec in LUMOTREE_STATE.findall(text)}
    if states:
        out["lumotree_states_s"] = states
    m = DECODE_STEP.search(text)
    if m:
        out["lumotree_decode_graphs_s"] = float(m.group(1))
    m = FIRST_VERIFY.search(text)
    if m:
        out["lumotree_first_verify_s"] = float(m.group(1))
    m = ENGINE.search(text)
    if m:
        out["engine_timings"] = m.group(1)[:400]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3.5-27b-32l", choices=sorted(SHAPES))
    ap.add_argument("--configs", default="lumotree-chain,nextn-chain")
    ap.add_argument("--starts", type=int, default=2, help="starts per configuration, the first cold")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=128)
    ap.add_argument("--mem-fraction-static", type=float, default=0.7)
    ap.add_argument("--server-timeout", type=int, default=300)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", action="store_true",
                    help="keep the configurations --out already holds every start of, from this machine, and start "
                         "the rest (a configuration's warm starts need its cold one's cache: it reruns whole)")
    args = ap.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    model = write_config(os.path.join(args.log_dir, "dummy-" + args.shape), args.shape)
    base = ["--attention-backend", "triton", "--disable-piecewise-cuda-graph", "--cuda-graph-max-bs",
            str(args.cuda_graph_max_bs), "--mem-fraction-static", str(args.mem_fraction_static), "--log-level", "info",
            "--load-format", "dummy", "--skip-tokenizer-init"]
    base += ["--tp-size", str(args.tp)] if args.tp > 1 else []
    res = dict(command="python3 " + " ".join(sys.argv), shape=args.shape, tp=args.tp, machine=machine(), rows=[])
    done = kept(res, args) if args.resume else set()
    for name in args.configs.split(","):
        if name in done:
            print(f"{name}: kept from {args.out}", flush=True)
            continue
        env = dict(config_env(name), LUMOTREE_BENCH_JIT_LOG="1")
        with jit_cache_env("fresh", env) as env_s:  # one cache for this configuration's starts
            for start in range(1, args.starts + 1):
                log = os.path.join(args.log_dir, f"startup-{name}-{start}.log")
                row = dict(config=name, args=CONFIGS[name], start=start, cache="cold" if start == 1 else "warm")
                t0 = time.time()
                try:
                    with sglang_server(model, CONFIGS[name], port=args.port, log=log, timeout=args.server_timeout,
                                       base_args=base, env=env_s) as url:
                        t_ready = time.time()
                        row["ready_s"] = round(t_ready - t0, 1)
                        generate(url, [[1000 + i for i in range(16)]], 8, key="input_ids")
                        row["first_request_s"] = round(time.time() - t_ready, 2)
                except Exception as e:
                    row["error"] = repr(e)[:1000]
                    t_ready = time.time()
                text = open(log, errors="replace").read()
                row.update(log_phases(text))
                row["jit"] = jit_compiles(log, {"start_up": (t0, t_ready)}).get("start_up")
                row.update(log_health(log))
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
                json.dump(res, open(args.out, "w"), indent=1)
    print(table(res["rows"]))


def kept(res: dict, args) -> set:
    """The configurations whose every start ``args.out`` holds without an error, from the same machine, shape and
    ``--tp`` (copied into ``res``); ``set()`` where there is no such file."""
    try:
        with open(args.out) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return set()
    if (old.get("machine"), old.get("shape"), old.get("tp")) != (res["machine"], res["shape"], res["tp"]):
        return set()
    done = set()
    for name in {r["config"] for r in old.get("rows", [])}:
        rows = [r for r in old["rows"] if r["config"] == name]
        if sorted(r["start"] for r in rows) == list(range(1, args.starts + 1)) and not any("error" in r for r in rows):
            done.add(name)
    res["rows"] += [r for r in old["rows"] if r["config"] in done]
    return done


def table(rows) -> str:
    head = ("| config | start | ready s | in server s | first request s | target verify graphs s | draft graphs s "
            "| LumoTree states s | Triton compiles (ms) |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        cap = r.get("captures_s", {})
        draft = sum(v for k, v in cap.items() if k.startswith("draft"))
        states = r.get("lumotree_states_s", {})
        extra = ", ".join(f"{k}: {v}" for k, v in states.items())
        if "lumotree_decode_graphs_s" in r:
            extra += f", decode graphs {r['lumotree_decode_graphs_s']}"
        jit = r.get("jit") or {}
        lines.append(f"| {r['config']} | {r['start']} ({r['cache']}) | {r.get('ready_s', 'error')} | "
                     f"{r.get('in_server_s', '')} | {r.get('first_request_s', '')} | {cap.get('target verify', '')} | "
                     f"{round(draft, 2) if draft else ''} | {extra} | {jit.get('count', '')} "
                     f"({jit.get('total_ms', '')}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
