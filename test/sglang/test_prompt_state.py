"""Prompt-interior states in the ``no_buffer`` radix cache (``lumotree.sglang.prompt_state``), on CPU: where an
extend tracks a state (exact positions), the slots a batch takes and gives back, the fields its forward gets and
loses, and the insert into SGLang's own ``MambaRadixCache`` (a later match of the prompt's first ``L - 1`` tokens
finds ``T`` of them; duplicates, absent keys and batches that never ran free their slot). Served behaviour is
``test_served_prompt_state_gpu.py``."""
from array import array
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

from lumotree.sglang import prompt_state as ps  # noqa: E402

C = 64


@pytest.mark.parametrize("prefix,end,fill,branching,want", [
    pytest.param(0, 256, 256, None, 192, id="resend-256"),
    pytest.param(0, 257, 257, None, 256, id="resend-257"),
    pytest.param(0, 65, 65, None, 64, id="just-over-a-chunk"),
    pytest.param(0, 64, 64, None, None, id="one-chunk"),
    pytest.param(0, 20, 20, None, None, id="short"),
    pytest.param(192, 256, 256, None, None, id="matched-to-the-track"),
    pytest.param(100, 300, 300, None, 292, id="unaligned-prefix-on-its-grid"),
    pytest.param(0, 128, 300, None, None, id="non-final-chunk"),
    pytest.param(0, 128, 300, 64, 64, id="branching-in-a-non-final-chunk"),
    pytest.param(0, 300, 300, 128, 128, id="branching-first"),
    pytest.param(10, 300, 300, 64, 10 + 256, id="branching-off-grid"),
    pytest.param(128, 300, 300, 128, 128 + 128, id="branching-at-prefix"),
    pytest.param(0, 300, 300, 300, 256, id="branching-at-end"),
])
def test_track_position(prefix, end, fill, branching, want):
    assert ps.track_position(prefix, end, fill, branching, C) == want


def test_kernel_seqlen_selects_the_chunk_state():
    # SGLang's extend path reads (seqlen - prefix) // chunk as the chunk state's index and an aligned length as
    # the final state: t + 1 gives index (t - prefix) / chunk, never aligned
    for prefix, t in ((0, 64), (0, 192), (100, 292)):
        s = ps.kernel_seqlen(t, prefix, C)
        assert (s - prefix) % C != 0 and (s - prefix) // C * C == t - prefix


def _req(rid, prompt, prefix=0, end=None, branching=None):
    end = len(prompt) if end is None else end
    return SimpleNamespace(rid=rid, prefix_indices=torch.arange(prefix), extend_range=SimpleNamespace(length=end - prefix),
                           full_untruncated_fill_ids=array("q", prompt), mamba_branching_seqlen=branching,
                           extra_key=None)


class _Tree:
    def __init__(self, evictable=0, alloc=None):
        self.evictable, self.alloc, self.evicted = evictable, alloc, 0

    def mamba_evictable_size(self):
        return self.evictable

    def evict(self, params):  # frees what it evicts, as SGLang's does
        n = min(params.mamba_num, self.evictable)
        self.evictable -= n
        self.evicted += n
        self.alloc.free(torch.arange(1000, 1000 + n))


def _batch(reqs, free, evictable=0):
    alloc = MambaSlotAllocator(64, "cpu")
    alloc.free_slots = alloc.free_slots[:free]
    tree = _Tree(evictable, alloc)
    return SimpleNamespace(reqs=reqs, req_to_token_pool=SimpleNamespace(mamba_allocator=alloc), tree_cache=tree,
                           device="cpu", mamba_track_mask=None, mamba_track_indices=None, mamba_track_seqlens=None)


ARGS = SimpleNamespace(mamba_cache_chunk_size=C)


def test_prepare_sets_the_fields_for_tracked_rows():
    reqs = [_req("a", list(range(256))), _req("b", list(range(30))), _req("c", list(range(300)), prefix=100)]
    b = _batch(reqs, free=10)
    assert ps.prepare_extend(b, ARGS) == 2
    assert b.mamba_track_mask.tolist() == [True, False, True]
    assert b.mamba_track_seqlens.tolist() == [193, -1, 293]
    slots = [getattr(r, ps.ATTR, None) for r in reqs]
    assert slots[1] is None and slots[0][0] == 192 and slots[2][0] == 292
    assert b.mamba_track_indices.tolist() == [int(slots[0][1]), 0, int(slots[2][1])]
    assert b.req_to_token_pool.mamba_allocator.available_size() == 8


