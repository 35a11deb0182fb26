"""LumoTree's hybrid GDN state backend for SGLang 0.5.17 (installed by
:mod:`lumotree.sglang.patches.gdn_backend_classes` while a LUMOTREE server runs).

Verify (``forward_extend`` in TARGET_VERIFY mode, per GDN layer, inside SGLang's CUDA graphs):

1. conv: SGLang's tree ``causal_conv1d_update`` on the conv pool (it also yields the tree's
   ``retrieve_parent_token``); its per-node conv windows are ``(W-1) x conv_dim`` each, not states.
2. the :class:`~lumotree.tree.TreeDescriptor` is built once per forward from those parents, on the
   device, without host synchronisation, and shared by all GDN layers;
3. GDN: LumoTree's tree-masked verify computes the gates, reads each request's committed
   state row of the pool ``[pool, Hv, V, K]`` once and computes every node's output; it writes no
   state at all. The mix verify (``ops/gdn_tree/verify.py``, fp32-accurate tf32x3 dots): pass 1 per
   request and key head leaves the tree's `[N, N]` node-mixing matrices (no state), pass 2 reads
   each state tile once and meets the whole tree in one dot. The verify keeps the step's raw k, v
   and gates g, beta in LumoTree's :class:`VerifyScratch`, one row per running request (the row
   SGLang's conv windows use: ``verify_intermediate_state_indices``): ``Hk K + Hv V`` bf16 +
   ``2 Hv`` fp32 per node, instead of NEXTN's ``Hv V K`` fp32 snapshot per node.

Commit (``update_mamba_state_after_mtp_verify``, called by SGLang's EAGLE worker after
acceptance): one kernel for all GDN layers walks the tree's parents up from the last accepted node
and replays that root path from the committed state into the same pool row, reading the scratch
in place; the prefix cache's interval-crossing snapshot (``mamba_track_indices``) is written by
the same replay; the conv windows are scattered by SGLang's kernel.

One-token verify (the no-draft step of the adaptive tree size, :mod:`lumotree.sglang.worker`): the
root token alone, which is always accepted, is a decode step; SGLang's decode conv and GDN kernels
update the pool rows in place and the commit is skipped (not with SGLang's ``extra_buffer`` state
cache, whose interval snapshots come from the replay).

Memory: the server runs with SGLang's ``enable_linear_replayssm_spec`` (its only pool layout
without ``intermediate_ssm``, the per-node snapshots); that layout also allocates ring buffers per
*pool slot* (every cached state, ``max_mamba_cache_size + 1`` rows), which LumoTree does not use:
the backend releases them at start and keeps its scratch per running request
(``max_running_requests + 1`` rows).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Optional

import torch
from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

from lumotree.sglang.crosscheck import CrossCheck
from lumotree.sglang.exact import ExactAttention, exact_mode
from lumotree.sglang.finish import FinishedRows
from lumotree.sglang.scheduling import overlap_consistent
from lumotree.sglang import step_timing
from lumotree.sglang import verify_attention
from lumotree.tree import ancestor_mask

logger = logging.getLogger(__name__)


def lumotree_active(server_args) -> bool:
    return (getattr(server_args, "speculative_algorithm", None) or "").upper() in ("LUMOTREE", "LUMOTREE_SUFFIX", "LUMOTREE_ORACLE")


def one_token_decode(server_args) -> bool:
    """Whether a one-token verify runs as a decode step in place (not with SGLang's extra_buffer state
    cache, whose interval snapshots the replay commit writes)."""
    extra = getattr(server_args, "enable_mamba_extra_buffer", None)
    return not (callable(extra) and extra())


def chain_parents(bs: int, n: int, device) -> torch.Tensor:
    return (torch.arange(n, device=device) - 1)[None].expand(bs, n).contiguous()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_RING_FIELDS = ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_rawv", "replayssm_rawk", "replayssm_beta")


@dataclasses.dataclass
class VerifyScratch:
    """What the commit replays from, per GDN layer, running-request row and draft node: raw k
    `[L, R, N, Hk, K]` and v `[L, R, N, Hv, V]` (activation dtype), gates g and beta `[L, R, N, Hv]`
    fp32. Written by the verify kernel, read in place by the commit; no states."""

    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    @classmethod
    def allocate(cls, layers: int, rows: int, nodes: int, hk: int, dk: int, hv: int, dv: int, dtype, device):
        def z(*shape, dt=torch.float32):
            return torch.zeros(*shape, dtype=dt, device=device)
        return cls(z(layers, rows, nodes, hk, dk, dt=dtype), z(layers, rows, nodes, hv, dv, dt=dtype),
                   z(layers, rows, nodes, hv), z(layers, rows, nodes, hv))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.g, self.beta))

    def layer(self, i: int):
        return self.k[i], self.v[i], self.g[i], self.beta[i]


def adopt_pool(pool) -> VerifyScratch:
    """LumoTree's scratch for ``pool`` (a MambaPool built with ``enable_linear_replayssm_spec``),
    allocated once per pool and shared by every backend on it; SGLang's per-slot ring buffers are
    dropped from the pool's state (never read under LUMOTREE) and their memory released."""
    scratch = getattr(pool, "lumotree_scratch", None)
    if scratch is not None:
        return scratch
    cache = pool.mamba_cache
    if getattr(cache, "replayssm_rawk", None) is None or getattr(cache, "intermediate_ssm", 0) is not None:
        raise RuntimeError("LUMOTREE needs the state pool built with enable_linear_replayssm_spec "
                           "(set by its server-argument handling); got a pool with per-node snapshots")
    if getattr(pool, "replayssm_cache_base", None) is not None:
        # SGLang's chain replay without the fold: commit_mamba_states_after_verify would advance its ring
        # cursors and return before the backend's commit (LumoTree's) runs, and the radix cache would cut
        # donated keys by those cursors
        raise RuntimeError("LUMOTREE: this SGLang state pool was built for its chain replay without the fold "
                           "(ring cursors allocated), whose commit would replace LumoTree's; SGLang 0.5.17 "
                           "builds it only with its fold off at allocation, which LUMOTREE's arguments never ask for")
    layers, _, hk, nodes, dk = cache.replayssm_rawk.shape
    hv, dv = cache.replayssm_rawv.shape[2], cache.replayssm_rawv.shape[4]
    rows = cache.intermediate_conv_window[0].shape[1]  # max_running_requests + 1 (SGLang's padding row)
    scratch = VerifyScratch.allocate(layers, rows, nodes, hk, dk, hv, dv, cache.replayssm_rawk.dtype,
                                     cache.replayssm_rawk.device)
    released = sum(getattr(cache, f).numel() * getattr(cache, f).element_size()
                   for f in _RING_FIELDS if getattr(cache, f, None) is not None)
    # SGLang's fold of its rings replays a chain prefix (and is keyed on this flag); ours replays the tree path
    pool.replayssm_spec_fold = False
    pool.mamba_cache = dataclasses.replace(cache, **{f: None for f in _RING_FIELDS})
    del cache
    if scratch.k.is_cuda:
        torch.cuda.empty_cache()
    pool.lumotree_scratch = scratch
    logger.info("LumoTree speculative scratch: %.2f MiB (k/v/g/beta for %d GDN layers x %d request rows x %d "
                "nodes; no intermediate_ssm); released SGLang's per-pool-slot ring buffers: %.2f MiB",
                scratch.nbytes / 2**20, layers, rows, nodes, released / 2**20)
    return scratch


