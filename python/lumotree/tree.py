"""`TreeDescriptor`: the one description of a draft tree that every LumoTree stage reads.

A draft tree of a request has ``N`` node slots. Node 0 is the *root*: the last sampled token, not
yet run through the model. ``parents[b, i]`` is node ``i``'s parent (``-1`` for the root) and
``0 <= parents[b, i] < i`` for every other node, so node indices are a topological order.
``num_nodes[b]`` allows ragged batches: nodes ``i >= num_nodes[b]`` are padding.

Path decomposition (what the verify kernel walks)
-------------------------------------------------
Every node continues the path of its parent if it is the parent's *first* (lowest-index) child;
any other child is the *head* of a new path. A node with two or more children is a *boundary*
node: the state after it is needed by the paths that start at its later children, so it is the
only state that is ever materialised. Laid out in depth-first preorder (first child first), each
path is a contiguous run of ``order`` that starts at its head, and a boundary node's state is
still needed only while the walk is inside its subtree. Two live boundary nodes are therefore
always at different depths, so ``slot = depth`` is a collision-free scratch index and the scratch
holds at most ``max depth`` states per (request, head) tile -- not one per node.

Everything here is built with static-shaped tensor ops (no host synchronisation) when
``validate=False``; the default ``validate=True`` checks the input and raises ``ValueError``
naming the first bad element (this needs one device->host copy).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

__all__ = ["TreeDescriptor", "ancestor_mask", "parents_from_eagle"]


@dataclasses.dataclass(frozen=True)
class TreeDescriptor:
    """A batch of draft trees and everything derived from it.

    Attributes (all `[B, N]` unless noted; padding nodes hold the value in brackets):
        parents: parent index, -1 for the root [-1].
        num_nodes: `[B]` number of real nodes per tree.
        valid: node is real [False].
        depth: distance from the root; a node's position is ``seq_len + depth`` [0].
        mask: `[B, N, N]` bool, ``mask[b, i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``
            (the tree attention mask) [padding rows see only themselves].
        first_child, next_sibling: SGLang's ``retrieve_next_token`` / ``retrieve_next_sibling`` [-1].
        num_children: number of children [0].
        is_boundary: node has >= 2 children: its state is materialised [False].
        is_head: node starts a path (the root, or a non-first child) [False].
        order: depth-first preorder, first child first; ``order[b, t]`` is the node visited t-th.
            Paths are contiguous runs of it. Padding nodes come last, in index order.
        preorder: inverse permutation of ``order``.
        path_id: index (in ``order``) of the path a node belongs to [-1].
        num_paths: `[B]` number of paths (= number of leaves).
        num_boundaries: `[B]` number of boundary nodes.
    """

    parents: torch.Tensor
    num_nodes: torch.Tensor
    valid: torch.Tensor
    depth: torch.Tensor
    mask: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    num_children: torch.Tensor
    is_boundary: torch.Tensor
    is_head: torch.Tensor
    order: torch.Tensor
    preorder: torch.Tensor
    path_id: torch.Tensor
    num_paths: torch.Tensor
    num_boundaries: torch.Tensor

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_parents(cls, parents, num_nodes=None, validate: bool = True) -> "TreeDescriptor":
        """Build the descriptor from `parents: [B, N]` (or `[N]`) and optional `num_nodes: [B]`."""
        parents = torch.as_tensor(parents)
        if parents.dim() == 1:
            parents = parents.unsqueeze(0)
        if parents.dim() != 2 or parents.shape[1] < 1:
            raise ValueError(f"parents must be [B, N] with N >= 1, got shape {tuple(parents.shape)}")
        if parents.dtype.is_floating_point or parents.dtype == torch.bool:
            raise ValueError(f"parents must be an integer tensor, got {parents.dtype}")
        parents = parents.long()
        B, N = parents.shape
        dev = parents.device
        if num_nodes is None:
            num_nodes = torch.full((B,), N, dtype=torch.long, device=dev)
        else:
            num_nodes = torch.as_tensor(num_nodes, device=dev).long().reshape(-1)
            if num_nodes.numel() != B:
                raise ValueError(f"num_nodes has {num_nodes.numel()} entries for a batch of {B}")
        if validate:
            _validate(parents, num_nodes)
        return cls._build(parents, num_nodes)

    @classmethod
    def _build(cls, parents: torch.Tensor, num_nodes: torch.Tensor) -> "TreeDescriptor":
        B, N = parents.shape
        dev = parents.device
        idx = torch.arange(N, device=dev)
        valid = idx[None, :] < num_nodes[:, None]
        par = torch.where(valid & (idx[None, :] > 0), parents, torch.full_like(parents, -1))
        mask, edge = _closure(par, valid)
        depth = torch.where(valid, mask.sum(-1) - 1, torch.zeros_like(par))
        is_child = edge  # [B, i, j]: j is i's parent
        num_children = is_child.sum(1)
        first_child, next_sibling = eagle_links(par, valid)
        same_parent = (par[:, :, None] == par[:, None, :]) & valid[:, :, None] & valid[:, None, :]
        same_parent &= (idx[None, :, None] > 0) & (idx[None, None, :] > 0)
        # Preorder (first child first): pre(i) = sum over ancestors-or-self a of off(a),
        # off(a) = 1 + total size of a's earlier siblings' subtrees, off(root) = 0.
        size = (mask & valid[:, :, None]).sum(1)  # subtree size of j
        earlier = same_parent & (idx[None, None, :] < idx[None, :, None])
        off = 1 + (earlier.long() * size[:, None, :]).sum(-1)
        off = torch.where(valid & (idx[None, :] > 0), off, torch.zeros_like(off))
        pre = (mask.long() * off[:, None, :]).sum(-1)
        pre = torch.where(valid, pre, idx[None, :].expand(B, N))
        order = torch.zeros_like(pre).scatter_(1, pre, idx[None, :].expand(B, N).contiguous())  # a permutation when valid
        pfc = first_child.gather(1, par.clamp(min=0))
        is_head = valid & ((idx[None, :] == 0) | (pfc != idx[None, :]))
        head_in_order = is_head.gather(1, order)
        path_in_order = head_in_order.long().cumsum(1) - 1
        path_id = torch.where(valid, path_in_order.gather(1, pre), torch.full_like(pre, -1))
        is_boundary = valid & (num_children >= 2)
        return cls(
            parents=par, num_nodes=num_nodes, valid=valid, depth=depth, mask=mask,
            first_child=first_child, next_sibling=next_sibling, num_children=num_children,
            is_boundary=is_boundary, is_head=is_head, order=order, preorder=pre, path_id=path_id,
            num_paths=is_head.sum(-1), num_boundaries=is_boundary.sum(-1),
        )

    # ------------------------------------------------------------------ shape helpers
    @property
    def batch_size(self) -> int:
        return self.parents.shape[0]

    @property
    def max_nodes(self) -> int:
        return self.parents.shape[1]

    @property
    def device(self) -> torch.device:
        return self.parents.device

    def num_slots(self) -> int:
        """Boundary-state slots a verify needs per (request, head): 1 + deepest boundary depth.

        Host-synchronising; kernels inside CUDA graphs take a static bound instead (the tree's
        maximum depth, e.g. ``speculative_num_steps``)."""
        d = torch.where(self.is_boundary, self.depth, torch.full_like(self.depth, -1)).max()
        return int(d.item()) + 1

    def positions(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """`[B, N]` absolute positions: ``seq_lens[b] + depth`` (``seq_lens`` excludes the root)."""
        return seq_lens.to(self.depth.device).long()[:, None] + self.depth

    def to(self, device) -> "TreeDescriptor":
        return TreeDescriptor(**{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)})

    def root_path(self, node: torch.Tensor) -> torch.Tensor:
        """`[B, N]` nodes on the path root -> ``node[b]`` in depth order, padded with -1."""
        B, N = self.parents.shape
        anc = self.mask[torch.arange(B, device=self.device), node]  # [B, N] ancestors-or-self
        d = torch.where(anc, self.depth, torch.full_like(self.depth, N))
        out = torch.full((B, N + 1), -1, dtype=torch.long, device=self.device)
        idx = torch.arange(N, device=self.device)[None, :].expand(B, N)
        out.scatter_(1, d, torch.where(anc, idx, -1))
        return out[:, :N]

    # ------------------------------------------------------------------ SGLang EAGLE format
    def to_eagle(self, seq_lens: torch.Tensor) -> dict:
        """SGLang's EAGLE tree representation of this batch.

        Returns a dict with ``retrieve_index`` `[B, N]` (flat draft-token index ``b * N + i``),
        ``retrieve_next_token`` `[B, N]`, ``retrieve_next_sibling`` `[B, N]`, ``positions`` `[B * N]`,
        ``tree_mask`` `[B, N, N]` (draft part) and ``custom_mask`` (flattened per request as
        ``[N, seq_len + N]`` rows, prefix columns all True: the layout of SGLang's tree verify)."""
        B, N = self.parents.shape
        dev = self.device
        retrieve_index = torch.arange(B * N, device=dev).view(B, N)
        seq_lens = seq_lens.to(dev).long()
        return dict(
            retrieve_index=retrieve_index,
            retrieve_next_token=self.first_child.clone(),
            retrieve_next_sibling=self.next_sibling.clone(),
            positions=self.positions(seq_lens).flatten(),
            tree_mask=self.mask.clone(),
            custom_mask=full_verify_mask(self.mask, seq_lens.cpu(), N),
        )

    @classmethod
    def from_eagle(cls, retrieve_next_token, retrieve_next_sibling, num_nodes=None,
                   validate: bool = True) -> "TreeDescriptor":
        """Inverse of :meth:`to_eagle`: rebuild ``parents`` from first-child / next-sibling links."""
        nt = torch.as_tensor(retrieve_next_token).long()
        ns = torch.as_tensor(retrieve_next_sibling).long()
        if nt.shape != ns.shape or nt.dim() != 2:
            raise ValueError(f"retrieve_next_token {tuple(nt.shape)} and retrieve_next_sibling "
                             f"{tuple(ns.shape)} must both be [B, N]")
        return cls.from_parents(parents_from_eagle(nt, ns), num_nodes, validate=validate)


def full_verify_mask(tree_mask: torch.Tensor, seq_lens_cpu, n: int) -> torch.Tensor:
    """SGLang's full tree-verify mask (``FULL_MASK``), built in one pass: per request ``b`` the rows of its
    ``n`` draft tokens, each ``seq_lens[b]`` prefix columns (all True) then the request's ``n x n`` tree block,
    flattened row by row, the requests one after another.

    SGLang 0.5.17's NGRAM worker builds the same tensor with a loop of four torch calls per request (ones,
    a host-to-device copy, cat, cast) and one cat over the batch -- host time that grows with the batch on the
    scheduler's thread (its own comment: "significant overhead in large batch size"). Here: one fill, one
    index copy and one scatter, whatever the batch.

    Args:
        tree_mask (torch.Tensor): `[B * n * n]` or `[B, n, n]`, the tree blocks (any dtype; nonzero = visible).
        seq_lens_cpu: `[B]` prefix lengths on the host (a CPU tensor, array or list), as SGLang's loop reads them.
        n (int): draft tokens per request.

    Returns:
        torch.Tensor: `[n * sum(seq_lens + n)]` bool, on ``tree_mask``'s device.
    """
    import numpy as np

    lens = np.asarray(seq_lens_cpu.numpy() if isinstance(seq_lens_cpu, torch.Tensor) else seq_lens_cpu,
                      dtype=np.int64).reshape(-1)
    B = lens.shape[0]
    if tree_mask.numel() != B * n * n:
        raise ValueError(f"tree_mask has {tree_mask.numel()} cells, expected B * n * n = {B} * {n} * {n}")
    if (lens < 0).any():
        raise ValueError(f"negative sequence lengths: {lens.tolist()}")
    row = lens + n
    start = n * (np.cumsum(row) - row)  # where each request's rows begin
    r = np.arange(n, dtype=np.int64)
    idx = (start[:, None, None] + r[None, :, None] * row[:, None, None] + lens[:, None, None]
           + r[None, None, :]).reshape(-1)
    out = torch.ones(int(n * row.sum()), dtype=torch.bool, device=tree_mask.device)
    # non_blocking: from pageable memory CUDA stages the copy at once (no wait on the stream), as SGLang's loop does
    out[torch.from_numpy(idx).to(tree_mask.device, non_blocking=True)] = tree_mask.reshape(-1).to(torch.bool)
    return out


def _closure(par: torch.Tensor, valid: torch.Tensor):
    """Ancestor-or-self mask `[B, N, N]` by repeated squaring of (I + parent edge), static trip
    count; also returns the parent-edge matrix (``edge[b, i, j]``: j is i's parent)."""
    N = par.shape[1]
    idx = torch.arange(N, device=par.device)
    edge = (par[:, :, None] == idx[None, None, :]) & valid[:, :, None]
    m = (edge | torch.eye(N, dtype=torch.bool, device=par.device)[None]).float()
    for _ in range(max(1, math.ceil(math.log2(max(N, 2))))):
        m = (torch.bmm(m, m) > 0).float()
    return m > 0, edge


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """Only ``TreeDescriptor.mask`` for full `[B, N]` trees (what the chunk verify reads), without
    the rest of the descriptor: for per-step paths. Node 0's parent entry is ignored; no host sync."""
    parents = parents.long()
    idx = torch.arange(parents.shape[1], device=parents.device)
    par = torch.where(idx[None, :] > 0, parents, torch.full_like(parents, -1))
    return _closure(par, torch.ones_like(par, dtype=torch.bool))[0]


def eagle_links(parents: torch.Tensor, valid: Optional[torch.Tensor] = None):
    """SGLang's ``retrieve_next_token`` (first child) and ``retrieve_next_sibling`` (the next child
    of the same parent, by node index) from `[B, N]` parents (root and padding: -1), -1 where none;
    ``valid`` `[B, N]` marks the real nodes (default: all). Static shapes, no host sync."""
    B, N = parents.shape
    idx = torch.arange(N, device=parents.device)
    if valid is None:
        valid = torch.ones_like(parents, dtype=torch.bool)
    child = (parents[:, None, :] == idx[None, :, None]) & valid[:, None, :]  # [B, p, i]: i is a child of p
    first = torch.where(child, idx[None, None, :].expand(B, N, N), N).min(-1).values
    later = (parents[:, :, None] == parents[:, None, :]) & (parents[:, :, None] >= 0) & valid[:, :, None] \
        & valid[:, None, :] & (idx[None, None, :] > idx[None, :, None])
    nxt = torch.where(later, idx[None, None, :].expand(B, N, N), N).min(-1).values
    return torch.where(first >= N, -1, first), torch.where(nxt >= N, -1, nxt)


def parents_from_eagle(retrieve_next_token: torch.Tensor, retrieve_next_sibling: torch.Tensor) -> torch.Tensor:
    """`[B, N]` parents (``-1`` for the root and unreached nodes) from SGLang's first-child /
    next-sibling links, with static shapes and no host synchronisation: a node's parent is the node
    whose first child heads its sibling chain; the heads are found by pointer jumping
    (``ceil(log2 N)`` rounds), ~20 tensor ops whatever N."""
    nt, ns = retrieve_next_token.long(), retrieve_next_sibling.long()
    B, N = nt.shape
    dev = nt.device
    src = torch.arange(N, device=dev)[None, :].expand(B, N)
    spare = torch.full_like(nt, N)  # out-of-range links write into a spare column, dropped at the end
    first_of = torch.full((B, N + 1), -1, dtype=torch.long, device=dev)  # first_of[c] = p if c is p's first child
    first_of.scatter_(1, torch.where((nt >= 0) & (nt < N), nt, spare), src)
    up = torch.arange(N + 1, device=dev)[None, :].expand(B, N + 1).clone()  # up[s] = previous sibling, or s
    up.scatter_(1, torch.where((ns >= 0) & (ns < N), ns, spare), src)
    up[:, N] = N
    for _ in range(max(1, math.ceil(math.log2(max(N, 2))))):
        up = up.gather(1, up)  # 2^k siblings back, stopping at the chain's head
    return first_of.gather(1, up)[:, :N]


def _validate(parents: torch.Tensor, num_nodes: torch.Tensor) -> None:
    B, N = parents.shape
    p = parents.cpu()
    nn = num_nodes.cpu()
    for b in range(B):
        n = int(nn[b])
        if not 1 <= n <= N:
            raise ValueError(f"num_nodes[{b}] = {n} is outside [1, {N}]")
        if int(p[b, 0]) != -1:
            raise ValueError(f"parents[{b}, 0] = {int(p[b, 0])}: node 0 must be the root (parent -1)")
        row = p[b, 1:n]
        bad = (row < -1) | (row >= torch.arange(1, n))
        if bool(bad.any()):
            i = int(bad.nonzero()[0]) + 1
            raise ValueError(f"parents[{b}, {i}] = {int(p[b, i])}: a parent must precede its child "
                             f"(0 <= parent < {i}); otherwise the tree has a cycle or a forward edge")
        second = row == -1
        if bool(second.any()):
            i = int(second.nonzero()[0]) + 1
            raise ValueError(f"parents[{b}, {i}] = -1: a second root; only node 0 may be a root")
