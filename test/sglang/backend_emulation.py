"""Drive LumoTree's SGLang backend (verify for two GDN layers, then the commit) with fake SGLang
state pools on CPU, running our real Triton kernels in Triton's interpreter, against the fp32
references. Checks the plumbing the GPU run cannot isolate: the per-slot buffers' layout, pool
rows, padded rows (slot -1), the accepted path, the track snapshot. SGLang's own conv and
conv-scatter kernels are replaced by stand-ins (they are SGLang's, tested there).

Called by test_backend_emulation.py in a subprocess (TRITON_INTERPRET must be set before import);
with the argument ``cuda`` it runs the same on the GPU at Qwen3.5-27B GDN shapes (bf16 activations,
16-node EAGLE trees): ``python3 test/sglang/backend_emulation.py cuda``."""
import os
import random
import sys
from types import SimpleNamespace

CUDA = "cuda" in sys.argv[1:]
CHAIN = "chain" in sys.argv[1:]  # topk 1: SGLang passes no tree links, the drafts are chains
EXACT = "exact" in sys.argv[1:]  # the decode-exact verify (--enable-deterministic-inference)
assert CUDA or os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sglang.kernels.ops.mamba.mamba_state_scatter_triton as sg_scatter  # noqa: E402
from sglang.srt.layers.attention.linear import gdn_backend as sg_gdn  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MambaPool  # noqa: E402

from lumotree.ops.gdn_tree import naive  # noqa: E402
from lumotree.sglang.backend import LumoTreeGDNBackend, adopt_pool  # noqa: E402
from lumotree.sglang.crosscheck import CrossCheck  # noqa: E402
from lumotree.tree import TreeDescriptor  # noqa: E402
from utils import assert_close  # noqa: E402

torch.manual_seed(0)
DEV = "cuda" if CUDA else "cpu"
ACT = torch.bfloat16 if CUDA else torch.float32  # SGLang's activations are bf16 on the GPU
if CUDA:  # Qwen3.5-27B GDN heads, 16-node EAGLE trees, 9 requests + 1 padded row, 3 layers
    from lumotree import tree_shapes

    B, N, Hk, Hv, K, V, LAYERS, SLOTS = 10, 16, 16, 48, 128, 128, 3, 12
    rng = random.Random(0)
    rows_ = [[max(p, 0) for p in tree_shapes.eagle(4, 4, N, rng)] for _ in range(B - 1)] + [[0] * N]
    PARENTS = torch.tensor(rows_, dtype=torch.int32, device=DEV)
    ROWS = torch.tensor(list(range(1, B)) + [-1], dtype=torch.int32, device=DEV)
else:
    B, N, Hk, Hv, K, V, LAYERS, SLOTS = 3, 6, 1, 2, 16, 16, 2, 5  # request 2 is cuda-graph padding (slot -1)
    # SGLang's parents (node 0's entry is 0): request 0: 0 -> {1, 2}, 1 -> 3, 2 -> 4, 3 -> 5; request 1: chain
    PARENTS = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    ROWS = torch.tensor([3, 1, -1], dtype=torch.int32)
REAL = B - 1  # requests that are not padding
if CHAIN:
    PARENTS = (torch.arange(N, device=DEV) - 1).clamp(min=0).int()[None].expand(B, N).contiguous()


def fake_conv(x, conv_state, weight, bias, activation, *, retrieve_parent_token=None, **kw):
    if retrieve_parent_token is not None:
        retrieve_parent_token.copy_(PARENTS)
    return x  # identity stand-in for SGLang's tree conv (its parents output is what we need)


def gating(A_log, a, b, dt_bias):  # SGLang's fused_gdn_gating, in torch: the reference
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g[None], torch.sigmoid(b.float())[None]


scattered = []
sg_gdn.causal_conv1d_update = fake_conv
sg_scatter.fused_conv_window_scatter_with_mask = lambda *a: scattered.append(a)