class _DeviceSlots(torch.Tensor):
    """Slot tensors standing for the allocator's device tensors: reading a value on the host (a device-to-host sync on
    a GPU) is recorded while ``watch`` is on."""

    watch, reads = False, []
    HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__index__,
                  torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.numpy}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if cls.watch and func in cls.HOST_READS:
            cls.reads.append(func.__name__)
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("sizes", [[256, 30, 300], [256, 200, 300]], ids=["some rows", "every row"])
def test_prepare_builds_the_track_indices_without_reading_a_slot_on_the_host(sizes):
    """The allocator's slots are device tensors; reading one on the host waits for all launched work (at a prefill:
    the previous batch's forward). The batch's track indices are built from them on the device."""
    reqs = [_req(str(i), list(range(n))) for i, n in enumerate(sizes)]
    b = _batch(reqs, free=10)
    alloc = b.req_to_token_pool.mamba_allocator
    alloc.free_slots = alloc.free_slots.as_subclass(_DeviceSlots)
    _DeviceSlots.reads, _DeviceSlots.watch = [], True
    try:
        n = ps.prepare_extend(b, ARGS)
    finally:
        _DeviceSlots.watch = False
    assert _DeviceSlots.reads == []
    tracked = [getattr(r, ps.ATTR, None) for r in reqs]
    assert n == sum(t is not None for t in tracked) == (2 if sizes[1] < C else 3)
    assert b.mamba_track_indices.tolist() == [int(t[1]) if t is not None else 0 for t in tracked]
    assert b.mamba_track_indices.dtype == torch.int64
    assert len(set(b.mamba_track_indices.tolist()) - {0}) == n


def test_prepare_leaves_a_free_slot_per_request_and_evicts_for_the_rest():
    reqs = [_req(str(i), list(range(200))) for i in range(3)]
    b = _batch(reqs, free=4)  # 3 kept for the prompt-end copies, 1 to track, nothing evictable
    assert ps.prepare_extend(b, ARGS) == 1
    assert b.req_to_token_pool.mamba_allocator.available_size() == 3
    reqs = [_req(str(i), list(range(200))) for i in range(3)]
    b = _batch(reqs, free=4, evictable=5)
    assert ps.prepare_extend(b, ARGS) == 3 and b.tree_cache.evicted == 2
    assert b.req_to_token_pool.mamba_allocator.available_size() == 3


def test_prepare_frees_a_slot_left_by_a_batch_that_never_ran():
    r = _req("a", list(range(200)))
    b = _batch([r], free=5)
    ps.prepare_extend(b, ARGS)
    first = getattr(r, ps.ATTR, None)[1]
    b.mamba_track_mask = None  # prepared again
    ps.prepare_extend(b, ARGS)
    assert b.req_to_token_pool.mamba_allocator.available_size() == 4  # one slot held, not two
    assert int(first) in b.req_to_token_pool.mamba_allocator.free_slots.tolist()


def test_forward_marks_slots_and_clears_the_fields():
    r = _req("a", list(range(200)))
    b = _batch([r], free=5)
    ps.prepare_extend(b, ARGS)
    ps.before_forward(b)
    assert getattr(r, ps.ATTR, None)[2] is True
    ps.note_tracked()  # a GDN layer of the forward copied its tracked states
    ps.after_forward(b)
    assert getattr(r, ps.ATTR, None) is not None  # kept for the cache
    assert b.mamba_track_mask is None and b.mamba_track_indices is None and b.mamba_track_seqlens is None
    assert getattr(b, ps.BATCH_ATTR) is None


def test_a_forward_no_layer_tracked_gives_the_slots_back():
    """A prefill CUDA graph replays without SGLang's tracking fields: no GDN layer copies a state, so the slots must
    not be cached (they hold whatever they held)."""
    r = _req("a", list(range(200)))
    b = _batch([r], free=5)
    ps.prepare_extend(b, ARGS)
    ps.before_forward(b)
    ps.after_forward(b)
    assert getattr(r, ps.ATTR, None) is None and b.req_to_token_pool.mamba_allocator.available_size() == 5
    assert b.mamba_track_mask is None


