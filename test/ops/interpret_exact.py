"""The decode-exact kernels in Triton's CPU interpreter against ``ops/exact/naive.py`` (run by
test_exact.py in a subprocess: TRITON_INTERPRET must be set before import)."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from lumotree.ops.exact import naive, triton as tri  # noqa: E402
from lumotree.ops.gdn_tree import naive as gdn_naive  # noqa: E402
from utils import assert_close  # noqa: E402

g = torch.Generator().manual_seed(3)
B, N, H, HV, K, V, S = 3, 6, 1, 2, 16, 64, 5
parents = torch.tensor([[-1, 0, 0, 1, 1, 3], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 2, 2]], dtype=torch.int64)
x = torch.randn(B, N, 2 * H * K + HV * V, generator=g)
a, b = torch.randn(B, N, HV, generator=g), torch.randn(B, N, HV, generator=g)
A_log, dt_bias = torch.rand(HV, generator=g), torch.rand(HV, generator=g)
pool = torch.randn(S, HV, V, K, generator=g) * 0.1
rows = torch.tensor([3, -1, 1])
R = 4
ring = (torch.zeros(R, N, H, K), torch.zeros(R, N, HV, V), torch.zeros(R, N, HV), torch.zeros(R, N, HV))
ring_rows = torch.tensor([2, -1, 0])
for par in (parents, None):
    ref = naive.gdn_tree_exact_verify(x, a, b, A_log, dt_bias, pool, rows, par, H, K ** -0.5)
    out = tri.gdn_tree_exact_verify_fwd(x, a, b, A_log, dt_bias, pool, rows, par, H, K ** -0.5, ring=ring,
                                        ring_rows=ring_rows)
    assert_close("exact verify", ref, out)
    assert (out[1] == 0).all()
# the ring keeps the raw inputs and decode's gates; the exact replay commit continues the recurrence
gg, bb = naive.decode_gates(a, b, A_log, dt_bias)
q, k, v = x.split([H * K, H * K, HV * V], dim=-1)
for bi, r in ((0, 2), (2, 0)):
    assert torch.equal(ring[0][r], k[bi].reshape(N, H, K)) and torch.equal(ring[1][r], v[bi].reshape(N, HV, V))
    assert_close("ring g", gg[bi], ring[2][r])
    assert_close("ring beta", bb[bi], ring[3][r])
L = 1
last = torch.tensor([5, 2, 4])
st = pool[None].clone()
tri.gdn_tree_exact_commit_layers_fwd(*(t[None].contiguous() for t in ring), st, rows.int(), last.int(),
                                     parents.int().contiguous(), ring_rows=ring_rows.int())
ref = pool[None].clone()
gdn_naive.gdn_tree_commit_layers(*(t[None] for t in ring), ref, rows, last, parents, ring_rows=ring_rows)
assert_close("exact commit", ref, st)
# conv states and the per-node KV lists
W1, dim = 3, 8
root, win = torch.randn(B, dim, W1, generator=g), torch.randn(B, N, dim, W1, generator=g)
assert torch.equal(naive.conv_tree_exact_states(root, win, parents), tri.conv_tree_exact_states(root, win, parents))
r2t = torch.arange(4 * 50, dtype=torch.int32).reshape(4, 50)
rpi, sl = torch.tensor([2, 0, 3]), torch.tensor([7, 0, 33])
ocl = torch.arange(1000, 1000 + B * N)
ip_ref, ix_ref = naive.tree_decode_kv(r2t, rpi, sl, parents, ocl, N)
depth = torch.tensor([[len(naive.root_path(parents, bi, i)) - 1 for i in range(N)] for bi in range(B)])
ip, ix, lens = tri.tree_decode_kv_fwd(r2t, rpi, sl, parents, ocl, N, depth,
                                      kv_indices=torch.full((int(sl.sum()) * N + B * N * N,), -7, dtype=torch.int32))
assert torch.equal(ip, ip_ref) and torch.equal(ix[: ix_ref.numel()], ix_ref), (ip, ip_ref)
print("exact kernels == references")
