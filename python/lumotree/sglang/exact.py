"""LUMOTREE's decode-exact verify (``--enable-deterministic-inference``): the served side of
:mod:`lumotree.ops.exact`.

With SGLang's batch-invariant kernels (the flag) every row of every GEMM, norm and activation is
computed alike in a one-token decode and in a verify; what still differs between a speculative and
a non-speculative server is the three per-position mixers. Under this mode LUMOTREE computes each
draft node's

* GDN output with the decode kernel's recurrence along the node's root path
  (:func:`lumotree.ops.exact.triton.gdn_tree_exact_verify_fwd`) and commits with the decode tile;
* conv output with SGLang's *decode* conv on the state the decode would hold before the node (its
  tree conv sums the taps in the opposite order);
* full attention with SGLang's split-KV *decode* kernel (the flag's fixed split size) over the KV slot
  list a decode at that position reads -- the committed prefix, then the root path
  (:class:`ExactAttention`).

So the target's logits at every node equal the non-speculative server's at that position, bit for
bit, and greedy outputs are token-identical. Costs: every node re-walks its path (GDN), reads the
whole prefix KV (attention: ``N`` decode queries per request instead of one tree query); meant for
reproducible serving and for checking, not for speed.
"""
from __future__ import annotations

import os

import torch

from lumotree.tree import ancestor_mask

EXACT_ATTENTION_BACKENDS = ("triton",)
KV_LIST_LIMIT_BYTES = 4 << 30


def exact_mode(server_args) -> bool:
    """A LUMOTREE server with ``--enable-deterministic-inference`` verifies decode-exactly."""
    return bool(getattr(server_args, "enable_deterministic_inference", False))


def validate(server_args, algorithm: str) -> None:
    """Clear errors for what the decode-exact verify cannot serve (called by the plugin's checks)."""
    sa = server_args
    backend = getattr(sa, "attention_backend", None)
    if backend not in EXACT_ATTENTION_BACKENDS:
        why = "none given: SGLang would pick fa3 on Hopper" if backend is None else f"got {backend!r}"
        raise ValueError(f"--speculative-algorithm {algorithm} with --enable-deterministic-inference verifies with "
                         f"SGLang's Triton decode-attention kernel: pass --attention-backend triton ({why})")
    if (getattr(sa, "page_size", None) or 1) != 1:
        raise ValueError(f"--speculative-algorithm {algorithm} with --enable-deterministic-inference needs "
                         f"--page-size 1 (got {sa.page_size})")
    if os.environ.get("FLA_USE_FAST_OPS", "0") == "1":
        raise ValueError("FLA_USE_FAST_OPS=1 switches SGLang's GDN decode to fast exp/log, which LUMOTREE's "
                         "decode-exact verify does not mirror; unset it with --enable-deterministic-inference")


