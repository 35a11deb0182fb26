"""Request capacity: a LumoTree server runs as many requests at once as the same server without speculation.

Two things in SGLang 0.5.17 make a speculative server run fewer requests at once than the same server without
speculation, and at batch 64 and up that alone decides the race (the requests beyond the cap wait for a second wave):

* **The running cap.** Without ``--max-running-requests``, SGLang's argument handling for EAGLE-family and NGRAM
  speculation sets it to 48; without speculation the cap is memory's. A LUMOTREE server that can serve no draft
  (adaptive, the default: large batches serve plain decode steps) takes :func:`default_running` instead -- 256,
  or the decode CUDA graphs' largest batch where that is larger -- so that memory caps it as it caps no speculation
  (a smaller ``--cuda-graph-max-bs`` does not cap it: batches above it run eager, as without speculation). Its price:
  SGLang's verify graphs keep KV-index buffers of (their largest batch x draft tokens x context length) int64, 2 GiB
  for 256 x 4 at a 262k-token context (no speculation's decode graphs: a quarter of that), taken from the memory
  outside the pools. A fixed tree (the decode-exact mode unless its config asks it to choose, data parallelism)
  keeps SGLang's 48; an explicit flag is kept as given. LUMOTREE_SUFFIX keeps 48: its 32-node trees would make those
  buffers eight times larger (its agent workloads run up to 32 requests).
* **The state slots.** SGLang sizes a hybrid model's state pool (``max_mamba_cache_size``; with the radix cache it
  allows ``slots // 3`` running requests) from the memory left after the weights, shared between state slots and KV
  tokens by ``--mamba-full-memory-ratio``. A speculative server's draft weights are counted first, and the ring
  buffers of the pool layout LumoTree runs on (``enable_linear_replayssm_spec``, released again by LumoTree's backend)
  are charged per slot, so it gets fewer slots. Served on one H100 at the Qwen3.5-27B 32-layer shape, the MTP layer's
  3.69 GiB of weights left LUMOTREE (and SGLang's NEXTN) 164 slots, 54 requests, against no speculation's 192 and 64:
  0.65x no speculation at batch 64 where drafts miss (an H100 run before this module; git history). Through
  :mod:`lumotree.sglang.patches.state_slots_as_no_spec`, a LumoTree server gets the slots SGLang would size without
  speculation -- from its memory plus the draft's own weights (:func:`draft_weight_bytes`, noted by the worker before
  the pools are sized), without the rings -- and the draft's memory comes out of the KV pool instead: a hybrid model
  keeps KV in few layers (8 of 32 at that shape, 443k tokens of KV against 64 x 384 needed). The draft's own copies
  of the embedding and LM head, which SGLang frees only after the pools are sized, are shared before
  (:func:`share_draft_head`), so the KV pool pays for the MTP layer alone. SGLang's own sizing is
  kept where the user set ``--max-mamba-cache-size``, where ``--max-running-requests`` sizes the pool (radix cache
  off), with pipeline or data-parallel attention, where it already gives as many slots, and where the KV pool would
  keep less than :data:`MIN_KV_KEPT` of what SGLang's own sizing leaves it (logged).

Served on one H200 at that shape (``benchmark/results/serving_speed_h200.json``): 473 state slots and 157 running
requests, as no speculation, where SGLang's own sizing gave 458 (0.79 GiB of draft weights once the head is shared;
36.26 GiB left for the KV pool against 37.36).
"""
from __future__ import annotations

import itertools
import logging

logger = logging.getLogger(__name__)

RUNNING = 256  # a LUMOTREE server's running cap without the flag (SGLang's decode-graph default from 60 GB of GPU memory)
OURS = ("LUMOTREE", "LUMOTREE_SUFFIX", "LUMOTREE_ORACLE")  # the algorithms on LumoTree's state path
# logged when a LumoTree server's state slots are sized as without speculation (the served GPU test reads it)
SLOTS_LINE = "state slots, as the server would have without speculation"
MIN_KV_KEPT = 0.5  # the share of SGLang's own KV memory that sizing slots as without speculation must leave
_draft = {"bytes": 0}  # the draft model's own weights in this process (set by the worker before the pools)


def serves_no_draft(server_args) -> bool:
    """Whether a LUMOTREE server may serve a step without a draft: adaptive, and 0 among the
    candidates (every default; ``--speculative-adaptive-config`` may leave it out). Read before SGLang resolves the
    tree flags, so the config's list is only looked at here; it is validated once they are resolved."""
    from lumotree.sglang.adaptive import _config, adaptive_tree_size

    if not adaptive_tree_size(server_args):
        return False
    _, cfg = _config(server_args)
    return cfg is None or (isinstance(cfg, dict) and 0 in (cfg.get("candidate_steps") or ()))


def default_running(server_args) -> int:
    """The running cap of a LUMOTREE server without ``--max-running-requests`` that can serve no draft:
    :data:`RUNNING`, or the largest batch of its decode CUDA graphs (``cuda_graph_config.decode.max_bs``) where that is
    larger."""
    graphs = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
    return max(RUNNING, int(getattr(graphs, "max_bs", None) or 0))


