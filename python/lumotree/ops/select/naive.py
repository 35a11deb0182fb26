"""Reference of tree acceptance (selection): greedy and lossless stochastic.

Greedy: the root is always accepted; from the last accepted node ``i`` accept the child whose
token equals the target's choice ``target_tokens[b, i]`` (lowest index if several); stop when
none does. ``bonus = target_tokens[b, last accepted]``.

Stochastic (multi-round rejection sampling, SpecInfer / EAGLE "target-only" form): at the last
accepted node with target distribution ``p``, try its children in index order. Child ``c`` with
token ``x`` is accepted with probability ``r[x] / sum(r)``, where ``r`` is the residual of ``p``
(starts as ``p``; a rejected token is zeroed). If no child is accepted, the bonus token is drawn
from ``r / sum(r)``. Each emitted token is distributed exactly as the target (the tries are a
sequential sieve of ``p``), so the scheme is lossless for any tree of distinct-sibling tokens.

Randomness enters only through ``coins`` (`[B, N]`, the uniform used when node ``c`` is tried) and
``coins_final`` (`[B]`, the bonus draw): the CUDA op consumes the same numbers, so it can be
compared exactly.
"""
from __future__ import annotations

from typing import Optional

import torch

from lumotree.ops.gdn_tree.common import check_tree
from lumotree.tree import TreeDescriptor

__all__ = ["tree_select_greedy", "tree_select_sample", "probs_from_logits"]


def _check(draft_tokens, target, tree, name):
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, N], got {tuple(draft_tokens.shape)}")
    B, N = draft_tokens.shape
    check_tree(tree, B, N)
    if tuple(target.shape[:2]) != (B, N):
        raise ValueError(f"{name} must start with [B, N] = {(B, N)}, got {tuple(target.shape)}")
    return B, N


def _children(tree: TreeDescriptor, b: int, i: int):
    c = int(tree.first_child[b, i])
    while c >= 0:
        yield c
        c = int(tree.next_sibling[b, c])


def tree_select_greedy(draft_tokens, target_tokens, tree: TreeDescriptor):
    """Greedy tree acceptance.

    Args:
        draft_tokens (torch.Tensor): `[B, N]` node i's token (node 0: the root's token)
        target_tokens (torch.Tensor): `[B, N]` the target's argmax after node i
        tree (TreeDescriptor): `[B, N]`

    Returns:
        accept_len `[B]` (>= 1, root included), accept_nodes `[B, N]` (-1 padded), bonus `[B]`.
    """
    B, N = _check(draft_tokens, target_tokens, tree, "target_tokens")
    accept_len = torch.zeros(B, dtype=torch.long)
    accept_nodes = torch.full((B, N), -1, dtype=torch.long)
    bonus = torch.zeros(B, dtype=torch.long)
    dt, tt = draft_tokens.cpu(), target_tokens.cpu()
    for b in range(B):
        cur, path = 0, [0]
        while True:
            want = int(tt[b, cur])
            nxt = next((c for c in _children(tree, b, cur) if int(dt[b, c]) == want), None)
            if nxt is None:
                break
            cur = nxt
            path.append(cur)
        accept_len[b] = len(path)
        accept_nodes[b, : len(path)] = torch.tensor(path)
        bonus[b] = tt[b, cur]
    dev = draft_tokens.device
    return accept_len.to(dev), accept_nodes.to(dev), bonus.to(dev)


def tree_select_sample(draft_tokens, target_probs, tree: TreeDescriptor, coins: Optional[torch.Tensor] = None,
                       coins_final: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None):
    """Lossless stochastic tree acceptance.

    Args:
        draft_tokens (torch.Tensor): `[B, N]`
        target_probs (torch.Tensor): `[B, N, vocab]` target distribution after node i (temperature,
            top-k/top-p already applied, see :func:`probs_from_logits`)
        tree (TreeDescriptor): `[B, N]`
        coins (torch.Tensor): `[B, N]` uniforms in [0, 1); drawn from ``generator`` if None
        coins_final (torch.Tensor): `[B]` uniforms for the bonus draw

    Returns:
        accept_len `[B]`, accept_nodes `[B, N]`, bonus `[B]` as in :func:`tree_select_greedy`.
    """
    B, N = _check(draft_tokens, target_probs, tree, "target_probs")
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must be [B, N, vocab], got {tuple(target_probs.shape)}")
    if coins is None:
        coins = torch.rand(B, N, generator=generator, dtype=torch.float64)
    if coins_final is None:
        coins_final = torch.rand(B, generator=generator, dtype=torch.float64)
    accept_len = torch.zeros(B, dtype=torch.long)
    accept_nodes = torch.full((B, N), -1, dtype=torch.long)
    bonus = torch.zeros(B, dtype=torch.long)
    dt, P = draft_tokens.cpu(), target_probs.detach().cpu().double()
    cn, cf = coins.cpu().double(), coins_final.cpu().double()
    for b in range(B):
        cur, path = 0, [0]
        while True:
            r = P[b, cur].clone()
            nxt = None
            for c in _children(tree, b, cur):
                x = int(dt[b, c])
                tot = float(r.sum())
                if tot > 0 and float(cn[b, c]) * tot < float(r[x]):
                    nxt = c
                    break
                r[x] = 0.0
            if nxt is None:
                break
            cur = nxt
            path.append(cur)
        tot = float(r.sum())
        if tot > 0:
            cdf = torch.cumsum(r, 0)
            tok = int(torch.searchsorted(cdf, torch.tensor([float(cf[b]) * tot], dtype=cdf.dtype), right=True))
            tok = min(tok, r.numel() - 1)
            while float(r[tok]) == 0.0 and tok > 0:  # never emit a zero-probability token
                tok -= 1
        else:
            tok = int(P[b, cur].argmax())
        accept_len[b] = len(path)
        accept_nodes[b, : len(path)] = torch.tensor(path)
        bonus[b] = tok
    dev = draft_tokens.device
    return accept_len.to(dev), accept_nodes.to(dev), bonus.to(dev)


def probs_from_logits(logits: torch.Tensor, temperature, top_k=None, top_p=None) -> torch.Tensor:
    """Target distribution as SGLang's sampling params define it: softmax(logits / temperature),
    restricted to the top-k tokens and to the smallest top-p nucleus, renormalised.

    ``temperature``, ``top_k``, ``top_p`` are floats/ints or `[B]` tensors (per request)."""
    lead = logits.shape[:-1]
    Vocab = logits.shape[-1]
    B = logits.shape[0]

    def per_req(x, dtype):
        t = torch.as_tensor(x, dtype=dtype, device=logits.device)
        return t.reshape(B, *([1] * (len(lead) - 1)), 1) if t.dim() == 1 else t

    temp = per_req(temperature, torch.float32).clamp(min=1e-6)
    probs = torch.softmax(logits.float() / temp, -1)
    if top_k is not None:
        kk = per_req(top_k, torch.long).clamp(1, Vocab)
        srt = probs.sort(-1, descending=True).values
        kth = srt.gather(-1, (kk - 1).expand(*lead, 1))
        probs = torch.where(probs >= kth, probs, 0.0)
    if top_p is not None:
        pp = per_req(top_p, torch.float32)
        srt, idx = probs.sort(-1, descending=True)
        csum = srt.cumsum(-1)
        keep_sorted = (csum - srt) < pp * csum[..., -1:]
        keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum(-1, keepdim=True)
