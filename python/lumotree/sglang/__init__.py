"""LumoTree as an SGLang 0.5.17 plugin (entry point ``sglang.srt.plugins: lumotree``).

- :mod:`lumotree.sglang.plugin` -- ``register()``: the ``LUMOTREE`` speculative algorithm, its
  server-argument validation and configuration.
- :mod:`lumotree.sglang.backend` -- the hybrid GDN state backend: tree verify without per-node
  snapshots, accepted-path replay commit into SGLang's state pool.
- :mod:`lumotree.sglang.worker`, :mod:`lumotree.sglang.adaptive` -- the LUMOTREE tree worker and its
  adaptive tree size (the configured tree or no draft, per decode step, from measured step times).
- :mod:`lumotree.sglang.scheduling` -- which scheduler and state cache a server runs with the radix cache
  (SGLang's overlap scheduler with ``no_buffer``; the synchronous one where the finished-row skip does not apply).
- :mod:`lumotree.sglang.select` -- LumoTree's fused selection in SGLang's greedy-verify format.
- :mod:`lumotree.sglang.suffix`, :mod:`lumotree.sglang.oracle` -- model-free drafting
  (``LUMOTREE_SUFFIX``) and the benchmark-only controlled-acceptance drafter;
  :mod:`lumotree.sglang.draft_oracle` -- benchmark-only controlled acceptance on the MTP draft loop.
- :mod:`lumotree.sglang.patches` -- the hooks SGLang's registries cannot express yet, one target
  per file (why / how / remove-when in each header).

Nothing here is imported by ``import lumotree``; SGLang imports ``plugin`` through the entry point.
"""
