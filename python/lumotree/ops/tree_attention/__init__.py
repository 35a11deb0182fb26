"""Tree verify attention of a full-attention layer: ``naive.py`` (fp32, the definition) and ``triton.py``
(split prefix + tree merge, two launches); :mod:`lumotree.ops` dispatches between them."""