def test_the_gdn_backend_copies_the_tracked_states_and_counts_the_layers_that_tracked(monkeypatch):
    """A LUMOTREE server's tracked chunk states go into their pool slots by one copy (lumotree.ops.copy_state_rows),
    as SGLang's copy would put them; SGLang's copy serves a non-LUMOTREE backend and the aligned final-state case.
    Every layer that tracked is counted."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    from lumotree.sglang.backend import LumoTreeGDNBackend

    calls = []
    sglang_copy = MambaAttnBackendBase._track_mamba_state_extend
    monkeypatch.setattr(MambaAttnBackendBase, "_track_mamba_state_extend",
                        lambda self, *a: (calls.append(a), sglang_copy(self, *a)))
    be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
    be.lumotree = False
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, 7, 2, 4, 3, generator=g).to(torch.bfloat16)  # [1, chunks, Hv, V, K]
    pool = torch.randn(6, 2, 4, 3, generator=g)
    empty = torch.zeros(0, dtype=torch.int64)
    md = SimpleNamespace(has_mamba_track_mask=True, track_ssm_h_src=torch.tensor([5, 1]),
                         track_ssm_h_dst=torch.tensor([2, 4]), track_ssm_final_src=empty, track_ssm_final_dst=empty)
    n = ps._tracked
    be._track_mamba_state_extend(None, h, pool.clone(), SimpleNamespace(has_mamba_track_mask=False))
    assert ps._tracked == n and calls == []
    want = pool.clone()
    be._track_mamba_state_extend(None, h, want, md)  # SGLang's copy (not a LUMOTREE backend)
    assert ps._tracked == n + 1 and len(calls) == 1
    assert torch.equal(want[[2, 4]], h[0, [5, 1]].float()) and torch.equal(want[[0, 1, 3, 5]], pool[[0, 1, 3, 5]])
    be.lumotree = True
    got = pool.clone()
    be._track_mamba_state_extend(None, h, got, md)
    assert ps._tracked == n + 2 and len(calls) == 1 and torch.equal(got, want)
    aligned = SimpleNamespace(**{**vars(md), "track_ssm_final_src": torch.tensor([0]),
                                 "track_ssm_final_dst": torch.tensor([3])})
    be._track_mamba_state_extend(None, h, got, aligned)  # the aligned final-state case: SGLang's
    assert ps._tracked == n + 3 and len(calls) == 2 and torch.equal(got[3], got[0])
    assert ps.copies_rows(h, pool) and not ps.copies_rows(h[:, :, :1], pool)
    assert not ps.copies_rows(h, pool.transpose(2, 3).contiguous().transpose(2, 3))  # rows not one block each


def test_a_batch_rebuilt_before_its_forward_gives_the_slots_back():
    r = _req("a", list(range(200)))
    b = _batch([r], free=5)
    ps.prepare_extend(b, ARGS)
    b.mamba_track_mask = b.mamba_track_indices = b.mamba_track_seqlens = None  # as merge_batch does
    ps.before_forward(b)
    assert getattr(r, ps.ATTR, None) is None and b.req_to_token_pool.mamba_allocator.available_size() == 5
    ps.after_forward(b)


class _KV:
    device = torch.device("cpu")
    page_size = 1

    def __init__(self):
        self.freed = []

    def free(self, idx):
        self.freed.append(idx.clone())

    def free_segment(self, idx, start_pos=0):
        self.freed.append(idx.clone())


def _mamba_cache():
    c = MambaRadixCache.__new__(MambaRadixCache)
    c.req_to_token_pool = SimpleNamespace(mamba_allocator=MambaSlotAllocator(64, "cpu"))
    c.token_to_kv_pool_allocator = _KV()
    c.mamba_cache_chunk_size, c.page_size, c.disable = C, 1, False
    c.enable_kv_cache_events, c.enable_mamba_extra_buffer, c.enable_mamba_extra_buffer_lazy = False, False, False
    c.kv_event_queue, c.device = [], torch.device("cpu")
    c.reset()
    return c


def _unified_cache(monkeypatch):
    """SGLang's hybrid-model cache as its registry builds it (Full + Mamba components), on CPU pools."""
    import sglang.srt.mem_cache.unified_cache.components.mamba_component as mc
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    monkeypatch.setattr(mc, "get_server_args", lambda: SimpleNamespace(mamba_cache_chunk_size=C))
    monkeypatch.setattr(mc, "get_exec", lambda: SimpleNamespace(mamba=SimpleNamespace(mamba_max_states_per_path=-1)))
    pool = HybridReqToTokenPool.__new__(HybridReqToTokenPool)
    pool.mamba_allocator = MambaSlotAllocator(64, "cpu")
    return UnifiedRadixCache(CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=_KV(),
                                             page_size=1, tree_components=(ComponentType.FULL, ComponentType.MAMBA)))


