"""Run the Triton kernels in Triton's CPU interpreter against the references (called by
test_kernels_interpret.py in a subprocess, because TRITON_INTERPRET must be set before import)."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

from lumotree import TreeDescriptor  # noqa: E402
from lumotree.ops.commit.naive import commit_plan  # noqa: E402
from lumotree.ops.conv_tree import naive as conv_naive  # noqa: E402
from lumotree.ops.conv_tree import triton as conv_tri  # noqa: E402
from lumotree.ops.gdn_tree import naive, tiles, triton as tri  # noqa: E402
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
        assert torch.equal(p2[:, 2], pool[:, 2])  # skipped rows untouched
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
    p5, p4 = pool.clone(), pool.clone()
    naive.gdn_tree_commit_layers(k, v, gg, be, p5, rows, last, parents, use_qk_l2norm=False)
    tri.gdn_tree_commit_layers_fwd(*per_req, p4, rows.int(), last.int(), parents, BV=8, ring_rows=ring_rows.int(),
                                   use_qk_l2norm=False)
    assert_close("commit layers, per-request rows, no L2 norm", p5, p4, 1e-5)
    for bad in (dict(track_rows=rows.int()), dict(parents=parents[:, :3].repeat(1, 3))):
        try:
            tri.gdn_tree_commit_layers_fwd(*per_req, pool.clone(), rows.int(), last.int(), **{"parents": parents, **bad})
            raise AssertionError(f"accepted {sorted(bad)}")
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
    fused = dict(A_log=A_log, a=a, dt_bias=dtb, b=bb)
    ref = naive.gdn_tree_verify(q, k, v, gg, be, pool, tree, use_qk_l2norm=l2, state_indices=si)
    # the boundary-state walk (the public op beyond 64 nodes)
    o = tri.gdn_tree_walk_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=si,
                                     out=torch.zeros(B, N, Hv, V), BV=8)
    assert_close(f"{kind} walk verify", ref, o, 1e-5)
    o = tri.gdn_tree_walk_verify_fwd(q, k, v, pool, tree, **fused, use_qk_l2norm=l2, state_indices=si,
                                     out=torch.zeros(B, N, Hv, V), BV=8)
    assert_close(f"{kind} walk verify fused gating", ref, o, 1e-5)
    # the mix verify (served): fused or given gates, every dot precision
    for gates in (fused, dict(g=gg, beta=be)):
        for prec, tol in (("tf32x3", 1e-4), ("ieee", 1e-5), ("tf32", 1e-3)):
            om = tri.gdn_tree_mix_verify_fwd(q, k, v, pool, tree, **gates, use_qk_l2norm=l2, state_indices=si,
                                             out=torch.zeros(B, N, Hv, V), BV=16, precision=prec)
            assert_close(f"{kind} mix verify ({prec}, {sorted(gates)})", ref, om, tol)
    # a padded request (slot -1) reads no state: its outputs are those of a zero state
    zero = pool.clone()
    zero[1] = 0
    ref_pad = naive.gdn_tree_verify(q, k, v, gg, be, zero, tree, use_qk_l2norm=l2, state_indices=torch.tensor([3, 1]))
    om = tri.gdn_tree_mix_verify_fwd(q, k, v, pool, tree, gg, be, use_qk_l2norm=l2, state_indices=torch.tensor([3, -1]),
                                     out=torch.zeros(B, N, Hv, V), BV=8)
    assert_close(f"{kind} mix verify, padded request", ref_pad, om, 1e-4)
    # the verify keeps raw k, v and the fused gates per request row (node-major) for the commit; q/k/v
    # as strided views into one packed projection (the served layout) read the same rows
    NR = N + 1
    ring = (torch.zeros(B + 1, NR, Hk, K), torch.zeros(B + 1, NR, Hv, V), torch.zeros(B + 1, NR, Hv),
            torch.zeros(B + 1, NR, Hv))
    rr = torch.tensor([1, 0], dtype=torch.int32)
    packed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], -1)
    qv, kv, vv = torch.split(packed, [Hk * K, Hk * K, Hv * V], -1)
    qv, kv, vv = qv.reshape(B, N, Hk, K), kv.reshape(B, N, Hk, K), vv.reshape(B, N, Hv, V)
    assert not qv.is_contiguous() and tiles.token_rows(qv)[0] is qv  # no copy
    o2 = tri.gdn_tree_mix_verify_fwd(qv, kv, vv, pool, None, **fused, use_qk_l2norm=l2, state_indices=si,
                                     anc_mask=tree.mask.to(torch.int8), num_nodes=tree.num_nodes,
                                     out=torch.zeros(B, N, Hv, V), BV=16, ring=ring, ring_rows=rr)
    assert_close(f"{kind} mix verify from packed views, with ring stores", ref, o2, 1e-4)
    for bi in range(B):
        n, r = int(nums[bi]), int(rr[bi])
        assert torch.equal(ring[0][r, :n], k[bi, :n]) and torch.equal(ring[1][r, :n], v[bi, :n])
        assert_close(f"{kind} ring g", gg[bi, :n], ring[2][r, :n], 1e-6)
        assert_close(f"{kind} ring beta", be[bi, :n], ring[3][r, :n], 1e-6)
        assert not ring[0][r, n:].any()  # padding nodes are not stored
    assert not ring[0][2].any()  # the spare row stays untouched
    # pass 1 with one value head per program (the group's heads in parallel programs): the same outputs and stores
    ring1 = tuple(torch.zeros_like(t) for t in ring)
    o3 = tri.gdn_tree_mix_verify_fwd(qv, kv, vv, pool, None, **fused, use_qk_l2norm=l2, state_indices=si,
                                     anc_mask=tree.mask.to(torch.int8), num_nodes=tree.num_nodes,
                                     out=torch.zeros(B, N, Hv, V), BV=16, ring=ring1, ring_rows=rr, prep_heads=1)
    assert torch.equal(o3, o2) and all(torch.equal(a, b) for a, b in zip(ring1, ring))
    try:
        tri.gdn_tree_mix_verify_fwd(q, k, v, pool, tree, gg, be, prep_heads=3)
        raise AssertionError("accepted prep_heads=3 for a group of 2")
    except ValueError:
        pass
    if l2:  # the ring's optional fifth buffer: each key's inverse L2 norm (one value head per program too)
        ring5 = (*(torch.zeros_like(t) for t in ring), torch.zeros(B + 1, NR, Hk))
        o4 = tri.gdn_tree_mix_verify_fwd(qv, kv, vv, pool, None, **fused, use_qk_l2norm=l2, state_indices=si,
                                         anc_mask=tree.mask.to(torch.int8), num_nodes=tree.num_nodes,
                                         out=torch.zeros(B, N, Hv, V), BV=16, ring=ring5, ring_rows=rr, prep_heads=1)
        assert torch.equal(o4, o2) and all(torch.equal(a, b) for a, b in zip(ring5, ring))
        for bi in range(B):
            n, r = int(nums[bi]), int(rr[bi])
            assert_close(f"{kind} ring inverse key norms", 1 / (k[bi, :n].float().pow(2).sum(-1) + 1e-6).sqrt(),
                         ring5[4][r, :n], 1e-6)
            assert not ring5[4][r, n:].any()
    for bad in (dict(precision="fp8"), dict(ring=ring)):  # a ring needs state_indices (padded requests)
        try:
            tri.gdn_tree_mix_verify_fwd(q, k, v, pool, tree, gg, be, **bad)
            raise AssertionError(f"accepted {sorted(bad)}")
        except ValueError:
            pass
    # the commit from those buffers == the reference commit of each request's deepest-numbered node
    an = tree.root_path(nums - 1)
    al = (an >= 0).sum(-1)
    p1, p2 = pool.clone(), pool.clone()
    naive.gdn_tree_commit(k, v, gg, be, p1, tree, an, al, use_qk_l2norm=l2, state_indices=si)
    tri.gdn_tree_commit_fwd(k, v, p2, an, al, gg, be, use_qk_l2norm=l2, state_indices=si, BV=8)
    assert_close(f"{kind} commit", p1, p2, 1e-5)
    p2 = pool.clone()
    tri.gdn_tree_commit_fwd(k, v, p2, an, al, **fused, use_qk_l2norm=l2, state_indices=si, BV=8)
    assert_close(f"{kind} commit fused gating", p1, p2, 1e-5)
    sglang_parents = torch.where(tree.parents < 0, 0, tree.parents).int()
    p6 = pool.clone()[None]
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p6, si.int(), (nums - 1).int(), sglang_parents,
                                   use_qk_l2norm=l2, BV=8, ring_rows=rr)
    assert_close(f"{kind} commit from the verify's request rows", p1, p6[0], 1e-5)
    if l2:  # the same commit reading the verify's inverse key norms instead of forming them
        p7 = pool.clone()[None]
        tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p7, si.int(), (nums - 1).int(), sglang_parents,
                                       use_qk_l2norm=l2, BV=8, ring_rows=rr, rnorm=ring5[4][None].contiguous())
        assert_close(f"{kind} commit with the stored inverse key norms", p1, p7[0], 1e-5)
        assert_close(f"{kind} commit: stored norms against formed ones", p6, p7, 1e-6)
        try:
            tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p7, si.int(), (nums - 1).int(), sglang_parents,
                                           use_qk_l2norm=False, rnorm=ring5[4][None].contiguous())
            raise AssertionError("accepted stored norms without use_qk_l2norm")
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
    o = tri.gdn_tree_walk_verify_fwd(q, k, v, state, tree, gg, be, use_qk_l2norm=True,
                                     out=torch.zeros(1, 100, 2, 16), BV=16)
    assert_close("walk, 100 nodes", ref, o, 1e-5)


def finish_rule():
    """The device finish rule's kernels vs its reference (test/ops/finish_cases.py)."""
    from finish_cases import compare_finish_rule

    compare_finish_rule("cpu")


