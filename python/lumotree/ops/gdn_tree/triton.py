"""The GDN tree ops as Triton kernels: same signatures and contracts as ``naive.py``.

* :func:`gdn_tree_verify` -- the mix verify (:mod:`.verify`; the form the SGLang backend serves)
  for trees of up to ``MIX_MAX_NODES`` nodes, the boundary-state walk beyond (up to 255);
* :func:`gdn_tree_commit` -- the replay commit (:mod:`.commit`).

Kernels and their launchers live in :mod:`.verify` and :mod:`.commit`, their shared Triton
helpers in :mod:`.tiles`; the SGLang backend calls the launchers directly
(:func:`gdn_tree_mix_verify_fwd`, :func:`gdn_tree_commit_layers_fwd`).
"""
from __future__ import annotations

from typing import Optional

import torch

from lumotree.ops.gdn_tree.commit import gdn_tree_commit_fwd, gdn_tree_commit_layers_fwd
from lumotree.ops.gdn_tree.common import check_accept, check_gdn_inputs
from lumotree.ops.gdn_tree.tiles import check_kernel_state
from lumotree.ops.gdn_tree.verify import MIX_MAX_NODES, gdn_tree_mix_verify_fwd, gdn_tree_walk_verify_fwd
from lumotree.tree import TreeDescriptor

__all__ = ["gdn_tree_verify", "gdn_tree_commit", "gdn_tree_mix_verify_fwd", "gdn_tree_walk_verify_fwd",
           "gdn_tree_commit_fwd", "gdn_tree_commit_layers_fwd", "MIX_MAX_NODES"]


def gdn_tree_verify(q, k, v, g, beta, state, tree: TreeDescriptor, scale: Optional[float] = None,
                    use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None):
    """Tree verify (Triton). Same contract as :func:`lumotree.ops.gdn_tree.naive.gdn_tree_verify`;
    returns ``o`` in q's dtype (padding nodes zero)."""
    check_gdn_inputs(q, k, v, g, beta, state, tree, state_indices)
    check_kernel_state(state)
    out = torch.zeros(*v.shape, dtype=q.dtype, device=q.device)
    fwd = gdn_tree_mix_verify_fwd if k.shape[1] <= MIX_MAX_NODES else gdn_tree_walk_verify_fwd
    return fwd(q, k, v, state, tree, g, beta, scale=scale, use_qk_l2norm=use_qk_l2norm,
               state_indices=state_indices, out=out)


def gdn_tree_commit(k, v, g, beta, state, tree: TreeDescriptor, accept_nodes, accept_len,
                    use_qk_l2norm: bool = False, state_indices: Optional[torch.Tensor] = None,
                    track_rows: Optional[torch.Tensor] = None, track_len: Optional[torch.Tensor] = None):
    """Accepted-path replay commit (Triton), in place on ``state`` (or pool rows ``state_indices``)."""
    B, N, *_ = check_gdn_inputs(None, k, v, g, beta, state, tree, state_indices)
    check_accept(accept_nodes, accept_len, B, N)
    check_kernel_state(state)
    return gdn_tree_commit_fwd(k, v, state, accept_nodes, accept_len, g, beta, use_qk_l2norm=use_qk_l2norm,
                               state_indices=state_indices, track_rows=track_rows, track_len=track_len)