@pytest.fixture(params=["unified", "mamba"])
def make_cache(request, monkeypatch):
    return (lambda: _unified_cache(monkeypatch)) if request.param == "unified" else _mamba_cache


def _cache_prompt(c, prompt):
    """What ``cache_unfinished_req`` leaves: the whole prompt, its KV, its end state."""
    slot = c.req_to_token_pool.mamba_allocator.alloc(1)
    c.insert(InsertParams(key=RadixKey(array("q", prompt)), value=torch.arange(len(prompt)), mamba_value=slot))
    return slot


def _match(c, tokens):
    return len(c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)))).device_indices)


def _tracked(c, prompt, launched=True):
    r = _req("a", prompt)
    slot = c.req_to_token_pool.mamba_allocator.alloc(1)
    setattr(r, ps.ATTR, [ps.track_position(0, len(prompt), len(prompt), None, C), slot, launched])
    return r, slot


def test_commit_makes_a_resent_prompt_hit_its_track(make_cache):
    c = make_cache()
    prompt = list(range(1, 257))
    _cache_prompt(c, prompt)
    assert _match(c, prompt[:-1]) == 0  # no_buffer alone: no state before the prompt's end
    r, slot = _tracked(c, prompt)
    assert ps.commit(c, r) is True and getattr(r, ps.ATTR, None) is None
    assert _match(c, prompt[:-1]) == 192
    assert c.mamba_evictable_size() == 2
    assert _match(c, prompt) == 256  # the prompt-end state unchanged
    assert c.token_to_kv_pool_allocator.freed == []  # no KV freed


def test_commit_frees_a_duplicate_an_absent_key_and_an_unlaunched_slot(make_cache):
    c = make_cache()
    prompt = list(range(1, 257))
    _cache_prompt(c, prompt)
    alloc = c.req_to_token_pool.mamba_allocator
    r, _ = _tracked(c, prompt)
    ps.commit(c, r)
    n = alloc.available_size()
    r, slot = _tracked(c, prompt)  # the same prompt tracked again
    assert ps.commit(c, r) is False and alloc.available_size() == n and int(slot) in alloc.free_slots.tolist()
    other = list(range(1000, 1300))
    r, slot = _tracked(c, other)  # its prompt never reached the tree
    assert ps.commit(c, r) is False and alloc.available_size() == n
    fresh = list(range(5000, 5256))
    _cache_prompt(c, fresh)
    r, slot = _tracked(c, fresh, launched=False)  # its batch never ran with the fields
    n = alloc.available_size()
    assert ps.commit(c, r) is False and alloc.available_size() == n + 1 and _match(c, fresh[:-1]) == 0


def test_applies_only_to_lumotree_no_buffer_servers():
    base = dict(speculative_algorithm="LUMOTREE", disable_radix_cache=False, mamba_radix_cache_strategy="no_buffer",
                page_size=1, pp_size=1, enable_int8_mamba_checkpoint=False, enable_mixed_chunk=False,
                enable_deterministic_inference=False)
    assert ps.applies(SimpleNamespace(**base))
    for k, v in (("speculative_algorithm", None), ("speculative_algorithm", "NEXTN"), ("disable_radix_cache", True),
                 ("mamba_radix_cache_strategy", "extra_buffer"), ("page_size", 64), ("pp_size", 2),
                 ("enable_int8_mamba_checkpoint", True), ("enable_mixed_chunk", True),
                 ("enable_deterministic_inference", True)):
        assert not ps.applies(SimpleNamespace(**{**base, k: v})), (k, v)


