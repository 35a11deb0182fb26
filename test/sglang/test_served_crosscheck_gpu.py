"""GPU, end to end: a LUMOTREE server on the committed tiny model (SGLang's Triton attention backend), with
the in-server cross-check (``LUMOTREE_SGLANG_CHECK=1``): every served GDN verify against SGLang 0.5.17's own
tree-verify kernel, every commit against that kernel's per-node snapshot of the accepted node, and every
full-attention verify (LumoTree's tree verify attention) against SGLang's prefill kernel with the verify's
mask, on the same inputs.
(Greedy text parity is measured by benchmark/serving/suite.py; it is not a unit test because
speculative kernels are not bit-identical to decode kernels.)"""
import json
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))


MTP = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3"]


@pytest.mark.parametrize("tree,min_steps", [
    (MTP + ["--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"], 10),
    (MTP + ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"], 10),
    # suffix drafts (SGLang's NGRAM worker): wider trees through the same verify attention
    (["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-num-draft-tokens", "8"], 4),
], ids=["tree6", "chain4", "suffix8"])
def test_served_verify_and_commit_equal_sglang_kernel(tmp_path, tree, min_steps):
    from sglang_server import generate, sglang_server

    report = tmp_path / "check.json"
    args = [*tree, "--disable-cuda-graph"]
    if "LUMOTREE" in tree:  # every step verifies the tree (no adaptive no-draft steps)
        fixed = tmp_path / "fixed_tree.json"
        fixed.write_text(json.dumps({"candidate_steps": [3]}))
        args += ["--speculative-adaptive-config", str(fixed)]
    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(model, args, port=port, log=str(tmp_path / "server.log"), timeout=400,
                       env={"LUMOTREE_SGLANG_CHECK": "1", "LUMOTREE_SGLANG_CHECK_REPORT": str(report)}) as url:
        outs = generate(url, ["import os\n", "def main():\n", "class Tree:\n", "# utils\n"], 48)
    assert all(o["meta_info"]["completion_tokens"] == 48 for o in outs)
    r = json.loads(report.read_text())
    # the 4 requests run as one batch: ~48 / accept length verify steps (MTP trees: 16 seen on the H200)
    assert r["steps"] >= min_steps
    assert r["worst_rel_err"]["verify"] < 1e-2  # bf16 outputs
    assert r["worst_rel_err"]["commit"] < 1e-4  # fp32 states: the accepted node's snapshot
    assert r["attention_checks"] >= r["steps"]  # every verify's full-attention layers went through LumoTree's kernel
    assert r["worst_rel_err"]["attention"] < 1e-2  # bf16 outputs
