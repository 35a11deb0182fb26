"""One kernel for the served merged tree: SGLang's MTP tree (tokens + first-child / next-sibling
links) united with a suffix draft under the node budget, and laid out as SGLang's verify input
(draft tokens, positions, links, the tree cells of the attention mask). One program per request;
the per-node logic runs on register vectors (a node's value is read with a one-hot reduction and
written with a one-hot select), so trees of up to 64 + 64 nodes stay in registers.

Reference: :func:`lumotree.drafters.tree_merge.merge_trees` for the merge (MTP nodes scored 1 for
the first ``keep`` of them and ``1e-3`` after, suffix nodes by their weighted path probability;
best-first, ties in slot order) and :mod:`lumotree.sglang.merge` for the layout
(:func:`~lumotree.sglang.merge.eagle_links`, :func:`~lumotree.sglang.merge.write_tree_mask`,
positions ``seq_len + depth``, padding as extra children of the root repeating its first child).
Replaces ~400 small device ops per step (the torch path) with one launch and 9 ops
(``benchmark/workloads/merge_host_cost.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

FULL_MASK, QLEN_ONLY = 0, 1


@triton.jit
def _at(vec, offs, idx):
    """``vec[idx]`` for a register vector (one-hot reduction)."""
    return tl.sum(tl.where(offs == idx, vec, 0), 0)


@triton.jit
def tree_merge_layout_fwd_kernel(
    m_tok, m_nt, m_ns, keep_mtp, s_tok, s_par, s_sc, s_num, seq_lens,
    o_tok, o_pos, o_nt, o_ns, mask, B,
    N: tl.constexpr, M: tl.constexpr, BU: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
    MASK_MODE: tl.constexpr, WRITE_MASK: tl.constexpr,
):
    b = tl.program_id(0)
    o_u = tl.arange(0, BU)
    o_m = tl.arange(0, M)
    base = b.to(tl.int64) * N
    m_in = o_u < N
    # ---- the MTP tree: tokens, parents from the links (first children, then their sibling chains)
    tok = tl.load(m_tok + base + o_u, mask=m_in, other=0)
    nt = tl.load(m_nt + base + o_u, mask=m_in, other=-1)
    ns = tl.load(m_ns + base + o_u, mask=m_in, other=-1)
    par = tl.full([BU], -1, tl.int64)
    for p in range(N):
        c = _at(nt, o_u, p)
        for _ in range(N):
            ok = (c >= 0) & (c < N)
            par = tl.where((o_u == c) & ok, p, par).to(tl.int64)
            c = tl.where(ok, _at(ns, o_u, c), -1)
    par = tl.where(o_u == 0, -1, par)
    keep = tl.load(keep_mtp + b)
    sc = tl.where(o_u < keep, 1.0, 1e-3)
    val = m_in
    # ---- the suffix draft, folded in by token path (parents precede children in both trees)
    st = tl.load(s_tok + b * M + o_m)
    sp = tl.load(s_par + b * M + o_m)
    ss = tl.load(s_sc + b * M + o_m)
    sn = tl.load(s_num + b)
    root_eq = (_at(st, o_m, 0) == _at(tok, o_u, 0)) & (sn > 0)
    slot_of = tl.where((o_m == 0) & root_eq, 0, tl.full([M], -1, tl.int64))  # suffix node -> union slot
    n_u = tl.sum(tl.zeros([BU], tl.int64), 0) + N
    for j in range(1, M):
        active = (j < sn) & root_eq
        up = _at(slot_of, o_m, _at(sp, o_m, j))
        tj = _at(st, o_m, j)
        sj = _at(ss, o_m, j)
        hit = (par == up) & (tok == tj) & val & (o_u > 0) & (up >= 0) & active
        found = tl.max(hit.to(tl.int32), 0) > 0
        k = tl.min(tl.where(hit, o_u, BU), 0).to(tl.int64)
        sc = tl.where(hit & (o_u == k), tl.maximum(sc, sj), sc)
        new = active & (up >= 0) & (found == 0)
        put = new & (o_u == n_u)
        tok = tl.where(put, tj, tok)
        par = tl.where(put, up, par)
        sc = tl.where(put, sj, sc)
        val = val | put
        slot_of = tl.where(o_m == j, tl.where(found, k, tl.where(new, n_u, -1)), slot_of).to(tl.int64)
        n_u = n_u + new.to(tl.int64)
    # ---- best-first selection (a node's score clamped to its parent's; the root first)
    sc = tl.where(val, sc, -1.0)
    sc = tl.where(o_u == 0, 2.0, sc)
    for i in range(1, N + M):
        sc = tl.where(o_u == i, tl.minimum(sc, _at(sc, o_u, _at(par, o_u, i))), sc)
    ahead = (sc[None, :] > sc[:, None]) | ((sc[None, :] == sc[:, None]) & (o_u[None, :] < o_u[:, None]))
    rank = tl.sum((ahead & val[None, :]).to(tl.int64), 1)
    kept = val & (rank < N)
    num = tl.minimum(tl.sum(val.to(tl.int64), 0), N)
    prank = tl.sum(tl.where(o_u[None, :] == par[:, None], rank[None, :], 0), 1)
    prank = tl.where(par >= 0, prank, -1)
    # ---- into output order: q = rank
    o_n = tl.arange(0, BN)
    sel = (rank[None, :] == o_n[:, None]) & kept[None, :]  # [BN, BU]
    q_tok = tl.sum(tl.where(sel, tok[None, :], 0), 1)
    q_par = tl.sum(tl.where(sel, prank[None, :], 0), 1)
    first_tok = tl.where(num > 1, _at(q_tok, o_n, 1), _at(q_tok, o_n, 0))
    pad = o_n >= num
    q_tok = tl.where(pad, first_tok, q_tok)
    q_par = tl.where(pad, 0, q_par)
    q_par = tl.where(o_n == 0, -1, q_par)
    # ---- layout: ancestor-or-self mask, depth, first child, next sibling
    anc = o_n[:, None] == o_n[None, :]
    cur = q_par
    for _ in range(N - 1):  # one more ancestor per pass
        anc = anc | ((o_n[None, :] == cur[:, None]) & (cur[:, None] >= 0))
        up_ = tl.sum(tl.where(o_n[None, :] == cur[:, None], q_par[None, :], 0), 1)
        cur = tl.where(cur >= 0, up_, -1)
    depth = tl.sum((anc & (o_n[None, :] < N)).to(tl.int64), 1) - 1
    child = (q_par[None, :] == o_n[:, None]) & (o_n[None, :] < N)  # [p, i]
    fc = tl.min(tl.where(child, o_n[None, :], BN), 1)
    fc = tl.where(fc == BN, -1, fc)
    sib = (q_par[None, :] == q_par[:, None]) & (o_n[None, :] > o_n[:, None]) & (q_par[:, None] >= 0) \
        & (o_n[None, :] < N)
    nx = tl.min(tl.where(sib, o_n[None, :], BN), 1)
    nx = tl.where(nx == BN, -1, nx)
    n_in = o_n < N
    sl = tl.load(seq_lens + b).to(tl.int64)
    tl.store(o_tok + base + o_n, q_tok, mask=n_in)
    tl.store(o_pos + base + o_n, sl + depth, mask=n_in)
    tl.store(o_nt + base + o_n, fc, mask=n_in)
    tl.store(o_ns + base + o_n, nx, mask=n_in)
    if WRITE_MASK:
        cells = n_in[:, None] & n_in[None, :]
        if MASK_MODE == 0:  # FULL_MASK: rows of seq_len + N, requests one after another
            o_b = tl.arange(0, BB)
            before = tl.sum(tl.where(o_b < b, tl.load(seq_lens + o_b, mask=o_b < B, other=0), 0), 0).to(tl.int64)
            start = N * before + b.to(tl.int64) * N * N
            off = start + o_n[:, None] * (sl + N) + sl + o_n[None, :]
        else:  # QLEN_ONLY: N x N per request
            off = b.to(tl.int64) * N * N + o_n[:, None] * N + o_n[None, :]
        tl.store(mask + off, anc.to(tl.int1), mask=cells)


def tree_merge_layout_fwd(draft_token: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor,
                          keep_mtp: torch.Tensor, suffix, seq_lens: torch.Tensor, positions: torch.Tensor,
                          custom_mask, mask_mode: int, write_mask: bool = True) -> None:
    """Merge and lay out in place: ``draft_token`` `[B * N]`, ``next_token`` / ``next_sibling`` `[B, N]`
    (read as SGLang's MTP tree, then overwritten; every program reads its request's row before it
    writes it), ``positions`` `[B * N]`, the tree cells of ``custom_mask``. ``suffix = (tokens,
    parents, scores, num)`` `[B, M]` / `[B]` (scores already weighted; ``M`` a power of two >= 2),
    ``keep_mtp`` `[B]`: the MTP nodes ranked ahead of the suffix nodes."""
    B, N = next_token.shape
    s_tok, s_par, s_sc, s_num = suffix
    M = s_tok.shape[1]
    if M < 2 or M & (M - 1):
        raise ValueError(f"the suffix width must be a power of two >= 2, got {M}")
    if mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError("the bit-packed tree mask (QLEN_ONLY_BITPACKING) is not supported")
    io = (draft_token, next_token, next_sibling, positions)
    if not all(t.dtype == torch.int64 and t.is_contiguous() for t in io):
        raise ValueError("draft_token, retrieve_next_token / next_sibling and positions must be contiguous int64 "
                         f"(SGLang's); got {[(t.dtype, t.is_contiguous()) for t in io]}")
    write = bool(write_mask and custom_mask is not None)
    tree_merge_layout_fwd_kernel[(B,)](
        draft_token, next_token, next_sibling, keep_mtp.long().contiguous(), s_tok.long().contiguous(),
        s_par.long().contiguous(), s_sc.float().contiguous(), s_num.long().contiguous(), seq_lens.long().contiguous(),
        draft_token, positions, next_token, next_sibling, custom_mask if write else draft_token, B,
        N=N, M=M, BU=triton.next_power_of_2(N + M), BN=triton.next_power_of_2(N), BB=triton.next_power_of_2(B),
        MASK_MODE=mask_mode, WRITE_MASK=write)
