"""GPU tests of the decode-exact verify: bit-identical to SGLang 0.5.17's own one-token decode
kernels run token by token along every node's root path (python3 -m pytest -q -m gpu test/ops/test_exact_gpu.py).

These are the premise of LUMOTREE's exact mode (``--enable-deterministic-inference``): a node's GDN
output, the state the commit leaves, the conv output and the attention output equal, bit for bit,
what a non-speculative server's decode computes at that position."""
import pytest
import torch

from lumotree.ops.exact import naive
from lumotree.ops.exact import triton as tri
from lumotree.tree import ancestor_mask, eagle_links

pytestmark = pytest.mark.gpu
PARENTS = [[-1, 0, 0, 1, 1, 2, 3, 5], [-1, 0, 1, 2, 3, 4, 5, 6], [-1, 0, 0, 0, 1, 4, 4, 2]]
SHAPES = {"tiny": (2, 4, 64, 64), "qwen3.5-27b": (16, 48, 128, 128)}


def _inputs(shape, seed=0, B=3, N=8):
    H, HV, K, V = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    dev = "cuda"
    par = torch.tensor([p[:N] for p in PARENTS[:B]], device=dev)
    x = torch.randn(B, N, 2 * H * K + HV * V, generator=g).to(torch.bfloat16).to(dev)
    a = torch.randn(B, N, HV, generator=g).to(torch.bfloat16).to(dev)
    b = torch.randn(B, N, HV, generator=g).to(torch.bfloat16).to(dev)
    A_log = (torch.rand(HV, generator=g) * 2).to(dev)
    dt_bias = torch.randn(HV, generator=g).to(torch.bfloat16).to(dev)
    pool = (torch.randn(B + 2, HV, V, K, generator=g) * 0.05).to(dev)
    rows = torch.tensor([3, 0, 4], dtype=torch.int32, device=dev)[:B]
    return H, HV, K, V, par, x, a, b, A_log, dt_bias, pool, rows


def _decode_path(x, a, b, A_log, dt_bias, h, path, H, HV, V, K):
    """SGLang's packed decode kernel, one token at a time along ``path`` from state ``h`` `[1, HV, V, K]`
    (updated in place); returns the last output."""
    from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode

    out = None
    for t in path:
        out = x.new_empty(1, 1, HV, V)
        fused_recurrent_gated_delta_rule_packed_decode(
            mixed_qkv=x[t][None].contiguous(), a=a[t][None].contiguous(), b=b[t][None].contiguous(), A_log=A_log,
            dt_bias=dt_bias, scale=K ** -0.5, initial_state=h, out=out,
            ssm_state_indices=torch.zeros(1, dtype=torch.int32, device=x.device), use_qk_l2norm_in_kernel=True)
    return out[0, 0]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_exact_gdn_verify_and_commit_equal_sglang_decode_bitwise(shape):
    H, HV, K, V, par, x, a, b, A_log, dt_bias, pool, rows = _inputs(shape)
    B, N = par.shape
    R = 5
    ring = (torch.zeros(R, N, H, K, dtype=x.dtype, device="cuda"), torch.zeros(R, N, HV, V, dtype=x.dtype, device="cuda"),
            torch.zeros(R, N, HV, device="cuda"), torch.zeros(R, N, HV, device="cuda"))
    ring_rows = torch.tensor([1, 4, 2], dtype=torch.int32, device="cuda")[:B]
    before = pool.clone()
    o = tri.gdn_tree_exact_verify_fwd(x, a, b, A_log, dt_bias, pool, rows, par.contiguous(), H, K ** -0.5,
                                      ring=ring, ring_rows=ring_rows)
    assert torch.equal(pool, before), "the verify wrote the pool"
    bad = []
    for bi in range(B):
        for i in range(N):
            h = pool[int(rows[bi])][None].clone()
            ref = _decode_path(x[bi], a[bi], b[bi], A_log, dt_bias, h, naive.root_path(par, bi, i), H, HV, V, K)
            if not torch.equal(o[bi, i], ref):
                bad.append((bi, i, (o[bi, i].float() - ref.float()).abs().max().item()))
    assert not bad, f"exact verify != SGLang decode at (request, node, max |diff|): {bad}"
    # the commit: replay the accepted path from the ring into the pool = decode's state after the path
    last = torch.tensor([6, 7, 5], dtype=torch.int32, device="cuda")[:B]
    st = pool[None].clone()
    tri.gdn_tree_exact_commit_layers_fwd(*(t[None].contiguous() for t in ring), st, rows, last, par.int().contiguous(),
                                         ring_rows=ring_rows)
    for bi in range(B):
        h = pool[int(rows[bi])][None].clone()
        _decode_path(x[bi], a[bi], b[bi], A_log, dt_bias, h, naive.root_path(par, bi, int(last[bi])), H, HV, V, K)
        assert torch.equal(st[0, int(rows[bi])], h[0]), \
            f"request {bi}: committed state != decode's, max |diff| {(st[0, int(rows[bi])] - h[0]).abs().max().item()}"


