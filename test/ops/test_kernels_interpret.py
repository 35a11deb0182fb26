import os
import subprocess
import sys


def test_triton_kernels_in_interpreter_match_references():
    """CPU coverage of the Triton kernels' logic (tree walk, boundary slots, pool rows, commit)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "interpret_kernels.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "interpreted kernels == references" in out.stdout


def test_tree_attention_kernels_in_interpreter_match_the_reference():
    """CPU coverage of the tree verify attention's kernels (split prefix, tree merge, GQA rows)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "interpret_kernels.py")
    out = subprocess.run([sys.executable, script, "tree_attention"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "interpreted tree attention == reference" in out.stdout
