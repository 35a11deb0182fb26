"""The MTP layer's KV entries of tokens a LUMOTREE server decodes without a draft: zeroed, not left stale.

A no-draft step skips the MTP layer's draft-extend (:mod:`lumotree.sglang.worker`: it costs what a decode step
costs), so the draft model writes no key and value at the token's KV slot. SGLang's draft KV pool shares the
target's slot numbering, and a slot a finished request freed keeps what the draft model last wrote there: after a
no-draft stretch, the request's later drafts attend over another request's entries at those positions. What that
costs, on the committed tiny model's trained MTP head replayed on the CPU (``benchmark/drafters/mtp_holes.py``, a
3-step chain, ``benchmark/results/mtp_holes_text_cpu.json``): after 64 / 192 no-draft steps the accept length is
0.977 / 0.917 of a fully written cache with stale entries, 0.996 / 0.965 with zeroed ones, which read like entries
left out of the attention (0.995 / 0.965); on the model's own greedy outputs 0.979 / 0.867 against 1.000 / 0.955.

So before a no-draft step :class:`MtpEntries` zeroes the draft model's key and value at each request's slot of the
step's token (``req_to_token[row, seq_len]``, the slot SGLang's speculative preparation gave the step's input) in
every attention layer of the draft model, through the pool's own ``set_kv_buffer`` (its layout, dtype and
quantization). A few small launches per step; the slot is the request's own until it is freed, and a later owner
writes its own entry there. A prefill that skips the draft-extend (its decode steps serve no draft) zeroes its
prompts' slots alike (:meth:`MtpEntries.clear_slots`).
"""
from __future__ import annotations

import logging
from typing import List, Optional

import torch

logger = logging.getLogger(__name__)


RAW_LINE = "no-draft steps zero the MTP entries in their preparation launch"  # logged at start-up, one of the two
POOL_LINE = "no-draft steps zero the MTP entries through the draft pool's set_kv_buffer"


class MtpEntries:
    """Zeroes a draft model's KV entries at given request positions (see the module docstring)."""

    SLOTS = 2048  # slots one write of :meth:`clear_slots` zeroes at most (its zero blocks' rows: ``max_rows`` or this)

    def __init__(self, pool, layers: List, req_to_token: torch.Tensor, max_rows: int):
        self.pool = pool
        self.layers = list(layers)
        self.req_to_token = req_to_token
        self.max_rows = int(max_rows)
        # per layer (layer, zero keys, zero values), sliced per call; layers of one shape share one zero block
        self.block = max(self.max_rows, self.SLOTS)
        zeros, self._targets = {}, []
        for layer in self.layers:
            key = (layer.tp_k_head_num, layer.qk_head_dim, layer.tp_v_head_num, layer.v_head_dim)
            if key not in zeros:
                dtype, device = pool.dtype, req_to_token.device
                zeros[key] = (torch.zeros(self.block, key[0], key[1], dtype=dtype, device=device),
                              torch.zeros(self.block, key[2], key[3], dtype=dtype, device=device))
            self._targets.append((layer, *zeros[key]))
        self.cleared = 0  # steps whose entries were zeroed (diagnostics, tests)
        # the layers' (key, value) buffers where a zero row is what the pool's set_kv_buffer of zeros writes: a no-draft
        # step zeroes them in its preparation launch (lumotree.ops.decode_prep); None: through set_kv_buffer
        self.raw_pairs = self._raw_pairs()

    def _raw_pairs(self):
        """``[(k, v)]`` per layer: the buffers of SGLang's plain MHA pool (not quantized, NHD rows, contiguous),
        directly or as a hybrid pool's full-attention pool -- where a slot's entry is one row and zero bits are what
        ``set_kv_buffer`` writes for zero keys and values in any of its dtypes. ``None`` for any other pool."""
        try:
            from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, MHATokenToKVPool
        except ImportError:
            return None

        def plain(p):
            return (type(p) is MHATokenToKVPool and not getattr(p, "is_quantized_kv_cache", False)
                    and not getattr(p, "use_hnd", False) and getattr(p, "kv_cache_layout", "nhd") == "nhd")

        pairs = []
        try:
            for layer in self.layers:
                if plain(self.pool):
                    inner, lid = self.pool, layer.layer_id
                elif (type(self.pool) is HybridLinearKVPool and not self.pool.use_mla
                      and plain(self.pool.full_kv_pool)):
                    inner, lid = self.pool.full_kv_pool, self.pool._transfer_full_attention_id(layer.layer_id)
                else:
                    return None
                at = lid - (inner.start_layer or 0)
                k, v = inner.k_buffer[at], inner.v_buffer[at]
                if not (k.is_contiguous() and v.is_contiguous()) or k.device != self.req_to_token.device:
                    return None
                pairs.append((k, v))
        except (AttributeError, IndexError, TypeError, KeyError, ValueError):  # (a layer the pool does not map)
            return None
        return pairs or None

    @classmethod
    def of_runner(cls, draft_runner) -> Optional["MtpEntries"]:
        """The entries of ``draft_runner``'s model (SGLang's draft ``ModelRunner``): its attention layers, its KV
        pool and request-to-token map. ``None`` under ``--enable-unified-memory``, whose pools write physical slots
        that a request's slot numbers are translated to (``KVWriteLoc``): the entries stay as they are there."""
        from sglang.srt.layers.radix_attention import RadixAttention

        if getattr(getattr(draft_runner, "server_args", None), "enable_unified_memory", False):
            logger.info("LumoTree: --enable-unified-memory: the MTP entries of no-draft steps are left as they are")
            return None
        layers = [m for m in draft_runner.model.modules() if isinstance(m, RadixAttention)]
        rt = draft_runner.req_to_token_pool.req_to_token
        got = cls(draft_runner.token_to_kv_pool, layers, rt, rt.shape[0])
        logger.info("LumoTree: %s (%s)", RAW_LINE if got.raw_pairs is not None else POOL_LINE,
                    type(draft_runner.token_to_kv_pool).__name__)
        return got

    def clear(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Zero the entries at position ``seq_lens[i]`` of request row ``req_pool_indices[i]`` `[bs]`."""
        bs = req_pool_indices.shape[0]
        if bs == 0 or not self.layers:
            return
        if bs > self.max_rows:
            raise ValueError(f"{bs} rows exceed the {self.max_rows} request rows the draft pool was built for")
        locs = self.req_to_token[req_pool_indices.to(torch.int64), seq_lens.to(torch.int64)].to(torch.int64)
        for layer, zk, zv in self._targets:
            self.pool.set_kv_buffer(layer, locs, zk[:bs], zv[:bs])
        self.cleared += 1

    def clear_slots(self, locs: torch.Tensor) -> None:
        """Zero the entries at KV slots ``locs`` `[n]` (a prefill's prompt tokens, whose draft-extend is skipped:
        :mod:`lumotree.sglang.worker`), :attr:`block` slots per write."""
        n = locs.shape[0]
        if n == 0 or not self.layers:
            return
        locs = locs.to(torch.int64)
        for start in range(0, n, self.block):
            part = locs[start:start + self.block]
            m = part.shape[0]
            for layer, zk, zv in self._targets:
                self.pool.set_kv_buffer(layer, part, zk[:m], zv[:m])
        self.cleared += 1
