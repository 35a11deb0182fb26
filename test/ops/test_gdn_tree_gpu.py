"""GPU tests of the Triton GDN tree kernels (run on the H200: python3 -m pytest -q -m gpu test).

``LUMOTREE_GPU_TESTS_DEVICE=cpu`` (with ``TRITON_INTERPRET=1``) runs a test function's logic on the
CPU at small shapes (``SMALL``): test_gpu_tests_in_interpreter.py does, so a broken GPU test shows
in CI, not first on the GPU. Code-generation checks (tilings refused on the GPU) run on CUDA only."""
import functools
import os
import random

import pytest
import torch
import torch.nn.functional as F

from lumotree import TreeDescriptor, tree_shapes
from lumotree.ops.gdn_tree import naive
from utils import assert_close, make_parents

pytestmark = pytest.mark.gpu
DEV = os.environ.get("LUMOTREE_GPU_TESTS_DEVICE", "cuda")
SMALL = DEV != "cuda"  # (the interpreter: Qwen3.5 head shapes shrunk)


def make(B, N, Hk, Hv, K, V, dtype, seed, pool_extra=3, kinds=("random",)):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(B):
        kind = kinds[b % len(kinds)]
        n = N if b == 0 else random.Random(seed + b).randint(1, N)
        rows.append(make_parents(kind, n, seed + b))
    N = max(len(r) for r in rows)
    nums = torch.tensor([len(r) for r in rows])
    parents = torch.tensor([r + [-1] * (N - len(r)) for r in rows])
    x = dict(
        q=torch.randn(B, N, Hk, K, generator=g).to(dtype), k=torch.randn(B, N, Hk, K, generator=g).to(dtype),
        v=torch.randn(B, N, Hv, V, generator=g).to(dtype),
        A_log=torch.randn(Hv, generator=g) * 0.5, dt_bias=torch.randn(Hv, generator=g) * 0.5,
        a=torch.randn(B, N, Hv, generator=g).to(dtype), b=torch.randn(B, N, Hv, generator=g).to(dtype),
        pool=torch.randn(B + pool_extra, Hv, V, K, generator=g) * 0.05,
        rows=torch.randperm(B + pool_extra, generator=g)[:B].int(),
    )
    x["g"] = -torch.exp(x["A_log"]) * F.softplus(x["a"].float() + x["dt_bias"])
    x["beta"] = torch.sigmoid(x["b"].float())
    return {k_: t.to(DEV) for k_, t in x.items()}, parents.to(DEV), nums.to(DEV)


CASES = [
    pytest.param(kind, B, N, Hk, Hv, K, V, dt, id=f"{kind}-B{B}-N{N}-Hk{Hk}-Hv{Hv}-K{K}-{str(dt)[6:]}")
    for kind in ("chain", "star", "caterpillar", "random", "eagle")
    for (B, N) in ((1, 4), (3, 17), (2, 64))
    for (Hk, Hv, K, V) in ((2, 6, 64, 64), (4, 8, 128, 128))
    for dt in (torch.float32, torch.bfloat16)
]