class ExactAttention:
    """Tree verify of the full-attention layers as one decode query per draft node.

    Per forward, the first full-attention layer lays out every node's KV slot list (the request's
    committed slots ``req_to_token[req, :seq_len]``, then the node's root path in ``out_cache_loc``)
    and its split count (``ceil(len / split_tile_size)``, as the deterministic decode does); every
    layer writes the step's K/V and calls SGLang's ``decode_attention_fwd`` with them. Static shapes,
    no host sync (runs inside SGLang's verify CUDA graphs)."""

    def __init__(self, full_attn_backend):
        fa = full_attn_backend
        if type(fa).__name__ != "TritonAttnBackend" or not getattr(fa, "enable_deterministic", False):
            raise RuntimeError(f"LumoTree's decode-exact verify needs SGLang's Triton attention backend in "
                               f"deterministic mode, got {type(fa).__name__}")
        if getattr(fa, "dcp_size", 1) > 1 or getattr(fa, "use_mla", False) or fa.sliding_window_size:
            raise RuntimeError("LumoTree's decode-exact verify supports plain MHA/GQA full attention "
                               "(no decode context parallelism, MLA or sliding window)")
        self.fa = fa
        self._first_layer = 1 << 30
        self._meta = None

    def _layout(self, layer_id: int, forward_batch, parents, n: int):
        if layer_id <= self._first_layer or self._meta is None:
            from lumotree.ops.exact.triton import tree_decode_kv_fwd

            self._first_layer = min(self._first_layer, layer_id)
            fa = self.fa
            bs = forward_batch.seq_lens.shape[0]
            dev = forward_batch.seq_lens.device
            par = parents[:bs] if parents is not None else None
            if par is not None:
                depth = ancestor_mask(par).sum(-1) - 1
            else:
                depth = torch.arange(n, device=dev)[None].expand(bs, n)
            T = bs * n
            need = T * (fa.max_context_len + n) * 8  # every node's list may span the whole context
            if need > KV_LIST_LIMIT_BYTES:
                raise RuntimeError(
                    f"LumoTree's decode-exact verify lays out one KV slot list per draft node: {bs} requests x {n} nodes x "
                    f"{fa.max_context_len} context tokens needs {need / 2**30:.1f} GiB of indices (limit "
                    f"{KV_LIST_LIMIT_BYTES / 2**30:.0f} GiB); lower --context-length, --cuda-graph-max-bs or "
                    f"--speculative-num-draft-tokens")
            kv_indices = torch.empty(T * (fa.max_context_len + n), dtype=torch.int64, device=dev)
            kv_indptr, kv_indices, lens = tree_decode_kv_fwd(
                fa.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, par,
                forward_batch.out_cache_loc, n, depth, kv_indices=kv_indices)
            splits = ((lens + fa.split_tile_size - 1) // fa.split_tile_size).to(torch.int32)
            self._meta = (kv_indptr, kv_indices, splits)
        return self._meta

    def forward(self, q, k, v, layer, forward_batch, parents, n: int, save_kv_cache: bool = True):
        from sglang.srt.layers.attention.triton_backend import logit_capping_mod
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        fa = self.fa
        H, D, Dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        q = q.reshape(-1, H * D)
        T = q.shape[0]
        if save_kv_cache and k is not None:  # as the decode writes its token's K/V
            fa._set_kv_buffer(forward_batch, layer,
                              KVWriteLoc(forward_batch.out_cache_loc, fa.forward_metadata.swa_out_cache_loc,
                                         full_loc=fa.forward_metadata.out_cache_loc_full_physical),
                              k, v, layer.k_scale, layer.v_scale)
        kv_indptr, kv_indices, splits = self._layout(layer.layer_id, forward_batch, parents, n)
        if kv_indptr.shape[0] - 1 != T:
            raise RuntimeError(f"LumoTree exact attention: layer {layer.layer_id} sees {T} tokens, the layout "
                               f"has {kv_indptr.shape[0] - 1}")
        o = q.new_empty((T, H * Dv))
        logits = torch.empty((T, H, fa.max_kv_splits, Dv), dtype=torch.float32, device=q.device)
        lse = torch.empty((T, H, fa.max_kv_splits), dtype=torch.float32, device=q.device)
        k_descale = layer.k_scale_float if layer.k_scale is not None and layer.v_scale is not None else 1.0
        v_descale = layer.v_scale_float if layer.k_scale is not None and layer.v_scale is not None else 1.0
        fa.decode_attention_fwd(
            q.view(-1, H, D), fa.token_to_kv_pool.get_key_buffer(layer.layer_id),
            fa.token_to_kv_pool.get_value_buffer(layer.layer_id), o.view(-1, H, Dv), kv_indptr, kv_indices,
            logits, lse, splits, fa.max_kv_splits, layer.scaling, k_descale, v_descale,
            logit_cap=logit_capping_mod(layer.logit_capping_method, layer.logit_cap), sinks=None,
            xai_temperature_len=layer.xai_temperature_len, has_mla=False, use_pdl=fa.use_pdl,
            page_size=fa.page_size)
        return o
