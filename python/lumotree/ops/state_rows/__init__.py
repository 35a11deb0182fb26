"""Copying whole state rows between a prefill's chunk states and the state pool (a prompt-interior state kept for the
radix cache, :mod:`lumotree.sglang.prompt_state`): ``naive.py`` (torch indexing, the definition) and ``triton.py``
(one launch); :mod:`lumotree.ops` dispatches between them."""
