"""GPU, end to end: a LUMOTREE or LUMOTREE_SUFFIX server pinned to its no-draft step (``--speculative-adaptive-config
{"candidate_steps": [0]}``: the target's decode forward through its own decode CUDA graphs,
``lumotree.sglang.decode_step``, no MTP draft-extend) on the committed tiny model, against the same
server without speculation (LUMOTREE: its prefills without the MTP draft-extend too). Greedy, two batches: its
tokens must be the no-speculation server's,
token for token (the same decode kernels and graphs run). A batch asking for logprobs is served by
the one-node verify instead (GDN decode kernels in place; LUMOTREE_SUFFIX: its suffix tree); its tokens must
match closely."""
import json
import os
import re
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))

PROMPTS = ["import os\n", "def main():\n", "class Tree:\n", "# utils\n", "for i in range(", "return self."]


def serve(tmp_path, name, args):
    from sglang_server import generate, sglang_server

    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    # batches of 1 and 6 only: fewer graphs to capture; info level for the start-up line the test reads
    args = [*args, "--cuda-graph-max-bs", "8", "--log-level", "info"]
    with sglang_server(model, args, port=port, log=str(tmp_path / f"{name}.log"), timeout=400) as url:
        one = [generate(url, [p], 64)[0] for p in PROMPTS[:2]]
        batch = generate(url, PROMPTS, 64)
        logprob = generate(url, PROMPTS[:3], 64, extra={"return_logprob": True})
    outs = one + batch + logprob
    log = (tmp_path / f"{name}.log").read_text(errors="replace")
    return [o["output_ids"] for o in outs], [o["meta_info"] for o in outs], log


@pytest.fixture(scope="module")
def no_speculation(tmp_path_factory):
    return serve(tmp_path_factory.mktemp("none"), "none", [])


@pytest.mark.parametrize("algorithm", ["LUMOTREE", "LUMOTREE_SUFFIX"])
def test_no_draft_step_decodes_like_no_speculation(tmp_path, no_speculation, algorithm):
    """LUMOTREE (EAGLE V2 loop) and LUMOTREE_SUFFIX (NGRAM loop) alike."""
    cfg = tmp_path / "no_draft.json"
    cfg.write_text(json.dumps({"candidate_steps": [0]}))
    tree = (["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
             "--speculative-num-draft-tokens", "6"] if algorithm == "LUMOTREE" else
            ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-num-draft-tokens", "8"])
    tree += ["--speculative-adaptive-config", str(cfg)]
    ref, _, ref_log = no_speculation
    got, meta, log = serve(tmp_path, algorithm.lower(), tree)
    assert "no-draft steps run as decode steps" in log
    if algorithm == "LUMOTREE":  # its prefills skip the MTP draft-extend (no step drafts), their entries zeroed
        assert "prefills whose decode steps serve no draft skip the MTP draft-extend" in log
    from lumotree.sglang.patches import future_map_host_lengths as hl

    if algorithm == "LUMOTREE":  # on the Triton backends SGLang copies no host lengths: nothing to wait for
        assert hl.UNNEEDED_LINE in log and hl.SERVED_LINE not in log
    else:  # NGRAM's loop copies them: its batches took theirs from the host
        # (lumotree.sglang.patches.future_map_host_lengths), and the record's comparisons with SGLang's device copy
        # (the first 16 such batches, then every 64th) found no difference
        assert hl.SERVED_LINE in log and hl.UNNEEDED_LINE not in log
    assert "LumoTree: " + hl.MISMATCH_LINE not in log
    if algorithm == "LUMOTREE":  # its no-draft steps' stub draft inputs stay out of the FutureMap's buffers
        from lumotree.sglang.patches import future_map_cold_rows

        assert future_map_cold_rows.SERVED_LINE in log
        from lumotree.sglang import mtp_entries  # the MTP entries zeroed in the step's preparation launch

        assert mtp_entries.RAW_LINE in log and mtp_entries.POOL_LINE not in log
    if algorithm == "LUMOTREE":  # capacity as without speculation (lumotree.sglang.capacity)
        from lumotree.sglang.capacity import RUNNING, SLOTS_LINE

        def slots(text):
            return int(re.search(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)", text).group(1))

        def running(text):
            return int(re.search(r"max_running_requests=(\d+), context_len", text).group(1))

        assert SLOTS_LINE in log
        assert slots(log) >= 0.98 * slots(ref_log), (slots(log), slots(ref_log))  # (allocator noise aside)
        assert running(log) >= min(RUNNING, 0.98 * running(ref_log)), (running(log), running(ref_log))
    # its decode graphs are captured at the sizes the server without speculation captured (1, 2, 4, 8 here),
    # not at the speculative list's (1..8), so its batches pad as that server's do
    none_bs = re.search(r"Capture target decode CUDA graph begin\..*?bs=(\[[0-9, ]*\])", ref_log)
    lt_bs = re.search(r"no-draft steps run as decode steps \(decode CUDA graphs for batch sizes (\[[0-9, ]*\])", log)
    assert none_bs and lt_bs and json.loads(lt_bs.group(1)) == json.loads(none_bs.group(1)) == [1, 2, 4, 8], (
        none_bs and none_bs.group(1), lt_bs and lt_bs.group(1))
    assert all(m["completion_tokens"] == 64 for m in meta)
    plain = len(got) - 3
    # the prefill makes the first token, then one token per verify step: nothing was drafted (LUMOTREE_SUFFIX serves
    # the logprob batch its suffix tree, which drafts)
    pinned = meta if algorithm == "LUMOTREE" else meta[:plain]
    assert all(m.get("spec_verify_ct") == 63 for m in pinned), [m.get("spec_verify_ct") for m in meta]
    first_diff = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), len(r)) for r, g in zip(ref, got)]
    # decode steps: the no-speculation server's kernels and graphs, so its tokens exactly
    assert got[:plain] == ref[:plain], first_diff
    # the logprob batch: a one-node verify (LUMOTREE) or the suffix tree (LUMOTREE_SUFFIX): close, not necessarily
    # equal (the verify's attention kernel)
    same = [sum(a == b for a, b in zip(r, g)) for r, g in zip(ref[plain:], got[plain:])]
    assert min(first_diff[plain:]) >= 16 and sum(same) >= 0.9 * 3 * 64, (first_diff, same)
