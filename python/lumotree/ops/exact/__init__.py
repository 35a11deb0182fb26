"""Decode-exact tree verify: every node of a draft tree computed with the *same arithmetic* as
SGLang 0.5.17's one-token decode at that position, so that a speculative server under
``--enable-deterministic-inference`` reproduces the non-speculative server bit for bit.

``naive.py`` is the definition (the decode recurrence along each node's root path, the per-node
decode conv windows, the per-node KV lists); ``triton.py`` the kernels the served verify runs.
"""
