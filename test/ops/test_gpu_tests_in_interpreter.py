import os
import subprocess
import sys


def test_gpu_tests_logic_runs_on_cpu_in_the_interpreter():
    """The GPU tests of the split / mix verify (all variants), the fused steps and the commit forms,
    run at small shapes on the CPU: a broken GPU test fails here, not first on the H200."""
    env = dict(os.environ, TRITON_INTERPRET="1", LUMOTREE_GPU_TESTS_DEVICE="cpu")
    script = os.path.join(os.path.dirname(__file__), "gpu_tests_in_interpreter.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "GPU tests' logic == references on CPU" in out.stdout