@pytest.mark.parametrize("impl", ["chunk", "walk"])
@pytest.mark.parametrize("kind, B, N, Hk, Hv, K, V, dtype", CASES)
def test_verify_and_commit_match_reference(kind, B, N, Hk, Hv, K, V, dtype, impl, monkeypatch):
    from lumotree.ops.gdn_tree import triton as tri

    monkeypatch.setenv("LUMOTREE_GDN_VERIFY", impl)
    fwd = tri.gdn_tree_chunk_verify_fwd if impl == "chunk" else tri.gdn_tree_verify_fwd

    x, parents, nums = make(B, N, Hk, Hv, K, V, dtype, seed=N + B, kinds=(kind, "random"))
    tree = TreeDescriptor.from_parents(parents, nums)
    pool0 = x["pool"].clone()
    ref = naive.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], tree, use_qk_l2norm=True,
                                state_indices=x["rows"])
    o = tri.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], tree, use_qk_l2norm=True,
                            state_indices=x["rows"])
    assert torch.equal(x["pool"], pool0), "verify wrote the state"
    tol = (1e-5 if impl == "walk" else 1e-4) if dtype == torch.float32 else 8e-3  # chunk: tf32x3 dots
    assert_close("verify", ref, o, tol)
    of = fwd(x["q"], x["k"], x["v"], x["pool"], tree, A_log=x["A_log"], a=x["a"],
             dt_bias=x["dt_bias"], b=x["b"], use_qk_l2norm=True, state_indices=x["rows"], out=torch.zeros_like(o))
    assert_close("verify fused gating", ref, of, tol)
    ends = torch.tensor([random.Random(b).randrange(int(n)) for b, n in enumerate(nums.tolist())], device=DEV)
    an = tree.root_path(ends)
    al = (an >= 0).sum(-1)
    p_ref, p_tri = x["pool"].clone(), x["pool"].clone()
    naive.gdn_tree_commit(x["k"], x["v"], x["g"], x["beta"], p_ref, tree, an, al, use_qk_l2norm=True,
                          state_indices=x["rows"])
    tri.gdn_tree_commit(x["k"], x["v"], x["g"], x["beta"], p_tri, tree, an, al, use_qk_l2norm=True,
                        state_indices=x["rows"])
    assert_close("commit", p_ref, p_tri, 1e-5)
    if impl == "chunk":  # closed-form commit from the innovations the chunk verify stores
        vnew = torch.zeros(*x["v"].shape, dtype=torch.float32, device=DEV)
        tri.gdn_tree_chunk_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, x["g"], x["beta"], use_qk_l2norm=True,
                                      state_indices=x["rows"], vnew_out=vnew)
        p_vn = x["pool"].clone()
        tri.gdn_tree_commit_vnew_fwd(x["k"], vnew, p_vn, an, al, x["g"], x["beta"], use_qk_l2norm=True,
                                     state_indices=x["rows"])
        assert_close("commit from vnew", p_ref, p_vn, 1e-4 if dtype == torch.float32 else 5e-3)


@pytest.mark.parametrize("kind, B, N, Hk, Hv, K, V, dtype", CASES)
def test_split_verify_matches_reference_and_chunk(kind, B, N, Hk, Hv, K, V, dtype):
    """The split verify (state-independent pass + one dot per state tile) == the reference, and
    == the chunk kernel (outputs and the ring stores the replay commit reads), in every served
    precision; the state is not written."""
    from lumotree.ops.gdn_tree import triton as tri

    x, parents, nums = make(B, N, Hk, Hv, K, V, dtype, seed=N + B, kinds=(kind, "random"))
    tree = TreeDescriptor.from_parents(parents, nums)
    pool0 = x["pool"].clone()
    ref = naive.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], tree, use_qk_l2norm=True,
                                state_indices=x["rows"])
    kw = dict(A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"], use_qk_l2norm=True,
              state_indices=x["rows"])
    NR = N + 2
    rings = [(torch.zeros(B + 1, NR, Hk, K, dtype=dtype, device=DEV),
              torch.zeros(B + 1, NR, Hv, V, dtype=dtype, device=DEV),
              torch.zeros(B + 1, NR, Hv, device=DEV), torch.zeros(B + 1, NR, Hv, device=DEV)) for _ in range(2)]
    ring_rows = torch.randperm(B + 1, device=DEV)[:B].int()
    o_c = tri.gdn_tree_chunk_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring=rings[0], ring_rows=ring_rows,
                                        **kw)
    o_s = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring=rings[1], ring_rows=ring_rows,
                                        **kw)
    assert torch.equal(x["pool"], pool0), "split verify wrote the state"
    tol = 1e-4 if dtype == torch.float32 else 8e-3
    assert_close("split verify", ref[tree.valid], o_s[tree.valid].float(), tol)
    assert_close("split vs chunk", o_c[tree.valid].float(), o_s[tree.valid].float(), tol)
    for a_, b_ in zip(*rings):
        assert torch.equal(a_, b_), "ring stores differ"
    for low, t in (("tf32", tol), (None, tol)):
        o_m = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, precision_low=low, **kw)
        assert_close(f"split verify (low={low})", ref[tree.valid], o_m[tree.valid].float(), t)
    for var in (dict(factored=True), dict(factored=True, prep_maxnreg=128), dict(prep_maxnreg=168), dict(apply_t=False)):
        o_v = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, **var, **kw)
        assert_close(f"split verify ({var})", ref[tree.valid], o_v[tree.valid].float(), tol)
    o_t = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, precision="tf32", **kw)
    assert_close("split verify (tf32)", ref[tree.valid], o_t[tree.valid].float(), 2e-3 if dtype == torch.float32 else 8e-3)
    # the mix form (pass 1 per key head: the [BT, BT] mixing matrices only): same outputs, same ring
    ring_m = tuple(torch.zeros_like(t) for t in rings[0])
    o_x = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring=ring_m, ring_rows=ring_rows,
                                        form="mix", **kw)
    assert torch.equal(x["pool"], pool0), "mix verify wrote the state"
    assert_close("mix verify", ref[tree.valid], o_x[tree.valid].float(), tol)
    assert_close("mix vs chunk", o_c[tree.valid].float(), o_x[tree.valid].float(), tol)
    for a_, b_ in zip(rings[0], ring_m):
        assert torch.equal(a_, b_), "mix ring stores differ"
    for var in (dict(precision_low="tf32"), dict(BV=128, num_warps=8), dict(BV=32, num_warps=2, prep_warps=8),
                dict(apply_t=False), dict(apply_t=False, BV=64, num_warps=8), dict(apply_fma=True),
                dict(apply_persistent=1), dict(apply_persistent=2, apply_fma=True), dict(prep_heads=1),
                dict(apply_maxnreg=128)):
        o_v = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, form="mix", **var, **kw)
        assert_close(f"mix verify ({var})", ref[tree.valid], o_v[tree.valid].float(), tol)
    for form in tri.SPLIT_FORMS if DEV == "cuda" else ():  # the tiling that faulted transposed on the H200
        with pytest.raises(ValueError, match="needs BV >= 16"):  # is refused, not launched
            tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, form=form, BV=64, num_warps=8, **kw)


