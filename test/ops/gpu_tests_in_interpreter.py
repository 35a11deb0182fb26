"""Runs a few GPU test functions' logic on the CPU (Triton's interpreter, small shapes; called by
test_gpu_tests_in_interpreter.py in a subprocess: TRITON_INTERPRET and the device must be set
before import)."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("LUMOTREE_GPU_TESTS_DEVICE") == "cpu"
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import test_gdn_tree_gpu as t  # noqa: E402

for impl in ("mix", "walk"):
    t.test_verify_and_commit_match_reference("eagle", 3, 17, 2, 6, 32, 32, torch.bfloat16, impl)
    t.test_verify_and_commit_match_reference("chain", 1, 4, 2, 6, 32, 32, torch.float32, impl)
print("GPU tests' logic == references on CPU")
