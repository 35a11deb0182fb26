"""Prompt-interior GDN states in a LumoTree server's radix cache (SGLang's ``no_buffer`` state cache).

SGLang's ``no_buffer`` cache, which LumoTree's servers take (:mod:`lumotree.sglang.scheduling`), keeps a
request's GDN state at the end of its prompt and at the end of the request. A radix match is only as long as
the last state on its path, and SGLang matches at most a prompt's first ``L - 1`` tokens (the last one must
be computed for its logits). So a prompt sent again, or a prefix that different requests share, finds no
state and is prefilled whole; SGLang's ``extra_buffer`` cache (no speculation's default) finds 192 of a
256-token prompt there.

What this module adds: every prefill of a LumoTree server with the ``no_buffer`` cache keeps one more
state, taken from the prefill kernel's own chunk states (SGLang's extend path already copies a chunk state
into a given slot: ``mamba_track_*`` of the forward batch), at :func:`track_position`:

* the **branching point** the radix match reported (the last 64-token boundary of the matched KV that has
  no state; another request shares the prefix up to there), where it lies inside this extend on its chunk
  grid -- as SGLang's ``extra_buffer`` does;
* else, on the extend that ends the request's fill, the last chunk boundary before its last token
  (``prefix + (L - 1 - prefix) // 64 * 64``): what the same prompt sent again can reuse, from its first
  sending on (``extra_buffer`` tracks it at the second).

The slot is taken from the state pool when the batch is prepared (:func:`prepare_extend`; never the last
free slots, which the cache's prompt-end copies need), handed to the extend forward only
(:func:`before_forward` checks that the batch still carries them, :func:`after_forward` clears them, so no
decode or verify sees them: SGLang's read ``mamba_track_indices`` as ``extra_buffer``'s interval snapshot),
and after the prefill the cache inserts it as the state of the prompt's first ``T`` tokens
(:func:`commit`) -- or frees it, where the key is not in the tree or already has a state, or where no GDN
layer of the forward copied it (:func:`note_tracked`, counted by LumoTree's GDN backend: a prefill CUDA
graph replays without SGLang's tracking fields). The state is the prefill kernel's chunk state (its dtype:
bf16 for a bf16 model, as ``extra_buffer``'s), not the fp32 state a prefill of those ``T`` tokens would end
with; states at prompt and request ends stay the committed fp32 ones. Not with
``--enable-deterministic-inference`` (the decode-exact mode keeps only committed states).

Hooks: :mod:`lumotree.sglang.patches.prompt_state_batch` (``ScheduleBatch.prepare_for_extend``),
:mod:`lumotree.sglang.patches.prompt_state_run` (``Scheduler.run_batch``),
:mod:`lumotree.sglang.patches.prompt_state_cache` (the two caching calls of ``UnifiedRadixCache``, SGLang's
hybrid-model cache, and of ``MambaRadixCache``).
"""
from __future__ import annotations

import contextlib
import logging
from typing import List, Optional, Sequence

logger = logging.getLogger(__name__)

ATTR = "_lumotree_prompt_state"  # on a Req: [T, slot tensor [1], launched] between prepare_extend and commit
BATCH_ATTR = "_lumotree_prompt_state_mask"  # on a ScheduleBatch: the mamba_track_mask it was given here
HOST_ATTR = "lumotree_host"  # on that mamba_track_mask tensor: (mask, track seqlens) as host tuples (host_marks)


def applies(server_args) -> bool:
    """A LumoTree server with the radix cache on, SGLang's ``no_buffer`` state cache (its active pool: no
    ``--enable-int8-mamba-checkpoint``), page size 1, one pipeline stage, not the decode-exact mode nor mixed
    chunks (the mixed batch is rebuilt without the tracking fields)."""
    from lumotree.sglang.scheduling import OVERLAP_ALGORITHMS  # LumoTree's algorithms

    return (str(getattr(server_args, "speculative_algorithm", None) or "").upper() in OVERLAP_ALGORITHMS
            and not getattr(server_args, "disable_radix_cache", False)
            and getattr(server_args, "mamba_radix_cache_strategy", None) == "no_buffer"
            and (getattr(server_args, "page_size", None) or 1) == 1
            and (getattr(server_args, "pp_size", None) or 1) == 1
            and not getattr(server_args, "enable_int8_mamba_checkpoint", False)
            and not getattr(server_args, "enable_mixed_chunk", False)
            and not getattr(server_args, "enable_deterministic_inference", False))


