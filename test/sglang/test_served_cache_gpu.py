"""GPU, end to end: is a cached hybrid state its key's? (``benchmark/serving/cache_consistency.py``'s check
on the committed tiny model.) Turn 1 ends by a length (odd ``max_new_tokens``, so that runs overshoot
the end) or by a stop token; turn 2 = prompt + reply + a follow-up is answered from the radix cache and
again after ``/flush_cache``; the two first tokens must agree for every request and their logprobs as
closely as the no-speculation server's own cached-vs-fresh spread. Servers: no speculation (the
control), LUMOTREE and LUMOTREE_SUFFIX with their defaults (the overlap scheduler with the finished
rows skipped on the device, the verify's run cut at the request's end, ``lumotree.sglang.finish``) and
LUMOTREE with ``--disable-overlap-schedule``."""
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "models"))
MODEL = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
TREE = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6"]


def check(tmp_path, name, args, env=None):
    from cache_consistency import run
    from eval_tiny_hybrid_sglang import prompts
    from sglang_server import sglang_server
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    texts = prompts(8)
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(MODEL, [*args, "--cuda-graph-max-bs", "8"], port=port, log=str(tmp_path / f"{name}.log"),
                       timeout=400, env=env) as url:
        return run(url, tok, texts), run(url, tok, texts, stop="\n")


@pytest.fixture(scope="module")
def none_spread(tmp_path_factory):
    by_length, by_stop = check(tmp_path_factory.mktemp("none"), "none", [])
    return max(by_length["max_logprob_gap"] or 0.0, by_stop["max_logprob_gap"] or 0.0)


@pytest.mark.parametrize("args", [TREE, TREE + ["--disable-overlap-schedule"],
                                  ["--speculative-algorithm", "LUMOTREE_SUFFIX"]], ids=["overlap", "sync", "suffix"])
def test_lumotree_caches_states_of_their_keys(tmp_path, none_spread, args):
    for res in check(tmp_path, "lumotree", args):
        assert res["same_first_token"] == res["of"], res["rows"]
        assert sum(res["turn1_verify_steps"]) > 0  # it speculated
        assert sum(res["cached_tokens"]) > 0  # turn 2 hit the cache
        assert res["max_logprob_gap"] is not None and res["max_logprob_gap"] <= max(0.15, 2 * none_spread), \
            (res["max_logprob_gap"], none_spread)
