"""GPU, end to end: the MTP-loop draft oracle controls a served model's acceptance (committed tiny
model, which accepts for real without it). Second pass of the same prompts: with p = 1 the first-child
chain carries the recorded continuation, so nearly every step accepts its 3 drafts; with p = 0 every
draft that would match is made wrong, so no step accepts one (96 tokens from 95 verify steps: the
prefill makes the first)."""
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "models"))
MODEL = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]
FIXED = ["--speculative-adaptive-config", os.path.join(ROOT, "benchmark", "serving", "fixed_tree.json")]


def second_pass_accept(tmp_path, algo, p):
    from eval_tiny_hybrid_sglang import prompts
    from sglang_server import accept_stats, generate, sglang_server

    args = ["--speculative-algorithm", algo, *TREE, "--cuda-graph-max-bs", "8"] + (FIXED if algo == "LUMOTREE" else [])
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(MODEL, args, port=port, log=str(tmp_path / f"{algo}-{p}.log"), timeout=400,
                       env={"LUMOTREE_BENCH_DRAFT_ORACLE_P": str(p)}) as url:
        texts = prompts(8)
        generate(url, texts, 96)  # records the continuations
        return accept_stats(generate(url, texts, 96))["accept_length"]


@pytest.mark.parametrize("algo", ["LUMOTREE", "NEXTN"])
def test_p1_accepts_the_chain(tmp_path, algo):
    assert second_pass_accept(tmp_path, algo, 1.0) > 3.5


def test_p0_accepts_nothing(tmp_path):
    assert second_pass_accept(tmp_path, "LUMOTREE", 0.0) == pytest.approx(96 / 95, abs=2e-3)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_chain_pinned_to_a_shallower_depth_accepts_that_depth(tmp_path, depth):
    """A LUMOTREE 3-step chain whose config pins a shallower depth (lumotree.sglang.adaptive.candidate_steps on a
    chain; the worker's runtime state of ``depth + 1`` tokens): with p = 1 nearly every step accepts its ``depth``
    drafts, and never more."""
    import json

    from eval_tiny_hybrid_sglang import prompts
    from sglang_server import accept_stats, generate, sglang_server

    cfg = tmp_path / "depth.json"
    cfg.write_text(json.dumps({"candidate_steps": [depth]}))
    args = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--speculative-adaptive-config", str(cfg), "--cuda-graph-max-bs", "8"]
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(MODEL, args, port=port, log=str(tmp_path / f"depth{depth}.log"), timeout=400,
                       env={"LUMOTREE_BENCH_DRAFT_ORACLE_P": "1.0"}) as url:
        texts = prompts(8)
        generate(url, texts, 96)
        got = accept_stats(generate(url, texts, 96))["accept_length"]
    assert depth + 0.8 < got <= depth + 1 + 1e-6, got