def track_position(prefix_len: int, extend_end: int, fill_len: int, branching: Optional[int],
                   chunk: int) -> Optional[int]:
    """The token count ``T`` whose state one extend keeps, or ``None``.

    Args:
        prefix_len: tokens before the extend (matched from the cache or an earlier chunk).
        extend_end: tokens after it.
        fill_len: the request's whole fill (prompt, and output tokens of a retracted request).
        branching: the radix match's branching point (SGLang's ``mamba_branching_seqlen``), or None.
        chunk: the prefill kernel's chunk (SGLang's ``mamba_cache_chunk_size``).

    ``T`` lies strictly inside the extend, on its chunk grid (``T - prefix_len`` a multiple of ``chunk``): the
    kernel's chunk states are there, and its final state is cached at ``extend_end`` anyway."""
    if chunk <= 1 or extend_end <= prefix_len:
        return None
    if branching is not None and prefix_len < branching < extend_end and (branching - prefix_len) % chunk == 0:
        return int(branching)
    if extend_end != fill_len:
        return None
    t = prefix_len + (fill_len - 1 - prefix_len) // chunk * chunk
    return t if prefix_len < t < extend_end else None


def kernel_seqlen(t: int, prefix_len: int, chunk: int) -> int:
    """The ``mamba_track_seqlens`` entry that makes SGLang's extend path copy the chunk state after ``t`` tokens.
    SGLang reads an aligned length as the extend's final state; one token more selects the chunk state ``h``
    at ``(t - prefix_len) // chunk`` and the conv window before ``t`` (its ``_force_track_h``)."""
    assert (t - prefix_len) % chunk == 0 and t > prefix_len
    return t + 1


def budget(free_slots: int, batch_reqs: int) -> int:
    """How many tracking slots one batch may take from ``free_slots`` free state slots: each of the batch's
    ``batch_reqs`` requests keeps one free for the cache's copy of its prompt-end state."""
    return max(0, free_slots - batch_reqs)


def plan(reqs: Sequence, chunk: int) -> List[Optional[int]]:
    """:func:`track_position` for each request of an extend batch (``prefix_indices``, ``extend_range``,
    ``full_untruncated_fill_ids``, ``mamba_branching_seqlen`` as SGLang's ``Req`` has them)."""
    out = []
    for r in reqs:
        prefix = len(r.prefix_indices)
        end = prefix + r.extend_range.length
        fill = len(r.full_untruncated_fill_ids)
        out.append(track_position(prefix, end, fill, getattr(r, "mamba_branching_seqlen", None), chunk))
    return out


def prepare_extend(batch, server_args=None) -> int:
    """After SGLang's ``ScheduleBatch.prepare_for_extend``: take a state slot for each request with a
    :func:`track_position` (within :func:`budget`, evicting cached states of the tree's LRU where the pool
    has too few free) and set the batch's ``mamba_track_*`` for its forward. Returns the slots taken."""
    import torch

    if server_args is None:
        from sglang.srt.runtime_context import get_server_args

        server_args = get_server_args()
    if not batch.reqs or getattr(batch, "mamba_track_mask", None) is not None:
        return 0
    alloc = batch.req_to_token_pool.mamba_allocator
    for r in batch.reqs:  # a request prepared before whose batch never ran
        release(alloc, r)
    chunk = int(server_args.mamba_cache_chunk_size)  # SGLang's prefill chunk grid (64 at page size 1)
    points = plan(batch.reqs, chunk)
    want = sum(t is not None for t in points)
    if want == 0:
        return 0
    room = budget(alloc.available_size(), len(batch.reqs))
    cache = batch.tree_cache
    if room < want and hasattr(cache, "mamba_evictable_size") and cache.mamba_evictable_size() > 0:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        cache.evict(EvictParams(num_tokens=0, mamba_num=want - room))
        room = budget(alloc.available_size(), len(batch.reqs))
    mask, slots, seqlen = [], [], []
    for r, t in zip(batch.reqs, points):
        slot = alloc.alloc(1) if (t is not None and len(slots) < room) else None
        if slot is None:
            mask.append(False), seqlen.append(-1)
            continue
        slots.append(slot)
        setattr(r, ATTR, [t, slot, False])
        mask.append(True), seqlen.append(kernel_seqlen(t, len(r.prefix_indices), chunk))
    if not slots:
        return 0
    dev = batch.device
    batch.mamba_track_mask = torch.tensor(mask, dtype=torch.bool).to(dev, non_blocking=True)
    batch.mamba_track_indices = track_indices(mask, slots, dev)
    batch.mamba_track_seqlens = torch.tensor(seqlen, dtype=torch.int64).to(dev, non_blocking=True)
    setattr(batch.mamba_track_mask, HOST_ATTR, (tuple(mask), tuple(seqlen)))  # (host_marks)
    setattr(batch, BATCH_ATTR, batch.mamba_track_mask)
    return len(slots)