@pytest.mark.parametrize("dim", [512, 10240])
def test_exact_conv_equals_sglang_decode_conv_bitwise(dim):
    """SGLang's tree conv (it keeps every node's window) + the per-node decode conv on the gathered
    states = SGLang's decode conv run token by token along the root path."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    g = torch.Generator().manual_seed(1)
    B, N, W = 3, 8, 4
    par = torch.tensor(PARENTS, device="cuda")
    nxt, sib = eagle_links(par)
    x = torch.randn(B, N, dim, generator=g).to(torch.bfloat16).cuda()
    w = torch.randn(dim, W, generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(dim, generator=g).to(torch.bfloat16).cuda()
    pool = torch.randn(6, W - 1, dim, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)  # feature-contiguous
    rows = torch.tensor([4, 1, 2], dtype=torch.int32, device="cuda")
    windows = torch.zeros(B + 1, N, dim, W - 1, dtype=torch.bfloat16, device="cuda")
    inter = torch.tensor([2, 0, 3], dtype=torch.int32, device="cuda")
    committed = pool.clone()
    root = pool[rows.long()].clone()
    causal_conv1d_update(x.transpose(1, 2), pool, w, bias, "silu", conv_state_indices=rows,
                         intermediate_conv_window=windows, intermediate_state_indices=inter,
                         retrieve_next_token=nxt.int(), retrieve_next_sibling=sib.int(), retrieve_parent_token=par.int())
    st = torch.empty(B * N, W - 1, dim, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    tri.conv_tree_exact_states(root, windows[inter.long()], par, out=st)
    y = causal_conv1d_update(x.reshape(B * N, dim), st, w, bias, "silu",
                             conv_state_indices=torch.arange(B * N, dtype=torch.int32, device="cuda"))
    for bi in range(B):
        for i in range(N):
            s = committed[int(rows[bi])][None].clone()
            for t in naive.root_path(par, bi, i):
                ref = causal_conv1d_update(x[bi, t][None].contiguous(), s, w, bias, "silu",
                                           conv_state_indices=torch.zeros(1, dtype=torch.int32, device="cuda"))
            assert torch.equal(y[bi * N + i], ref[0]), f"conv of request {bi}, node {i}"


def test_tree_decode_attention_equals_sglang_decode_bitwise():
    """Per-node KV lists (prefix + root path) fed to SGLang's split-KV decode kernel with the
    deterministic split size = one decode per node with the same list; and the lists = the reference's."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    g = torch.Generator().manual_seed(2)
    B, N, Hq, Hkv, D, tile = 3, 8, 4, 2, 64, 256
    par = torch.tensor(PARENTS, device="cuda")
    ctx = 1200
    slots = 8192
    kbuf = torch.randn(slots, Hkv, D, generator=g).to(torch.bfloat16).cuda()
    vbuf = torch.randn(slots, Hkv, D, generator=g).to(torch.bfloat16).cuda()
    r2t = torch.randperm(slots - 100, generator=g)[: 4 * ctx].reshape(4, ctx).int().cuda()
    rpi = torch.tensor([3, 0, 2], device="cuda")
    seq = torch.tensor([5, 700, 511], dtype=torch.int32, device="cuda")
    ocl = torch.arange(slots - 100, slots - 100 + B * N, device="cuda")
    depth = ancestor_mask(par).sum(-1) - 1
    kv_indices = torch.empty(B * N * (ctx + N), dtype=torch.int64, device="cuda")
    ip, ix, lens = tri.tree_decode_kv_fwd(r2t, rpi, seq, par, ocl, N, depth, kv_indices=kv_indices)
    ip_ref, ix_ref = naive.tree_decode_kv(r2t.cpu(), rpi.cpu(), seq.cpu(), par.cpu(), ocl.cpu(), N)
    assert torch.equal(ip.cpu(), ip_ref) and torch.equal(ix[: ix_ref.numel()].cpu(), ix_ref.long())
    max_splits = (ctx + N + tile - 1) // tile
    q = torch.randn(B * N, Hq, D, generator=g).to(torch.bfloat16).cuda()

    def run(qq, indptr, indices, L):
        o = torch.empty(qq.shape[0], Hq, D, dtype=torch.bfloat16, device="cuda")
        logits = torch.empty(qq.shape[0], Hq, max_splits, D, dtype=torch.float32, device="cuda")
        lse = torch.empty(qq.shape[0], Hq, max_splits, dtype=torch.float32, device="cuda")
        splits = ((L + tile - 1) // tile).int()
        decode_attention_fwd(qq, kbuf, vbuf, o, indptr, indices, logits, lse, splits, max_splits, D ** -0.5, 1.0, 1.0)
        return o

    o_tree = run(q, ip, ix, lens)
    for t in range(B * N):
        one = ix[int(ip[t]): int(ip[t + 1])]
        o1 = run(q[t: t + 1], torch.tensor([0, one.numel()], dtype=torch.int32, device="cuda"), one.clone(),
                 lens[t: t + 1])
        assert torch.equal(o_tree[t], o1[0]), f"attention of query {t}"
