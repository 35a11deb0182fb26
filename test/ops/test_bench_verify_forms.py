import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_served_kernel_bench_runs_and_checks_outputs(tmp_path):
    """benchmark/kernels/bench_verify_forms.py end to end on CPU (Triton's interpreter, tiny heads):
    the served verify's outputs and the commit's state agree with SGLang's native path on the same
    inputs, and the JSON / table carry every column."""
    pytest.importorskip("sglang")
    out = tmp_path / "vf.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmark/kernels/bench_verify_forms.py"), "--models",
                          "tiny", "--trees", "chain-4,eagle-16", "--batches", "2", "--served-only", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "partial" not in data["meta"] and data["meta"]["command"].startswith("python3 ")
    assert [(r["tree"], r["nodes"]) for r in data["rows"]] == [("chain-4", 4), ("eagle-16", 16)]
    for r in data["rows"]:
        assert set(r["rel_err"]) == {"mix", "commit_state"} and max(r["rel_err"].values()) < 1e-4, r["rel_err"]
        assert r["served_total_us"] == r["mix_verify_us"] + r["commit_us"]
        assert r["served_speedup_vs_native"] == (r["native_verify_us"] + r["native_commit_us"]) / r["served_total_us"]
    assert "| tiny | eagle-16 (16) | 2 |" in res.stdout