def decode_prep():
    """A no-draft decode step's preparation kernel vs its reference (test/ops/decode_prep_cases.py)."""
    from decode_prep_cases import compare_decode_prep

    compare_decode_prep("cpu")


def state_rows():
    """The state-row copy kernel vs its reference (test/ops/state_rows_cases.py)."""
    from state_rows_cases import compare_state_rows

    compare_state_rows("cpu")


def tree_attention():
    """The tree verify attention's kernels vs its reference (test/ops/tree_attention_cases.py), and vs
    SGLang's prefill kernel with the verify's custom mask as benchmark/kernels/bench_tree_attention.py
    builds it (chain and EAGLE tree)."""
    from tree_attention_cases import compare_tree_attention
    from lumotree.ops.tree_attention import naive as ta_naive, triton as ta_tri
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    compare_tree_attention("cpu")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "kernels"))
    import bench_tree_attention as bench

    for tree, nodes in (("chain", 4), ("eagle", 8)):
        p, anc, (mask, mask_indptr, qo) = bench.inputs(2, 24, nodes, tree, heads=(4, 2, 32), dtype=torch.float32,
                                                       device="cpu")
        ref = ta_naive.tree_verify_attention(**p, anc=anc)
        sg = torch.empty_like(ref)
        extend_attention_fwd(p["q"], p["k"], p["v"], sg, p["k_buffer"], p["v_buffer"], qo, p["kv_indptr"],
                             p["kv_indices"], mask, True, mask_indptr, nodes, 1.0, 1.0)
        assert_close(f"SGLang's prefill kernel, {tree} (the benchmark's inputs)", ref, sg, 1e-5)
        assert_close(f"tree attention, {tree} (the benchmark's inputs)", ref, ta_tri.tree_verify_attention(**p, anc=anc),
                     1e-5)


if __name__ == "__main__":
    if sys.argv[1:] == ["tree_attention"]:  # its own process: the suite runs it beside the others
        tree_attention()
        print("interpreted tree attention == reference")
        sys.exit(0)
    finish_rule()
    decode_prep()
    state_rows()
    gdn_large_tree_public_op()
    commit_layers()
    for kind in ("chain", "star", "caterpillar", "random", "eagle"):
        gdn(kind, True)
        conv(kind, 4 if kind != "star" else 2)
    print("interpreted kernels == references")
