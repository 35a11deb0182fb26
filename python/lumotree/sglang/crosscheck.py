"""In-server cross-check of LumoTree's served GDN verify and commit against SGLang 0.5.17's own
tree-verify kernel (diagnostics: ``LUMOTREE_SGLANG_CHECK=1``, eager steps only, i.e. with
``--disable-cuda-graph``).

Every verify is also run through ``fused_sigmoid_gating_delta_rule_update`` on the very same inputs
with per-node snapshots; every commit is compared with the snapshot of the accepted node.
``LUMOTREE_SGLANG_CHECK_REPORT=FILE`` keeps the worst relative errors in a JSON file;
``LUMOTREE_SGLANG_CHECK_DUMP=DIR`` saves the tensors of the first three steps, which
``benchmark/serving/check_dump.py`` replays offline. Host syncs and per-node buffers: never in
production.
"""
from __future__ import annotations

import json
import logging
import os

import torch

logger = logging.getLogger(__name__)


class CrossCheck:
    """Diagnostics (``LUMOTREE_SGLANG_CHECK=1``): LumoTree's served verify and commit against
    SGLang 0.5.17's own tree-verify kernel (``fused_sigmoid_gating_delta_rule_update`` with per-node
    snapshots) on the very same inputs, inside a running server. Host syncs and per-node buffers:
    eager steps only, never in production."""

    def __init__(self):
        self.snapshots = {}
        self.steps = 0
        self.worst = dict(verify=0.0, commit=0.0, attention=0.0)
        self.attention_checks = 0
        self.dump_dir = os.environ.get("LUMOTREE_SGLANG_CHECK_DUMP")  # tensors of the first steps, for offline replay
        self.dump = {}
        self.report = os.environ.get("LUMOTREE_SGLANG_CHECK_REPORT")  # JSON with the worst errors so far

    def _keep(self, key, **tensors):
        if self.dump_dir and self.steps < 3:
            self.dump[key] = {k: (t.detach().cpu().clone() if torch.is_tensor(t) else t) for k, t in tensors.items()}

    def verify(self, li, layer, q, k, v, a, b, temporal, rows, md, o):
        from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
            fused_sigmoid_gating_delta_rule_update,
        )

        bs, n, Hk, K = k.shape
        Hv, V = v.shape[2], v.shape[3]
        snaps = torch.zeros(bs, n, Hv, V, K, dtype=torch.float32, device=q.device)
        par = md.retrieve_parent_token
        if par is not None:  # rows without a state slot (finished, padded): SGLang's conv kernel skips them and
            # leaves their parents unwritten (torch.empty in eager mode); SGLang's kernel below would index its
            # snapshot buffer with them, so those rows get a chain (their outputs are not compared)
            chain = (torch.arange(n, device=par.device) - 1).clamp(min=0).to(par.dtype)[None].expand(bs, n)
            par = torch.where((rows[:bs] >= 0)[:, None], par[:bs], chain)
        ref = fused_sigmoid_gating_delta_rule_update(
            A_log=layer.A_log, a=a, dt_bias=layer.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=q.reshape(1, bs * n, Hk, K), k=k.reshape(1, bs * n, Hk, K), v=v.reshape(1, bs * n, Hv, V), b=b,
            initial_state_source=temporal, initial_state_indices=rows, scale=K ** -0.5, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(0, bs * n + 1, n, dtype=torch.int32, device=q.device), disable_state_update=True,
            intermediate_states_buffer=snaps, intermediate_state_indices=torch.arange(bs, dtype=torch.int32,
                                                                                       device=q.device),
            cache_steps=n, retrieve_parent_token=par[:bs] if par is not None else None)
        real = rows >= 0
        ref_all = ref.reshape(bs, n, Hv, V)
        ref = ref_all[real].float()
        got = o.reshape(bs, n, Hv, V)[real].float()
        err = ((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item() if ref.numel() else 0.0
        self.worst["verify"] = max(self.worst["verify"], err)
        self.snapshots[li] = snaps
        self._keep(f"verify{li}", q=q, k=k, v=v, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias, o=o, ref=ref_all,
                   S0=temporal[rows.clamp(min=0).long()], rows=rows, snaps=snaps, parents=par)
        if self.steps < 3:
            logger.warning("LumoTree check: layer %d verify rel err %.2e (bs %d, n %d)", li, err, bs, n)

    def attention(self, fa, q, k, v, layer, forward_batch, o, n: int, live=None):
        """LumoTree's verify attention output ``o`` of one full-attention layer against SGLang's Triton
        backend on the same inputs (its prefill kernel with the verify's custom mask; the K/V are in the pool
        already), over the rows in ``live`` (``[bs]`` bool, default all). Skipped inside CUDA-graph capture."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        got = o.detach().float().clone()  # a copy: SGLang's backend may write into the same buffer (forward_batch._attn_output)
        ref = fa.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=False).float().reshape(got.shape)
        if live is not None:
            got, ref = (t.reshape(live.shape[0], n, -1)[live] for t in (got, ref))
        err = ((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item() if ref.numel() else 0.0
        self.worst["attention"] = max(self.worst["attention"], err)
        self.attention_checks += 1
        if self.attention_checks <= 3:
            logger.warning("LumoTree check: layer %d verify attention rel err %.2e (%d tokens)", layer.layer_id, err,
                           q.shape[0])

    def expected_commit(self, rows, last):
        exp = {}
        for li, snaps in self.snapshots.items():
            bs = min(snaps.shape[0], rows.shape[0])
            idx = [(b, int(rows[b]), int(last[b])) for b in range(bs) if int(rows[b]) >= 0 and int(last[b]) >= 0]
            exp[li] = [(row, snaps[b, node].clone()) for b, row, node in idx]
        return exp

    def commit(self, expected, temporal, rows, last, **inputs):
        if self.dump_dir and self.steps < 3:
            self._keep("commit", rows=rows, last=last, after=temporal[:, rows.clamp(min=0).long()], **inputs)
            os.makedirs(self.dump_dir, exist_ok=True)
            torch.save(self.dump, os.path.join(self.dump_dir, f"step{self.steps}.pt"))
            self.dump = {}
        err = 0.0
        for li, items in expected.items():
            for row, want in items:
                got = temporal[li, row]
                err = max(err, ((got - want).abs().max() / want.abs().max().clamp(min=1e-6)).item())
        self.worst["commit"] = max(self.worst["commit"], err)
        if self.report:
            with open(self.report, "w") as f:
                json.dump(dict(steps=self.steps + 1, worst_rel_err=self.worst, attention_checks=self.attention_checks), f)
        if self.steps < 3 or self.steps % 200 == 0:
            logger.warning("LumoTree check: step %d commit rel err %.2e; worst so far %s (last %s)", self.steps, err,
                           {k: f"{v:.2e}" for k, v in self.worst.items()}, last[:4].tolist())
        self.steps += 1
        self.snapshots.clear()