def _chunk_size() -> int:
    """SGLang's prefill chunk grid (``--mamba-cache-chunk-size``), on which an extend's chunk states lie."""
    from sglang.srt.runtime_context import get_server_args

    return int(get_server_args().mamba_cache_chunk_size)


class LumoTreeGDNBackend(GDNAttnBackend):
    """``GDNAttnBackend`` with LumoTree's tree verify and replay commit (LUMOTREE servers only)."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.lumotree = lumotree_active(model_runner.server_args) and not model_runner.is_draft_worker
        self._first_gdn_layer = 1 << 30
        self._cur_tree = None
        self._cur_chain = True  # the step's tree is a chain (no retrieve_parent_token): causal attention
        self._first_verify_done = False
        self.exact = False
        self.verify_attention_on = False  # full-attention verifies by LumoTree's kernel (LumoTreeHybridBackend)
        self.finished = None  # lumotree.sglang.finish.FinishedRows with the overlap scheduler's consistent cache
        self._verify_tokens = None  # draft tokens per request of this backend's verifies (one runtime state each)
        if not self.lumotree:
            return
        # a one-token verify (the adaptive worker's no-draft step) is a decode step: SGLang's decode conv and
        # GDN kernels update the pool rows in place, and the commit has nothing to do. Not with SGLang's
        # extra_buffer state cache, whose interval snapshots the replay commit writes.
        self.one_token_decode = one_token_decode(model_runner.server_args)
        self.scratch = adopt_pool(self.req_to_token_pool.mamba_pool)
        # --enable-deterministic-inference: every node computed as the one-token decode at its position
        # (lumotree.sglang.exact); greedy outputs then equal a non-speculative server's, token for token
        self.exact = exact_mode(model_runner.server_args)
        self.verify_attention_on = verify_attention.applies(model_runner.server_args)
        if self.exact:
            logger.info("LumoTree: decode-exact verify (--enable-deterministic-inference): GDN by the decode "
                        "recurrence along each node's root path, decode conv, per-node decode attention")
        # LUMOTREE_SGLANG_CHECK=1 (diagnostics; eager steps only, i.e. with --disable-cuda-graph):
        # every verify is also run through SGLang's own tree-verify kernel on the same inputs with
        # per-node snapshots, and every commit is compared with the snapshot of the accepted node
        self.check = CrossCheck() if os.environ.get("LUMOTREE_SGLANG_CHECK") == "1" else None
        # the overlap scheduler with a consistent radix cache: rows finished in the previous step keep their
        # state slot as that step left it (lumotree.sglang.finish)
        self.finished = FinishedRows.of(self.req_to_token_pool) if overlap_consistent(model_runner.server_args) else None
        from lumotree.sglang import prompt_state

        dtype = getattr(model_runner, "dtype", None)  # the model's: its prefill chunk states'
        if dtype is not None and prompt_state.applies(model_runner.server_args):  # prompt-interior states: the copy
            prompt_state.warm_copy(self.req_to_token_pool.mamba_pool.mamba_cache.temporal, dtype)

    # ------------------------------------------------------------------ state indices
    def _skip_finished(self, md, req_pool_indices, forward_mode):
        if self.finished is not None and md is not None and (forward_mode.is_decode() or forward_mode.is_target_verify()):
            self.finished.mask_rows(md.mamba_cache_indices, req_pool_indices)
        return md

    def init_forward_metadata(self, forward_batch):
        """SGLang's, with a prompt-interior state's tracking read on the host (:func:`prompt_state.mask_on_host`:
        SGLang's test of the mask and its tracked rows' ``nonzero``), unless its FlashInfer extend plans checkpoints
        from those rows (then SGLang's as it is)."""
        from lumotree.sglang import prompt_state

        if getattr(getattr(self, "kernel_dispatcher", None), "extend_uses_state_checkpoints", False):
            return super().init_forward_metadata(forward_batch)
        # (SGLang's _forward_metadata, called from it, tests the mask; its tracked rows are then a host tensor, read
        # by nothing else)
        with prompt_state.mask_on_host(forward_batch):
            super().init_forward_metadata(forward_batch)

    def _forward_metadata(self, forward_batch):
        md = super()._forward_metadata(forward_batch)
        return self._skip_finished(md, forward_batch.req_pool_indices, forward_batch.forward_mode)

    def _init_track_conv_indices(self, query_start_loc, forward_batch):
        from lumotree.sglang import prompt_state

        marks = prompt_state.host_marks(forward_batch)
        if marks is None:  # not a prompt-interior state's tracking: SGLang's
            return super()._init_track_conv_indices(query_start_loc, forward_batch)
        return prompt_state.track_conv_indices(marks, self.conv_states_shape[-1], _chunk_size(), query_start_loc.device)

    def _init_track_ssm_indices(self, mamba_cache_indices, forward_batch):
        from lumotree.sglang import prompt_state

        marks = prompt_state.host_marks(forward_batch)
        if marks is None:
            return super()._init_track_ssm_indices(mamba_cache_indices, forward_batch)
        return prompt_state.track_ssm_indices(marks, mamba_cache_indices, forward_batch.mamba_track_indices,
                                              _chunk_size())

    def _replay_metadata(self, bs, req_pool_indices, forward_mode, *args, **kwargs):
        md = super()._replay_metadata(bs, req_pool_indices, forward_mode, *args, **kwargs)
        return self._skip_finished(md, req_pool_indices[:bs], forward_mode)

    def _track_mamba_state_extend(self, forward_batch, h, ssm_states, forward_metadata):
        """The copy of an extend's tracked chunk states into their pool slots; counted for
        :mod:`lumotree.sglang.prompt_state`, which caches a prefill's tracked slot only where a layer of its forward
        ran this (not a prefill CUDA graph that replays without the tracking fields). A LUMOTREE server's tracked
        states (chunk states ``h``, never the aligned final-state case) are copied in one launch
        (:func:`lumotree.ops.copy_state_rows`) where the pool's rows are contiguous; SGLang's copy otherwise."""
        if not forward_metadata.has_mamba_track_mask:
            return
        from lumotree.sglang import prompt_state

        if (self.lumotree and h is not None and forward_metadata.track_ssm_final_src.numel() == 0
                and prompt_state.copies_rows(h, ssm_states)):
            from lumotree import ops

            if forward_metadata.track_ssm_h_src.numel() > 0:
                ops.copy_state_rows(h.squeeze(0), forward_metadata.track_ssm_h_src, ssm_states,
                                    forward_metadata.track_ssm_h_dst)
        else:
            super()._track_mamba_state_extend(forward_batch, h, ssm_states, forward_metadata)
        prompt_state.note_tracked()

    # ------------------------------------------------------------------ tree
    def _tree_for(self, layer_id: int, md, bs: int, n: int, device):
        """``(ancestor mask int8 [bs, n, n], num_nodes [bs])`` of the step's trees -- all the chunk
        verify reads -- built by the first GDN layer of every forward (after its conv kernel filled
        ``retrieve_parent_token``) and reused by the later GDN layers of that forward. Never reused
        across forwards: under CUDA graphs the build must be part of each captured verify (warm-up
        runs and the capture share metadata objects). Static shapes, no host sync."""
        if layer_id <= self._first_gdn_layer or self._cur_tree is None:
            self._first_gdn_layer = min(self._first_gdn_layer, layer_id)
            parents = md.retrieve_parent_token
            par = parents[:bs] if parents is not None else chain_parents(bs, n, device)
            self._cur_tree = (ancestor_mask(par).to(torch.int8), torch.full((bs,), n, dtype=torch.long, device=device))
            self._cur_chain = parents is None
        anc, num_nodes = self._cur_tree
        if tuple(anc.shape) != (bs, n, n):
            raise RuntimeError(f"LumoTree: GDN layer {layer_id} sees a [{bs}, {n}] verify, but the first GDN layer "
                               f"({self._first_gdn_layer}) built trees of shape {tuple(anc.shape)}")
        return anc, num_nodes

    def tree_mask(self, layer_id: int, bs: int, n: int):
        """For a full-attention layer ``layer_id`` of a ``[bs, n]`` verify: ``(True, anc)`` with the step's
        ancestor mask (int8 ``[bs, n, n]``, ``None`` for a chain or a one-token verify), or ``(False, None)``
        where this forward's trees are not built yet (the layer comes before every GDN layer)."""
        if n == 1:
            return True, None
        if self._cur_tree is None or layer_id < self._first_gdn_layer or tuple(self._cur_tree[0].shape) != (bs, n, n):
            return False, None
        return True, (None if self._cur_chain else self._cur_tree[0])

    # ------------------------------------------------------------------ verify
    def _decodes_in_place(self) -> bool:
        """This backend's verifies are one-token (no-draft) steps served as a decode, in place (in the decode-exact
        mode too: the decode kernels in place are what its exact verify computes for one node)."""
        return self._verify_tokens == 1 and self.one_token_decode

    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if not (self.lumotree and forward_batch.forward_mode.is_target_verify()):
            return super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        self._verify_tokens = forward_batch.spec_info.draft_token_num
        if self._decodes_in_place():  # the no-draft step: the root token only, always accepted
            return super().forward_decode(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        if getattr(self, "_first_verify_done", True):
            return self._verify(layer, forward_batch, mixed_qkv, a, b)
        # the first verify of the process: how long the host spends in it (Triton compiles our kernels on
        # first use, synchronously; a cold Triton cache makes start-up minutes longer)
        t0 = time.perf_counter()
        o = self._verify(layer, forward_batch, mixed_qkv, a, b)
        self._first_verify_done = True
        logger.info("LumoTree: first GDN verify call (layer %d, %d tokens) took %.1f s on the host", layer.layer_id,
                    mixed_qkv.shape[0], time.perf_counter() - t0)
        return o

    def _verify(self, layer, forward_batch, mixed_qkv, a, b):
        from lumotree.ops.gdn_tree.verify import gdn_tree_mix_verify_fwd
        from sglang.srt.layers.attention.linear import gdn_backend as sg

        assert isinstance(mixed_qkv, torch.Tensor)
        md = self.forward_metadata
        T = mixed_qkv.shape[0]
        n = forward_batch.spec_info.draft_token_num
        bs = T // n
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        rows = md.mamba_cache_indices[:bs]
        if self.exact:
            return self._verify_exact(layer, mixed_qkv, a, b, cache, rows, bs, n)
        x = sg.causal_conv1d_update(
            mixed_qkv.view(bs, n, -1).transpose(1, 2), cache.conv[0], layer.conv_weights, layer.bias,
            layer.activation, conv_state_indices=rows,
            intermediate_conv_window=cache.intermediate_conv_window[0],
            intermediate_state_indices=self.verify_intermediate_state_indices[:bs],
            retrieve_next_token=md.retrieve_next_token, retrieve_next_sibling=md.retrieve_next_sibling,
            retrieve_parent_token=md.retrieve_parent_token)
        x = x.transpose(1, 2).reshape(T, -1)
        Hk, K, Hv, V = layer.num_k_heads, layer.head_k_dim, layer.num_v_heads, layer.head_v_dim
        q, k, v = torch.split(x, [layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        q = q.reshape(bs, n, Hk, K)
        k = k.reshape(bs, n, Hk, K)
        v = v.reshape(bs, n, Hv, V)
        anc, num_nodes = self._tree_for(layer.layer_id, md, bs, n, x.device)
        # the mix verify with fp32-accurate (tf32x3) dots: gates from (A_log, a, dt_bias, b), pass 1 per
        # request and key head leaves the [BT, BT] node-mixing matrices, pass 2 meets each state tile of
        # the pool rows once; the raw k, v, g, beta kept per request row for the replay commit (padded
        # rows, slot -1, skipped)
        o = gdn_tree_mix_verify_fwd(
            q, k, v, cache.temporal, None, A_log=layer.A_log, a=a.reshape(bs, n, Hv),
            dt_bias=layer.dt_bias, b=b.reshape(bs, n, Hv), scale=K ** -0.5, use_qk_l2norm=True, state_indices=rows,
            anc_mask=anc, num_nodes=num_nodes, precision="tf32x3",
            ring=self.scratch.layer(self.req_to_token_pool.mamba_map[layer.layer_id]),
            ring_rows=self.verify_intermediate_state_indices[:bs])
        if self.check is not None and not _capturing():
            self.check.verify(self.req_to_token_pool.mamba_map[layer.layer_id], layer, q, k, v, a, b,
                              cache.temporal, rows, md, o)
        return o.view(T, Hv, V)

    def _verify_exact(self, layer, mixed_qkv, a, b, cache, rows, bs: int, n: int):
        """Decode-exact verify of one GDN layer (see :mod:`lumotree.sglang.exact`)."""
        from lumotree.ops.exact.triton import conv_tree_exact_states, gdn_tree_exact_verify_fwd
        from sglang.srt.layers.attention.linear import gdn_backend as sg

        md = self.forward_metadata
        T = bs * n
        conv = cache.conv[0]
        inter_rows = self.verify_intermediate_state_indices[:bs]
        root = conv[rows.clamp(min=0).long()]  # the committed windows, before the tree conv shifts the rows
        # SGLang's tree conv only for what the commit scatters: every node's window
        sg.causal_conv1d_update(
            mixed_qkv.view(bs, n, -1).transpose(1, 2), conv, layer.conv_weights, layer.bias, layer.activation,
            conv_state_indices=rows, intermediate_conv_window=cache.intermediate_conv_window[0],
            intermediate_state_indices=inter_rows, retrieve_next_token=md.retrieve_next_token,
            retrieve_next_sibling=md.retrieve_next_sibling, retrieve_parent_token=md.retrieve_parent_token)
        parents = md.retrieve_parent_token
        par = parents[:bs] if parents is not None else chain_parents(bs, n, mixed_qkv.device)
        states = torch.empty((T, conv.shape[2], conv.shape[1]), dtype=conv.dtype,
                             device=conv.device).transpose(1, 2)  # feature-contiguous, as the pool
        conv_tree_exact_states(root, cache.intermediate_conv_window[0][inter_rows.long(), :n], par, out=states)
        x = sg.causal_conv1d_update(mixed_qkv.reshape(T, -1), states, layer.conv_weights, layer.bias,
                                    layer.activation,
                                    conv_state_indices=torch.arange(T, dtype=torch.int32, device=conv.device))
        sc = self.scratch.layer(self.req_to_token_pool.mamba_map[layer.layer_id])
        o = gdn_tree_exact_verify_fwd(
            x, a.reshape(T, -1), b.reshape(T, -1), layer.A_log, layer.dt_bias, cache.temporal, rows,
            parents[:bs].contiguous() if parents is not None else None, layer.num_k_heads, layer.head_k_dim ** -0.5,
            ring=sc, ring_rows=inter_rows)
        return o.view(T, layer.num_v_heads, layer.head_v_dim)

    # ------------------------------------------------------------------ commit
    def commit_after_verify(self, last_step: torch.Tensor, track_rows: Optional[torch.Tensor],
                            track_steps: Optional[torch.Tensor]) -> None:
        """Replay each request's accepted path (root .. ``last_step[b]``) into its pool row: one
        launch for all GDN layers, reading the verify's scratch in place; the path is walked
        up the verify tree's parents inside the kernel; the prefix-cache snapshot comes from the same
        replay."""
        from lumotree.ops.gdn_tree.commit import gdn_tree_commit_layers_fwd
        from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_conv_window_scatter_with_mask

        if self._decodes_in_place():
            return  # the one-token verify updated the pool rows in place (forward_extend)
        bs = last_step.shape[0]
        md = self.forward_metadata
        rows = md.mamba_cache_indices[:bs]
        par = md.retrieve_parent_token
        caches = self.req_to_token_pool.get_speculative_mamba2_params_all_layers()
        sc = self.scratch
        check = self.check is not None and not _capturing()
        if check:
            expected = self.check.expected_commit(rows, last_step)
            before = dict(scratch_k=sc.k[:, :bs].clone(), scratch_v=sc.v[:, :bs].clone(), scratch_g=sc.g[:, :bs].clone(),
                          scratch_beta=sc.beta[:, :bs].clone(), ring_rows=self.verify_intermediate_state_indices[:bs],
                          before=caches.temporal[:, rows.clamp(min=0).long()].clone(),
                          parents=par[:bs] if par is not None else None, track_rows=track_rows,
                          track_steps=track_steps)
        if self.exact:  # the decode kernel's tile and warp count: the decode's state, bit for bit
            from lumotree.ops.exact.triton import gdn_tree_exact_commit_layers_fwd

            gdn_tree_exact_commit_layers_fwd(
                sc.k, sc.v, sc.g, sc.beta, caches.temporal, rows, last_step, par[:bs] if par is not None else None,
                track_rows[:bs] if track_rows is not None else None, track_steps,
                ring_rows=self.verify_intermediate_state_indices[:bs])
        else:
            gdn_tree_commit_layers_fwd(
                sc.k, sc.v, sc.g, sc.beta, caches.temporal, rows, last_step, par[:bs] if par is not None else None,
                track_rows[:bs] if track_rows is not None else None, track_steps, use_qk_l2norm=True,
                ring_rows=self.verify_intermediate_state_indices[:bs])
        if check:
            self.check.commit(expected, caches.temporal, rows, last_step, **before)
        for conv, window in zip(caches.conv, caches.intermediate_conv_window):
            fused_conv_window_scatter_with_mask(conv, window, rows, last_step)
            if track_rows is not None:
                fused_conv_window_scatter_with_mask(conv, window, track_rows, track_steps)


class LumoTreeHybridBackend(HybridLinearAttnBackend):
    """``HybridLinearAttnBackend`` whose post-verify state update is LumoTree's replay commit and whose
    full-attention verify is LumoTree's tree verify attention (:mod:`lumotree.sglang.verify_attention`;
    in the decode-exact mode, one decode query per node)."""

    def forward_extend(self, layer, forward_batch, save_kv_cache: bool = True, q=None, k=None, v=None,
                       mixed_qkv=None, a=None, b=None, **kwargs):
        lin = self.linear_attn_backend
        verify_full_attn = (forward_batch.forward_mode.is_target_verify()
                            and self._is_full_attn(layer, kwargs.get("layer_id")))
        if verify_full_attn and getattr(lin, "exact", False):
            exact = getattr(self, "_exact_attention", None)
            if exact is None:
                exact = self._exact_attention = ExactAttention(self.full_attn_backend)
            self._note_full_mask(layer.layer_id, False)
            return exact.forward(q, k, v, layer, forward_batch, lin.forward_metadata.retrieve_parent_token,
                                 forward_batch.spec_info.draft_token_num, save_kv_cache)
        if verify_full_attn and getattr(lin, "verify_attention_on", False):
            va = getattr(self, "_verify_attention", None)
            if va is None:
                va = self._verify_attention = verify_attention.VerifyAttention(self.full_attn_backend)
                va.check = getattr(lin, "check", None)
            n = forward_batch.spec_info.draft_token_num
            bs = q.shape[0] // n
            built, anc = lin.tree_mask(layer.layer_id, bs, n)
            if built and va.serves(layer, k, v, kwargs):
                self._note_full_mask(layer.layer_id, True)
                live = lin.forward_metadata.mamba_cache_indices[:bs] >= 0 if va.check is not None else None
                return va.forward(q, k, v, layer, forward_batch, anc, n, save_kv_cache, live)
        if verify_full_attn:
            self._note_full_mask(layer.layer_id, False)
        return super().forward_extend(layer, forward_batch, save_kv_cache, q, k, v, mixed_qkv, a, b, **kwargs)

    def _note_full_mask(self, layer_id: int, served: bool) -> None:
        """Which kernel verified full-attention layer ``layer_id``: whether the NGRAM loop still needs SGLang's full
        verify mask (:class:`~lumotree.sglang.verify_attention.FullMaskUse`)."""
        use = getattr(self, "full_mask_use", None)
        if use is None:
            use = self.full_mask_use = verify_attention.FullMaskUse()
        use.note(layer_id, served)

    def update_mamba_state_after_mtp_verify(self, last_correct_step_indices, mamba_track_indices,
                                            mamba_steps_to_track, model, req_pool_indices=None):
        lin = self.linear_attn_backend
        if not getattr(lin, "lumotree", False):
            return super().update_mamba_state_after_mtp_verify(
                last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model, req_pool_indices)
        step_timing.measure_size("commit", int(last_correct_step_indices.shape[0]), lin.commit_after_verify,
                                 last_correct_step_indices, mamba_track_indices, mamba_steps_to_track)
