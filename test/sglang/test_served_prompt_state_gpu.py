"""GPU, end to end: prompt-interior states in a LUMOTREE server's radix cache (``lumotree.sglang.prompt_state``),
flags alone (the overlap scheduler, the ``no_buffer`` state cache), on the committed tiny model, its prefills eager
and under SGLang's default prefill CUDA graphs.

- A prompt of ``L`` tokens sent again reuses ``(L - 1) // 64 * 64`` of them (the state tracked at its first
  prefill), where ``no_buffer`` alone reused none; its greedy answer starts with the same token, the first
  token's logprob within the spread the cache-consistency test allows.
- Prompts sharing a prefix: the second one tracks the state at the branching point, the third reuses it.
- Idle afterwards, SGLang's own pool check finds no leaked state slot and the server answers again.
"""
import os
import random
import sys
import time

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))
MODEL = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
TREE = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6", "--cuda-graph-max-bs", "8"]
LENGTHS = (256, 200, 130, 65, 40)


def _gen(url, ids, n=6):
    from sglang_server import post

    out = post(url + "/generate", {"input_ids": ids, "return_logprob": True,
                                   "sampling_params": dict(temperature=0.0, max_new_tokens=n, ignore_eos=True)})
    meta = out["meta_info"]
    return meta["cached_tokens"], out["output_ids"], meta["output_token_logprobs"][0][0]


@pytest.fixture(scope="module", params=["eager prefill", "prefill graphs"])
def served(tmp_path_factory, request):
    """The server prefills eagerly (``--disable-piecewise-cuda-graph``, as the benchmarks run), or with SGLang's
    default prefill CUDA graphs (what a user who gives no such flag runs: the GDN layers run in the graphs' eager
    breaks, and a prefill whose GDN layers copied no tracked state gives its slots back uncached,
    ``prompt_state.after_forward`` -- so there the tests below fail if the graphs drop the tracking)."""
    from sglang_server import BASE_ARGS, sglang_server

    base = BASE_ARGS if request.param == "eager prefill" else [a for a in BASE_ARGS
                                                                if a != "--disable-piecewise-cuda-graph"]
    rng = random.Random(7)
    log = str(tmp_path_factory.mktemp("prompt_state") / "lumotree.log")
    prompts = [[rng.randrange(10, 4000) for _ in range(n)] for n in LENGTHS]
    shared = [rng.randrange(10, 4000) for _ in range(150)]
    branches = [shared + [rng.randrange(10, 4000) for _ in range(50)] for _ in range(3)]
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(MODEL, TREE, port=port, log=log, timeout=600, base_args=base) as url:
        first = [_gen(url, p) for p in prompts]
        again = [_gen(url, p) for p in prompts]
        shared_runs = [_gen(url, p) for p in branches]
        time.sleep(3)  # idle: SGLang checks its pools
        after = _gen(url, prompts[0])
    with open(log) as f:
        text = f.read()
    return dict(first=first, again=again, shared=shared_runs, after=after, log=text)


def test_a_resent_prompt_reuses_its_tracked_state(served):
    for n, (c1, out1, lp1), (c2, out2, lp2) in zip(LENGTHS, served["first"], served["again"]):
        assert c1 == 0, n
        assert c2 == (n - 1) // 64 * 64, (n, c2)  # 192, 192, 128, 64, 0
        assert out2[0] == out1[0], n
        assert abs(lp2 - lp1) <= 0.15, (n, lp1, lp2)


def test_a_shared_prefix_is_reused_from_its_branching_point(served):
    (c1, _, _), (c2, _, _), (c3, _, _) = served["shared"]
    assert c1 == 0 and c2 == 0  # the second finds the prefix's KV but no state on it, and tracks 128
    assert c3 == 128


def test_no_state_slot_leaks(served):
    assert "memory leak" not in served["log"], [l for l in served["log"].splitlines() if "leak" in l][:3]
    assert "Traceback" not in served["log"]
    assert served["after"][0] == 192 and served["after"][1][0] == served["first"][0][1][0]  # it still answers
