import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_verify_forms_bench_runs_and_checks_outputs(tmp_path):
    """benchmark/kernels/bench_verify_forms.py end to end on CPU (Triton's interpreter, tiny heads):
    every form's outputs and the commit's state agree with SGLang's native path on the same inputs,
    and the JSON / table carry every column."""
    pytest.importorskip("sglang")
    out = tmp_path / "vf.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmark/kernels/bench_verify_forms.py"), "--models",
                          "tiny", "--trees", "topk2-depth3,eagle-16", "--batches", "2", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "partial" not in data["meta"] and data["meta"]["command"].startswith("python3 ")
    assert [(r["tree"], r["nodes"]) for r in data["rows"]] == [("topk2-depth3", 6), ("eagle-16", 16)]
    for r in data["rows"]:
        assert set(r["rel_err"]) == {"chunk", "wy", "mix", "commit_state", "dot_commit_state", "gather_commit_state",
                                  "fused_step_state_vs_commit", "fused_step_o_vs_sequential", "knorm_commit_state"}
        assert max(r["rel_err"].values()) < 1e-4, r["rel_err"]
        assert max(r["mix_variants_rel_err"].values()) < 1e-4, r["mix_variants_rel_err"]
        for key in ("native_verify_us", "mix_prep_us", "mix_apply_us", "commit_us", "commit_knorm_us", "dot_commit_us",
                    "gather_commit_us", "mix_fused_step_us", "mix_fused_step_replay_us",
                    "best_total_us"):
            assert r[key] > 0
    assert "| tiny | eagle-16 (16) | 2 |" in res.stdout


def test_verify_forms_served_only(tmp_path):
    """``--served-only``: SGLang's native path and the served forms (mix verify + replay commit) only,
    outputs checked against SGLang's, with the served table."""
    pytest.importorskip("sglang")
    out = tmp_path / "vf.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmark/kernels/bench_verify_forms.py"), "--models",
                          "tiny", "--trees", "chain-4", "--batches", "2", "--served-only", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (r,) = json.loads(out.read_text())["rows"]
    assert set(r["rel_err"]) == {"mix", "commit_state", "knorm_commit_state"} and max(r["rel_err"].values()) < 1e-4
    assert r["commit_knorm_us"] > 0
    assert "chunk_verify_us" not in r and r["served_total_us"] == r["mix_verify_us"] + r["commit_us"]
    assert r["served_speedup_vs_native"] == (r["native_verify_us"] + r["native_commit_us"]) / r["served_total_us"]
    assert "| tiny | chain-4 (4) | 2 |" in res.stdout
