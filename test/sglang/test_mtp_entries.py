"""lumotree.sglang.mtp_entries: a no-draft step zeroes the draft model's KV at its tokens' slots, in every attention
layer of the draft model, through SGLang's own pool; nothing else in the pool changes; only no-draft steps do it."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")


def _pool_and_layers(start_layer=5, layers=2, size=64, device="cpu"):
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(size=size, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=layers,
                            device=device, enable_memory_saver=False, start_layer=start_layer,
                            end_layer=start_layer + layers - 1)
    g = torch.Generator().manual_seed(0)
    for buf in list(pool.k_buffer) + list(pool.v_buffer):
        buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype).to(buf.device))
    attn = [RadixAttention(num_heads=4, head_dim=8, scaling=1.0, num_kv_heads=2, layer_id=start_layer + i)
            for i in range(layers)]
    return pool, attn


def _clear_zeroes_exactly_the_slots_of_the_requests_positions(device):
    from lumotree.sglang.mtp_entries import MtpEntries

    pool, attn = _pool_and_layers(device=device)
    req_to_token = torch.arange(1, 65, dtype=torch.int32)[torch.randperm(64, generator=torch.Generator().manual_seed(1))]
    req_to_token = req_to_token.view(4, 16).to(device)  # 4 request rows of 16 positions, slots 1..64 shuffled
    keep_k = [b.clone() for b in pool.k_buffer]
    keep_v = [b.clone() for b in pool.v_buffer]
    e = MtpEntries(pool, attn, req_to_token, max_rows=4)
    rows, lens = torch.tensor([2, 0, 3], device=device), torch.tensor([5, 11, 0], device=device)
    e.clear(rows, lens)
    slots = {int(req_to_token[2, 5]), int(req_to_token[0, 11]), int(req_to_token[3, 0])}
    for before, after in zip(keep_k + keep_v, list(pool.k_buffer) + list(pool.v_buffer)):
        before, after = before.cpu(), after.cpu()
        for s in range(after.shape[0]):
            if s in slots:
                assert not after[s].any(), s
            else:
                assert torch.equal(after[s], before[s]), s
    assert e.cleared == 1


def test_clear_zeroes_exactly_the_slots_of_the_requests_positions():
    _clear_zeroes_exactly_the_slots_of_the_requests_positions("cpu")


@pytest.mark.gpu
def test_clear_on_the_gpu_goes_through_sglang_s_store_kernel_alike():
    """On CUDA SGLang's pool writes through its ``store_cache`` kernel, not the torch path the CPU test takes."""
    _clear_zeroes_exactly_the_slots_of_the_requests_positions("cuda")


def _clear_slots_zeroes_exactly_those_slots_in_blocks(device, monkeypatch):
    from lumotree.sglang.mtp_entries import MtpEntries

    monkeypatch.setattr(MtpEntries, "SLOTS", 4)
    pool, attn = _pool_and_layers(device=device)
    keep = [b.clone() for b in list(pool.k_buffer) + list(pool.v_buffer)]
    e = MtpEntries(pool, attn, torch.zeros(2, 16, dtype=torch.int32, device=device), max_rows=2)
    assert e.block == 4
    slots = [3, 60, 17, 18, 19, 20, 41, 5, 9, 33]  # a prefill's prompt slots: 10, three writes of at most 4
    e.clear_slots(torch.tensor(slots, dtype=torch.int32, device=device))
    for before, after in zip(keep, list(pool.k_buffer) + list(pool.v_buffer)):
        before, after = before.cpu(), after.cpu()
        for s in range(after.shape[0]):
            assert (not after[s].any()) if s in slots else torch.equal(after[s], before[s]), s
    e.clear_slots(torch.zeros(0, dtype=torch.int64, device=device))  # an empty prefill: nothing


def test_clear_slots_zeroes_exactly_those_slots_in_blocks(monkeypatch):
    _clear_slots_zeroes_exactly_those_slots_in_blocks("cpu", monkeypatch)


@pytest.mark.gpu
def test_clear_slots_on_the_gpu(monkeypatch):
    _clear_slots_zeroes_exactly_those_slots_in_blocks("cuda", monkeypatch)


def test_of_runner_finds_the_draft_model_s_attention_layers():
    from sglang.srt.layers.radix_attention import RadixAttention

    from lumotree.sglang.mtp_entries import MtpEntries

    pool, attn = _pool_and_layers()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList(attn))
    runner = SimpleNamespace(model=model, token_to_kv_pool=pool,
                             req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(6, 16, dtype=torch.int32)))
    e = MtpEntries.of_runner(runner)
    assert e.layers == attn and all(isinstance(m, RadixAttention) for m in e.layers)
    assert e.max_rows == 6 and e.pool is pool
    with pytest.raises(ValueError, match="7 rows exceed the 6 request rows"):
        e.clear(torch.arange(7), torch.zeros(7, dtype=torch.int64))
    runner.server_args = SimpleNamespace(enable_unified_memory=True)  # slots translated to physical ones: left alone
    assert MtpEntries.of_runner(runner) is None


