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

t.test_split_verify_matches_reference_and_chunk("eagle", 2, 17, 2, 6, 32, 32, torch.bfloat16)
t.test_fused_step_equals_commit_then_verify(6)
t.test_dot_commit_equals_replay_commit_and_reference("eagle", torch.float32)
t.test_mix_verify_key_norms_feed_the_replay_commit(16)
print("GPU tests' logic == references on CPU")
