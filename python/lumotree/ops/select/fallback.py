"""Tree selection + commit plan with static-shaped torch ops: no host sync, no Python loop over
requests or nodes' values (a fixed ``N``-step loop of batched tensor ops). The fallback of the CUDA
extension (``cuda.py``) where it is not built; same semantics as ``naive.py``."""
from __future__ import annotations

import torch

from lumotree.ops.commit.fallback import commit_plan_from_path
from lumotree.tree import TreeDescriptor

__all__ = ["tree_select_and_plan"]


def tree_select_and_plan(draft_tokens, target, tree: TreeDescriptor, *, greedy: bool, coins=None, coins_final=None,
                         cache_slots=None, conv_width: int = 1):
    """Returns ``(bonus, plan)``; ``target`` is `[B, N]` target tokens (greedy) or `[B, N, vocab]` probs."""
    B, N = draft_tokens.shape
    dev = draft_tokens.device
    idx = torch.arange(N, device=dev)
    bidx = torch.arange(B, device=dev)
    draft = draft_tokens.long()
    child_ok = tree.valid & (idx[None, :] > 0)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    path = torch.full((B, N + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    length = torch.ones(B, dtype=torch.long, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    if greedy:
        tt = target.long()
        for _ in range(N - 1):
            want = tt.gather(1, cur[:, None])
            match = child_ok & (tree.parents == cur[:, None]) & (draft == want)
            has = match.any(1) & active
            nxt = torch.where(match, idx[None, :], N).min(1).values
            path[bidx, torch.where(has, length, N)] = torch.where(has, nxt, -1)
            length = length + has.long()
            cur = torch.where(has, nxt, cur)
            active = has
        bonus = tt.gather(1, cur[:, None])[:, 0]
    else:
        P = target.double()
        V = P.shape[-1]
        cn = coins.double()
        rej = torch.zeros(B, V, dtype=torch.bool, device=dev)
        rej_sum = torch.zeros(B, dtype=torch.float64, device=dev)
        last = torch.zeros(B, dtype=torch.long, device=dev)
        for _ in range(N):
            p = P[bidx, cur]
            tot = p.sum(1) - rej_sum
            cand = child_ok & (tree.parents == cur[:, None]) & (idx[None, :] > last[:, None])
            has = cand.any(1) & active
            c = torch.where(cand, idx[None, :], N).min(1).values.clamp(max=N - 1)
            x = draft.gather(1, c[:, None])
            seen = rej.gather(1, x)[:, 0]
            px = p.gather(1, x)[:, 0]
            rx = torch.where(seen, 0.0, px)
            acc = has & (tot > 0) & (cn.gather(1, c[:, None])[:, 0] * tot < rx)
            rejnow = has & ~acc
            rej_sum = rej_sum + torch.where(rejnow & ~seen, px, 0.0)
            rej.scatter_(1, x, rej.gather(1, x) | rejnow[:, None])
            last = torch.where(rejnow, c, last)
            path[bidx, torch.where(acc, length, N)] = torch.where(acc, c, -1)
            length = length + acc.long()
            cur = torch.where(acc, c, cur)
            last = torch.where(acc, 0, last)
            rej = rej & ~acc[:, None]
            rej_sum = torch.where(acc, 0.0, rej_sum)
            active = has
        p = P[bidx, cur]
        r = torch.where(rej, 0.0, p)
        tot = r.sum(1)
        cdf = r.cumsum(1)
        tok = (cdf <= (coins_final.double() * tot)[:, None]).sum(1).clamp(max=V - 1)
        vidx = torch.arange(V, device=dev)
        lastpos = torch.where(r > 0, vidx[None, :], 0).cummax(1).values
        tok = lastpos.gather(1, tok[:, None])[:, 0]
        bonus = torch.where(tot > 0, tok, p.argmax(1))
    accept_nodes = path[:, :N]
    if cache_slots is None:
        cache_slots = torch.full((B, N), -1, dtype=torch.long, device=dev)
    return bonus, commit_plan_from_path(tree, accept_nodes, length, cache_slots, conv_width)