@pytest.mark.parametrize("chosen", [0, 3])
def test_only_a_no_draft_step_clears_its_tokens_entries(monkeypatch, chosen):
    from test_adaptive import TreeSizePolicy, bare_worker

    from lumotree.sglang.worker import worker_class

    w = bare_worker(worker_class(), TreeSizePolicy([0, 3]), overlap_consistent=False)
    w.tree_policy.choose = lambda batch: chosen

    def apply_runtime_state(state):
        w.speculative_num_steps = state

    w.apply_runtime_state = apply_runtime_state
    calls = []
    w._mtp_entries = SimpleNamespace(clear=lambda rows, lens: calls.append((rows.tolist(), lens.tolist())))
    monkeypatch.setattr(type(w).__mro__[1], "forward_batch_generation", lambda self, batch, *a, **k: "sglang")
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                             is_extend_in_batch=False, seq_lens=torch.tensor([9, 4, 7]),
                             req_pool_indices=torch.tensor([5, 1, 2, 0]))  # padded past the batch's 3 rows
    assert w._forward(decode) == "sglang"
    assert calls == ([([5, 1, 2], [9, 4, 7])] if chosen == 0 else [])


def test_a_no_draft_decode_step_zeroes_the_entries_at_its_own_slots(monkeypatch):
    """Where the no-draft step runs as a decode step, the worker does not look the slots up itself: the step hands it
    the slots of its forward (``DecodeStep.run``'s ``on_slots``), and those are zeroed (``clear_slots``), once."""
    from test_adaptive import TreeSizePolicy, bare_worker

    from lumotree.sglang.worker import worker_class

    w = bare_worker(worker_class(), TreeSizePolicy([0, 3]), overlap_consistent=False)
    w.tree_policy.choose = lambda batch: 0

    def apply_runtime_state(state):
        w.speculative_num_steps = state

    w.apply_runtime_state = apply_runtime_state
    calls = []
    w._mtp_entries = SimpleNamespace(clear=lambda rows, lens: calls.append(("clear", rows.tolist(), lens.tolist())),
                                     clear_slots=lambda locs: calls.append(("slots", locs.tolist())))

    class Step:
        serves = staticmethod(lambda batch: True)

        def run(self, batch, on_publish=None, on_slots=None, zero_kv=None):
            calls.append(("zero_kv", zero_kv))
            if on_slots is not None:
                on_slots(torch.tensor([40, 41, 42]))
            return "decoded"

    w._decode_step, w._draft_oracle = Step(), False
    w._stub_skipped_draft_extend = lambda batch, out: None
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                             is_extend_in_batch=False, seq_lens=torch.tensor([9, 4, 7]),
                             req_pool_indices=torch.tensor([5, 1, 2, 0]))
    assert w._forward(decode) == "decoded"
    assert calls == [("zero_kv", None), ("slots", [40, 41, 42])]
    # a pool whose rows the step's preparation launch zeroes itself: the buffers handed over, no slots back
    calls.clear()
    w._mtp_entries.raw_pairs = [("k", "v")]
    assert w._forward(decode) == "decoded"
    assert calls == [("zero_kv", [("k", "v")])]


def test_raw_pairs_are_the_pool_s_buffers_and_the_prep_launch_zeroes_them_as_clear_does():
    """SGLang's plain MHA pool: each draft layer's (key, value) buffers, and zeroing their rows at the step's slots in
    the no-draft step's preparation (lumotree.ops.decode_prep) leaves the pool as the pool's own set_kv_buffer of zeros
    (:meth:`MtpEntries.clear`) does. Another pool (a quantized one, a stand-in): none, the pool's own writes."""
    from lumotree import ops
    from lumotree.sglang.mtp_entries import MtpEntries

    req_to_token = torch.arange(1, 65, dtype=torch.int32).view(4, 16)
    rows, lens = torch.tensor([2, 0, 3]), torch.tensor([5, 11, 0])
    (p1, a1), (p2, a2) = _pool_and_layers(), _pool_and_layers()
    e1, e2 = MtpEntries(p1, a1, req_to_token, max_rows=4), MtpEntries(p2, a2, req_to_token, max_rows=4)
    assert [(k.data_ptr(), v.data_ptr()) for k, v in e2.raw_pairs] == [
        (k.data_ptr(), v.data_ptr()) for k, v in zip(p2.k_buffer, p2.v_buffer)]
    e1.clear(rows, lens)
    loc, new = ops.decode_prep(req_to_token, rows, lens, e2.raw_pairs)
    assert loc.tolist() == req_to_token[rows, lens].tolist() and new.tolist() == [6, 12, 1]
    for a, b in zip(list(p1.k_buffer) + list(p1.v_buffer), list(p2.k_buffer) + list(p2.v_buffer)):
        assert torch.equal(a, b)
    p1.use_hnd = True  # SGLang's head-major layout: a slot's entry is not one row
    assert MtpEntries(p1, a1, req_to_token, max_rows=4).raw_pairs is None
    assert MtpEntries(SimpleNamespace(dtype=torch.bfloat16), a1, req_to_token, max_rows=4).raw_pairs is None


