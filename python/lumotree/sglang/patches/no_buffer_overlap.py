"""Hook: SGLang's server-argument check that refuses the ``no_buffer`` state cache with the overlap scheduler.

Why: ``ServerArgs._validate_mamba_no_buffer`` (SGLang 0.5.17) asserts ``disable_overlap_schedule``
for ``--mamba-radix-cache-strategy no_buffer``, because under overlap a finished request's state slot
takes one more decode step before it is cached. A LUMOTREE, LUMOTREE_SUFFIX or LUMOTREE_ORACLE server
skips exactly that step for the rows it finished (:mod:`lumotree.sglang.finish`), so for it the pairing
is consistent; there is no registry entry for such a check.

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on the method): for server arguments that ask
for LumoTree's overlap-consistent cache (:func:`lumotree.sglang.scheduling.overlap_applies`) the
check runs on a view that reads the overlap scheduler as off; every other launch gets SGLang's
check unchanged. Registered in every process (the check runs while the launcher parses arguments,
before the LUMOTREE backend hooks are installed).

Remove when: SGLang lets a speculative algorithm declare that it keeps ``no_buffer`` states
consistent under overlap (e.g. a ``supports_no_buffer_overlap`` flag on ``SpeculativeAlgorithm.register``).
"""
from __future__ import annotations

TARGET = "sglang.srt.server_args.ServerArgs._validate_mamba_no_buffer"


class _SynchronousView:
    """``view`` with ``disable_overlap_schedule`` read as True; every other field as ``view`` has it."""

    def __init__(self, view):
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        if name == "disable_overlap_schedule":
            return True
        return getattr(self._view, name)


def validate_no_buffer(original, self, view, *args, **kwargs):
    from lumotree.sglang.scheduling import overlap_applies

    if overlap_applies(view) or overlap_applies(self):
        return original(self, _SynchronousView(view), *args, **kwargs)
    return original(self, view, *args, **kwargs)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, validate_no_buffer, "AROUND")
