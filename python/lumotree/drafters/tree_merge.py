"""Draft trees merged on the device: the batched, static-shaped, host-sync-free form of
:func:`lumotree.drafters.suffix.merge_drafts` (its reference), and the re-rooting of a host draft
that is one step stale (:func:`lumotree.drafters.suffix.align_draft`, its reference).

Why on the device. With SGLang's overlap scheduler the host learns a step's accepted tokens only
after the next step has been launched, so a host drafter (the suffix tries) always drafts from a
context that misses the tokens the GPU accepted last. Rather than synchronise, the host drafts from
the context it has, rooted at its last known token, deep enough to cover one step of acceptance;
on the device, once the verify has accepted ``a`` tokens, :func:`align_stale` walks them down the
host's tree and re-roots the tree at the node they reach (the new root token). What is left is a
valid draft for the current step, which :func:`merge_trees` unites with the MTP head's tree by token
path under the node budget. Both are plain tensor programs with fixed trip counts: they can be
captured in a CUDA graph.

Tree layout, per request ``b``: ``tokens [B, N]`` (node 0 the root: the last context token),
``parents [B, N]`` (``-1`` for the root, every parent precedes its child), ``scores [B, N]`` (the
drafter's probability of the path root -> node, 1 at the root, never above the parent's) and
``num_nodes [B]`` (nodes ``>= num_nodes[b]`` are padding and ignored).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["merge_trees", "align_stale", "to_lists"]

Tree = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # tokens, parents, scores, num_nodes


def _valid(num_nodes: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(n, device=num_nodes.device)[None, :] < num_nodes[:, None]


def _gather_parent(x: torch.Tensor, parents: torch.Tensor, fill) -> torch.Tensor:
    """``x[b, parents[b, i]]``, ``fill`` where the parent is -1."""
    g = x.gather(1, parents.clamp(min=0))
    return torch.where(parents >= 0, g, torch.full_like(g, fill))


def _path_reduce(x: torch.Tensor, parents: torch.Tensor, op) -> torch.Tensor:
    """``op`` (min / or) of ``x`` over every node and all its ancestors, by pointer jumping:
    ``ceil(log2 N)`` rounds, each doubling the ancestors covered."""
    up = parents.clone()
    for _ in range(max(1, math.ceil(math.log2(max(parents.shape[1], 2))))):
        x = torch.where(up >= 0, op(x, x.gather(1, up.clamp(min=0))), x)
        up = _gather_parent(up, up, -1)
    return x


def _check(tree: Tree, name: str) -> None:
    tok, par, sc, n = tree
    if tok.dim() != 2 or par.shape != tok.shape or sc.shape != tok.shape or n.shape != tok.shape[:1]:
        raise ValueError(f"{name}: tokens, parents, scores must be [B, N] and num_nodes [B]; got "
                         f"{tuple(tok.shape)}, {tuple(par.shape)}, {tuple(sc.shape)}, {tuple(n.shape)}")


def _union(a, b: Tree, weight_b: float, passes: Optional[int] = None):
    """The accumulated tree ``a`` (tokens, parents, scores, validity mask `[B, NA]`) and the tree
    ``b`` as one tree of ``NA + NB`` slots: B's nodes whose token path A already has are folded
    into A's node (score = max) and their slots become padding; the others keep B's structure,
    re-parented onto A where their parent was folded. Resolves one depth per pass (``NB - 1``)."""
    ta, pa, sa, va = a
    tb, pb, sb, nb = b
    B, NA = ta.shape
    NB = tb.shape[1]
    dev = ta.device
    vb = _valid(nb, NB)
    sb = sb * weight_b
    roots_equal = (ta[:, 0] == tb[:, 0]) & va[:, 0] & (nb > 0)
    mapped = torch.full((B, NB), -1, dtype=torch.long, device=dev)
    mapped[:, 0] = torch.where(roots_equal, 0, -1)
    for _ in range(NB - 1 if passes is None else min(passes, NB - 1)):
        mp = _gather_parent(mapped, pb, -1)
        hit = (pa[:, None, :] == mp[:, :, None]) & (ta[:, None, :] == tb[:, :, None]) & va[:, None, :] \
            & (mp[:, :, None] >= 0)
        hit[:, :, 0] = False
        k = hit.float().argmax(2)
        new = torch.where(hit.any(2) & vb, k, torch.full_like(k, -1))
        new[:, 0] = mapped[:, 0]
        mapped = new
    folded = torch.where((mapped >= 0) & vb, sb, torch.full_like(sb, float("-inf")))
    best = torch.full_like(sa, float("-inf")).scatter_reduce(1, mapped.clamp(min=0), folded, "amax")
    sa2 = torch.where(va, torch.maximum(sa, best), sa)
    mp = _gather_parent(mapped, pb, -1)
    par_b = torch.where(mp >= 0, mp, torch.where(pb >= 0, pb + NA, pb))
    keep_b = vb & (mapped < 0) & roots_equal[:, None]
    return (torch.cat([ta, tb], 1), torch.cat([pa, par_b], 1), torch.cat([sa2, sb], 1), torch.cat([va, keep_b], 1))


def merge_trees(trees: Sequence[Tree], budget: int, weights: Optional[Sequence[float]] = None,
                max_depth: Optional[int] = None) -> Tree:
    """Union of draft trees sharing a root token, by token path, keeping the ``budget`` best nodes.

    A merged node's score is the best ``weight * score`` among its sources, clamped to its parent's
    (a child never outranks its parent, so the kept set is a tree); nodes are kept best-first, ties
    in slot order (the first tree's nodes first), and numbered in that order (parents precede
    children). A source whose root token differs from the first tree's contributes nothing.

    Args:
        trees: ``(tokens, parents, scores, num_nodes)`` per source, `[B, N_s]` / `[B]`.
        budget (int): nodes per request in the result, the root included.
        weights: per-source score multipliers (default 1).
        max_depth (int, optional): a static bound on the depth of the trees after the first (the
            MTP steps, the suffix drafter's ``max_spec``): the token-path matching then takes that
            many passes instead of ``N_s - 1``. A smaller bound than the real depth leaves deeper
            shared paths unmerged (duplicates), never a wrong tree.

    Returns:
        ``(tokens, parents, scores, num_nodes)`` with `[B, budget]` / `[B]`; padding slots repeat
        the root token with parent -1 and score 0.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if not trees:
        raise ValueError("nothing to merge")
    for i, t in enumerate(trees):
        _check(t, f"tree {i}")
        if t[0].shape[0] != trees[0][0].shape[0]:
            raise ValueError("all trees must have the same batch size")
    weights = list(weights) if weights is not None else [1.0] * len(trees)
    if len(weights) != len(trees):
        raise ValueError(f"{len(weights)} weights for {len(trees)} trees")
    tok, par, sc, n0 = trees[0]
    sc = sc * weights[0]
    valid = _valid(n0, tok.shape[1])
    for t, w in zip(trees[1:], weights[1:]):
        tok, par, sc, valid = _union((tok, par, sc, valid), t, w, max_depth)
    B, U = tok.shape
    dev = tok.device
    sc = torch.where(valid, sc, torch.full_like(sc, float("-inf")))
    sc[:, 0] = torch.where(valid[:, 0], torch.ones_like(sc[:, 0]) * float("inf"), sc[:, 0])
    sc = _path_reduce(sc, par, torch.minimum)  # a node's score: at most any ancestor's
    # best-first; ties keep slot order, which is topological (each source lists parents first and
    # the union appends), so a child tied with its parent still comes after it
    order = torch.sort(-sc, dim=1, stable=True).indices
    k = min(budget, U)
    keep = order[:, :k]
    kept_valid = valid.gather(1, keep) & torch.isfinite(sc.gather(1, keep)) | (keep == 0) & valid[:, :1]
    rank = torch.full((B, U), -1, dtype=torch.long, device=dev).scatter_(
        1, keep, torch.arange(k, device=dev)[None, :].expand(B, k))
    out_par = _gather_parent(rank, par.gather(1, keep), -1)
    out_tok = tok.gather(1, keep)
    out_sc = sc.gather(1, keep).clamp(max=1.0)
    num = kept_valid.sum(1)
    pad = ~kept_valid
    root_tok = tok[:, :1].expand(B, k)
    out_tok = torch.where(pad, root_tok, out_tok)
    out_par = torch.where(pad, -1, out_par)
    out_sc = torch.where(pad, 0.0, out_sc)
    if k < budget:  # fewer slots than the budget: pad the rest
        extra = budget - k
        out_tok = torch.cat([out_tok, tok[:, :1].expand(B, extra)], 1)
        out_par = torch.cat([out_par, torch.full((B, extra), -1, dtype=out_par.dtype, device=dev)], 1)
        out_sc = torch.cat([out_sc, torch.zeros(B, extra, dtype=out_sc.dtype, device=dev)], 1)
    return out_tok, out_par, out_sc, num


def align_stale(tree: Tree, accepted: torch.Tensor, accepted_len: torch.Tensor) -> Tree:
    """Re-root a draft made from a stale context at the tokens accepted since.

    The host drafted ``tree`` from its last known token (the root). Since then the device accepted
    ``accepted[b, :accepted_len[b]]`` (the last of them is the new root). Walks them down the tree;
    the node reached becomes the root, its subtree the draft (scores divided by the node's score,
    order kept); a walk that leaves the tree leaves only the new root.

    Args:
        tree: ``(tokens, parents, scores, num_nodes)``, `[B, N]` / `[B]`.
        accepted (torch.Tensor): `[B, A]` tokens accepted after the host's root.
        accepted_len (torch.Tensor): `[B]`, ``0 <= accepted_len <= A``.

    Returns:
        the re-rooted tree, `[B, N]` / `[B]`, padding as in :func:`merge_trees`.
    """
    _check(tree, "tree")
    tok, par, sc, n = tree
    B, N = tok.shape
    if accepted.dim() != 2 or accepted.shape[0] != B or accepted_len.shape != (B,):
        raise ValueError(f"accepted must be [B, A] and accepted_len [B] for B = {B}; got "
                         f"{tuple(accepted.shape)}, {tuple(accepted_len.shape)}")
    dev = tok.device
    valid = _valid(n, N)
    node = torch.where(n > 0, 0, -1)
    for t in range(accepted.shape[1]):
        step = t < accepted_len
        hit = (par == node[:, None]) & (tok == accepted[:, t:t + 1]) & valid & (node[:, None] >= 0)
        hit[:, 0] = False
        nxt = torch.where(hit.any(1), hit.float().argmax(1), torch.full_like(node, -1))
        node = torch.where(step, nxt, node)
    last = accepted.gather(1, (accepted_len - 1).clamp(min=0)[:, None])[:, 0]
    new_root_tok = torch.where(accepted_len > 0, last, tok[:, 0])
    # the subtree under the anchor: nodes whose root path passes through it
    inside = torch.arange(N, device=dev)[None, :] == node[:, None]
    inside = _path_reduce(inside, torch.where(valid, par, -1), torch.logical_or) & valid & (node[:, None] >= 0)
    # compact, keeping order (the anchor, an ancestor of the rest, comes first)
    pos = inside.long().cumsum(1) - 1
    count = inside.sum(1)
    slot = torch.where(inside, pos, torch.full_like(pos, N))  # N: a dropped node goes to a spare column
    src = torch.arange(N, device=dev)[None, :].expand(B, N)
    idx = torch.zeros(B, N + 1, dtype=torch.long, device=dev).scatter_(1, slot, src)[:, :N]
    new_index = torch.where(inside, pos, torch.full_like(pos, -1))
    o_tok = tok.gather(1, idx)
    o_par = _gather_parent(new_index, par.gather(1, idx), -1)
    anchor_score = sc.gather(1, node.clamp(min=0)[:, None])
    o_sc = sc.gather(1, idx) / anchor_score.clamp(min=torch.finfo(sc.dtype).tiny)
    keep = torch.arange(N, device=dev)[None, :] < count[:, None]
    o_par = torch.where(keep, o_par, -1)
    o_par[:, 0] = -1
    o_sc = torch.where(keep, o_sc.clamp(max=1.0), torch.zeros_like(o_sc))
    o_sc[:, 0] = 1.0
    o_tok = torch.where(keep, o_tok, new_root_tok[:, None].expand(B, N))
    o_tok[:, 0] = new_root_tok
    return o_tok, o_par, o_sc, torch.clamp(count, min=1)


def to_lists(tree: Tree) -> List[Tuple[List[int], List[int], List[float]]]:
    """Per request ``(tokens, parents, scores)`` of the real nodes (host copy; tests, debugging)."""
    tok, par, sc, n = (t.cpu() for t in tree)
    return [(tok[b, :n[b]].tolist(), par[b, :n[b]].tolist(), sc[b, :n[b]].tolist()) for b in range(tok.shape[0])]
