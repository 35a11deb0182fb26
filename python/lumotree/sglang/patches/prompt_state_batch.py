"""Hook: an extend batch of a LumoTree server with the ``no_buffer`` state cache keeps one prompt-interior state.

Why: SGLang's ``no_buffer`` cache keeps GDN states only at prompt and request ends, so a prompt sent again (SGLang
reuses at most all but its last token) or a prefix shared by different requests is prefilled whole
(:mod:`lumotree.sglang.prompt_state`). SGLang fills ``ScheduleBatch.mamba_track_*`` for its extend path only with the
``extra_buffer`` cache, which LumoTree's servers leave off (:mod:`lumotree.sglang.scheduling`).

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on ``ScheduleBatch.prepare_for_extend``): after SGLang's method,
:func:`lumotree.sglang.prompt_state.prepare_extend` takes a state slot per request with a track position and sets the
batch's ``mamba_track_*``; SGLang's own extend path (``HybridLinearAttnBackend._init_track_ssm_indices``) copies the
chunk state there. Installed only while a LUMOTREE, LUMOTREE_SUFFIX or LUMOTREE_ORACLE server runs; a no-op unless
:func:`lumotree.sglang.prompt_state.applies`.

Remove when: SGLang's ``no_buffer`` strategy tracks a prompt-interior state itself (or ``extra_buffer`` serves
speculative requests states equal to a fresh prefill's).
"""
from __future__ import annotations

TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
_applies = None


def _on() -> bool:
    global _applies
    if _applies is None:
        from sglang.srt.runtime_context import get_server_args

        from lumotree.sglang.prompt_state import applies

        _applies = applies(get_server_args())
    return _applies


def prepare_for_extend(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    if _on():
        from lumotree.sglang.prompt_state import prepare_extend

        prepare_extend(self)
    return out


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, prepare_for_extend, "AROUND")
