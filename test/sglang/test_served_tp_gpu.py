"""GPU, two of them, end to end: LUMOTREE and LUMOTREE_SUFFIX at ``--tp-size 2`` with their flags alone (adaptive tree
size: every rank's policy takes rank 0's step times at the same steps, ``lumotree.sglang.shared_times``; LUMOTREE_SUFFIX
indexes admissions in line, ``lumotree.sglang.suffix.drafts_alone``) on the committed tiny model, against a
``--tp-size 2`` server without speculation. Enough batches of enough requests that the policy explores and switches;
every request must finish with its tokens, both ranks must log the adaptive candidates, no exchange may find the
ranks' choices differing, and the greedy outputs must stay close to no speculation's (the default mode is not
token-identical)."""
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))

PROMPTS = ["import os\n", "def main():\n", "class Tree:\n", "# utils\n", "for i in range(", "return self.",
           "def __init__(self", "from typing import", "    if not ", "while True:\n", "try:\n    ", "with open("]


def _two_gpus():
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


def serve(tmp_path, name, args):
    from sglang_server import generate, sglang_server

    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    args = [*args, "--tp-size", "2", "--cuda-graph-max-bs", "16", "--log-level", "info"]
    outs = []
    with sglang_server(model, args, port=port, log=str(tmp_path / f"{name}.log"), timeout=600) as url:
        for _ in range(3):  # passes of 1, 4 and 12 requests, 96 tokens each: the policy explores, probes, switches
            outs += [generate(url, [p], 96)[0] for p in PROMPTS[:1]]
            outs += generate(url, PROMPTS[:4], 96)
            outs += generate(url, PROMPTS, 96)
    log = (tmp_path / f"{name}.log").read_text(errors="replace")
    return [o["output_ids"] for o in outs], [o["meta_info"] for o in outs], log


@pytest.fixture(scope="module")
def no_speculation(tmp_path_factory):
    if not _two_gpus():
        pytest.skip("needs two GPUs")
    return serve(tmp_path_factory.mktemp("none"), "none", [])


@pytest.mark.parametrize("algorithm", ["LUMOTREE", "LUMOTREE_SUFFIX"])
def test_tensor_parallel_ranks_choose_alike_and_serve_every_request(tmp_path, no_speculation, algorithm):
    tree = (["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"] if algorithm == "LUMOTREE" else
            ["--speculative-algorithm", "LUMOTREE_SUFFIX"])
    ref, _, _ = no_speculation
    got, meta, log = serve(tmp_path, algorithm.lower(), tree)
    assert all(m["completion_tokens"] == 96 for m in meta)
    assert "chose differently" not in log, log[-4000:]
    # both ranks built the adaptive policy (SGLang prefixes each rank's lines with its TP rank)
    lines = [ln for ln in log.splitlines() if "LumoTree adaptive tree size: candidates" in ln]
    assert any("TP0" in ln for ln in lines) and any("TP1" in ln for ln in lines), lines
    first_diff = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), len(r)) for r, g in zip(ref, got)]
    same = sum(a == b for r, g in zip(ref, got) for a, b in zip(r, g))
    assert same >= 0.8 * sum(len(r) for r in ref), (same, first_diff)