def track_indices(mask: Sequence[bool], slots: Sequence, device):
    """The batch's ``mamba_track_indices`` (int64 ``[len(mask)]`` on ``device``): row ``i`` the slot of the ``i``-th
    tracked row (``slots``: the allocator's one-element tensors, in row order), 0 where ``mask`` is false -- built on
    the device: the slots' values are never read on the host. Why: the allocator's slots are device tensors, and
    reading one (``int(slot[0])``) waits for every launched kernel -- at the start of a prefill the previous batch's
    whole forward -- then copies; a batch of 32 tracked prompts made 32 such syncs (27B shape, batch 128, one H100:
    93 device-to-host copies with the device idle between them over three prefill forwards)."""
    import torch

    values = torch.cat([s.reshape(1) for s in slots]).to(device=device, dtype=torch.int64)
    if len(slots) == len(mask):
        return values
    rows = torch.tensor([i for i, m in enumerate(mask) if m], dtype=torch.int64).to(device, non_blocking=True)
    return torch.zeros(len(mask), dtype=torch.int64, device=device).index_copy_(0, rows, values)


def host_marks(forward_batch):
    """``(mask, track seqlens, extend lengths, prefix lengths)`` of an extend's rows as host sequences, where its
    tracking fields are the ones :func:`prepare_extend` built (their mask tensor carries them, :data:`HOST_ATTR`) and
    the forward batch has its extend lengths on the host; else ``None`` (SGLang's own tracking, a padded batch)."""
    mask_t = getattr(forward_batch, "mamba_track_mask", None)
    marks = getattr(mask_t, HOST_ATTR, None) if mask_t is not None else None
    ext = getattr(forward_batch, "extend_seq_lens_cpu", None)
    pre = getattr(forward_batch, "extend_prefix_lens_cpu", None)
    if marks is None or ext is None or pre is None:
        return None
    mask, seqlens = marks
    if not len(mask) == len(seqlens) == len(ext) == len(pre) == mask_t.shape[0]:
        return None
    return mask, seqlens, [int(x) for x in ext], [int(x) for x in pre]


@contextlib.contextmanager
def mask_on_host(forward_batch):
    """While SGLang builds an extend's forward metadata: the batch's ``mamba_track_mask`` as a host tensor (with its
    :data:`HOST_ATTR`) where :func:`host_marks` knows it, so that SGLang's ``bool(mask.any())`` and its GDN
    backend's ``mask.nonzero()`` read the host. Why: each read of a device tensor on the host waits for every kernel
    launched before it -- at the start of a prefill, the decode step in flight -- and the tracking metadata read the
    mask, the lengths and the slots that way nine times a tracked prefill (those two, a boolean-mask index and six
    ``.cpu()``; with :func:`track_conv_indices` and :func:`track_ssm_indices`: none). A GDN layer's ``h`` copy reads
    the device indices these build, as SGLang's did."""
    import torch

    marks = host_marks(forward_batch)
    if marks is None:
        yield
        return
    dev = forward_batch.mamba_track_mask
    host = torch.tensor(marks[0], dtype=torch.bool)
    setattr(host, HOST_ATTR, getattr(dev, HOST_ATTR))
    forward_batch.mamba_track_mask = host
    try:
        yield
    finally:
        forward_batch.mamba_track_mask = dev


