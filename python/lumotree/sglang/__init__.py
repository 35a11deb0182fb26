"""LumoTree as an SGLang 0.5.17 plugin (entry point ``sglang.srt.plugins: lumotree``).

- :mod:`lumotree.sglang.plugin` -- ``register()``: the ``LUMOTREE`` speculative algorithm, its
  server-argument validation and configuration.
- :mod:`lumotree.sglang.backend` -- the hybrid GDN state backend: tree verify without per-node
  snapshots, accepted-path replay commit into SGLang's state pool.
- :mod:`lumotree.sglang.patches` -- the one class-replacement hook SGLang's registries cannot
  express yet (why / how / remove-when in its header).

Nothing here is imported by ``import lumotree``; SGLang imports ``plugin`` through the entry point.
"""
