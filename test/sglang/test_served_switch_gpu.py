"""GPU, end to end: a LUMOTREE chain server whose adaptive tree size switches between no draft and the chain every
few steps (``--speculative-adaptive-config`` with probes every 2-4 steps) answers, in the decode-exact mode
(``--enable-deterministic-inference``), token for token as the no-speculation server in the same mode does.

Why: every switch runs a step of one kind on state the other kind left -- a drafted step's verify and commit on the
GDN state, conv window and KV cache that no-draft decode steps wrote (its draft from a skipped draft-extend's zero
stub), a no-draft decode step on what a commit wrote -- and requests end on either kind. The served tables switch
rarely (a probe every 128 steps and more); here nearly every step is a switch, on repetitive prompts (the tiny
model's MTP head accepts) and on prose (it mostly misses), one request and batches of 2, 4 and 8.

On the GPU machine: ``pytest -q -m gpu test/sglang/test_served_switch_gpu.py``."""
import json
import os
import re
import sys

import pytest

pytestmark = pytest.mark.gpu
sys.path.insert(0, os.path.dirname(__file__))
from test_served_suffix_sizes_gpu import EXACT, PROMPTS, serve  # noqa: E402  (tiny model, exact mode, batches 1-8)

PROSE = ["The committee met on a rainy Tuesday to discuss ", "Rivers carry sediment from mountains toward ",
         "In the old market, traders argued about ", "A quiet morning: the baker opened his shop and "]
MIXED = [p for pair in zip(PROMPTS[:4], PROSE) for p in pair]  # repetitive and prose, alternating
CHAIN = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]
SWITCHY = {"candidate_steps": [0, 3], "ema": 0.5, "probe_every": 2, "probe_max": 4, "probe_budget": 0.5,
           "drop_z": 0.0, "floor_first": False}


def test_exact_mode_replies_through_switches_between_no_draft_and_the_chain_are_token_identical(tmp_path):
    cfg = tmp_path / "switchy.json"
    cfg.write_text(json.dumps(SWITCHY))
    ref, _, ref_log = serve(tmp_path, "none-exact", EXACT, {}, MIXED)
    got, meta, log = serve(tmp_path, "switchy-exact", CHAIN + EXACT + ["--speculative-adaptive-config", str(cfg)], {},
                           MIXED)
    assert "Traceback" not in log and "Traceback" not in ref_log
    assert "no-draft steps run as decode steps" in log
    on = len(re.findall(r"Switch adaptive runtime state: steps 0 -> 3", log))
    off = len(re.findall(r"Switch adaptive runtime state: steps 3 -> 0", log))
    assert on >= 8 and off >= 8, (on, off)  # the switches this test is about did happen
    assert all(m["completion_tokens"] == 64 for m in meta)
    assert got == ref, [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(ref, got)]