temporal = torch.randn(LAYERS, SLOTS + 1, Hv, V, K, device=DEV) * 0.1
start = temporal.clone()
RUNNING = B + 1  # SGLang's speculative rows: max_running_requests + 1 (its padding row); here > B
conv = [torch.zeros(LAYERS, SLOTS + 1, 8, 3, device=DEV)]
window = [torch.zeros(LAYERS, RUNNING, N, 8, 3, device=DEV)]
# SGLang's own state dataclass, as its pool builds it under enable_linear_replayssm_spec: ring buffers
# per pool slot (which LumoTree releases), no intermediate_ssm
mamba_pool = SimpleNamespace(replayssm_spec_fold=True, mamba_cache=MambaPool.SpeculativeState(
    conv=conv, temporal=temporal, intermediate_ssm=None, intermediate_conv_window=window,
    replayssm_rawk=torch.zeros(LAYERS, SLOTS + 1, Hk, N, K, dtype=ACT, device=DEV),
    replayssm_rawv=torch.zeros(LAYERS, SLOTS + 1, Hv, N, V, dtype=ACT, device=DEV),
    replayssm_g=torch.zeros(LAYERS, SLOTS + 1, Hv, N, device=DEV),
    replayssm_beta=torch.zeros(LAYERS, SLOTS + 1, Hv, N, device=DEV)))
MAMBA_MAP = {li: li for li in range(LAYERS)}


class Pool:  # SGLang's HybridReqToTokenPool, what the backend reads of it
    mamba_map = MAMBA_MAP

    def __init__(self):
        self.mamba_pool = mamba_pool

    def mamba2_layer_cache(self, layer_id):
        return mamba_pool.mamba_cache.at_layer_idx(MAMBA_MAP[layer_id])

    def get_speculative_mamba2_params_all_layers(self):
        return mamba_pool.mamba_cache


be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
be.lumotree, be._first_gdn_layer, be._cur_tree = True, 1 << 30, None
# the in-server cross-check runs too: SGLang's own tree-verify kernel (per-node snapshots) on the
# same inputs, compared with our verify and our commit
be.check = CrossCheck()
report = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"lumotree-emulation-check-{os.getpid()}.json")
be.check.report = report
be.check.dump_dir = report[:-5] + "-dump"  # and the tensor dump that benchmark/serving/check_dump.py replays
be.exact = EXACT
be.one_token_decode, be._verify_tokens = True, None
if EXACT:  # the cross-check compares with SGLang's tree kernel, which the exact verify does not mirror
    be.check = None
be.req_to_token_pool = Pool()
be.scratch = adopt_pool(mamba_pool)
assert adopt_pool(mamba_pool) is be.scratch  # one scratch per pool, shared by every backend on it
assert mamba_pool.mamba_cache.replayssm_rawk is None and mamba_pool.mamba_cache.temporal is temporal
assert not mamba_pool.replayssm_spec_fold  # SGLang's chain fold stays off
assert tuple(be.scratch.k.shape) == (LAYERS, RUNNING, N, Hk, K) and be.scratch.k.dtype == ACT
# request b's verify inputs live in scratch row b (SGLang's verify_intermediate_state_indices, an arange)
be.verify_intermediate_state_indices = torch.arange(RUNNING, dtype=torch.int32, device=DEV)
zeros = lambda: torch.zeros(B, N, dtype=torch.int32, device=DEV)  # noqa: E731
be.forward_metadata = SimpleNamespace(mamba_cache_indices=ROWS, retrieve_next_token=None if CHAIN else zeros(),
                                      retrieve_next_sibling=None if CHAIN else zeros(),
                                      retrieve_parent_token=None if CHAIN else zeros())
fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                     spec_info=SimpleNamespace(draft_token_num=N))
idx = torch.arange(N, device=DEV)
tree = TreeDescriptor.from_parents(torch.where(idx == 0, -1, PARENTS.long()), validate=False)
real_tree = TreeDescriptor(**{f: getattr(tree, f)[:REAL] for f in tree.__dataclass_fields__})
inputs = []
for li in range(LAYERS):
    layer = SimpleNamespace(layer_id=li, num_k_heads=Hk, head_k_dim=K, num_v_heads=Hv, head_v_dim=V, q_dim=Hk * K,
                            k_dim=Hk * K, v_dim=Hv * V, conv_weights=None, bias=None, activation="silu",
                            A_log=torch.randn(Hv, device=DEV), dt_bias=torch.randn(Hv, device=DEV))
    mixed = torch.randn(B * N, 2 * Hk * K + Hv * V, device=DEV).to(ACT)
    a, b = torch.randn(B * N, Hv, device=DEV).to(ACT), torch.randn(B * N, Hv, device=DEV).to(ACT)
    o = be.forward_extend(layer, fb, mixed, a, b)
    q, k, v = torch.split(mixed, [Hk * K, Hk * K, Hv * V], -1)
    q, k, v = q.reshape(B, N, Hk, K), k.reshape(B, N, Hk, K), v.reshape(B, N, Hv, V)
    g, beta = (t[0].reshape(B, N, Hv) for t in gating(layer.A_log, a, b, layer.dt_bias))
    if EXACT:  # the decode kernel rounds beta to the activations' dtype
        beta = beta.to(ACT).float()
    ref = naive.gdn_tree_verify(q[:REAL], k[:REAL], v[:REAL], g[:REAL], beta[:REAL], start[li], real_tree,
                                use_qk_l2norm=True, state_indices=ROWS[:REAL].long())
    assert_close(f"layer {li} verify", ref, o.view(B, N, Hv, V)[:REAL], 5e-3 if CUDA else 1e-4)
    assert torch.equal(temporal[li], start[li]), "verify must not write the state"
    assert torch.equal(be.scratch.k[li, 0], k[0]) and torch.equal(be.scratch.v[li, 1], v[1])  # row b: request b
    assert not be.scratch.k[li, REAL:].any()  # the padded request (slot -1) and the spare row stay empty
    inputs.append((k, v, g, beta))

