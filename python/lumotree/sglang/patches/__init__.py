"""Hooks into SGLang that no registry covers yet: one target per file, each with why / how /
remove-when in its header. Installed only while a LUMOTREE server runs, except four in every process:
``no_buffer_overlap`` (a no-op for other launches), ``prefill_delayer_gather``, ``prefill_delayer_idle`` and
``prefill_delayer_early`` (no-ops for servers without SGLang's prefill delayer)."""
from __future__ import annotations

_installed = set()  # (target, the hook's module, its qualified name)


def _key(target: str, hook) -> tuple:
    return target, getattr(hook, "__module__", None), getattr(hook, "__qualname__", repr(hook))


def register_hook(target: str, hook, kind: str) -> None:
    """Register ``hook`` on ``target`` with SGLang's ``HookRegistry`` once per process (``kind``: a
    ``HookType`` name). Once per hook, not per target: several of LumoTree's hooks wrap one SGLang function
    (``eagle_sample``: the end-of-request clamp, the benchmark's acceptance oracle and its step timer), and SGLang
    composes them; keyed by target alone, the first one registered silently dropped the others."""
    key = _key(target, hook)
    if key in _installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(target, hook, getattr(HookType, kind))
    _installed.add(key)


def forget(*targets: str) -> None:
    """Let the hooks on ``targets`` register again (tests that restore SGLang's registry)."""
    _installed.difference_update({k for k in _installed if k[0] in targets})