def test_the_hooks_name_sglangs_methods():
    import importlib

    from lumotree.sglang.patches import prompt_state_batch, prompt_state_cache, prompt_state_run

    targets = [prompt_state_batch.TARGET, prompt_state_run.TARGET]
    targets += [c + m for c in prompt_state_cache.CLASSES for m in (".cache_unfinished_req", ".cache_finished_req")]
    for t in targets:
        mod, cls, meth = t.rsplit(".", 2)
        assert callable(getattr(getattr(importlib.import_module(mod), cls), meth)), t


def test_the_copy_is_compiled_at_start_up_in_the_variant_a_prefill_launches(monkeypatch, caplog):
    """``warm_copy`` launches the copy once on scratch rows of the pool's state shape: the model's dtype into the pool's,
    int64 rows, strided as a layer's view (one state a row); nothing on a device other than the pool's; a failure
    leaves the server starting."""
    import lumotree.ops as ops

    calls = []
    monkeypatch.setattr(ops, "copy_state_rows", lambda *a: calls.append(a))
    pool = torch.zeros(3, 5, 2, 4, 3)  # [layers, slots, Hv, V, K]
    ps.warm_copy(pool, torch.bfloat16)  # the pool is on the CPU: nothing to compile
    assert calls == []
    ps.warm_copy(pool, torch.bfloat16, devices=("cpu",))
    (src, src_rows, dst, dst_rows), = calls
    assert src.dtype == torch.bfloat16 and dst.dtype == pool.dtype and src_rows.dtype == dst_rows.dtype == torch.int64
    assert src.shape[1:] == dst.shape[1:] == pool.shape[2:]
    assert src.stride(0) == dst.stride(0) == pool[1].stride(0) and ps.copies_rows(src[None], dst)

    def fails(*a):
        raise RuntimeError("no compiler")
    monkeypatch.setattr(ops, "copy_state_rows", fails)
    with caplog.at_level("WARNING", logger="lumotree.sglang.prompt_state"):
        ps.warm_copy(pool, torch.bfloat16, devices=("cpu",))
    assert "could not be compiled ahead (RuntimeError" in caplog.text


class _OnDevice(torch.Tensor):
    """A forward batch's device tensors: what would read one on the host (a sync on a GPU: ``.cpu()``, ``.item()``,
    ``bool()``, a boolean-mask index) is recorded while ``watch`` is on."""

    watch, reads = False, []
    HOST_READS = {torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__,
                  torch.Tensor.__index__, torch.Tensor.__bool__, torch.Tensor.numpy, torch.Tensor.nonzero}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if cls.watch and (func in cls.HOST_READS or (
                func is torch.Tensor.__getitem__ and isinstance(args[1], torch.Tensor) and args[1].dtype == torch.bool)):
            cls.reads.append(func.__name__)
        return super().__torch_function__(func, types, args, kwargs or {})


def _extend(mask, seqlens, ext, pre, slots, host=True):
    """An extend's forward batch as SGLang builds it (its tracking fields as ``prepare_extend`` sets them)."""
    fb = SimpleNamespace(mamba_track_mask=torch.tensor(mask, dtype=torch.bool),
                         mamba_track_indices=torch.tensor(slots, dtype=torch.int64),
                         mamba_track_seqlens=torch.tensor(seqlens, dtype=torch.int64),
                         extend_seq_lens=torch.tensor(ext, dtype=torch.int32),
                         extend_prefix_lens=torch.tensor(pre, dtype=torch.int32),
                         extend_seq_lens_cpu=list(ext), extend_prefix_lens_cpu=list(pre))
    if host:
        setattr(fb.mamba_track_mask, ps.HOST_ATTR, (tuple(mask), tuple(seqlens)))
    return fb


def _prepared(sizes, prefixes):
    """An extend batch through ``prepare_extend`` (its seqlens pick chunk states) as a forward batch."""
    reqs = [_req(str(i), list(range(n)), prefix=p) for i, (n, p) in enumerate(zip(sizes, prefixes))]
    b = _batch(reqs, free=20)
    ps.prepare_extend(b, ARGS)
    fb = SimpleNamespace(mamba_track_mask=b.mamba_track_mask, mamba_track_indices=b.mamba_track_indices,
                         mamba_track_seqlens=b.mamba_track_seqlens,
                         extend_seq_lens=torch.tensor([n - p for n, p in zip(sizes, prefixes)], dtype=torch.int32),
                         extend_prefix_lens=torch.tensor(prefixes, dtype=torch.int32),
                         extend_seq_lens_cpu=[n - p for n, p in zip(sizes, prefixes)], extend_prefix_lens_cpu=list(prefixes))
    return fb