# SGLang's acceptance: request b's last accepted node is the deepest node of its tree (request 0:
# node 5, path 0, 1, 3, 5), with a prefix-cache snapshot after path position 1 of request 0 into row 0
last = torch.tensor([N - 1] * REAL, device=DEV)
if not CUDA:
    last = torch.tensor([5, 2])
paths = [real_tree.root_path(last)[b] for b in range(REAL)]
paths = [[int(x) for x in p if x >= 0] for p in paths]
track_rows = torch.full((REAL,), -1, dtype=torch.long, device=DEV)
track_steps = torch.full((REAL,), -1, dtype=torch.long, device=DEV)
track_rows[0], track_steps[0] = 0, paths[0][1]
be.commit_after_verify(last, track_rows, track_steps)
for li, (k, v, g, beta) in enumerate(inputs):
    for b in range(REAL):
        row, path = int(ROWS[b]), paths[b]
        S = start[li, row].double()
        for j, i in enumerate(path):
            kk = k[b, i].double()
            kk = (kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(Hv // Hk, 0)
            S = S * torch.exp(g[b, i].double())[:, None, None]
            u = (v[b, i].double() - torch.einsum("hvk,hk->hv", S, kk)) * beta[b, i].double()[:, None]
            S = S + u[:, :, None] * kk[:, None, :]
            if b == 0 and j == 1:
                assert_close(f"layer {li} track row", S, temporal[li, 0], 1e-4 if CUDA else 1e-5)
        assert_close(f"layer {li} request {b} committed", S, temporal[li, row], 1e-4 if CUDA else 1e-5)
    untouched = sorted(set(range(1, SLOTS + 1)) - {int(r) for r in ROWS[:REAL]})
    for row in untouched:
        assert torch.equal(temporal[li, row], start[li, row]), f"row {row} must stay untouched"
if EXACT:
    assert len(scattered) == 2 and torch.equal(scattered[0][3], last)
    print("backend emulation == references", DEV, "chain" if CHAIN else "tree", "exact")
    sys.exit(0)
import json  # noqa: E402

import shutil  # noqa: E402

worst = json.load(open(report))["worst_rel_err"]
os.remove(report)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "serving"))
import check_dump  # noqa: E402

replayed = check_dump.analyse(os.path.join(be.check.dump_dir, "step0.pt"))
shutil.rmtree(be.check.dump_dir)
assert len(replayed) == LAYERS * REAL, len(replayed)
for r in replayed:  # the dump replays to the same verdict offline
    assert r["scratch_k_is_verify_k"] and r["scratch_v_is_verify_v"] and r["served_commit_wrote_the_row"], r
    assert r["replay_rel_err_vs_sglang_snapshot"] < 1e-5 and r["served_commit_rel_err_vs_replay"] < 1e-5, r
assert worst["verify"] < (1e-2 if CUDA else 1e-4) and worst["commit"] < 1e-5, worst  # == SGLang's kernel
assert len(scattered) == 2 and torch.equal(scattered[0][3], last)  # conv windows: last step, then track
if not CUDA:
    assert paths == ([[0, 1, 2, 3, 4, 5], [0, 1, 2]] if CHAIN else [[0, 1, 3, 5], [0, 1, 2]])
print("backend emulation == references", DEV, "chain" if CHAIN else "tree")
