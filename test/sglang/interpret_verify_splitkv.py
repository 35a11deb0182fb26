"""SGLang's split-KV verify kernel in Triton's CPU interpreter (called by test_verify_attention.py in a
subprocess: TRITON_INTERPRET must be set before import): scratch holding a NaN bit pattern turns a
request with splits that have no keys into NaN; with LumoTree's allocation hook the kernel equals
SGLang's prefill kernel on the same causal chain."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: E402
from sglang.kernels.ops.attention.verify_splitkv import VerifySplitKV  # noqa: E402

from lumotree.sglang.patches.verify_splitkv_scratch import alloc_finite  # noqa: E402
from lumotree.sglang.verify_attention import chain_problem  # noqa: E402

H_Q, H_KV, D, N = 4, 2, 32, 4


def main():
    (q, k, v, kb, vb, qo, kvp, kvi), ref = chain_problem(H_Q, H_KV, D, D, torch.float32, "cpu", N, prefixes=(5, 37, 90),
                                                         pool=256)
    extend_attention_fwd(q, k, v, ref, kb, vb, qo, kvp, kvi, None, True, None, N, 1.0, 1.0)
    vk = VerifySplitKV(3, H_Q, H_KV, D, D, N, device="cpu", n_splits=8)
    vk.att_out.fill_(float("nan"))  # what uninitialised memory may hold
    out = vk(q, k, v, kb, vb, qo, kvp, kvi, D ** -0.5)
    bad = ~torch.isfinite(out).view(3, N, -1).all(-1).all(-1)
    assert bad.tolist() == [True, True, True], bad  # every request has a split without keys (8 splits of 32)
    alloc_finite(VerifySplitKV._alloc, vk, 3)  # SGLang's allocation (torch.empty) under LumoTree's hook
    out = vk(q, k, v, kb, vb, qo, kvp, kvi, D ** -0.5)
    gap = float((out - ref).abs().max())
    assert gap < 1e-5, gap
    print(f"split-KV verify == prefill kernel (max gap {gap:.1e}) once its scratch starts finite")


if __name__ == "__main__":
    main()
