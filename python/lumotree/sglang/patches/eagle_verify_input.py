"""Hook: with ``LUMOTREE_SUFFIX_MERGE=1``, LUMOTREE's verify input carries MTP and suffix branches.

Why: SGLang 0.5.17's EAGLE V2 worker lays out its MTP draft tree as the verify input in the
module-level function ``build_eagle_verify_input`` (imported into ``eagle_worker_v2``), and no
registry lets a speculative algorithm add draft branches of its own.

How: SGLang's ``HookRegistry`` (function REPLACE) swaps the name ``build_eagle_verify_input`` in
``sglang.srt.speculative.eagle_worker_v2`` for a wrapper that calls SGLang's function, then rebuilds
the result in place from the MTP tree merged with the running requests' suffix drafts
(:mod:`lumotree.sglang.merge`). Registered only while a LUMOTREE server starts with the flag.

Remove when: SGLang lets a speculative algorithm supply or post-process its draft tree.
"""
from __future__ import annotations

TARGET = "sglang.srt.speculative.eagle_worker_v2.build_eagle_verify_input"


def wrap(original):
    """The replacement of ``build_eagle_verify_input`` around SGLang's ``original``."""
    from lumotree.sglang import merge

    def build_eagle_verify_input(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, *,
                                 target_worker, topk, num_steps, num_draft_tokens, tree_mask_mode, device):
        vi = original(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs,
                      target_worker=target_worker, topk=topk, num_steps=num_steps,
                      num_draft_tokens=num_draft_tokens, tree_mask_mode=tree_mask_mode, device=device)
        if batch.forward_mode.is_idle():
            return vi
        verify_mask = getattr(target_worker.model_runner.attn_backend, "verify_mask", None)
        mode, fill = (tree_mask_mode, True) if verify_mask is None else (verify_mask.mode, verify_mask.is_read)
        merge.state(num_draft_tokens, num_steps).merge(vi, batch.seq_lens, int(mode), [r.rid for r in batch.reqs],
                                            [merge.request_tokens(r) for r in batch.reqs], fill_mask=fill)
        return vi

    return build_eagle_verify_input


def install() -> None:
    from sglang.srt.speculative import eagle_worker_common

    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, wrap(eagle_worker_common.build_eagle_verify_input), "REPLACE")
