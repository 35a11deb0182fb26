"""Hook: the radix cache takes a prefill's prompt-interior state (:mod:`lumotree.sglang.prompt_state`).

Why: SGLang's hybrid-model radix cache (``UnifiedRadixCache`` with its Mamba component; ``MambaRadixCache``
where that is chosen) with the ``no_buffer`` strategy inserts a request's state at the end of its
prompt (``cache_unfinished_req``) and of the request (``cache_finished_req``) only; the state an extend tracked for
the prompt's first ``T`` tokens has no caller.

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on both methods of both classes): after SGLang's, where the request carries a
tracked state, :func:`lumotree.sglang.prompt_state.commit` inserts it at ``T`` where that key is in the tree whole and
has no state (``prev_prefix_len = T``: no KV freed, no node takes KV), else frees the slot. Requests without one pass
through with one attribute read. Installed only while a LumoTree server runs.

Remove when: :mod:`lumotree.sglang.patches.prompt_state_batch` goes.
"""
from __future__ import annotations

from lumotree.sglang.prompt_state import ATTR, commit

CLASSES = ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache",
           "sglang.srt.mem_cache.mamba_radix_cache.MambaRadixCache")


def cache_unfinished_req(original, self, req, *args, **kwargs):
    out = original(self, req, *args, **kwargs)
    if getattr(req, ATTR, None) is not None:
        commit(self, req)
    return out


def cache_finished_req(original, self, req, *args, **kwargs):
    out = original(self, req, *args, **kwargs)
    if getattr(req, ATTR, None) is not None:
        commit(self, req)
    return out


def install() -> None:
    from lumotree.sglang.patches import register_hook

    for cls in CLASSES:
        register_hook(cls + ".cache_unfinished_req", cache_unfinished_req, "AROUND")
        register_hook(cls + ".cache_finished_req", cache_finished_req, "AROUND")
