"""Tree verify attention of a full-attention layer -- the definition (fp32, loop-clear).

A verify step of ``bs`` requests holds ``n`` draft-tree nodes per request, laid out request-major
(token ``b * n + i`` is node ``i`` of request ``b``). Node ``i`` of request ``b`` attends to

* every key of the request's prefix, read from the KV pool at ``kv_indices[kv_indptr[b] :
  kv_indptr[b + 1]]`` (the committed sequence, as SGLang's Triton backend lays it out), and
* the verify tokens ``j`` of the same request that are ancestors of ``i`` or ``i`` itself
  (``anc[b, i, j]``; ``anc=None``: a chain, ``j <= i``), whose keys and values are ``k``, ``v``.

Grouped-query attention as in Qwen3.5: query head ``h`` reads key/value head ``h // (Hq // Hkv)``.
"""
from __future__ import annotations

from typing import Optional

import torch


def tree_verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor,
                          v_buffer: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                          anc: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """Attention of the verify tokens over their prefix and their tree ancestors.

    Args:
        q (torch.Tensor): `[bs * n, Hq, D]` queries of the verify tokens.
        k (torch.Tensor): `[bs * n, Hkv, D]` their keys.
        v (torch.Tensor): `[bs * n, Hkv, Dv]` their values.
        k_buffer (torch.Tensor): `[slots, Hkv, D]` the KV pool's keys.
        v_buffer (torch.Tensor): `[slots, Hkv, Dv]` the KV pool's values.
        kv_indptr (torch.Tensor): `[bs + 1]` where each request's prefix slots start in ``kv_indices``.
        kv_indices (torch.Tensor): `[>= kv_indptr[bs]]` pool slots of the prefixes.
        anc (torch.Tensor, optional): `[bs, n, n]` ancestor-or-self mask (``anc[b, i, j]``: node ``j`` is
            ``i`` or an ancestor of it); ``None`` for chains (``j <= i``).
        scale (float, optional): softmax scale, default ``D ** -0.5``.

    Returns:
        torch.Tensor: `[bs * n, Hq, Dv]` in ``q``'s dtype.
    """
    bs = kv_indptr.shape[0] - 1
    T, Hq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    n = T // bs
    G = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty(T, Hq, Dv, dtype=torch.float32, device=q.device)
    idx = torch.arange(n, device=q.device)
    for b in range(bs):
        slots = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        keys = torch.cat([k_buffer[slots], k[b * n:(b + 1) * n]]).float()  # [L + n, Hkv, D]
        vals = torch.cat([v_buffer[slots], v[b * n:(b + 1) * n]]).float()
        tree = anc[b].bool() if anc is not None else idx[None, :] <= idx[:, None]  # [n (i), n (j)]
        seen = torch.cat([torch.ones(n, slots.numel(), dtype=torch.bool, device=q.device), tree], dim=1)
        for h in range(Hq):
            s = q[b * n:(b + 1) * n, h].float() @ keys[:, h // G].T * scale  # [n, L + n]
            p = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)
            out[b * n:(b + 1) * n, h] = p @ vals[:, h // G]
    return out.to(q.dtype)
