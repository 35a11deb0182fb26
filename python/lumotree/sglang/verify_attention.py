"""A LUMOTREE server's full-attention verify: LumoTree's tree verify attention
(:mod:`lumotree.ops.tree_attention`) in place of SGLang's prefill kernel.

SGLang's Triton attention backend verifies a draft tree with ``extend_attention_fwd``, its prefill
kernel: one program per (request, query head, query tile) walks the request's whole prefix, so every
key block is read once per query head. LumoTree's kernel reads each block once per KV head for all of
a request's verify rows (``nodes x Hq / Hkv``), splits the prefix over about two waves of programs and
adds the tree block under the ancestor mask (``benchmark/kernels/bench_tree_attention.py``, H200,
Qwen3.5-27B heads: 1.2-11x faster per layer).

On by default for LUMOTREE servers: served on the H200 it made the drafted step faster than SGLang's
prefill kernel did in the same server, and the in-server cross-check against that kernel
(``test/sglang/test_served_crosscheck_gpu.py``: a chain, a topk-2 tree and LUMOTREE_SUFFIX's 8-token suffix
trees, which are wider and come through SGLang's NGRAM worker) matched on every step
(``benchmark/results/serving_speed_h200.json``, ``docs/performance.md``).

Served where its result is the one SGLang's kernel would give (:func:`backend_why_not`,
:func:`layer_why_not`): a target verify of LUMOTREE or LUMOTREE_SUFFIX (not the decode-exact mode, whose
attention is one decode query per node) on SGLang's Triton backend with
plain GQA layers -- no sliding window, logit cap, attention sinks, scaled (fp8) KV cache, decode context
parallelism or unified / SWA pools. Anything else keeps SGLang's path, and the server log says which
kernel verifies and why (``LumoTree: verify attention by ...``).

The tree: chains (topk 1) are causal; trees use the ancestor mask that the step's first GDN layer
built from SGLang's ``retrieve_parent_token`` (:meth:`LumoTreeGDNBackend.tree_mask`), the same mask
the GDN verify reads. A full-attention layer that comes before every GDN layer of the forward keeps
SGLang's path for that step. Static shapes and no host sync: it runs inside the verify CUDA graphs.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

ALGORITHMS = ("LUMOTREE", "LUMOTREE_SUFFIX")


def applies(server_args) -> bool:
    """Whether a server's target verifies use LumoTree's attention (the backend is checked later):
    LUMOTREE and LUMOTREE_SUFFIX, not the decode-exact mode."""
    from lumotree.sglang.exact import exact_mode

    algo = (getattr(server_args, "speculative_algorithm", None) or "").upper()
    return algo in ALGORITHMS and not exact_mode(server_args)


def backend_why_not(fa) -> Optional[str]:
    """Why SGLang's full-attention backend ``fa`` cannot hand its verify to LumoTree's kernel (``None``: it can)."""
    name = type(fa).__name__
    if name != "TritonAttnBackend":
        return f"the full-attention backend is {name} (LumoTree's kernel reads the Triton backend's KV layout)"
    if getattr(fa, "dcp_size", 1) > 1:
        return "decode context parallelism"
    if getattr(fa, "enable_deterministic", False):
        return "deterministic inference"
    if getattr(fa, "use_mla", False):
        return "MLA"
    if getattr(fa, "_translate_kv_loc", None) is not None:
        return "a unified KV pool"
    pool = getattr(fa, "token_to_kv_pool", None)
    if pool is not None and type(pool).__name__ == "SWAKVPool":
        return "a sliding-window KV pool"
    return None


def layer_why_not(layer) -> Optional[str]:
    """Why an attention layer needs SGLang's kernel (``None``: LumoTree's computes the same)."""
    if (getattr(layer, "sliding_window_size", -1) or -1) > -1:
        return f"layer {layer.layer_id} has a sliding window"
    if getattr(layer, "logit_cap", 0) or 0:
        return f"layer {layer.layer_id} caps its logits"
    if getattr(layer, "k_scale", None) is not None or getattr(layer, "v_scale", None) is not None:
        return f"layer {layer.layer_id} has a scaled KV cache"
    if getattr(layer, "is_cross_attention", False):
        return f"layer {layer.layer_id} is cross-attention"
    if (getattr(layer, "xai_temperature_len", -1) or -1) > 0:
        return f"layer {layer.layer_id} scales its queries by position"
    attn_type = getattr(layer, "attn_type", None)
    if attn_type is not None and getattr(attn_type, "name", "DECODER") != "DECODER":
        return f"layer {layer.layer_id} is {attn_type.name} attention"
    return None


class FullMaskUse:
    """Which of a backend's target-verify full-attention layers went to LumoTree's kernel and which to SGLang's.

    SGLang's NGRAM loop lays out a full verify mask ``[n x (seq_len + n)]`` per request (on LUMOTREE_SUFFIX's path in
    one pass, :mod:`lumotree.sglang.patches.ngram_full_mask`; 4 M cells a step at 32 agents' prompts, 0.35 ms of
    the scheduler's thread at 32 requests on the H200). Only SGLang's prefill kernel reads it: LumoTree's kernel
    reads the ancestor mask the first GDN layer builds. Every layer's choice is the same in every verify of a
    server (:meth:`VerifyAttention.serves`, the layer's place before or after the first GDN layer), and the verify
    CUDA graphs capture every layer's forward at start-up, so once one verify forward has been seen with every
    full-attention layer on LumoTree's kernel, later verifies need no full mask. Conservative: a layer that went to
    SGLang's kernel (or to the decode-exact attention) once keeps the full mask for good; so does the in-server
    cross-check, which runs SGLang's kernel beside LumoTree's."""

    def __init__(self):
        self.served = set()  # layer ids verified by LumoTree's kernel
        self.sglang = set()  # layer ids verified by any other path

    def note(self, layer_id: int, served: bool) -> None:
        (self.served if served else self.sglang).add(layer_id)

    def unused(self, check=None) -> bool:
        """Whether the full mask is read by no one: layers seen, every one of them on LumoTree's kernel, no check."""
        return bool(self.served) and not self.sglang and check is None


def full_mask_unused(attn_backend) -> bool:
    """Whether ``attn_backend`` (a model runner's) verifies without SGLang's full verify mask (:class:`FullMaskUse`);
    ``False`` for any backend that does not say (SGLang's own)."""
    use = getattr(attn_backend, "full_mask_use", None)
    if not isinstance(use, FullMaskUse):
        return False
    lin = getattr(attn_backend, "linear_attn_backend", None)
    return use.unused(getattr(lin, "check", None))


class VerifyAttention:
    """A target verify's full-attention layers by :func:`lumotree.ops.tree_attention.triton.tree_verify_attention`.

    Args:
        full_attn_backend: SGLang's full-attention backend of the hybrid backend (its KV pool and the
            verify's ``kv_indptr`` / ``kv_indices``).
    """

    def __init__(self, full_attn_backend):
        self.fa = full_attn_backend
        self.why = backend_why_not(full_attn_backend)
        self._layers = {}  # layer id -> why not (None: served)
        self._said = False
        self.check = None  # set by the hybrid backend under LUMOTREE_SGLANG_CHECK=1

    def serves(self, layer, k, v, kwargs) -> bool:
        """Whether this call goes to LumoTree's kernel (logs the first decision, and each layer that cannot)."""
        why = self.why
        if why is None:
            lid = layer.layer_id
            if lid not in self._layers:
                self._layers[lid] = layer_why_not(layer)
                if self._layers[lid] is not None:
                    logger.info("LumoTree: verify attention of layer %d by SGLang's prefill kernel (%s)", lid,
                                self._layers[lid])
            why = self._layers[lid]
        if why is None and (k is None or v is None):
            why = "the layer passes no new keys and values"
        if why is None and any(kwargs.get(x) is not None for x in ("sinks", "score_mod", "aux_tensors")):
            why = "attention sinks or a score modifier"
        if not self._said:
            self._said = True
            logger.info("LumoTree: verify attention by %s", "LumoTree's tree kernel (split prefix + tree merge)"
                        if why is None else f"SGLang's prefill kernel ({why})")
        return why is None

    def forward(self, q, k, v, layer, forward_batch, anc: Optional[torch.Tensor], n: int, save_kv_cache: bool = True,
                live: Optional[torch.Tensor] = None):
        """The verify's attention output ``[bs * n, Hq * Dv]`` (SGLang's layout), its K/V written to the pool first.

        ``anc``: the step's ancestor mask ``[bs, n, n]`` (int8), ``None`` for a chain; ``live`` ``[bs]``: the rows
        whose output is used (state slot >= 0; the cross-check compares those only -- a finished or padded
        row's tree is never written by SGLang's conv kernel, so its mask is whatever the buffer held)."""
        from lumotree.ops.tree_attention.triton import tree_verify_attention

        fa = self.fa
        md = fa.forward_metadata
        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        d, dv = layer.qk_head_dim, layer.v_head_dim
        q3 = q.view(-1, hq, d)
        k3 = k.reshape(-1, hkv, d)
        v3 = v.reshape(-1, hkv, dv)
        T = q3.shape[0]
        bs = T // n
        if save_kv_cache:
            self._save_kv(fa, forward_batch, layer, md, k3, v3)
        out = getattr(forward_batch, "_attn_output", None)
        if out is None:
            out = q.new_empty((T, hq * dv))
        kb = fa.token_to_kv_pool.get_key_buffer(layer.layer_id)
        vb = fa.token_to_kv_pool.get_value_buffer(layer.layer_id)
        tree_verify_attention(q3, k3.contiguous(), v3.contiguous(), kb, vb, md.kv_indptr[: bs + 1], md.kv_indices,
                              anc=anc, scale=layer.scaling, out=out.view(T, hq, dv))
        if self.check is not None:
            self.check.attention(self.fa, q, k, v, layer, forward_batch, out, n, live)
        return out

    @staticmethod
    def _save_kv(fa, forward_batch, layer, md, k, v):
        """The step's keys and values into the KV pool, as SGLang's Triton backend writes them."""
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        loc = KVWriteLoc(forward_batch.out_cache_loc, getattr(md, "swa_out_cache_loc", None),
                         full_loc=getattr(md, "out_cache_loc_full_physical", None))
        fa.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