TRACKED_EXTENDS = {
    "prepared: resend, short, unaligned prefix": lambda: _prepared([256, 30, 300], [0, 0, 100]),
    "prepared: every row": lambda: _prepared([256, 200, 129, 65], [0, 0, 0, 0]),
    "prepared: resumed rows": lambda: _prepared([256, 384, 300], [192, 64, 10]),
    "chunk states and final states": lambda: _extend([True, False, True, True], [193, -1, 128, 64 + 100],
                                                     [256, 30, 128, 200], [0, 0, 0, 100], [7, 0, 9, 11]),
    "final states only": lambda: _extend([True, True], [64, 192], [64, 192], [0, 0], [3, 5]),
    "first row untracked, window clamped at 0": lambda: _extend([False, True], [-1, 3], [5, 70], [0, 0], [0, 4]),
}


@pytest.mark.parametrize("name", list(TRACKED_EXTENDS))
def test_the_track_indices_built_on_the_host_equal_sglangs(name, monkeypatch):
    """The GDN backend's conv-window and state indices of a tracked extend, built from the host's marks, equal SGLang's
    ``_init_track_conv_indices`` / ``_init_track_ssm_indices`` on the same batch -- values and dtypes -- and read no
    device tensor on the host (SGLang's read the mask, lengths and slots: a sync each on a GPU)."""
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hl
    import sglang.srt.runtime_context as rc

    from lumotree.sglang.backend import LumoTreeGDNBackend

    monkeypatch.setattr(hl, "get_server_args", lambda: ARGS)
    monkeypatch.setattr(rc, "get_server_args", lambda: ARGS)
    fb = TRACKED_EXTENDS[name]()
    conv_len = 4
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(fb.extend_seq_lens, 0).to(torch.int32)])
    cache_rows = torch.arange(30, 30 + fb.mamba_track_mask.shape[0], dtype=torch.int32)
    sg = SimpleNamespace(device="cpu", conv_states_shape=(8, 16, conv_len))
    want_conv = hl.MambaAttnBackendBase._init_track_conv_indices(sg, qsl, fb)
    want_ssm = hl.MambaAttnBackendBase._init_track_ssm_indices(sg, cache_rows, fb)

    be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
    be.device, be.conv_states_shape = "cpu", sg.conv_states_shape
    marks = getattr(fb.mamba_track_mask, ps.HOST_ATTR)
    for f in ("mamba_track_mask", "mamba_track_indices", "mamba_track_seqlens", "extend_seq_lens", "extend_prefix_lens"):
        setattr(fb, f, getattr(fb, f).as_subclass(_OnDevice))
    setattr(fb.mamba_track_mask, ps.HOST_ATTR, marks)
    _OnDevice.reads, _OnDevice.watch = [], True
    try:
        got_conv = be._init_track_conv_indices(qsl.as_subclass(_OnDevice), fb)
        got_ssm = be._init_track_ssm_indices(cache_rows.as_subclass(_OnDevice), fb)
        with ps.mask_on_host(fb):
            tracked = bool(fb.mamba_track_mask.any())  # SGLang's test of the mask, in _forward_metadata
    finally:
        _OnDevice.watch = False
    assert _OnDevice.reads == []
    assert tracked and type(fb.mamba_track_mask) is _OnDevice  # the device mask back after the metadata
    assert got_conv.dtype == want_conv.dtype and torch.equal(got_conv, want_conv)
    assert len(got_ssm) == len(want_ssm) == 4
    for g, w in zip(got_ssm, want_ssm):
        assert g.dtype == w.dtype and torch.equal(g.as_subclass(torch.Tensor), w)
    # SGLang's own methods do read the device on the host (what this saves)
    _OnDevice.reads, _OnDevice.watch = [], True
    try:
        hl.MambaAttnBackendBase._init_track_ssm_indices(sg, cache_rows.as_subclass(_OnDevice), fb)
    finally:
        _OnDevice.watch = False
    assert "cpu" in _OnDevice.reads


