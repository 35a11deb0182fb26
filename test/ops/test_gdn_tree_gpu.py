"""GPU tests of the Triton GDN tree kernels (run on the H200: python3 -m pytest -q -m gpu test).

``LUMOTREE_GPU_TESTS_DEVICE=cpu`` (with ``TRITON_INTERPRET=1``) runs a test function's logic on the
CPU at small shapes (``SMALL``): test_gpu_tests_in_interpreter.py does, so a broken GPU test shows
in CI, not first on the GPU. Code-generation checks (tilings refused on the GPU) run on CUDA only."""
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


@pytest.mark.parametrize("impl", ["mix", "walk"])
@pytest.mark.parametrize("kind, B, N, Hk, Hv, K, V, dtype", CASES)
def test_verify_and_commit_match_reference(kind, B, N, Hk, Hv, K, V, dtype, impl):
    """Both verify forms and the replay commit == the references; the verify writes no state; the
    mix verify's ring stores are the raw inputs and feed the all-layer commit."""
    from lumotree.ops.gdn_tree import triton as tri

    fwd = tri.gdn_tree_mix_verify_fwd if impl == "mix" else tri.gdn_tree_walk_verify_fwd
    x, parents, nums = make(B, N, Hk, Hv, K, V, dtype, seed=N + B, kinds=(kind, "random"))
    tree = TreeDescriptor.from_parents(parents, nums)
    pool0 = x["pool"].clone()
    ref = naive.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], tree, use_qk_l2norm=True,
                                state_indices=x["rows"])
    o = tri.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], tree, use_qk_l2norm=True,
                            state_indices=x["rows"])  # the public op: the mix verify up to 64 nodes
    assert_close("verify (public op)", ref, o, 1e-4 if dtype == torch.float32 else 8e-3)
    tol = (1e-5 if impl == "walk" else 1e-4) if dtype == torch.float32 else 8e-3  # mix: tf32x3 dots
    NR = N + 2
    ring = (torch.zeros(B + 1, NR, Hk, K, dtype=dtype, device=DEV), torch.zeros(B + 1, NR, Hv, V, dtype=dtype, device=DEV),
            torch.zeros(B + 1, NR, Hv, device=DEV), torch.zeros(B + 1, NR, Hv, device=DEV))
    ring_rows = torch.randperm(B + 1, device=DEV)[:B].int()
    kw = dict(ring=ring, ring_rows=ring_rows) if impl == "mix" else {}
    of = fwd(x["q"], x["k"], x["v"], x["pool"], tree, A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"],
             use_qk_l2norm=True, state_indices=x["rows"], out=torch.zeros_like(o), **kw)
    assert torch.equal(x["pool"], pool0), "verify wrote the state"
    assert_close(f"{impl} verify fused gating", ref, of, tol)
    ends = torch.tensor([random.Random(b).randrange(int(n)) for b, n in enumerate(nums.tolist())], device=DEV)
    an = tree.root_path(ends)
    al = (an >= 0).sum(-1)
    p_ref, p_tri = x["pool"].clone(), x["pool"].clone()
    naive.gdn_tree_commit(x["k"], x["v"], x["g"], x["beta"], p_ref, tree, an, al, use_qk_l2norm=True,
                          state_indices=x["rows"])
    tri.gdn_tree_commit(x["k"], x["v"], x["g"], x["beta"], p_tri, tree, an, al, use_qk_l2norm=True,
                        state_indices=x["rows"])
    assert_close("commit", p_ref, p_tri, 1e-5)
    if impl == "mix":  # the served pair: the all-layer commit reads what the verify kept
        for i in range(B):
            n, r = int(nums[i]), ring_rows[i].long()
            assert torch.equal(ring[0][r, :n], x["k"][i, :n]) and torch.equal(ring[1][r, :n], x["v"][i, :n])
        p_srv = x["pool"].clone()[None]
        sgp = torch.where(parents < 0, 0, parents).int()
        tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_srv, x["rows"], ends.int(), sgp,
                                       ring_rows=ring_rows)
        assert_close("served commit from the verify's buffers", p_ref, p_srv[0],
                     1e-4 if dtype == torch.float32 else 5e-3)
        # the launcher options the tile sweep times: pass 1 with one value head per program, storing each key's
        # inverse L2 norm in a fifth ring buffer, and the commit reading it -- the same outputs, stores and state
        ring5 = (*(torch.zeros_like(t) for t in ring), torch.zeros(B + 1, NR, Hk, device=DEV))
        o5 = fwd(x["q"], x["k"], x["v"], x["pool"], tree, A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"],
                 use_qk_l2norm=True, state_indices=x["rows"], out=torch.zeros_like(o), ring=ring5, ring_rows=ring_rows,
                 prep_heads=1)
        assert torch.equal(o5, of) and all(torch.equal(a_, b_) for a_, b_ in zip(ring5, ring))
        for i in range(B):
            n, r = int(nums[i]), ring_rows[i].long()
            assert_close("stored inverse key norms", 1 / (x["k"][i, :n].float().pow(2).sum(-1) + 1e-6).sqrt(),
                         ring5[4][r, :n], 1e-6)
        p_rn = x["pool"].clone()[None]
        tri.gdn_tree_commit_layers_fwd(*(t[None] for t in ring), p_rn, x["rows"], ends.int(), sgp,
                                       ring_rows=ring_rows, rnorm=ring5[4][None].contiguous())
        assert_close("commit reading the stored key norms", p_srv, p_rn, 1e-6)
        if DEV == "cuda":  # the tiling that faulted transposed on the H200 is refused, not launched
            with pytest.raises(ValueError, match="needs BV >= 16"):
                fwd(x["q"], x["k"], x["v"], x["pool"], tree, x["g"], x["beta"], BV=64, num_warps=8,
                    state_indices=x["rows"])


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
    for fwd in (tri.gdn_tree_walk_verify_fwd, tri.gdn_tree_mix_verify_fwd):
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
    for bb in range(B):  # also the snapshot itself, request by request
        assert_close(f"snapshot {bb}", nat.intermediate[bb, int(ends[bb])], p_ours[x["rows"][bb].long()], 1e-5)


@pytest.mark.parametrize("impl", ["walk", "mix"])
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

    def step():
        tree = TreeDescriptor.from_parents(s_par, s_num, validate=False)
        kw = dict(A_log=static["A_log"], a=static["a"], dt_bias=static["dt_bias"], b=static["b"], use_qk_l2norm=True,
                  state_indices=static["rows"], out=out)
        if impl == "walk":
            tri.gdn_tree_walk_verify_fwd(static["q"], static["k"], static["v"], static["pool"], tree, num_slots=slots,
                                         **kw)
        else:
            tri.gdn_tree_mix_verify_fwd(static["q"], static["k"], static["v"], static["pool"], tree, **kw)
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
