import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))


def test_tile_sweep_runs_checks_each_config_and_reports_the_default(tmp_path):
    """benchmark/kernels/sweep_gdn_tiles.py end to end on CPU (Triton's interpreter, tiny heads): every tiling it
    times produced the default tiling's outputs, the default is among those timed, the best is the fastest."""
    pytest.importorskip("sglang")
    out = tmp_path / "tiles.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmark/kernels/sweep_gdn_tiles.py"), "--models",
                          "tiny", "--trees", "chain-4", "--batches", "2", "--layers", "2", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "partial" not in data["meta"] and data["meta"]["layers"] == 2
    (row,) = data["rows"]
    assert "BV16-w1-p4-h1" in row["verify"]["us"]  # pass 1 with one value head per program too
    assert "BV16-w4-rnorm" in row["commit"]["us"]  # the commit reading stored key norms too
    for op, default in (("commit", "BV16-w4"), ("verify", "BV16-w1-p4-h2")):
        us, b = row[op]["us"], row[op]["best"]
        assert all(isinstance(t, float) for t in us.values()), us  # none wrong or failed on the interpreter
        assert default in us and b["default_us"] == us[default]
        assert b["us"] == min(us.values()) and b["speedup_over_default"] == b["default_us"] / b["us"]
    assert isinstance(row["verify"]["walk_us"], float)  # the walk verify agreed with the mix verify
    assert isinstance(row["verify"]["default_storing_rnorm_us"], float)
    assert "| tiny | chain-4 | 2 |" in res.stdout


def test_best_of_a_sweep_skips_configs_that_were_wrong():
    from sweep_gdn_tiles import best

    times = {(16, 4): 10.0, (32, 4): "wrong: rel. err 1.0e-02", (8, 2): 8.0, "walk": 1.0, "rnorm": 1.0}
    assert best(times, (16, 4)) == dict(config=[8, 2], us=8.0, default=[16, 4], default_us=10.0,
                                        speedup_over_default=1.25)
    assert best({(16, 4): "failed: x"}, (16, 4)) is None
