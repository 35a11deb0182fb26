"""Nsight Compute profile of the served GDN tree kernels beside SGLang 0.5.17's native tree path
(why a cell misses its target). One cell per ``--cells`` entry (model shapes, tree, batch,
the same inputs as ``bench_verify_forms.py``); every op runs a few times first (Triton compiles and
autotunes outside the profiled range), then once between ``cudaProfilerStart`` / ``Stop``:

    ncu --clock-control none --profile-from-start off --set full -o /tmp/gdn python3 benchmark/kernels/ncu_profile.py
    ncu --import /tmp/gdn.ncu-rep --csv --page raw > raw.csv
    python3 benchmark/kernels/ncu_profile.py --summarize raw.csv --out benchmark/results/ncu_gdn_tree_h200.json

Ops, per cell: ``native_verify`` (SGLang's tree verify writing per-node snapshots),
``native_commit`` (its post-verify scatter), ``mix_verify`` (the served verify: pass 1
``gdn_tree_mix_prep`` + pass 2 ``gdn_tree_mix_apply``), ``replay_commit`` (the served commit, one
layer).
``--summarize`` reads the raw CSV and keeps, per kernel: duration, DRAM bytes and throughput,
SM / memory throughput, achieved vs theoretical occupancy, registers, the limiter of resident
blocks, issue-slot use and the warp-stall breakdown (cycles per issued instruction by reason).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "math_pipe_throttle", "mio_throttle", "lg_throttle",
          "wait", "not_selected", "selected", "dispatch_stall", "no_instruction", "branch_resolving", "membar",
          "drain", "imc_miss", "tex_throttle", "sleeping", "misc")
KEEP = {  # raw metric -> summary key
    "gpu__time_duration.sum": "duration_us",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct_of_peak",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct_of_peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__occupancy_limit_registers": "block_limit_registers",
    "launch__occupancy_limit_shared_mem": "block_limit_shared_mem",
    "launch__occupancy_limit_warps": "block_limit_warps",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_slots_busy_pct",
    "smsp__average_warp_latency_per_inst_issued.ratio": "warp_cycles_per_issued_inst",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pipe_pct",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": "fma_pipe_pct",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "shared_bank_conflicts",
    "local_load_store_bytes": "local_bytes",
}


def ops_for_cell(model, tree_name, B):
    """The cell's ops as ``{name: fn}`` on one set of inputs (bench_verify_forms' setup)."""
    from bench_verify_forms import served_ops

    return served_ops(model, tree_name, B)[0]


def run(cells):
    import torch

    marks = []
    for cell in cells:
        model, tree_name, B = cell.split(":")
        ops = ops_for_cell(model, tree_name, int(B))
        for fn in ops.values():  # compile / autotune outside the profiled range
            for _ in range(3):
                fn()
        gpu = torch.cuda.is_available()  # (CPU: a smoke test of the setup in Triton's interpreter)
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        for name, fn in ops.items():
            fn()
            if gpu:
                torch.cuda.synchronize()
            marks.append(dict(cell=cell, op=name))
        if gpu:
            torch.cuda.cudart().cudaProfilerStop()
        del ops
        torch.cuda.empty_cache()
    print(json.dumps(dict(profiled=marks)))


def _num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return s


def summarize(raw_csv, cells=None):
    """Per profiled kernel (in launch order) the metrics of ``KEEP`` and the stall breakdown."""
    with open(raw_csv, newline="") as f:
        rows = list(csv.reader(f))
    hdr, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(hdr)}
    kernels = []
    for r in data:
        if len(r) != len(hdr):
            continue
        k = dict(kernel=r[col["Kernel Name"]].split("(")[0], id=int(_num(r[col["ID"]])))
        for m, key in KEEP.items():
            if m in col:
                val, unit = _num(r[col[m]]), units[col[m]]
                if key == "duration_us" and isinstance(val, float):
                    val = val / 1e3 if unit in ("nsecond", "ns") else val * 1e3 if unit in ("msecond", "ms") else val
                if key.endswith("_bytes") and isinstance(val, float):
                    val *= {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)
                k[key] = val
        stalls = {}
        for s in STALLS:
            m = f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
            if m in col and isinstance(_num(r[col[m]]), float):
                stalls[s] = round(_num(r[col[m]]), 3)
        k["stall_cycles_per_issue"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
        if isinstance(k.get("duration_us"), float) and isinstance(k.get("dram_read_bytes"), float):
            k["dram_GBps"] = round((k["dram_read_bytes"] + k.get("dram_write_bytes", 0.0)) / k["duration_us"] / 1e3, 1)
        kernels.append(k)
    kernels.sort(key=lambda k: k["id"])
    return kernels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="qwen3.5-27b:eagle-16:32,qwen3.5-27b:topk2-depth3:8")
    ap.add_argument("--summarize", help="raw CSV of `ncu --import REP --csv --page raw`")
    ap.add_argument("--marks", help="the JSON line this script printed when profiled (op order)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.summarize:
        run(args.cells.split(","))
        return
    kernels = summarize(args.summarize)
    res = dict(command="ncu --clock-control none --profile-from-start off --set full -o REP python3 "
                       f"benchmark/kernels/ncu_profile.py --cells {args.cells}", cells=args.cells.split(","),
               kernels=kernels)
    if args.marks:
        res["profiled_ops"] = json.load(open(args.marks))["profiled"]
    text = json.dumps(res, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    for k in kernels:
        print(k["kernel"][:48], {x: k.get(x) for x in ("duration_us", "dram_GBps", "achieved_occupancy_pct",
                                                        "registers_per_thread", "issue_slots_busy_pct")},
              list(k["stall_cycles_per_issue"].items())[:4])


if __name__ == "__main__":
    main()
