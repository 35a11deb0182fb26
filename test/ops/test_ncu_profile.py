"""CPU checks of benchmark/kernels/ncu_profile.py: the profiled setup runs (Triton's interpreter, tiny
shapes) and the raw-CSV summary keeps the right metrics in the right units."""
import csv
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "benchmark/kernels/ncu_profile.py")


def load():
    spec = importlib.util.spec_from_file_location("ncu_profile", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_summarize_raw_csv(tmp_path):
    m = load()
    hdr = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]
    units = ["", "", "usecond", "Mbyte", "Mbyte", "%", "register/thread", "inst", "inst"]
    rows = [["1", "gdn_tree_commit_layers_fwd_kernel(...)", "100", "200", "100", "12.5", "96", "3.5", "7.0"],
            ["0", "gdn_tree_mix_apply_fwd_kernel(...)", "50,000", "100", "0", "6.25", "255", "9.0", "1.0"]]
    p = tmp_path / "raw.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerows([hdr, units] + rows)
    ks = m.summarize(str(p))
    assert [k["kernel"] for k in ks] == ["gdn_tree_mix_apply_fwd_kernel", "gdn_tree_commit_layers_fwd_kernel"]
    commit = ks[1]
    assert commit["duration_us"] == 100.0 and commit["dram_read_bytes"] == 200e6
    assert commit["dram_GBps"] == 3000.0  # 300 MB in 100 us
    assert list(commit["stall_cycles_per_issue"]) == ["wait", "long_scoreboard"]  # largest first
    assert ks[0]["registers_per_thread"] == 255.0 and ks[0]["duration_us"] == 50000.0  # "50,000" read as a number


def test_profiled_ops_run_on_cpu():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, SCRIPT, "--cells", "tiny:topk2-depth3:2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    marks = json.loads(out.stdout.strip().splitlines()[-1])["profiled"]
    assert [x["op"] for x in marks] == ["native_verify", "native_commit", "mix_verify", "replay_commit"]