@pytest.mark.parametrize("shape", ["chain-4", "topk2-d3", "topk4-n8", "eagle-16", "eagle-64"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equals_sglang_native_tree_verify(shape, dtype):
    """Same inputs through SGLang 0.5.17's tree-verify kernel: outputs agree, and our replay commit
    equals its per-node snapshot of the accepted node."""
    from lumotree.ops.gdn_tree import triton as tri
    from lumotree.ops.gdn_tree.native import NativeTreeVerify

    rng = random.Random(7)
    p = {"chain-4": tree_shapes.chain(4), "topk2-d3": tree_shapes.eagle(2, 3, 6, rng),
         "topk4-n8": tree_shapes.eagle(4, 3, 8, rng), "eagle-16": tree_shapes.eagle(4, 5, 16, rng),
         "eagle-64": tree_shapes.eagle(8, 8, 64, rng)}[shape]
    B, N, Hk, Hv, K, V = 4, len(p), 4, 12, 128, 128
    x, _, _ = make(B, N, Hk, Hv, K, V, dtype, seed=11)
    parents = torch.tensor([p] * B, device=DEV)
    tree = TreeDescriptor.from_parents(parents)
    nat = NativeTreeVerify(B, N, Hv, V, K, DEV)
    o_nat = nat.verify(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["dt_bias"], x["b"], x["pool"], x["rows"],
                       parents.int())
    mix = functools.partial(tri.gdn_tree_split_verify_fwd, form="mix")
    mix.__name__ = "mix verify"
    for fwd in (tri.gdn_tree_verify_fwd, tri.gdn_tree_chunk_verify_fwd, tri.gdn_tree_split_verify_fwd, mix):
        o = fwd(x["q"], x["k"], x["v"], x["pool"], tree, A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"],
                use_qk_l2norm=True, state_indices=x["rows"])
        assert_close(f"o vs sglang ({fwd.__name__})", o_nat.float(), o.float(),
                     1e-4 if dtype == torch.float32 else 8e-3)
    ends = torch.tensor([N - 1, 0, N // 2, 1 if N > 1 else 0], device=DEV)
    an = tree.root_path(ends)
    al = (an >= 0).sum(-1)
    p_ours, p_nat = x["pool"].clone(), x["pool"].clone()
    tri.gdn_tree_commit_fwd(x["k"], x["v"], p_ours, an, al, A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"],
                            b=x["b"], use_qk_l2norm=True, state_indices=x["rows"])
    nat.commit(p_nat, x["rows"], ends.int())
    assert_close("commit vs sglang snapshot", p_nat, p_ours, 1e-5)
    vnew = torch.zeros(B, N, Hv, V, device=DEV)
    tri.gdn_tree_chunk_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, A_log=x["A_log"], a=x["a"],
                                  dt_bias=x["dt_bias"], b=x["b"], use_qk_l2norm=True, state_indices=x["rows"],
                                  vnew_out=vnew)
    p_vn = x["pool"].clone()
    tri.gdn_tree_commit_vnew_fwd(x["k"], vnew, p_vn, an, al, A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"],
                                 b=x["b"], use_qk_l2norm=True, state_indices=x["rows"])
    assert_close("vnew commit vs sglang snapshot", p_nat, p_vn, 1e-4 if dtype == torch.float32 else 5e-3)
    for bb in range(B):  # also the snapshot itself, request by request
        assert_close(f"snapshot {bb}", nat.intermediate[bb, int(ends[bb])], p_ours[x["rows"][bb].long()], 1e-5)


@pytest.mark.parametrize("impl", ["chunk", "walk", "split", "mix"])
def test_verify_and_commit_capture_in_cuda_graph(impl):
    """Descriptor build (validate=False) + verify + commit with no host sync: captured once, replayed
    on new trees and inputs copied into the static buffers."""
    from lumotree.ops.gdn_tree import triton as tri

    B, N, Hk, Hv, K, V = 3, 16, 2, 8, 128, 128
    x, parents, nums = make(B, N, Hk, Hv, K, V, torch.bfloat16, seed=5, kinds=("eagle",))
    static = {k_: t.clone() for k_, t in x.items()}
    s_par = torch.tensor([tree_shapes.eagle(4, 5, N, random.Random(0))] * B, device=DEV)
    s_num = torch.full((B,), N, device=DEV)
    s_ends = torch.zeros(B, dtype=torch.long, device=DEV)
    out = torch.empty(B, N, Hv, V, dtype=torch.bfloat16, device=DEV)
    slots = N  # static bound on the boundary depth
    scratch = torch.empty(132 * 4 * slots * 16 * 128, dtype=torch.float32, device=DEV)

    def step():
        tree = TreeDescriptor.from_parents(s_par, s_num, validate=False)
        kw = dict(A_log=static["A_log"], a=static["a"], dt_bias=static["dt_bias"], b=static["b"], use_qk_l2norm=True,
                  state_indices=static["rows"], out=out)
        if impl == "walk":
            tri.gdn_tree_verify_fwd(static["q"], static["k"], static["v"], static["pool"], tree, num_slots=slots,
                                    scratch=scratch, **kw)
        elif impl in ("split", "mix"):
            tri.gdn_tree_split_verify_fwd(static["q"], static["k"], static["v"], static["pool"], tree,
                                          form="wy" if impl == "split" else "mix", **kw)
        else:
            tri.gdn_tree_chunk_verify_fwd(static["q"], static["k"], static["v"], static["pool"], tree, **kw)
        an = tree.root_path(s_ends)
        tri.gdn_tree_commit_fwd(static["k"], static["v"], static["pool"], an, (an >= 0).sum(-1),
                                A_log=static["A_log"], a=static["a"], dt_bias=static["dt_bias"], b=static["b"],
                                use_qk_l2norm=True, state_indices=static["rows"])

    pool_before = static["pool"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(s)
    static["pool"].copy_(pool_before)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for trial in range(3):
        x2, par2, num2 = make(B, N, Hk, Hv, K, V, torch.bfloat16, seed=100 + trial, kinds=("random", "eagle"))
        ends = torch.tensor([int(n) - 1 for n in num2.tolist()], device=DEV)
        for k_ in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "pool", "rows"):
            static[k_].copy_(x2[k_])
        s_par.copy_(par2)
        s_num.copy_(num2)
        s_ends.copy_(ends)
        graph.replay()
        tree = TreeDescriptor.from_parents(par2, num2)
        ref = naive.gdn_tree_verify(x2["q"], x2["k"], x2["v"], x2["g"], x2["beta"], x2["pool"], tree,
                                    use_qk_l2norm=True, state_indices=x2["rows"])
        assert_close("graph verify", ref[tree.valid], out[tree.valid].float(), 8e-3)
        an = tree.root_path(ends)
        p_ref = x2["pool"].clone()
        naive.gdn_tree_commit(x2["k"], x2["v"], x2["g"], x2["beta"], p_ref, tree, an, (an >= 0).sum(-1),
                              use_qk_l2norm=True, state_indices=x2["rows"])
        assert_close("graph commit", p_ref, static["pool"], 1e-5)


@pytest.mark.parametrize("W", [2, 4])
def test_conv_tree_gpu(W):
    from lumotree.ops.conv_tree import naive as cn
    from lumotree.ops.conv_tree import triton as ct

    B, N, D = 4, 33, 700
    rows = [make_parents(k_, N, s) for s, k_ in enumerate(("eagle", "random", "caterpillar", "chain"))]
    N = max(len(r) for r in rows)
    tree = TreeDescriptor.from_parents(torch.tensor([r + [-1] * (N - len(r)) for r in rows], device=DEV),
                                       torch.tensor([len(r) for r in rows], device=DEV))
    x = torch.randn(B, N, D, device=DEV, dtype=torch.bfloat16)
    pool = torch.randn(B + 2, D, W - 1, device=DEV, dtype=torch.bfloat16)
    w, bias = torch.randn(D, W, device=DEV), torch.randn(D, device=DEV)
    si = torch.tensor([5, 0, 2, 3], device=DEV, dtype=torch.int32)
    assert_close("conv", cn.conv_tree_verify(x, pool, w, bias, tree, state_indices=si).float(),
                 ct.conv_tree_verify(x, pool, w, bias, tree, state_indices=si).float(), 1e-2)
    an = tree.root_path(tree.num_nodes - 1)
    al = (an >= 0).sum(-1)
    p1, p2 = pool.clone(), pool.clone()
    cn.conv_tree_commit(x, p1, tree, an, al, state_indices=si)
    ct.conv_tree_commit(x, p2, tree, an, al, state_indices=si)
    assert torch.equal(p1, p2)


def test_commit_layers_on_a_pool_past_2_31_elements_per_layer_offset():
    """Regression (seen served: the third GDN layer of a 96k-slot pool was never committed and its
    writes wrapped to a negative offset): the all-layer commit's layer offsets need 64 bits once
    ``layer * slots * Hv * V * K`` passes 2^31 elements. Here 3 layers x 140000 slots x 4 x 64 x 64
    fp32 (27.5 GB): layer 2 starts 4.6e9 elements in."""
    from lumotree.ops.gdn_tree import triton as tri

    L, S, NR, Hk, Hv, K, V = 3, 140000, 6, 2, 4, 64, 64
    assert 2 * S * Hv * V * K > 2**31
    g = torch.Generator(device=DEV).manual_seed(0)
    pool = torch.zeros(L, S, Hv, V, K, device=DEV)
    rows = torch.tensor([S - 1, 7], dtype=torch.int32, device=DEV)
    pool[:, rows.long()] = torch.randn(L, 2, Hv, V, K, device=DEV, generator=g) * 0.05
    ring = (torch.randn(L, 2, NR, Hk, K, device=DEV, generator=g).bfloat16(),
            torch.randn(L, 2, NR, Hv, V, device=DEV, generator=g).bfloat16(),
            -torch.rand(L, 2, NR, Hv, device=DEV, generator=g), torch.rand(L, 2, NR, Hv, device=DEV, generator=g))
    parents = torch.tensor([[0, 0, 0, 1, 1, 3], [0, 0, 0, 1, 2, 2]], dtype=torch.int64, device=DEV)
    last = torch.tensor([5, 3], dtype=torch.int32, device=DEV)
    ring_rows = torch.arange(2, dtype=torch.int32, device=DEV)
    want = pool[:, rows.long()].clone()
    small = want.clone()
    naive.gdn_tree_commit_layers(*(t.float() for t in ring), small, ring_rows.long(), last, parents)
    tri.gdn_tree_commit_layers_fwd(*ring, pool, rows, last, parents, ring_rows=ring_rows)
    got = pool[:, rows.long()]
    for li in range(L):
        assert not torch.equal(got[li], want[li]), f"layer {li} was not committed"
        assert_close(f"layer {li}", small[li], got[li], 1e-4)
    assert pool[:, 8:1000].abs().max() == 0  # no stray writes into other rows


@pytest.mark.parametrize("tree_kind", ["chain", "eagle", "random"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dot_commit_equals_replay_commit_and_reference(tree_kind, dtype):
    """The all-layer commit in chunk form (``form="dot"``) and with the path gathered up front
    (``form="gather"``) == the reference and == the served replay form, at Qwen3.5-like heads (GQA 3), 16- and 64-node trees, with prefix-cache snapshots,
    skipped requests, per-request ring rows; BV 64 / 4 warps (default) and BV 128 / 8 warps."""
    from lumotree.ops.gdn_tree import triton as tri

    L, Hk, Hv, K, V = (1, 2, 6, 32, 32) if SMALL else (2, 4, 12, 128, 128)
    for N in (16,) if SMALL else (16, 64):
        B = 5
        g = torch.Generator(device=DEV).manual_seed(N)
        par = [make_parents(tree_kind, N, b) for b in range(B)]
        parents = torch.tensor([[0] + [max(0, x) for x in p[1:]] for p in par], device=DEV)
        S = B + 4
        pool = torch.randn(L, S, Hv, V, K, device=DEV, generator=g) * 0.05
        ring = (torch.randn(L, B, N, Hk, K, device=DEV, generator=g).to(dtype),
                torch.randn(L, B, N, Hv, V, device=DEV, generator=g).to(dtype),
                -torch.rand(L, B, N, Hv, device=DEV, generator=g), torch.rand(L, B, N, Hv, device=DEV, generator=g))
        rows = torch.tensor([3, 0, -1, 7, 5], dtype=torch.int32, device=DEV)
        last = torch.tensor([N - 1, N // 2, 1, -1, 0], dtype=torch.int32, device=DEV)
        ring_rows = torch.tensor([4, 2, 0, 1, 3], dtype=torch.int32, device=DEV)
        trows = torch.tensor([8, -1, 6, 2, 1], dtype=torch.int32, device=DEV)
        tsteps = torch.tensor([0, 3, 0, 0, 0], dtype=torch.int32, device=DEV)
        want = pool.clone()
        naive.gdn_tree_commit_layers(*(t.float() for t in ring), want, rows.long(), last, parents, trows.long(),
                                     tsteps.long(), ring_rows=ring_rows.long())
        rep = pool.clone()
        tri.gdn_tree_commit_layers_fwd(*ring, rep, rows, last, parents, trows, tsteps, ring_rows=ring_rows)
        tol = 1e-4 if dtype == torch.float32 else 5e-3
        for cfg in (dict(form="dot"), dict(form="dot", BV=128, num_warps=8), dict(form="gather"),
                    dict(form="gather", BV=32)):
            dot = pool.clone()
            tri.gdn_tree_commit_layers_fwd(*ring, dot, rows, last, parents, trows, tsteps, ring_rows=ring_rows, **cfg)
            assert_close(f"dot commit vs reference ({N}, {cfg})", want, dot, tol)
            assert_close(f"dot commit vs replay ({N}, {cfg})", rep, dot, 1e-4)
            assert torch.equal(dot[:, 2], pool[:, 2]) and torch.equal(dot[:, 4], pool[:, 4])  # untouched rows
        if DEV == "cuda":  # (a code-generation limit: the interpreter has none)
            with pytest.raises(ValueError, match="needs BV >= 16"):
                tri.gdn_tree_commit_layers_fwd(*ring, pool.clone(), rows, last, parents, ring_rows=ring_rows, form="dot",
                                               BV=32, num_warps=4)


@pytest.mark.parametrize("N", [6, 16, 64])
def test_mix_verify_key_norms_feed_the_replay_commit(N):
    """The mix verify's pass 1 keeps each node's key norm (``ring_knorm``); the replay commit that
    divides by them (``k_norm``) == the one that reduces every key again == the reference commit,
    at Qwen3.5-27B GDN heads (GQA 3), EAGLE trees, bf16 inputs, per-request ring rows, a skipped
    request; the verify's outputs and ring stores are unchanged by keeping the norms."""
    from lumotree.ops.gdn_tree import triton as tri

    Hk, Hv, K, V = (2, 6, 32, 32) if SMALL else (16, 48, 128, 128)
    B = 4
    x, parents, nums = make(B, N, Hk, Hv, K, V, torch.bfloat16, seed=7 * N, kinds=("eagle",))
    N = parents.shape[1]
    tree = TreeDescriptor.from_parents(parents, nums)
    kw = dict(A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"], use_qk_l2norm=True,
              state_indices=x["rows"], form="mix")
    R = B + 1
    ring_rows = torch.tensor([2, 0, 4, 1], dtype=torch.int32, device=DEV)
    rings = [(torch.zeros(R, N, Hk, K, dtype=torch.bfloat16, device=DEV),
              torch.zeros(R, N, Hv, V, dtype=torch.bfloat16, device=DEV),
              torch.zeros(R, N, Hv, device=DEV), torch.zeros(R, N, Hv, device=DEV)) for _ in range(2)]
    kn = torch.zeros(R, N, Hk, device=DEV)
    o0 = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring=rings[0], ring_rows=ring_rows, **kw)
    o1 = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring=rings[1], ring_rows=ring_rows,
                                       ring_knorm=kn, **kw)
    assert torch.equal(o0[tree.valid], o1[tree.valid]), "keeping the key norms changed the verify's outputs"
    for a_, b_ in zip(*rings):
        assert torch.equal(a_, b_), "keeping the key norms changed the ring stores"
    want_n = torch.sqrt((x["k"].float() ** 2).sum(-1) + 1e-6)  # [B, N, Hk]
    for i in range(B):
        n = int(nums[i])
        assert_close(f"key norms, request {i}", want_n[i, :n], kn[ring_rows[i].long(), :n], 1e-6)
    rows = x["rows"].clone()
    rows[2] = -1  # a padded request: nothing committed
    last = (nums - 1).to(torch.int32)
    sgp = torch.where(parents < 0, 0, parents).int()
    pool = x["pool"][None]
    want = pool.clone()
    naive.gdn_tree_commit_layers(*(t_[None].float() for t_ in rings[0]), want, rows.long(), last, sgp,
                                 ring_rows=ring_rows.long())
    rep = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*(t_[None] for t_ in rings[0]), rep, rows, last, sgp, ring_rows=ring_rows)
    got = pool.clone()
    tri.gdn_tree_commit_layers_fwd(*(t_[None] for t_ in rings[0]), got, rows, last, sgp, ring_rows=ring_rows,
                                   k_norm=kn[None])
    assert_close("commit with kept key norms vs reference", want, got, 1e-5)
    assert_close("commit with kept key norms vs replay", rep, got, 1e-6)
    assert torch.equal(got[:, x["rows"][2].long()], pool[:, x["rows"][2].long()])
    with pytest.raises(ValueError, match="k_norm is read by form='replay'"):
        tri.gdn_tree_commit_layers_fwd(*(t_[None] for t_ in rings[0]), got, rows, last, sgp, ring_rows=ring_rows,
                                       k_norm=kn[None], form="gather")
    with pytest.raises(ValueError, match="ring_knorm"):
        tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring_knorm=kn, **kw)


@pytest.mark.parametrize("N", [6, 16, 64])
def test_fused_step_equals_commit_then_verify(N):
    """The fused step (the previous step's replay commit inside this verify) == the all-layer commit
    followed by the served verify, at Qwen3.5-27B GDN head shapes, EAGLE trees, bf16 inputs."""
    from lumotree.ops.gdn_tree import triton as tri

    B, Hk, Hv, K, V = (2, 2, 6, 32, 32) if SMALL else (8, 16, 48, 128, 128)
    x, parents, nums = make(B, N, Hk, Hv, K, V, torch.bfloat16, 7, kinds=("eagle",))
    N = parents.shape[1]
    tree = TreeDescriptor.from_parents(parents, nums)
    sg_par = torch.where(parents < 0, 0, parents).int()
    ring = (torch.zeros(B, N, Hk, K, device=DEV, dtype=torch.bfloat16),
            torch.zeros(B, N, Hv, V, device=DEV, dtype=torch.bfloat16),
            torch.zeros(B, N, Hv, device=DEV), torch.zeros(B, N, Hv, device=DEV))
    ring_rows = torch.arange(B, dtype=torch.int32, device=DEV)
    kw = dict(A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"], use_qk_l2norm=True,
              state_indices=x["rows"])
    # step 1 fills the buffers; its last accepted nodes are each tree's deepest leaf
    tri.gdn_tree_chunk_verify_fwd(x["q"], x["k"], x["v"], x["pool"], tree, ring=ring, ring_rows=ring_rows, **kw)
    last = (nums - 1).int()
    seq, fused = x["pool"].clone(), x["pool"].clone()
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), seq[None], x["rows"], last, sg_par, ring_rows=ring_rows)
    o_seq = tri.gdn_tree_chunk_verify_fwd(x["q"], x["k"], x["v"], seq, tree, **kw)
    ring2 = tuple(torch.zeros_like(t) for t in ring)
    o_fused = tri.gdn_tree_chunk_verify_fwd(x["q"], x["k"], x["v"], fused, tree, ring=ring2, ring_rows=ring_rows,
                                            pre_commit=dict(ring=ring, rows=ring_rows, last=last, parents=sg_par), **kw)
    assert_close("fused step state", seq, fused, 1e-5)
    # rows past a request's node count are never written (torch.empty in both): compare real nodes
    assert_close("fused step outputs", o_seq[tree.valid].float(), o_fused[tree.valid].float(), 5e-3)
    assert torch.equal(ring2[0], ring[0])  # this step's buffers: the same inputs again
    # the same in mix form (pass 2 commits the previous path on the tile, then verifies)
    seq_m, fused_m = x["pool"].clone(), x["pool"].clone()
    tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), seq_m[None], x["rows"], last, sg_par, ring_rows=ring_rows)
    o_seq_m = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], seq_m, tree, form="mix", **kw)
    ring3 = tuple(torch.zeros_like(t) for t in ring)
    o_fused_m = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], fused_m, tree, form="mix", ring=ring3,
                                              ring_rows=ring_rows, pre_commit=dict(ring=ring, rows=ring_rows, last=last,
                                                                                   parents=sg_par), **kw)
    assert_close("mix fused step state", seq_m, fused_m, 1e-5)
    assert_close("mix fused step outputs", o_seq_m[tree.valid].float(), o_fused_m[tree.valid].float(), 5e-3)
    for a_, b_ in zip(ring, ring3):
        assert torch.equal(a_, b_)
    # the same with the previous path's rows loaded per step (pre_commit["gather"] = False)
    fused_r = x["pool"].clone()
    o_fused_r = tri.gdn_tree_split_verify_fwd(x["q"], x["k"], x["v"], fused_r, tree, form="mix",
                                              ring=tuple(torch.zeros_like(t) for t in ring), ring_rows=ring_rows,
                                              pre_commit=dict(ring=ring, rows=ring_rows, last=last, parents=sg_par,
                                                              gather=False), **kw)
    assert_close("mix fused step (per-step loads) state", seq_m, fused_r, 1e-5)
    assert_close("mix fused step (per-step loads) outputs", o_seq_m[tree.valid].float(),
                 o_fused_r[tree.valid].float(), 5e-3)
