"""A no-draft decode step's inputs from a speculative batch: ``naive.py`` (torch ops, the definition) and
``triton.py`` (one launch); :mod:`lumotree.ops` dispatches between them."""