def track_conv_indices(marks, conv_len: int, chunk: int, device):
    """SGLang's ``_init_track_conv_indices`` (the flattened input positions of each tracked row's conv window: the
    ``conv_len`` tokens before its last chunk boundary to track) from an extend's :func:`host_marks`, built on the host
    and sent (no read of a device tensor)."""
    import torch

    mask, seqlens, ext, pre = marks
    starts, q = [], 0
    for m, t, length, prefix in zip(mask, seqlens, ext, pre):
        if m:
            starts.append(q + (t - prefix) // chunk * chunk - conv_len)
        q += length
    idx = torch.tensor(starts, dtype=torch.int64)[:, None] + torch.arange(conv_len, dtype=torch.int64)
    return idx.clamp(0, q - 1).to(device, non_blocking=True)


def track_ssm_indices(marks, mamba_cache_indices, track, chunk: int):
    """SGLang's ``_init_track_ssm_indices`` for GDN layers -- ``(h_src, h_dst, final_src, final_dst)``: rows whose
    tracked length is not on the chunk grid take the chunk state ``h`` at their last boundary (its index among the
    batch's chunks), the others the layer's final state -- with the row choice made on the host from an extend's
    :func:`host_marks` on ``chunk``'s grid and the slots (``mamba_cache_indices``, its ``mamba_track_indices``
    ``track``) gathered on the device (no read of a device tensor)."""
    import torch

    mask, seqlens, ext, pre = marks
    offsets, at = [], 0
    for length in ext:  # each row's first chunk among the batch's chunk states
        offsets.append(at)
        at += (length - 1) // chunk + 1
    rows = [i for i, m in enumerate(mask) if m]
    aligned = [i for i in rows if (seqlens[i] - pre[i]) % chunk == 0]
    inside = [i for i in rows if (seqlens[i] - pre[i]) % chunk != 0]

    def pick(t, sel):
        return t[:0] if not sel else t.index_select(0, torch.tensor(sel, dtype=torch.int64).to(t.device, non_blocking=True))

    h_src = torch.tensor([offsets[i] + (seqlens[i] - pre[i]) // chunk for i in inside], dtype=torch.int64)
    return (h_src.to(track.device, non_blocking=True), pick(track, inside), pick(mamba_cache_indices, aligned),
            pick(track, aligned))


def copies_rows(h, ssm_states) -> bool:
    """Whether a GDN layer's tracked chunk states (SGLang's ``h``: `[1, chunks, Hv, V, K]`) go into its pool
    (``ssm_states``: `[slots, Hv, V, K]`) by :func:`lumotree.ops.copy_state_rows`: the same state shape, each state
    one contiguous block on both sides (not SGLang's page-major envelope pool)."""
    from lumotree.ops.state_rows import rows_contiguous_layout

    if h.dim() != ssm_states.dim() + 1 or tuple(h.shape[2:]) != tuple(ssm_states.shape[1:]) or h.shape[0] != 1:
        return False
    return (rows_contiguous_layout(tuple(h.shape[1:]), h.stride()[1:])
            and rows_contiguous_layout(tuple(ssm_states.shape), ssm_states.stride()))


def warm_copy(temporal, dtype, devices=("cuda",)) -> None:
    """Compile :func:`lumotree.ops.copy_state_rows` in the variant a prefill launches -- the model's ``dtype`` chunk
    states into the pool ``temporal`` (`[layers, slots, Hv, V, K]`; one layer's view), int64 rows -- by one launch on
    scratch rows of the same shape, so that the first prefill does not compile it while its requests wait. Nothing on
    ``devices`` other than the pool's: a no-op."""
    import torch

    from lumotree import ops

    if temporal.device.type not in devices:
        return
    state = tuple(temporal.shape[2:])
    rows = torch.zeros(1, dtype=torch.int64, device=temporal.device)
    src = torch.zeros((1, *state), dtype=dtype, device=temporal.device)
    dst = torch.empty((1, *state), dtype=temporal.dtype, device=temporal.device)
    try:
        ops.copy_state_rows(src, rows, dst, rows)
    except Exception as e:  # a compile ahead of time is not worth a server: the first prefill compiles it
        logger.warning("LumoTree: the prompt-state copy could not be compiled ahead (%s: %s); the first prefill "
                       "compiles it", type(e).__name__, e)


_tracked = 0  # GDN layer forwards that copied tracked chunk states (note_tracked, from LumoTree's GDN backend)
_untracked_warned = False


def note_tracked() -> None:
    """A GDN layer's extend just copied its tracked chunk states (LumoTree's GDN backend,
    ``_track_mamba_state_extend``)."""
    global _tracked
    _tracked += 1


def before_forward(batch) -> None:
    """Before SGLang runs a batch prepared by :func:`prepare_extend`: its requests' slots count as written
    where the batch still carries the tracking fields it was given; else (a path that rebuilt the batch) they
    are freed. Notes the tracked-layer count :func:`after_forward` compares with."""
    mark = getattr(batch, BATCH_ATTR, None)
    if mark is None:
        return
    kept = batch.mamba_track_mask is mark
    alloc = batch.req_to_token_pool.mamba_allocator
    for r in batch.reqs:
        track = getattr(r, ATTR, None)
        if track is None:
            continue
        if kept:
            track[2] = True
        else:
            release(alloc, r)
    batch._lumotree_prompt_state_tracked = _tracked


def after_forward(batch) -> None:
    """After SGLang launched the extend (every layer's host code has run): where no GDN layer copied its tracked
    states -- a prefill CUDA graph replayed without the tracking fields (SGLang's graph runners carry them only for
    ``extra_buffer`` servers without speculation) -- the requests' slots are freed, never cached unwritten. Then
    the tracking fields leave the ``ScheduleBatch`` (it may become the running batch, and SGLang's decode and
    verify read ``mamba_track_indices`` as ``extra_buffer``'s interval snapshot)."""
    global _untracked_warned
    mark = getattr(batch, BATCH_ATTR, None)
    if mark is None:
        return
    seen = getattr(batch, "_lumotree_prompt_state_tracked", None)
    if seen is not None and _tracked == seen:
        alloc = batch.req_to_token_pool.mamba_allocator
        for r in batch.reqs:
            release(alloc, r)
        if not _untracked_warned:
            _untracked_warned = True
            logger.info("LumoTree: a prefill ran without SGLang's extend state tracking (a prefill CUDA graph): its "
                        "prompts' interior states are not cached (--disable-piecewise-cuda-graph runs prefills "
                        "eagerly)")
    if batch.mamba_track_mask is mark:
        batch.mamba_track_mask = batch.mamba_track_indices = batch.mamba_track_seqlens = None
    setattr(batch, BATCH_ATTR, None)
    batch._lumotree_prompt_state_tracked = None


def _root(cache):
    core = getattr(cache, "tree_core", None)  # UnifiedRadixCache (SGLang's hybrid-model cache) or MambaRadixCache
    return core.root_node if core is not None else cache.root_node


def _present(cache, key) -> bool:
    """Whether ``key`` (a ``RadixKey``) lies in ``cache``'s tree whole with its KV on the device, without touching
    LRU or locks."""
    node, rest = _root(cache), key
    while len(rest) > 0:
        child = node.children.get(rest.child_key(cache.page_size))
        if child is None or getattr(child, "evicted", False):
            return False
        n = child.key.match(rest, page_size=cache.page_size)
        if n < min(len(child.key), len(rest)):
            return False
        rest = rest[n:]
        node = child
    return True


def commit(cache, req) -> bool:
    """After the cache took a request's prompt (``cache_unfinished_req``) or the request
    (``cache_finished_req``): the tracked state becomes the state of the fill's first ``T`` tokens where the
    forward wrote it, that key is in the tree and has no state yet; the slot is freed otherwise. Returns
    whether it was inserted."""
    track = getattr(req, ATTR, None)
    if track is None:
        return False
    setattr(req, ATTR, None)
    t, slot, launched = track
    token_ids = req.full_untruncated_fill_ids
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    key = RadixKey(token_ids[:t], req.extra_key)
    inserted = False
    bigram = getattr(getattr(cache, "tree_core", None), "is_eagle", False)  # bigram keys: not a hybrid-model tree
    if launched and not bigram and not cache.disable and len(token_ids) >= t and _present(cache, key):
        import torch

        # every token of the key is in the tree: prev_prefix_len = T frees nothing and no node takes `value`
        res = cache.insert(InsertParams(key=key, value=torch.zeros(t, dtype=torch.int64), mamba_value=slot,
                                        prev_prefix_len=t))
        inserted = not res.mamba_exist
    if not inserted:
        cache.req_to_token_pool.mamba_allocator.free(slot)
    return inserted


def release(alloc, req) -> None:
    """Free a request's tracking slot to the state pool's allocator ``alloc`` without caching it."""
    track = getattr(req, ATTR, None)
    if track is not None:
        setattr(req, ATTR, None)
        alloc.free(track[1])
