"""Hooks into SGLang that no registry covers yet: one target per file, each with why / how /
remove-when in its header. Installed only while a LUMOTREE server runs (``no_buffer_overlap``: in every
process, a no-op for other launches)."""
from __future__ import annotations

_installed = set()


def register_hook(target: str, hook, kind: str) -> None:
    """Register ``hook`` on ``target`` with SGLang's ``HookRegistry`` once per process (``kind``: a
    ``HookType`` name)."""
    if target in _installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(target, hook, getattr(HookType, kind))
    _installed.add(target)
