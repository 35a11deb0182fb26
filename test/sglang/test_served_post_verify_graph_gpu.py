"""GPU, end to end: a LUMOTREE_SUFFIX server's drafted steps with their post-verify work (tree walk, state commit,
accepted tokens, KV move) replayed as CUDA graphs (:mod:`lumotree.sglang.post_verify`), and a LUMOTREE chain
server's (sampling, state commit, accepted and bonus tokens; the chain on every step, ``benchmark/serving/fixed_tree.json``).

In the decode-exact mode (``--enable-deterministic-inference``: every node computed as the decode step at its
position) the replies must equal the no-speculation server's in the same mode, token for token, through batches of
1, 2, 4 and 8 repetitive prompts (each size verified for many steps: eager at its first ones, captured at its
``PostVerifyGraphs.CAPTURE_AT``-th, replayed after): a graph that read a stale row, length or KV slot would change the
tokens. In the default mode the same batches must capture graphs and finish every request.

On the H200: ``pytest -q -m gpu test/sglang/test_served_post_verify_graph_gpu.py``."""
import os
import re
import sys

import pytest

pytestmark = pytest.mark.gpu
sys.path.insert(0, os.path.dirname(__file__))
from test_served_suffix_sizes_gpu import EXACT, serve  # noqa: E402  (the prompts, the batches, the server's flags)

SUFFIX = ["--speculative-algorithm", "LUMOTREE_SUFFIX"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAIN = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4", "--speculative-adaptive-config",
         os.path.join(ROOT, "benchmark", "serving", "fixed_tree.json")]


def captured(log):
    return {int(m.group(1)) for m in re.finditer(r"post-verify CUDA graph captured for (\d+) requests", log)}


def test_exact_mode_replies_with_post_verify_graphs_are_token_identical(tmp_path):
    ref, _, ref_log = serve(tmp_path, "none-exact", EXACT, {})
    got, meta, log = serve(tmp_path, "suffix-exact", SUFFIX + EXACT, {})
    assert "Traceback" not in log and "Traceback" not in ref_log
    assert "could not be captured" not in log
    assert len(captured(log)) >= 2, sorted(captured(log))  # batch sizes whose steps replayed a graph
    assert all(m["completion_tokens"] == 64 for m in meta)
    assert got == ref, [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(ref, got)]
    verify = [m.get("spec_verify_ct") for m in meta]  # drafts were verified: fewer steps than tokens
    assert all(v is not None for v in verify) and sum(verify) < 0.8 * sum(m["completion_tokens"] for m in meta)


def test_default_mode_captures_and_finishes_every_request(tmp_path):
    got, meta, log = serve(tmp_path, "suffix", SUFFIX, {})
    assert "Traceback" not in log and "could not be captured" not in log
    assert captured(log), "no post-verify graph captured"
    assert all(m["completion_tokens"] == 64 for m in meta)


def test_exact_mode_chain_replies_with_post_verify_graphs_are_token_identical(tmp_path):
    ref, _, ref_log = serve(tmp_path, "none-exact", EXACT, {})
    got, meta, log = serve(tmp_path, "chain-exact", CHAIN + EXACT, {})
    assert "Traceback" not in log and "Traceback" not in ref_log
    assert "could not be captured" not in log and "post-verify CUDA graph reads moved" not in log
    assert len(captured(log)) >= 2, sorted(captured(log))  # batch sizes whose steps replayed a graph
    assert all(m["completion_tokens"] == 64 for m in meta)
    assert got == ref, [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(ref, got)]
    verify = [m.get("spec_verify_ct") for m in meta]  # drafts were verified: fewer steps than tokens
    assert all(v is not None for v in verify) and sum(verify) < 0.8 * sum(m["completion_tokens"] for m in meta)
