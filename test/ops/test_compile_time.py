"""benchmark/kernels/compile_time.py on CPU: it compiles LumoTree's served kernels for sm_90 through their
real launchers (no GPU, nothing run) and reports per kernel how many variants it compiled."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_compile_time_compiles_the_served_kernels_for_sm90_without_a_gpu(tmp_path):
    out = tmp_path / "ct.json"
    # a subprocess: the script replaces Triton's active driver for the rest of its process
    code = ("import json, sys; sys.path.insert(0, 'benchmark/kernels'); import compile_time as ct; "
            f"ct.main(['--shapes', 'tiny', '--batches', '32', '--ops', 'commit,finish', '--out', {str(out)!r}])")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=600)
    import json

    res = json.load(open(out))
    kernels = {name: k for r in res["rows"] for name, k in r["kernels"].items()}
    assert set(kernels) == {"gdn_tree_commit_layers_fwd_kernel", "mark_finished_fwd_kernel", "clamp_run_fwd_kernel"}
    assert all(k["compiles"] == 1 and k["seconds"] > 0 for k in kernels.values())
    assert res["compile_s_per_shape"]["tiny"] > 0 and [r["op"] for r in res["rows"]] == ["commit", "finish"]


def test_compile_time_refuses_unknown_shapes_and_ops():
    for bad in (["--shapes", "tiny,nope"], ["--ops", "verify,nope"]):
        r = subprocess.run([sys.executable, "benchmark/kernels/compile_time.py", *bad], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode != 0 and "nope" in r.stderr