def take_running_cap(server_args, algorithm: str) -> None:
    """Before SGLang's speculative argument handling (which sets 48 where the flag is absent): where
    ``--max-running-requests`` is absent and the server can serve no draft, :func:`default_running`."""
    if server_args.max_running_requests is not None or not serves_no_draft(server_args):
        return
    server_args.max_running_requests = default_running(server_args)
    logger.info("%s: up to %d running requests, as memory allows (no speculation's cap; SGLang's speculative default "
                "is 48): large batches serve steps without a draft. --max-running-requests sets it.", algorithm,
                server_args.max_running_requests)


def _tensors(module):
    return itertools.chain(module.parameters(), module.buffers())


def draft_weight_bytes(draft, target) -> int:
    """Bytes of the storages of ``draft``'s parameters and buffers that ``target``'s do not share (each counted
    once): what the draft model holds beyond the target (after :func:`share_draft_head`, the MTP layer's own
    weights)."""
    shared = {_storage(t)[0] for t in _tensors(target)}
    seen, total = set(), 0
    for t in _tensors(draft):
        ptr, nbytes = _storage(t)
        if ptr in shared or ptr in seen:
            continue
        seen.add(ptr)
        total += nbytes
    return total


def _storage(t):
    """``(address, bytes)`` of ``t``'s storage; a tensor without one (a subclass, a meta tensor) by its own
    address and size."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return ("tensor", id(t)), t.numel() * t.element_size()


def share_draft_head(draft_worker) -> None:
    """SGLang's sharing of the target's embedding and LM head with the MTP draft (``EagleDraftWorker.init_token_map``,
    ``init_lm_head``), run before the pools are sized: the draft's own copies are freed then, and SGLang's memory
    profile (it empties the allocator's cache) finds their memory -- 2.9 GiB at the 27B shape's 152k-token vocabulary --
    for the pools. SGLang shares them again once the pools exist, which sets the same tensors."""
    if getattr(draft_worker, "init_lm_head", None) is None:
        return
    draft_worker.init_token_map()
    draft_worker.init_lm_head()


def note_draft_bytes(n: int) -> None:
    _draft["bytes"] = int(n)


def draft_bytes() -> int:
    return _draft["bytes"]


def slots_without_speculation(rest_gib: float, per_req: int, ratio: float) -> int:
    """The state slots SGLang 0.5.17 sizes for a server without speculation and without ring buffers from
    ``rest_gib`` GiB left after the weights (``KVCacheConfigurator._handle_max_mamba_cache``, its ratio-based branch:
    a budget of ``ratio / (1 + ratio)`` of it, one padding slot)."""
    budget = rest_gib * ratio / (1 + ratio) * (1 << 30)
    return int((budget - per_req) // per_req)


def size_state_slots(original, configurator, rest_gib: float, *args, **kwargs) -> float:
    """``KVCacheConfigurator._handle_max_mamba_cache`` (``original``) of a LumoTree server: the slots no speculation
    would get (see the module docstring); returns the GiB left for the KV pool, as SGLang's does. Any other server
    (another algorithm in the same process) is sized by SGLang's alone."""
    from sglang.srt.runtime_context import get_context, get_memory, get_schedule

    sched = get_schedule()
    ps = getattr(configurator, "ps", None)
    if (getattr(getattr(configurator, "spec_algorithm", None), "name", None) not in OURS
            or getattr(configurator, "is_draft_worker", False) or configurator.mambaish_config is None
            or sched.max_mamba_cache_size is not None
            or (get_memory().disable_radix_cache and sched.max_running_requests is not None)
            or getattr(ps, "pp_size", 1) != 1 or getattr(ps, "attn_dp_size", 1) != 1):
        return original(configurator, rest_gib, *args, **kwargs)
    kv_own = original(configurator, rest_gib, *args, **kwargs)
    own = get_schedule().max_mamba_cache_size
    draft_gib = draft_bytes() / (1 << 30)
    per_req = int(configurator.mambaish_config.mamba2_cache_params.mamba_cache_per_req)
    want = slots_without_speculation(rest_gib + draft_gib, per_req, sched.mamba_full_memory_ratio)
    if want <= own:
        return kv_own
    get_context().override("lumotree.capacity.state_slots", max_mamba_cache_size=want)
    kv = original(configurator, rest_gib, *args, **kwargs)
    if kv < MIN_KV_KEPT * kv_own:
        get_context().override("lumotree.capacity.state_slots_kept", max_mamba_cache_size=own)
        logger.warning("LumoTree: %d state slots as without speculation would leave the KV pool %.2f GiB of the %.2f "
                       "SGLang's sizing leaves it; kept SGLang's %d slots", want, kv, kv_own, own)
        return kv_own
    logger.info("LumoTree: %d %s (SGLang's sizing: %d); the draft's %.2f GiB of weights and the per-slot rings come "
                "out of the KV pool (%.2f GiB left for it, %.2f with SGLang's)", want, SLOTS_LINE, own, draft_gib, kv,
                kv_own)
    return kv