@pytest.mark.parametrize("candidates,builds", [(None, True), ([3], False)])
def test_the_worker_builds_its_entries_once_sglang_has_allocated_the_pools(tmp_path, monkeypatch, candidates, builds):
    """SGLang's scheduler builds the speculative worker first and allocates the pools after (``alloc_memory_pool``):
    the worker's constructor must not read the draft runner's pools, which are ``None`` then (it once did, and every
    adaptive LUMOTREE server stopped at start-up). Once they exist, an adaptive server that can serve no draft finds
    the MTP layer's entries and hooks the prefill's draft-extend; a fixed tree does neither."""
    import json

    import sglang.srt.speculative.eagle_worker_v2 as ew

    from lumotree.sglang.worker import worker_class

    pool, attn = _pool_and_layers()
    own, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 16, bias=False)
    target = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(8, 16, bias=False)])
    runner = SimpleNamespace(model=torch.nn.ModuleList(attn + [own, head]), token_to_kv_pool=None,
                             req_to_token_pool=None, server_args=SimpleNamespace(enable_unified_memory=False))
    prefill_extend = object()
    shared = []

    def init_lm_head():  # SGLang's: the draft's head replaced by the target's (its own freed)
        runner.model[-1] = target[1]
        shared.append(runner.req_to_token_pool)

    draft_worker = SimpleNamespace(draft_runner=runner, _draft_extend_for_prefill=prefill_extend,
                                   _draft_extend_for_decode=lambda batch, out: None,
                                   init_token_map=lambda: None, init_lm_head=init_lm_head)

    def sglang_init(self, server_args, *args, **kwargs):  # what the constructor needs of EAGLEWorkerV2's
        self.server_args, self.speculative_num_steps, self.topk = server_args, 3, 1
        self._draft_worker = draft_worker
        self._target_worker = SimpleNamespace(model_runner=SimpleNamespace(model=target))

    def sglang_alloc(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        runner.req_to_token_pool, runner.token_to_kv_pool = req_to_token_pool, pool

    monkeypatch.setattr(ew.EAGLEWorkerV2, "__init__", sglang_init)
    monkeypatch.setattr(ew.EAGLEWorkerV2, "alloc_memory_pool", sglang_alloc)
    config = None
    if candidates is not None:
        config = tmp_path / "fixed.json"
        config.write_text(json.dumps({"candidate_steps": candidates}))
    args = SimpleNamespace(speculative_algorithm="LUMOTREE", speculative_num_steps=3, speculative_eagle_topk=1,
                           speculative_num_draft_tokens=4, speculative_adaptive_config=str(config) if config else None,
                           tp_size=1, dp_size=1, disable_overlap_schedule=True)
    from lumotree.sglang import capacity

    capacity.note_draft_bytes(0)
    w = worker_class()(args)  # the pools are None here
    assert w._mtp_entries is None
    # before the pools: the target's head shared (the draft's copy freed), then the draft's own weights noted for
    # the state pool's sizing (lumotree.sglang.capacity)
    assert shared == [None] and capacity.draft_bytes() == (8 * 8 + 8) * 4
    w.alloc_memory_pool(req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(6, 16, dtype=torch.int32)))
    if builds:
        assert w._mtp_entries is not None and w._mtp_entries.layers == list(attn) and w._mtp_entries.max_rows == 6
        assert draft_worker._draft_extend_for_prefill is not prefill_extend  # the prefill's draft-extend is hooked
    else:
        assert w._mtp_entries is None and draft_worker._draft_extend_for_prefill is prefill_extend


