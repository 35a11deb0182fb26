"""Hook: greedy tree verification of LUMOTREE servers runs LumoTree's fused selection op.

Why: SGLang 0.5.17's EAGLE and NGRAM workers call the module-level function
``sglang.srt.speculative.eagle_utils.verify_tree_greedy_func`` from ``eagle_sample``; there is no
registry for the acceptance step of a speculative algorithm.

How: SGLang's ``HookRegistry`` (function REPLACE) swaps it for
:func:`lumotree.sglang.select.verify_tree_greedy`, which has the same signature and outputs
(checked against SGLang's own kernel in ``test/sglang/test_select_adapter.py``). Registered only
while a LUMOTREE server starts (``LUMOTREE_SGLANG_ACTIVE=1``); ``LUMOTREE_SGLANG_SELECT=0`` keeps
SGLang's function. Sampled (non-greedy) verification stays SGLang's.

Remove when: SGLang lets a speculative algorithm supply its own acceptance function.
"""
from __future__ import annotations

import os

TARGET = "sglang.srt.speculative.eagle_utils.verify_tree_greedy_func"


def install() -> None:
    if os.environ.get("LUMOTREE_SGLANG_SELECT", "1") == "0":
        return
    from lumotree.sglang.patches import register_hook
    from lumotree.sglang.select import verify_tree_greedy

    register_hook(TARGET, verify_tree_greedy, "REPLACE")
