"""Drive LumoTree's SGLang backend (verify for two GDN layers, then the commit) with fake SGLang
state pools on CPU, running our real Triton kernels in Triton's interpreter, against the fp32
references. Checks the plumbing the GPU run cannot isolate: the per-slot buffers' layout, pool
rows, padded rows (slot -1), the accepted path, the track snapshot. SGLang's own conv and
conv-scatter kernels are replaced by stand-ins (they are SGLang's, tested there).

Called by test_backend_emulation.py in a subprocess (TRITON_INTERPRET must be set before import)."""
import os
import sys
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sglang.kernels.ops.mamba.mamba_state_scatter_triton as sg_scatter  # noqa: E402
from sglang.srt.layers.attention.linear import gdn_backend as sg_gdn  # noqa: E402

from lumotree.ops.gdn_tree import naive  # noqa: E402
from lumotree.sglang.backend import LumoTreeGDNBackend  # noqa: E402
from lumotree.tree import TreeDescriptor  # noqa: E402
from utils import assert_close  # noqa: E402

torch.manual_seed(0)
B, N, Hk, Hv, K, V, LAYERS, SLOTS = 3, 6, 1, 2, 16, 16, 2, 5  # request 2 is cuda-graph padding (slot -1)
# SGLang's parents (node 0's entry is 0): request 0: 0 -> {1, 2}, 1 -> 3, 2 -> 4, 3 -> 5; request 1: chain
PARENTS = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
ROWS = torch.tensor([3, 1, -1], dtype=torch.int32)


def fake_conv(x, conv_state, weight, bias, activation, *, retrieve_parent_token=None, **kw):
    if retrieve_parent_token is not None:
        retrieve_parent_token.copy_(PARENTS)
    return x  # identity stand-in for SGLang's tree conv


def gating(A_log, a, b, dt_bias):  # SGLang's fused_gdn_gating, in torch: the reference
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g[None], torch.sigmoid(b.float())[None]


scattered = []
sg_gdn.causal_conv1d_update = fake_conv
sg_scatter.fused_conv_window_scatter_with_mask = lambda *a: scattered.append(a)

temporal = torch.randn(LAYERS, SLOTS + 1, Hv, V, K) * 0.1
start = temporal.clone()
rings = SimpleNamespace(
    replayssm_rawk=torch.zeros(LAYERS, SLOTS + 1, Hk, N, K), replayssm_rawv=torch.zeros(LAYERS, SLOTS + 1, Hv, N, V),
    replayssm_g=torch.zeros(LAYERS, SLOTS + 1, Hv, N), replayssm_beta=torch.zeros(LAYERS, SLOTS + 1, Hv, N))
conv = [torch.zeros(LAYERS, SLOTS + 1, 8, 3)]
window = [torch.zeros(LAYERS, SLOTS + 1, N, 8, 3)]
all_layers = SimpleNamespace(temporal=temporal, conv=conv, intermediate_conv_window=window, **vars(rings))


class Pool:
    def mamba2_layer_cache(self, layer_id):
        return SimpleNamespace(**{k: (v[layer_id] if torch.is_tensor(v) else [t[layer_id] for t in v])
                                  for k, v in vars(all_layers).items()})

    def get_speculative_mamba2_params_all_layers(self):
        return all_layers


be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
be.lumotree, be.ring_len, be._first_gdn_layer, be._cur_tree = True, N, 1 << 30, None
be.req_to_token_pool = Pool()
be.verify_intermediate_state_indices = torch.arange(B)
be.forward_metadata = SimpleNamespace(mamba_cache_indices=ROWS, retrieve_next_token=torch.zeros(B, N, dtype=torch.int32),
                                      retrieve_next_sibling=torch.zeros(B, N, dtype=torch.int32),
                                      retrieve_parent_token=torch.zeros(B, N, dtype=torch.int32))
fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                     spec_info=SimpleNamespace(draft_token_num=N))
tree = TreeDescriptor.from_parents(torch.where(torch.arange(N) == 0, -1, PARENTS.long()), validate=False)
inputs = []
for li in range(LAYERS):
    layer = SimpleNamespace(layer_id=li, num_k_heads=Hk, head_k_dim=K, num_v_heads=Hv, head_v_dim=V, q_dim=Hk * K,
                            k_dim=Hk * K, v_dim=Hv * V, conv_weights=None, bias=None, activation="silu",
                            A_log=torch.randn(Hv), dt_bias=torch.randn(Hv))
    mixed = torch.randn(B * N, 2 * Hk * K + Hv * V)
    a, b = torch.randn(B * N, Hv), torch.randn(B * N, Hv)
    o = be.forward_extend(layer, fb, mixed, a, b)
    q, k, v = torch.split(mixed, [Hk * K, Hk * K, Hv * V], -1)
    q, k, v = q.reshape(B, N, Hk, K), k.reshape(B, N, Hk, K), v.reshape(B, N, Hv, V)
    g, beta = (t[0].reshape(B, N, Hv) for t in gating(layer.A_log, a, b, layer.dt_bias))
    ref = naive.gdn_tree_verify(q[:2], k[:2], v[:2], g[:2], beta[:2], start[li], TreeDescriptor(
        **{f: getattr(tree, f)[:2] for f in tree.__dataclass_fields__}), use_qk_l2norm=True,
        state_indices=ROWS[:2].long())
    assert_close(f"layer {li} verify", ref, o.view(B, N, Hv, V)[:2], 1e-4)
    assert torch.equal(temporal[li], start[li]), "verify must not write the state"
    assert torch.equal(rings.replayssm_rawk[li].view(-1, N, Hk, K)[3], k[0])  # slot 3 holds request 0
    inputs.append((k, v, g, beta))

# SGLang accepted request 0 up to node 5 (path 0, 1, 3, 5) with a track snapshot after node 1 into
# row 0, and request 1 up to node 2 (path 0, 1, 2), no track
be.commit_after_verify(torch.tensor([5, 2]), torch.tensor([0, 2]), torch.tensor([1, -1]))
for li, (k, v, g, beta) in enumerate(inputs):
    for b, (row, path) in enumerate([(3, [0, 1, 3, 5]), (1, [0, 1, 2])]):
        S = start[li, row].double()
        for j, i in enumerate(path):
            kk = k[b, i].double()
            kk = (kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(Hv // Hk, 0)
            S = S * torch.exp(g[b, i].double())[:, None, None]
            u = (v[b, i].double() - torch.einsum("hvk,hk->hv", S, kk)) * beta[b, i].double()[:, None]
            S = S + u[:, :, None] * kk[:, None, :]
            if b == 0 and j == 1:
                assert_close(f"layer {li} track row", S, temporal[li, 0], 1e-5)
        assert_close(f"layer {li} request {b} committed", S, temporal[li, row], 1e-5)
    for row in (2, 4):
        assert torch.equal(temporal[li, row], start[li, row]), "untouched rows stay"
assert len(scattered) == 2 and torch.equal(scattered[0][3], torch.tensor([5, 2]))  # conv windows: last step, track
print("backend emulation == references")
