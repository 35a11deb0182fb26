"""Hook: the EAGLE draft tree that SGLang selects keeps every selected node's parent.

Why: SGLang 0.5.17's ``organize_draft_results`` (``sglang.srt.speculative.eagle_utils``) picks a
tree's nodes as the ``num_draft_tokens - 1`` best cumulative scores (parent score x child probability)
with ``torch.topk``. A child's score is at most its parent's, but it can *equal* it -- a probability
that is 1.0 in fp32 (a confident model), or scores that are all 0 (a probability that underflows; a
draft from a stub) -- and ``torch.topk`` breaks such ties in no defined order, so it can keep a child
and drop its parent. SGLang's ``build_tree`` kernel then prints "invalid eagle tree" for the orphan on
one thread while its other threads' walk towards the root never ends (it has no not-found check): the
GPU stream hangs, and with it the server. This was seen on a LUMOTREE server.

How: SGLang's ``HookRegistry`` (``HookType.AROUND``, propagated to the workers that imported the
function by name): the same selection on keys that break exact ties towards the shallower node
(:func:`tie_break_keys`); wherever scores differ they order the nodes as the scores do, so the tree is
SGLang's whenever it had no tie, and whole always. Static shapes, no host sync (it runs inside the
draft CUDA graphs). Registered only while a LUMOTREE server starts.

Remove when: SGLang's tree selection (or its ``build_tree`` kernel) handles ties and orphans.
"""
from __future__ import annotations

import torch

TARGET = "sglang.srt.speculative.eagle_utils.organize_draft_results"

_SHRINK = 1.0 - 1e-12  # per depth level: far above float64's resolution, far below fp32's gaps between scores
_FLOOR = 1e-300  # per depth level, for scores that are 0 (float64 normal numbers reach 2.2e-308)


def tie_break_keys(score_list):
    """float64 selection keys of SGLang's per-step score tensors (``score_list[i]``: the step-``i``
    candidates' scores, ``[b, 1, topk]`` then ``[b, topk, topk]``): ``score * SHRINK**i - i * FLOOR``.
    A child (step ``i + 1``, score <= its parent's) always keys strictly below its parent; two scores
    that differ (fp32: relative gaps >= 2**-24) keep their order; NaN counts as 0."""
    keys = []
    for i, s in enumerate(score_list):
        s = torch.nan_to_num(s.double(), nan=0.0, posinf=1.0, neginf=0.0)
        keys.append(s * (_SHRINK ** i) - i * _FLOOR)
    return keys


def organize_whole(original, score_list, token_list, parents_list, num_draft_token, *args, **kwargs):
    return original(tie_break_keys(score_list), token_list, parents_list, num_draft_token, *args, **kwargs)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, organize_whole, "AROUND")
