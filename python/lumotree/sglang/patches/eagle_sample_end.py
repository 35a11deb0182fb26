"""Hook: the accepted run of a LUMOTREE / LUMOTREE_SUFFIX verify ends at the request's end.

Why: SGLang 0.5.17's ``eagle_sample`` (``sglang.srt.speculative.eagle_utils``) returns each request's
accepted run without regard to where the request ends; the host trims the output past a stop token or
``max_new_tokens``, but the KV cache and the GDN state (the commit replays the whole run) keep the
tokens after it, so a finished request's cached state holds tokens past its key
(:mod:`lumotree.sglang.finish`). There is no registry for the acceptance step.

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on the function; SGLang propagates the patch to
``eagle_worker_common``, which imported it by name): after SGLang's sampling,
:meth:`lumotree.sglang.finish.FinishedRows.clamp_run` cuts each run at its first finishing token, for
the requests the LUMOTREE and LUMOTREE_SUFFIX workers admitted into the pool's table (other servers have none: unchanged).
Registered only while a LUMOTREE server starts (``LUMOTREE_SGLANG_ACTIVE=1``).

Remove when: SGLang stops a request's accepted run at its end (a stop-token / length clamp in
``eagle_sample``), or lets a speculative algorithm post-process its acceptance.
"""
from __future__ import annotations

TARGET = "sglang.srt.speculative.eagle_utils.eagle_sample"


def eagle_sample_end(original, verify_input, batch, *args, **kwargs):
    predict, accept_lens, accept_index = original(verify_input, batch, *args, **kwargs)
    rows = getattr(batch.req_to_token_pool, "lumotree_finished", None)
    if rows is None or batch.forward_mode.is_idle() or accept_index.numel() == 0:
        return predict, accept_lens, accept_index
    accept_lens = rows.clamp_run(batch.req_pool_indices, batch.seq_lens, predict, accept_lens, accept_index)
    return predict, accept_lens, accept_index


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, eagle_sample_end, "AROUND")
