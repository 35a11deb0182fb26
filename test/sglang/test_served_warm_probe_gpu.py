"""GPU, end to end: a LUMOTREE server whose drafts miss serves no draft, and its probes of the chain start with a warm
no-draft step (SGLang's one-node verify and the MTP draft-extend, ``lumotree.sglang.adaptive.TreeSizePolicy._tree_run``)
instead of a cold drafted step. The committed tiny model with dummy weights (``--load-format dummy``: its MTP drafts
miss, as the serving benchmark's dummy 27B shape's do), probes every 8-16 steps (``--speculative-adaptive-config``),
greedy, batches 1 and 4, against the same dummy model served without speculation: the warm steps are served (the
worker's log line), every probe is decided, no traceback, and the tokens are no speculation's (the one-node verify and
the chain's verify compute what a decode step computes, up to the verify's attention kernel: close, as the one-node
verify of ``test_served_no_draft_gpu.py``)."""
import json
import os
import re
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))

PROMPTS = ["import os\n", "def main():\n", "class Tree:\n", "# utils\n"]
NEW = 96


def serve(tmp_path, name, args):
    from sglang_server import generate, sglang_server

    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    args = [*args, "--load-format", "dummy", "--cuda-graph-max-bs", "8", "--log-level", "info"]
    with sglang_server(model, args, port=port, log=str(tmp_path / f"{name}.log"), timeout=400) as url:
        outs = [generate(url, [p], NEW)[0] for p in PROMPTS[:2]] + generate(url, PROMPTS, NEW)
        outs += generate(url, PROMPTS, NEW)  # again: the probe interval has doubled to its cap by now
    log = (tmp_path / f"{name}.log").read_text(errors="replace")
    return [o["output_ids"] for o in outs], [o["meta_info"] for o in outs], log


def test_probes_of_a_chain_whose_drafts_miss_start_warm(tmp_path):
    ref, _, _ = serve(tmp_path, "none", [])
    cfg = tmp_path / "probe_often.json"
    cfg.write_text(json.dumps({"candidate_steps": [0, 3], "probe_every": 8, "probe_max": 16, "probe_budget": 0.5}))
    got, meta, log = serve(tmp_path, "lumotree", [
        "--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--speculative-adaptive-config", str(cfg)])
    assert "Traceback" not in log
    warm = [int(n) for n in re.findall(r"LumoTree adaptive: (\d+) warm no-draft steps", log)]
    assert warm and warm[0] == 1, warm  # the first warm step was served (the line repeats at 64, then every 1024)
    probes = len(re.findall(r"LumoTree adaptive: batch bucket \d+ -> .* after a probe", log))
    assert probes >= 4, probes
    assert not re.search(r"batch bucket \d+ -> 3-step tree", log)  # the drafts miss: no bucket serves the chain
    assert all(m["completion_tokens"] == NEW for m in meta)
    first_diff = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), len(r)) for r, g in zip(ref, got)]
    same = [sum(a == b for a, b in zip(r, g)) for r, g in zip(ref, got)]
    assert min(first_diff) >= 16 and sum(same) >= 0.9 * len(ref) * NEW, (first_diff, same)