def test_track_indices_without_the_host_marks_are_sglangs(monkeypatch):
    """A forward batch whose tracking fields are not prepare_extend's (no host marks: SGLang's own tracking, a padded
    batch) or that has no host extend lengths: SGLang's methods, and the mask is left on the device."""
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hl

    from lumotree.sglang.backend import LumoTreeGDNBackend

    calls = []
    monkeypatch.setattr(hl.MambaAttnBackendBase, "_init_track_conv_indices", lambda self, q, fb: calls.append("conv"))
    monkeypatch.setattr(hl.MambaAttnBackendBase, "_init_track_ssm_indices", lambda self, c, fb: calls.append("ssm"))
    be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
    be.conv_states_shape = (8, 16, 4)
    plain = _extend([True], [193], [256], [0], [7], host=False)
    no_lengths = _extend([True], [193], [256], [0], [7])
    no_lengths.extend_seq_lens_cpu = None
    for fb in (plain, no_lengths):
        assert ps.host_marks(fb) is None
        be._init_track_conv_indices(torch.tensor([0, 256], dtype=torch.int32), fb)
        be._init_track_ssm_indices(torch.tensor([3], dtype=torch.int32), fb)
        mask = fb.mamba_track_mask
        with ps.mask_on_host(fb):
            assert fb.mamba_track_mask is mask
    assert calls == ["conv", "ssm"] * 2


@pytest.mark.parametrize("name", list(TRACKED_EXTENDS))
def test_the_gdn_metadata_s_tracked_rows_are_sglangs_without_a_host_read(name, monkeypatch):
    """SGLang's GDN ``init_forward_metadata`` takes the tracked rows (``nonzero`` of the mask) and their conv slots;
    LumoTree's backend gives the same, from the host's mask where it knows it (no read of a device tensor), and
    leaves SGLang's as it is where the extend plans FlashInfer checkpoints from those rows."""
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hl
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from lumotree.sglang.backend import LumoTreeGDNBackend

    # the base metadata (SGLang's _forward_metadata, its own test of the mask included), without the pools
    monkeypatch.setattr(hl.MambaAttnBackendBase, "_forward_metadata",
                        lambda self, fb: SimpleNamespace(has_mamba_track_mask=bool(fb.mamba_track_mask.any())))
    fb = TRACKED_EXTENDS[name]()
    fb.req_pool_indices, fb.forward_mode = None, SimpleNamespace(is_decode=lambda: False, is_target_verify=lambda: False)
    ref = GDNAttnBackend.__new__(GDNAttnBackend)
    ref.kernel_dispatcher = SimpleNamespace(extend_uses_state_checkpoints=False)
    GDNAttnBackend.init_forward_metadata(ref, fb)
    want = ref.forward_metadata

    be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
    be.kernel_dispatcher, be.finished = SimpleNamespace(extend_uses_state_checkpoints=False), None
    marks = getattr(fb.mamba_track_mask, ps.HOST_ATTR)
    fb.mamba_track_mask = fb.mamba_track_mask.as_subclass(_OnDevice)
    fb.mamba_track_indices = fb.mamba_track_indices.as_subclass(_OnDevice)
    setattr(fb.mamba_track_mask, ps.HOST_ATTR, marks)
    _OnDevice.reads, _OnDevice.watch = [], True
    try:
        be.init_forward_metadata(fb)
    finally:
        _OnDevice.watch = False
    got = be.forward_metadata
    assert _OnDevice.reads == [] and type(fb.mamba_track_mask) is _OnDevice
    assert got.has_mamba_track_mask is want.has_mamba_track_mask is True
    for f in ("mamba_track_mask_indices", "conv_states_mask_indices"):
        g, w = getattr(got, f), getattr(want, f)
        assert g.dtype == w.dtype and torch.equal(g.as_subclass(torch.Tensor), w)
    # FlashInfer's checkpointed extend: SGLang's method, the device mask read as SGLang reads it
    be.kernel_dispatcher.extend_uses_state_checkpoints = True
    monkeypatch.setattr(GDNAttnBackend, "init_forward_metadata", lambda self, fb: _OnDevice.reads.append("sglang's"))
    _OnDevice.reads = []
    be.init_forward_metadata(fb)
    assert _OnDevice.reads == ["sglang's"]
