"""Reference of the state-row copy: what SGLang's extend path does to keep a tracked chunk state
(``HybridLinearAttnBackend._track_mamba_state_extend``: ``ssm_states[dst] = h[src].to(ssm_states.dtype)``). Plain torch
ops, the definition :mod:`lumotree.ops.state_rows.triton` is tested against.
"""
from __future__ import annotations

import torch


def copy_state_rows(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for every ``i``, cast to ``dst``'s dtype, in place.

    Args:
        src (torch.Tensor): `[S, *state]` states (a prefill's chunk states ``h``: `[chunks, Hv, V, K]`, the model's
            dtype; or the pool itself).
        src_rows (torch.Tensor): `[n]` integer rows of ``src``.
        dst (torch.Tensor): `[D, *state]` the state pool of one layer (`[slots, Hv, V, K]`, fp32), written in place.
        dst_rows (torch.Tensor): `[n]` integer rows of ``dst``, distinct.
    """
    if src_rows.numel():
        dst[dst_rows.long()] = src[src_rows.long()].to(dst.dtype)
