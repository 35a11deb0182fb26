import os
import subprocess
import sys


def test_fused_merge_layout_kernel_in_interpreter():
    """The one-launch merge + layout of the served merged tree == its torch reference (see the script)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "interpret_tree_merge.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "tree merge kernel == torch path" in out.stdout
