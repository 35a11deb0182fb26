"""Run the Triton kernels in Triton's CPU interpreter against the references (called by
test_kernels_interpret.py in a subprocess, because TRITON_INTERPRET must be set before import)."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from lumotree import TreeDescriptor  # noqa: E402
from lumotree.ops.commit.naive import commit_plan  # noqa: E402
from lumotree.ops.conv_tree import naive as conv_naive  # noqa: E402
from lumotree.ops.conv_tree import triton as conv_tri  # noqa: E402
from lumotree.ops.gdn_tree import naive, triton as tri  # noqa: E402
from utils import assert_close, make_parents  # noqa: E402


def batch(kind):
    rows = [make_parents(kind, n, s) for n, s in [(9, 1), (5, 2)]]
    N = max(len(r) for r in rows)
    nums = torch.tensor([len(r) for r in rows])
    return TreeDescriptor.from_parents(torch.tensor([r + [-1] * (N - len(r)) for r in rows]), nums), nums, N


def commit_layers():
    """All-layer replay commit on per-slot buffers vs its reference: trees, chains, skips, track."""
    g = torch.Generator().manual_seed(5)
    L, S, NR, Hk, Hv, K, V = 2, 6, 7, 1, 2, 16, 16
    k, v = torch.randn(L, S, NR, Hk, K, generator=g), torch.randn(L, S, NR, Hv, V, generator=g)
    gg, be = -torch.rand(L, S, NR, Hv, generator=g), torch.rand(L, S, NR, Hv, generator=g)
    pool = torch.randn(L, S, Hv, V, K, generator=g) * 0.1
    parents = torch.tensor([[0, 0, 0, 1, 1, 2, 3], [0, 0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0, 0],
                            [0, 0, 0, 1, 2, 3, 4]], dtype=torch.int32)
    rows, last = torch.tensor([4, 1, -1, 2]), torch.tensor([6, 3, 2, -1])
    for par, trows, tsteps in ((parents, torch.tensor([0, -1, 5, 3]), torch.tensor([1, -1, 0, 0])),
                               (None, None, None), (parents, None, None)):
        p1, p2 = pool.clone(), pool.clone()
        naive.gdn_tree_commit_layers(k, v, gg, be, p1, rows, last, par, trows, tsteps)
        tri.gdn_tree_commit_layers_fwd(k, v, gg, be, p2, rows.int(), last.int(),
                                       par, trows.int() if trows is not None else None,
                                       tsteps.int() if tsteps is not None else None, BV=8)
        assert_close(f"commit layers (parents={par is not None}, track={trows is not None})", p1, p2, 1e-5)
        for form in ("dot", "gather"):  # the path in chunk (WY) form; the steps on rows loaded up front
            p3 = pool.clone()
            tri.gdn_tree_commit_layers_fwd(k, v, gg, be, p3, rows.int(), last.int(),
                                           par, trows.int() if trows is not None else None,
                                           tsteps.int() if tsteps is not None else None, BV=8, form=form)
            assert_close(f"{form} commit layers (parents={par is not None}, track={trows is not None})", p1, p3, 1e-5)
            assert torch.equal(p3[:, 2], pool[:, 2])  # skipped rows untouched
        assert not torch.equal(p1[:, 4], pool[:, 4]) and torch.equal(p1[:, 2], pool[:, 2])  # row 2: last = -1
        if trows is not None:
            assert not torch.equal(p1[:, 0], pool[:, 0]) and torch.equal(p1[:, 3], pool[:, 3])  # 3: rows -1 / last -1
    # buffers kept per request row (the served layout: row b of a [L, R, NR, ...] scratch), not per
    # state slot: the same result as the per-slot buffers they hold
    ring_rows = torch.tensor([2, 0, 3, 1])
    per_req = [t[:, rows.clamp(min=0)][:, torch.argsort(ring_rows)].contiguous() for t in (k, v, gg, be)]
    p1, p2 = pool.clone(), pool.clone()
    naive.gdn_tree_commit_layers(k, v, gg, be, p1, rows, last, parents)
    tri.gdn_tree_commit_layers_fwd(*per_req, p2, rows.int(), last.int(), parents, BV=8, ring_rows=ring_rows.int())
    assert_close("commit layers from per-request rows", p1, p2, 1e-5)
    p3 = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*per_req, p3, rows.int(), last.int(), parents, BV=8,
                                   ring_rows=torch.tensor([-1, 0, 3, 1], dtype=torch.int32))
    assert torch.equal(p3[:, 4], pool[:, 4]) and torch.equal(p3[:, 1], p2[:, 1])  # ring row -1: skipped
    p5 = pool.clone()
    naive.gdn_tree_commit_layers(k, v, gg, be, p5, rows, last, parents, use_qk_l2norm=False)
    for form in ("dot", "gather"):
        p4 = pool.clone()
        tri.gdn_tree_commit_layers_fwd(*per_req, p4, rows.int(), last.int(), parents, BV=8, ring_rows=ring_rows.int(),
                                       form=form, use_qk_l2norm=False)
        assert_close(f"{form} commit layers, per-request rows, no L2 norm", p5, p4, 1e-5)
    try:
        tri.gdn_tree_commit_layers_fwd(*per_req, pool.clone(), rows.int(), last.int(), parents, form="wy")
        raise AssertionError("accepted form='wy'")
    except ValueError:
        pass


def gdn(kind, l2):
    tree, nums, N = batch(kind)
    B, Hk, Hv, K, V = 2, 2, 4, 16, 32
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(B, N, Hk, K, generator=g), torch.randn(B, N, Hk, K, generator=g)
    v = torch.randn(B, N, Hv, V, generator=g)
    A_log, dtb = torch.randn(Hv, generator=g), torch.randn(Hv, generator=g)
    a, bb = torch.randn(B, N, Hv, generator=g), torch.randn(B, N, Hv, generator=g)
    gg = -torch.exp(A_log) * torch.nn.functional.softplus(a + dtb)
    be = torch.sigmoid(bb)
    pool = torch.randn(5, Hv, V, K, generator=g) * 0.1
    si = torch.tensor([3, 1])
    ref = naive.gdn_tree_verify(q, k, v, gg, be, pool, tree, use_qk_l2norm=l2, state_indices=si)
    o = tri.gdn_tree_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si,
                                out=torch.zeros(B, N, Hv, V), BV=8)
    assert_close(f"{kind} verify", ref, o, 1e-5)
    o = tri.gdn_tree_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                state_indices=si, out=torch.zeros(B, N, Hv, V), BV=8)
    assert_close(f"{kind} verify fused gating", ref, o, 1e-5)
    vnew = torch.zeros(B, N, Hv, V)
    o = tri.gdn_tree_chunk_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                      state_indices=si, out=torch.zeros(B, N, Hv, V), BV=16, vnew_out=vnew)
    assert_close(f"{kind} chunk verify", ref, o, 1e-4)
    # the mixed precision setting (two dot precisions in one kernel) and the served configs
    for setting in tri.SERVED_PRECISIONS:
        BVs, warps, prec, low = tri.served_chunk_config(16, V, setting)
        om = tri.gdn_tree_chunk_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                           state_indices=si, out=torch.zeros(B, N, Hv, V), BV=min(BVs, V),
                                           num_warps=warps, precision=prec, precision_low=low)
        assert_close(f"{kind} chunk verify ({setting})", ref, om, 1e-3 if setting == "tf32" else 1e-4)
    # the split verify (state-independent pass + one-dot state pass): same outputs, same ring stores
    for prec, low, tol in (("tf32x3", None, 1e-4), ("tf32x3", "tf32", 1e-4), ("ieee", None, 1e-5)):
        os_ = tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb,
                                            use_qk_l2norm=l2, state_indices=si, out=torch.zeros(B, N, Hv, V),
                                            BV=16, precision=prec, precision_low=low)
        assert_close(f"{kind} split verify ({prec}/{low})", ref, os_, tol)
    os_ = tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si,
                                        out=torch.zeros(B, N, Hv, V), BV=8)
    assert_close(f"{kind} split verify (g, beta given)", ref, os_, 1e-4)
    os_ = tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si,
                                        out=torch.zeros(B, N, Hv, V), BV=8, factored=True)
    assert_close(f"{kind} split verify (factored M = P T)", ref, os_, 1e-4)
    # the mix form (pass 1 per key head: only the [BT, BT] mixing matrices; pass 2 forms q h^T, k h^T)
    for kw_ in (dict(A_log=A_log, a=a, dt_bias=dtb, b=bb), dict(g=gg, beta=be)):
        for prec, low, var in (("tf32x3", None, {}), ("tf32x3", "tf32", {}), ("ieee", None, {}),
                               ("tf32x3", None, dict(apply_fma=True)), ("tf32x3", None, dict(apply_persistent=1)),
                               ("tf32x3", None, dict(apply_persistent=2, apply_t=False)),
                               ("tf32x3", None, dict(prep_heads=1)), ("tf32x3", None, dict(prep_heads=2))):
            os_ = tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, use_qk_l2norm=l2, state_indices=si, BV=16,
                                                out=torch.zeros(B, N, Hv, V), precision=prec, precision_low=low,
                                                form="mix", **var, **kw_)
            assert_close(f"{kind} mix verify ({prec}/{low}, {var}, {sorted(kw_)})", ref, os_, 1e-4)
    BT_ = max(16, 1 << (N - 1).bit_length())
    mix = (torch.full((B * Hv * (2 * BT_ * BT_ + BT_),), float("nan")),)
    o_p = torch.zeros(B, N, Hv, V)
    tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si, out=o_p, BV=8,
                                  scratch=mix, passes="prep", form="mix")
    assert not o_p.any() and not mix[0].isnan().any()  # pass 1 fills the whole scratch, writes no output
    tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si, out=o_p, BV=8,
                                  scratch=mix, passes="apply", form="mix")
    assert_close(f"{kind} mix verify (passes apart)", ref, o_p, 1e-4)
    for bad in (dict(form="qr"), dict(form="mix", factored=True), dict(form="mix", prep_maxnreg=128),
                dict(apply_fma=True), dict(form="mix", apply_fma=True, apply_t=False), dict(apply_persistent=2), dict(form="mix", prep_heads=3),
                dict(form="mix", scratch=(mix[0][:7],)), dict(form="mix", passes="apply")):
        try:
            tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si, **bad)
            raise AssertionError(f"accepted {bad}")
        except ValueError:
            pass
    # the passes one by one through preallocated Q / C (as the bench times them)
    scr = (torch.full((B * Hv * BT_ * 16,), float("nan")), torch.full((B * Hv * BT_ * 32,), float("nan")))
    o_p = torch.zeros(B, N, Hv, V)
    tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si, out=o_p, BV=8,
                                  scratch=scr, passes="prep")
    assert not o_p.any()  # pass 1 writes no output
    tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si, out=o_p, BV=8,
                                  scratch=scr, passes="apply")
    assert_close(f"{kind} split verify (passes apart)", ref, o_p, 1e-4)
    for bad in (dict(passes="apply"), dict(passes="neither"), dict(scratch=(scr[0][:5], scr[1]))):
        try:
            tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si, **bad)
            raise AssertionError(f"accepted {list(bad)}")
        except ValueError:
            pass
    # a padded request (slot -1) reads no state: its outputs are those of a zero state
    si_pad = torch.tensor([3, -1])
    zero = pool.clone()
    zero[1] = 0
    ref_pad = naive.gdn_tree_verify(q, k, v, gg, be, zero, tree, use_qk_l2norm=l2, state_indices=torch.tensor([3, 1]))
    for form in tri.SPLIT_FORMS:
        for apply_t in (True, False):  # pass 2's state dot transposed (default) or not
            os_ = tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si_pad,
                                                out=torch.zeros(B, N, Hv, V), BV=8, form=form, apply_t=apply_t)
            assert_close(f"{kind} split verify ({form}, apply_t={apply_t}), padded request", ref_pad, os_, 1e-4)
    # the verify also keeps raw k, v and the fused gates per state slot (node-major) for the commit
    NR = N + 1
    ring = (torch.zeros(5, NR, Hk, K), torch.zeros(5, NR, Hv, V), torch.zeros(5, NR, Hv), torch.zeros(5, NR, Hv))
    o2 = tri.gdn_tree_chunk_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                       state_indices=si, out=torch.zeros(B, N, Hv, V), BV=16, ring=ring)
    assert torch.equal(o, o2)
    # q/k/v as strided views into one packed projection (the served layout) read the same rows
    packed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], -1)
    qv, kv, vv = torch.split(packed, [Hk * K, Hk * K, Hv * V], -1)
    qv, kv, vv = qv.reshape(B, N, Hk, K), kv.reshape(B, N, Hk, K), vv.reshape(B, N, Hv, V)
    assert not qv.is_contiguous() and qv.data_ptr() == packed.data_ptr()
    assert tri._token_rows(qv)[0] is qv  # no copy
    o3 = tri.gdn_tree_chunk_verify_fwd(qv, kv, vv, pool, None, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                       state_indices=si, anc_mask=tree.mask.to(torch.int8), num_nodes=tree.num_nodes,
                                       out=torch.zeros(B, N, Hv, V), BV=16)
    assert torch.equal(o, o3)
    for bi in range(B):
        n, r = int(nums[bi]), int(si[bi])
        assert torch.equal(ring[0][r, :n], k[bi, :n]) and torch.equal(ring[1][r, :n], v[bi, :n])
        assert_close(f"{kind} ring g", gg[bi, :n], ring[2][r, :n], 1e-6)
        assert_close(f"{kind} ring beta", be[bi, :n], ring[3][r, :n], 1e-6)
        assert not ring[0][r, n:].any()  # padding nodes are not stored
    assert not ring[0][[0, 2, 4]].any()  # rows of no request stay untouched
    # the same buffers kept per request (ring row = batch position; the served layout)
    ring_b = tuple(torch.zeros(B + 1, *t.shape[1:]) for t in ring)
    o4 = tri.gdn_tree_chunk_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                       state_indices=si, out=torch.zeros(B, N, Hv, V), BV=16, ring=ring_b,
                                       ring_rows=torch.tensor([1, 0], dtype=torch.int32))
    assert torch.equal(o, o4) and not ring_b[0][2].any()
    for form, var in [(f, dict(apply_t=t)) for f in tri.SPLIT_FORMS for t in (True, False)] + [
            ("mix", dict(apply_persistent=1)), ("mix", dict(prep_heads=1))]:
        ring_s = tuple(torch.zeros_like(t) for t in ring_b)
        os_ = tri.gdn_tree_split_verify_fwd(q, k, v, pool, tree, A_log=A_log, a=a, dt_bias=dtb, b=bb,
                                            use_qk_l2norm=l2, state_indices=si, out=torch.zeros(B, N, Hv, V),
                                            BV=16, ring=ring_s, ring_rows=torch.tensor([1, 0], dtype=torch.int32),
                                            form=form, **var)
        assert_close(f"{kind} split verify ({form}, {var}) with ring", ref, os_, 1e-4)
        for t, ts in zip(ring_b, ring_s):
            assert torch.equal(t, ts), f"split verify ({form}, {var}) ring stores != chunk verify ring stores"
    for t, tb in zip(ring, ring_b):
        assert torch.equal(tb[1], t[3]) and torch.equal(tb[0], t[1])
    # the fused step in mix form: the previous step's accepted paths (kept in ring_b, rows [1, 0])
    # committed inside this step's pass 2 == the all-layer commit, then the mix verify
    sg_par = torch.where(tree.parents < 0, 0, tree.parents).int()
    last_a, rr = torch.tensor([int(nums[0]) - 1, 2], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)
    p_seq = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring_b), p_seq[None], si.int(), last_a, sg_par, BV=8,
                                   use_qk_l2norm=l2, ring_rows=rr)
    o_seq = tri.gdn_tree_split_verify_fwd(q, k, v, p_seq, tree, gg, be, use_qk_l2norm=l2, state_indices=si, BV=16,
                                          out=torch.zeros(B, N, Hv, V), form="mix")
    for par_ in (sg_par, None) if kind == "chain" else (sg_par,):
        p_f = pool.clone()
        ring_c = tuple(torch.zeros_like(t) for t in ring_b)
        o_f = tri.gdn_tree_split_verify_fwd(q, k, v, p_f, tree, gg, be, use_qk_l2norm=l2, state_indices=si, BV=16,
                                            out=torch.zeros(B, N, Hv, V), form="mix", ring=ring_c, ring_rows=rr,
                                            pre_commit=dict(ring=ring_b, rows=rr, last=last_a, parents=par_))
        assert_close(f"{kind} mix fused step: state", p_seq, p_f, 1e-5)
        assert_close(f"{kind} mix fused step: outputs", o_seq, o_f, 1e-4)
    for bad in (dict(form="mix", pre_commit=dict(ring=ring_b, rows=rr, last=last_a), ring=ring_b, ring_rows=rr),
                dict(pre_commit=dict(ring=ring_b, rows=rr, last=last_a)),
                dict(form="mix", apply_persistent=1, pre_commit=dict(ring=ring_b, rows=rr, last=last_a))):
        try:
            tri.gdn_tree_split_verify_fwd(q, k, v, pool.clone(), tree, gg, be, use_qk_l2norm=l2, state_indices=si, **bad)
            raise AssertionError(f"accepted {sorted(bad)}")
        except ValueError:
            pass
    an = tree.root_path(nums - 1)
    al = (an >= 0).sum(-1)
    p1, p2 = pool.clone(), pool.clone()
    naive.gdn_tree_commit(k, v, gg, be, p1, tree, an, al, use_qk_l2norm=l2, state_indices=si)
    tri.gdn_tree_commit_fwd(k, v, p2, an, al, gg, be, use_qk_l2norm=l2, state_indices=si, BV=8)
    assert_close(f"{kind} commit", p1, p2, 1e-5)
    # the all-layer commit straight from those per-slot buffers (one layer here)
    sglang_parents = torch.where(tree.parents < 0, 0, tree.parents).int()
    p6 = pool.clone()[None]
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p6, si.int(), (nums - 1).int(), sglang_parents,
                                   use_qk_l2norm=l2, BV=8)
    assert_close(f"{kind} commit from the verify's slot buffers", p1, p6[0], 1e-5)
    # the fused step: the previous step's commit (from `ring`, kept per state slot) inside this
    # verify == that commit, then the verify
    g2 = torch.Generator().manual_seed(11)
    q2, k2 = torch.randn(B, N, Hk, K, generator=g2), torch.randn(B, N, Hk, K, generator=g2)
    v2, a2, bb2 = torch.randn(B, N, Hv, V, generator=g2), torch.randn(B, N, Hv, generator=g2), torch.randn(B, N, Hv,
                                                                                                           generator=g2)
    last = torch.tensor([int(nums[0]) - 1, 0], dtype=torch.int32)
    for par in (sglang_parents, None):
        p_seq, p_fused = pool.clone(), pool.clone()
        tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_seq[None], si.int(), last, par, use_qk_l2norm=l2,
                                       BV=8)
        o_seq = tri.gdn_tree_chunk_verify_fwd(q2, k2, v2, p_seq, tree, A_log=A_log, a=a2, dt_bias=dtb, b=bb2,
                                              use_qk_l2norm=l2, state_indices=si, out=torch.zeros(B, N, Hv, V), BV=16)
        new_ring = tuple(torch.zeros_like(t) for t in ring)
        o_fused = tri.gdn_tree_chunk_verify_fwd(q2, k2, v2, p_fused, tree, A_log=A_log, a=a2, dt_bias=dtb, b=bb2,
                                                use_qk_l2norm=l2, state_indices=si, out=torch.zeros(B, N, Hv, V), BV=16,
                                                ring=new_ring, pre_commit=dict(ring=ring, rows=si.int(), last=last,
                                                                               parents=par))
        assert_close(f"{kind} fused commit+verify state (parents={par is not None})", p_seq, p_fused, 1e-5)
        assert_close(f"{kind} fused commit+verify outputs (parents={par is not None})", o_seq, o_fused, 1e-4)
        assert not torch.equal(p_fused[3], pool[3]) and torch.equal(p_fused[0], pool[0])
        assert torch.equal(new_ring[0][3, :int(nums[0])], k2[0, :int(nums[0])])
    try:
        tri.gdn_tree_chunk_verify_fwd(q2, k2, v2, pool.clone(), tree, A_log=A_log, a=a2, dt_bias=dtb, b=bb2,
                                      state_indices=si, ring=ring, pre_commit=dict(ring=ring, rows=si, last=last))
        raise AssertionError("a verify must not write the buffers its pre-commit reads")
    except ValueError:
        pass
    # prefix-cache track rows: row 0 gets the state after 2 accepted nodes of request 0, row 4 the
    # committed state before any node of request 1 (track_len 0)
    tr, tln = torch.tensor([0, 4]), torch.tensor([min(2, int(al[0])), 0])
    p4, p5 = pool.clone(), pool.clone()
    naive.gdn_tree_commit(k, v, gg, be, p4, tree, an, al, use_qk_l2norm=l2, state_indices=si, track_rows=tr,
                          track_len=tln)
    tri.gdn_tree_commit_fwd(k, v, p5, an, al, gg, be, use_qk_l2norm=l2, state_indices=si, track_rows=tr,
                            track_len=tln, BV=8)
    assert_close(f"{kind} commit with track", p4, p5, 1e-5)
    assert torch.equal(p4[4], pool[1]) and not torch.equal(p4[0], pool[0])
    p3 = pool.clone()
    tri.gdn_tree_commit_vnew_fwd(k, vnew, p3, an, al, A_log=A_log, a=a, dt_bias=dtb, b=bb, use_qk_l2norm=l2,
                                 state_indices=si, BV=8)
    assert_close(f"{kind} commit from vnew", p1, p3, 1e-4)


def conv(kind, W):
    tree, nums, N = batch(kind)
    B, D = 2, 12
    g = torch.Generator().manual_seed(4)
    x, pool = torch.randn(B, N, D, generator=g), torch.randn(4, D, W - 1, generator=g)
    w, bias, si = torch.randn(D, W, generator=g), torch.randn(D, generator=g), torch.tensor([2, 0])
    assert_close(f"{kind} conv", conv_naive.conv_tree_verify(x, pool, w, bias, tree, state_indices=si),
                 conv_tri.conv_tree_verify(x, pool, w, bias, tree, state_indices=si), 1e-6)
    for ends in (nums - 1, torch.tensor([0, 1])):
        an = tree.root_path(ends)
        al = (an >= 0).sum(-1)
        p1, p2 = pool.clone(), pool.clone()
        conv_naive.conv_tree_commit(x, p1, tree, an, al, state_indices=si)
        conv_tri.conv_tree_commit(x, p2, tree, an, al, state_indices=si)
        assert torch.equal(p1, p2), f"{kind} W={W} conv commit"
        plan = commit_plan(tree, an, al, torch.zeros(B, N, dtype=torch.long), W)
        assert torch.equal(plan.conv_src, conv_tri.conv_commit_src(an, al, W - 1))


def gdn_large_tree_public_op():
    """Trees over 64 nodes: the public op takes the walk kernel (8-bit node ids, up to 255)."""
    import random

    from lumotree.tree_shapes import random_tree

    p = random_tree(100, random.Random(5))
    tree = TreeDescriptor.from_parents(torch.tensor([p]))
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(1, 100, 1, 16, generator=g), torch.randn(1, 100, 1, 16, generator=g)
    v = torch.randn(1, 100, 2, 16, generator=g)
    gg, be = -torch.rand(1, 100, 2, generator=g), torch.rand(1, 100, 2, generator=g)
    state = torch.randn(1, 2, 16, 16, generator=g) * 0.1
    ref = naive.gdn_tree_verify(q, k, v, gg, be, state, tree, use_qk_l2norm=True)
    o = tri.gdn_tree_verify_fwd(q, k, v, state, tree, gg, be, use_qk_l2norm=True, out=torch.zeros(1, 100, 2, 16),
                                BV=16)
    assert_close("walk, 100 nodes", ref, o, 1e-5)


if __name__ == "__main__":
    gdn_large_tree_public_op()
    commit_layers()
    for kind in ("chain", "star", "caterpillar", "random", "eagle"):
        gdn(kind, True)
        conv(kind, 4 if kind != "star" else 2)
    print("interpreted kernels == references")
