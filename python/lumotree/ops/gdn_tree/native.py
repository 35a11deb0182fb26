"""SGLang 0.5.17's own hybrid tree path on the same inputs as ours, for tests and benchmarks.

Verify: ``fused_sigmoid_gating_delta_rule_update`` in target-verify mode (what
``gdn_triton.target_verify`` calls) writes every node's state into an ``intermediate_ssm`` buffer
``[slots, N, Hv, V, K]`` (the per-node snapshots) with ``retrieve_parent_token``; commit:
``fused_mamba_state_scatter_with_mask`` copies the accepted node's snapshot into the pool row
(what ``update_mamba_state_after_mtp_verify`` does per layer). SGLang is imported lazily.
"""
from __future__ import annotations

import torch


def native_snapshot_bytes(B: int, N: int, Hv: int, V: int, K: int) -> int:
    return B * N * Hv * V * K * 4


class NativeTreeVerify:
    """Holds SGLang's per-node snapshot buffer for a (B, N) shape and runs verify / commit."""

    def __init__(self, B: int, N: int, Hv: int, V: int, K: int, device):
        self.intermediate = torch.empty(B, N, Hv, V, K, dtype=torch.float32, device=device)
        self.intermediate_indices = torch.arange(B, dtype=torch.int32, device=device)

    def verify(self, q, k, v, A_log, a, dt_bias, b, pool, state_indices, parents, use_qk_l2norm=True):
        from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
            fused_sigmoid_gating_delta_rule_update,
        )

        return fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=q, k=k, v=v, b=b, initial_state_source=pool, initial_state_indices=state_indices,
            use_qk_l2norm_in_kernel=use_qk_l2norm, disable_state_update=True,
            intermediate_states_buffer=self.intermediate, intermediate_state_indices=self.intermediate_indices,
            cache_steps=self.intermediate.shape[1], retrieve_parent_token=parents,
        )

    def commit(self, pool, state_indices, last_node):
        from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_mamba_state_scatter_with_mask

        # SGLang's scatter kernel indexes the source as int32 (pid_req * src_req_stride): past 2**31
        # elements (e.g. 64 requests x 64 nodes x Hv=48) it faults, so large buffers go in request chunks
        # of the same kernel -- the same bytes moved, a few more launches.
        if not pool.is_cuda:  # SGLang's scatter is CUDA-only; the same copy for CPU smoke tests
            ok = (state_indices >= 0) & (last_node >= 0)
            b = torch.nonzero(ok).flatten()
            pool[state_indices[b].long()] = self.intermediate[b, last_node[b].long()]
            return
        per_req = self.intermediate[0].numel()
        step = max(1, (2 ** 31 - 1) // per_req)
        B = self.intermediate.shape[0]
        for s in range(0, B, step):
            fused_mamba_state_scatter_with_mask(pool.unsqueeze(0), self.intermediate[s:s + step].unsqueeze(0),
                                                state_indices[s:s + step], last_node[s:s + step])
