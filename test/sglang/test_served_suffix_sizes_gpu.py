"""GPU, end to end: a LUMOTREE_SUFFIX server whose draft-tree size follows the batch bucket
(:mod:`lumotree.sglang.suffix_sizes`). With ``LUMOTREE_SUFFIX_TOKENS_PER_STEP=32`` and 8 running requests the
server drafts 32 nodes for one request, 16 for two, 8 for three or four and 4 for five to eight, so a batch of 8
repetitive prompts, whose requests all end together, is verified at every size in turn -- the smaller ones
through verify states swapped in around SGLang's NGRAM step, their results laid out at the server's stride.

In the decode-exact mode (``--enable-deterministic-inference``; every node computed as the decode step at its
position) the replies must equal the no-speculation server's in the same mode, token for token: a wrong stride
or a stale buffer would change the tokens.

On the H200: ``pytest -q -m gpu test/sglang/test_served_suffix_sizes_gpu.py``."""
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))

BLOCK = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
PROMPTS = [BLOCK * 3 + "def mul(a, b):\n", BLOCK * 2 + "import os\n", "x = 1\ny = 2\n" * 6, BLOCK + "class A:\n",
           "for i in range(10):\n    print(i)\n" * 4, BLOCK * 4, "# notes\n" + BLOCK * 2, "a = [1, 2, 3]\n" * 8]
EXACT = ["--enable-deterministic-inference"]
ENV = {"SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM": "0"}
SIZES_ENV = {"LUMOTREE_SUFFIX_TOKENS_PER_STEP": "32"}


def serve(tmp_path, name, args, env, prompts=PROMPTS):
    """One request, then batches of 2, 4 and 8 of ``prompts`` (each batch's requests end together, so its steps run
    at its size, then smaller ones as no request leaves early)."""
    from sglang_server import BASE_ARGS, generate, sglang_server

    base = ["info" if a == "warning" else a for a in BASE_ARGS] + ["--max-running-requests", "8"]
    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(model, args, port=port, base_args=base, env={**ENV, **env},
                       log=str(tmp_path / f"{name}.log"), timeout=600) as url:
        outs = []
        for k in (1, 2, 4, 8):
            outs += generate(url, prompts[:k], 64)
    log = (tmp_path / f"{name}.log").read_text(errors="replace")
    return [o["output_ids"] for o in outs], [o["meta_info"] for o in outs], log


def test_exact_mode_with_a_tree_size_per_batch_bucket_is_token_identical(tmp_path):
    ref, ref_meta, ref_log = serve(tmp_path, "none-exact", EXACT, {})
    got, meta, log = serve(tmp_path, "suffix-exact", ["--speculative-algorithm", "LUMOTREE_SUFFIX", *EXACT], SIZES_ENV)
    assert "Traceback" not in log and "Traceback" not in ref_log
    for nodes in (16, 8, 4):  # the smaller sizes' verify states were built
        assert f"LUMOTREE_SUFFIX: {nodes}-node verify state" in log, nodes
    assert all(m["completion_tokens"] == 64 for m in meta)
    assert got == ref, [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(ref, got)]
    # the drafts were verified, not skipped: fewer verify steps than tokens on the repetitive prompts
    verify = [m.get("spec_verify_ct") for m in meta]
    assert all(v is not None for v in verify) and sum(verify) < 0.8 * sum(m["completion_tokens"] for m in meta), verify