def test_raw_pairs_of_a_hybrid_pool_are_its_full_attention_pool_s_and_none_for_a_layer_it_does_not_map():
    """SGLang's hybrid pool (GDN + attention): a draft layer's buffers are its full-attention pool's at the layer's
    mapped index; a layer the pool does not map (its own ValueError) leaves the entries to set_kv_buffer, no error."""
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool

    from lumotree.sglang.mtp_entries import MtpEntries

    inner, attn = _pool_and_layers(start_layer=0, layers=2)
    hybrid = object.__new__(HybridLinearKVPool)
    hybrid.full_kv_pool, hybrid.use_mla = inner, False
    hybrid.full_attention_layer_id_mapping = {7: 1}
    hybrid.dtype = torch.bfloat16
    req_to_token = torch.arange(1, 65, dtype=torch.int32).view(4, 16)
    attn[0].layer_id = 7
    got = MtpEntries(hybrid, attn[:1], req_to_token, max_rows=4).raw_pairs
    assert [(k.data_ptr(), v.data_ptr()) for k, v in got] == [(inner.k_buffer[1].data_ptr(), inner.v_buffer[1].data_ptr())]
    attn[0].layer_id = 3  # not a full-attention layer of this pool
    assert MtpEntries(hybrid, attn[:1], req_to_token, max_rows=4).raw_pairs is None


def test_a_warm_no_draft_step_runs_sglang_s_step_and_its_draft_extend(monkeypatch):
    """A warm no-draft step (``TreeSizePolicy.warm``: a tree probe's first step) is SGLang's one-node verify with its
    MTP draft-extend: not the decode step, no entries zeroed (the draft-extend writes them), the prefill stubs of its
    rows gone; the drafted step after it is counted (not cold), and the warm step's time is no sample of no draft's."""
    from test_adaptive import TreeSizePolicy, bare_worker

    from lumotree.sglang import adaptive
    from lumotree.sglang.worker import worker_class

    w = bare_worker(worker_class(), TreeSizePolicy([0, 3], warm_probes=True), overlap_consistent=False)
    plan = iter([(0, False), (0, True), (3, False), (3, False)])

    def choose(batch):
        steps, w.tree_policy.warm = next(plan)
        return steps

    w.tree_policy.choose = choose

    def apply_runtime_state(state):
        w.speculative_num_steps = state

    w.apply_runtime_state = apply_runtime_state
    calls = []
    w._mtp_entries = SimpleNamespace(clear=lambda rows, lens: calls.append("clear"),
                                     clear_slots=lambda locs: calls.append("slots"))

    class Step:
        serves = staticmethod(lambda batch: True)

        def run(self, batch, on_publish=None, on_slots=None, zero_kv=None):
            calls.append("decode")
            return "decoded"

    w._decode_step, w._draft_oracle = Step(), False
    w._stub_skipped_draft_extend = lambda batch, out: None
    w._stub_rows = {5, 9}
    # SGLang's step asks the worker for its tree size again (the choice stands: activate_step_by_batch)
    monkeypatch.setattr(type(w).__mro__[1], "forward_batch_generation",
                        lambda self, batch, *a, **k: self.activate_step_by_batch(3) or "sglang")
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                             is_extend_in_batch=False, seq_lens=torch.tensor([9, 4, 7]),
                             req_pool_indices=torch.tensor([5, 1, 2, 0]),
                             reqs=[SimpleNamespace(req_pool_idx=r) for r in (5, 1, 2)])
    assert w._forward(decode) == "decoded" and not w._warm  # a plain no-draft step: the decode step
    assert w._forward(decode) == "sglang" and w._warm  # the warm one: SGLang's step, nothing zeroed
    assert calls == ["decode"] and w._stub_rows == {9}
    w._stub_rows = set()
    assert w._forward(decode) == "sglang" and not w._warm  # the tree
    assert [e[1] for e in w._ledger.pending] == [False, False, False]  # the drafted step after it is counted
    w.activate_step_by_batch(3)  # the next step: the device has passed the warm step, whose time is read now
    assert list(w._ledger.warm_ms()) == [4]  # the warm step's time: the policy's, not a candidate's sample
    w.tree_policy.observe_time(3, adaptive.WARM, 0.5)
    assert w.tree_policy.buckets[4].samples[0] == 1 and adaptive.WARM not in w.tree_policy.buckets[4].samples


def test_an_idle_batch_after_a_warm_step_is_not_warm():
    """The warm flag is the step's own: an idle batch (no decode step chosen) after a warm step does not run the MTP
    draft-extend as one."""
    from test_adaptive import TreeSizePolicy, bare_worker

    from lumotree.sglang.worker import worker_class

    w = bare_worker(worker_class(), TreeSizePolicy([0, 3], warm_probes=True), overlap_consistent=False)

    def choose(batch):
        w.tree_policy.warm = True
        return 0

    w.tree_policy.choose = choose
    w.apply_runtime_state = lambda state: None
    w.activate_step_by_batch(4)
    assert w._warm
    w.activate_step_by_batch(0)  # an idle batch: SGLang's loop asks with no running request
    assert not w._warm
