"""The device finish rule of :mod:`lumotree.sglang.finish`: ``naive.py`` (torch ops, the definition)
and ``triton.py`` (one launch each); :mod:`lumotree.ops` dispatches between them."""
