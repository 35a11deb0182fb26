"""Hook: SGLang's hybrid-GDN attention wrapper builds its linear-attention backend by class name.

Why: ``sglang.srt.layers.attention.attention_registry.attn_backend_wrapper`` (SGLang 0.5.17)
constructs ``GDNAttnBackend(runner)`` and ``HybridLinearAttnBackend(...)`` directly for every
hybrid GDN model; ``register_attention_backend`` only chooses the *full*-attention backend, and the
linear-attention model registry (``register_linear_attn_model``) is consulted only for models that
are not hybrid GDN. There is no registry entry for "the GDN state backend".

How: SGLang's own plugin ``HookRegistry`` (``HookType.REPLACE`` on a class) swaps both names for
LumoTree's subclasses (:mod:`lumotree.sglang.backend`); ``isinstance`` checks keep working. The
subclasses behave exactly like SGLang's unless the server runs ``--speculative-algorithm
LUMOTREE``, and the hook is only registered when ``LUMOTREE_SGLANG_ACTIVE=1`` (set by LUMOTREE's
server-argument handling), so other launches never see it.

Remove when: SGLang lets a plugin register the linear-attention (GDN) backend of hybrid models,
e.g. a ``register_linear_attn_backend("gdn", factory)`` consulted by ``attn_backend_wrapper``.
"""
from __future__ import annotations

TARGETS = {
    "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend": "LumoTreeGDNBackend",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend": "LumoTreeHybridBackend",
}


def install() -> None:
    from lumotree.sglang import backend
    from lumotree.sglang.patches import register_hook

    for target, name in TARGETS.items():
        register_hook(target, getattr(backend, name), "REPLACE")
