"""Hook: a LumoTree server's state slots sized as the same server's without speculation.

Why: SGLang 0.5.17 sizes a hybrid model's state pool in ``KVCacheConfigurator._handle_max_mamba_cache`` from the
memory left after the weights, and with the radix cache that pool caps the running requests at ``slots // 3``. A
speculative server's draft weights are counted first and the ring buffers of the pool layout LumoTree runs on
(``enable_linear_replayssm_spec``; LumoTree's backend releases them) are charged per slot, so it runs fewer requests at
once than no speculation: 54 against 64 on one H100 at the Qwen3.5-27B 32-layer shape, 0.65x no speculation at batch
64 where drafts miss (an H100 run before this hook). With it, on one H200: 473 slots and 157 running requests, as no
speculation (``benchmark/results/serving_speed_h200.json``). No registry lets a speculative algorithm size
the state pool.

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on the method), installed in the processes of a LUMOTREE or
LUMOTREE_SUFFIX server only: :func:`lumotree.sglang.capacity.size_state_slots` runs SGLang's sizing, then, where no
speculation would get more slots, sets that count (SGLang's runtime context, as its own sizing does) and runs
SGLang's sizing again with it, which charges the slots and returns what is left for the KV pool.

Remove when: SGLang sizes a speculative server's state slots without its draft weights (or lets a speculative
algorithm declare how its state pool is sized).
"""
from __future__ import annotations

TARGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache"


def handle_max_mamba_cache(original, self, total_rest_memory, *args, **kwargs):
    from lumotree.sglang.capacity import size_state_slots

    return size_state_slots(original, self, total_rest_memory, *args, **kwargs)


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, handle_max_mamba_cache, "AROUND")
