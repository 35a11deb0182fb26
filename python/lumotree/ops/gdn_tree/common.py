"""Input checks shared by the GDN tree ops (reference and kernels); one place, one message style."""
from __future__ import annotations

from typing import Optional

import torch

from lumotree.tree import TreeDescriptor

L2NORM_EPS = 1e-6  # x / sqrt(sum(x^2) + eps): the same formula as SGLang's fused GDN kernels


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def check_tree(tree, B: int, N: int, name: str = "tree") -> None:
    if not isinstance(tree, TreeDescriptor):
        raise ValueError(f"{name} must be a lumotree.TreeDescriptor, got {type(tree).__name__}")
    if tuple(tree.parents.shape) != (B, N):
        raise ValueError(f"{name} describes [B, N] = {tuple(tree.parents.shape)} but the inputs are [{B}, {N}]")


def check_state(state: torch.Tensor, state_indices: Optional[torch.Tensor], B: int, Hv: int,
                V: int, K: int) -> None:
    if state.dim() != 4 or tuple(state.shape[1:]) != (Hv, V, K):
        raise ValueError(f"state must be [pool, Hv, V, K] = [*, {Hv}, {V}, {K}], got {tuple(state.shape)}")
    if state.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"state must be float32 (SGLang's GDN pool dtype), got {state.dtype}")
    if state_indices is None:
        if state.shape[0] != B:
            raise ValueError(f"state has {state.shape[0]} rows for a batch of {B}; pass state_indices "
                             "to address rows of a larger pool")
    else:
        if state_indices.dim() != 1 or state_indices.shape[0] != B:
            raise ValueError(f"state_indices must be [B] = [{B}], got {tuple(state_indices.shape)}")
        if state_indices.dtype.is_floating_point:
            raise ValueError(f"state_indices must be integer, got {state_indices.dtype}")


def check_gdn_inputs(q: Optional[torch.Tensor], k, v, g, beta, state, tree, state_indices):
    """Validate shapes; returns (B, N, Hk, Hv, K, V)."""
    if k.dim() != 4:
        raise ValueError(f"k must be [B, N, Hk, K], got {tuple(k.shape)}")
    B, N, Hk, K = k.shape
    if q is not None and tuple(q.shape) != (B, N, Hk, K):
        raise ValueError(f"q must match k's [B, N, Hk, K] = {(B, N, Hk, K)}, got {tuple(q.shape)}")
    if v.dim() != 4 or tuple(v.shape[:2]) != (B, N):
        raise ValueError(f"v must be [B, N, Hv, V] with [B, N] = {(B, N)}, got {tuple(v.shape)}")
    Hv, V = v.shape[2], v.shape[3]
    if Hv % Hk != 0:
        raise ValueError(f"GQA needs Hv % Hk == 0, got Hv={Hv}, Hk={Hk}")
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (B, N, Hv):
            raise ValueError(f"{name} must be [B, N, Hv] = {(B, N, Hv)}, got {tuple(t.shape)}")
    check_tree(tree, B, N)
    check_state(state, state_indices, B, Hv, V, K)
    devs = {t.device for t in (k, v, g, beta, state, tree.parents) + ((q,) if q is not None else ())}
    if len(devs) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devs))}")
    return B, N, Hk, Hv, K, V


def check_accept(accept_nodes: torch.Tensor, accept_len: torch.Tensor, B: int, N: int) -> None:
    if accept_nodes.dim() != 2 or accept_nodes.shape[0] != B or accept_nodes.shape[1] > N:
        raise ValueError(f"accept_nodes must be [B, <=N] = [{B}, <={N}], got {tuple(accept_nodes.shape)}")
    if tuple(accept_len.shape) != (B,):
        raise ValueError(f"accept_len must be [B] = [{B}], got {tuple(accept_len.shape)}")


def check_accept_is_root_path(tree: TreeDescriptor, accept_nodes, accept_len) -> None:
    """Host-side check (CPU reference only): each accepted list is root -> descendant, parent by parent."""
    an, al, par = accept_nodes.cpu(), accept_len.cpu(), tree.parents.cpu()
    for b in range(an.shape[0]):
        L = int(al[b])
        if not 0 <= L <= an.shape[1]:
            raise ValueError(f"accept_len[{b}] = {L} is outside [0, {an.shape[1]}]")
        prev = -1
        for j in range(L):
            node = int(an[b, j])
            if not 0 <= node < par.shape[1] or int(par[b, node]) != prev or (j > 0 and node == 0):
                raise ValueError(f"accept_nodes[{b}, {j}] = {node} is not a child of the previous accepted "
                                 f"node {prev}: accepted nodes must form a path from the root")
            prev = node
