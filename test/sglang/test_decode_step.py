"""The no-draft step as SGLang's decode forward (``lumotree.sglang.decode_step``) on CPU, with SGLang's
own forward-batch and cache-location code and a stand-in model runner: the decode view of a speculative
V2 batch (positions, KV slot, lengths), the backend and graph swap around the forward, the result in
the one-node verify's conventions, which batches it serves, and the worker's dispatch to it. The
served step (tokens equal to no speculation, under CUDA graphs) is
``test_served_no_draft_gpu.py``."""
import copy
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from lumotree.sglang import decode_step as ds  # noqa: E402
from lumotree.sglang.adaptive import TreeSizePolicy  # noqa: E402


def spec_batch(bs=3, **kw):
    seq = torch.tensor([5, 9, 2][:bs], dtype=torch.int64)
    b = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, spec_algorithm=SpeculativeAlgorithm.EAGLE,
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([11, 22, 33][:bs], dtype=torch.int32)),
        seq_lens=seq, seq_lens_cpu=seq.clone(), seq_lens_sum=int(seq.sum()), req_pool_indices=torch.tensor([2, 0, 1][:bs]),
        device="cpu", input_ids=None, out_cache_loc=None, return_logprob=False, return_hidden_states=False,
        has_grammar=False, is_extend_in_batch=False, req_to_token_pool=None,
        sampling_info=SimpleNamespace(has_custom_logit_processor=False,
                                      penalizer_orchestrator=SimpleNamespace(is_required=False)))
    for k, v in kw.items():
        setattr(b, k, v)
    return b


class Runner:
    """What DecodeStep reads of SGLang's model runner."""

    def __init__(self):
        self.attn_backend, self.decode_cuda_graph_runner = "verify-backend", "verify-graphs"
        self.req_to_token_pool = SimpleNamespace(req_to_token=torch.arange(3 * 16).view(3, 16) + 1000)
        self.sampled = torch.tensor([7, 8, 9], dtype=torch.int64)

    def sample(self, logits_output, fb):
        assert logits_output == "logits" and fb.tag == "fb"
        return self.sampled[: fb.bs]


def cache_locs(req_pool_indices, req_to_token, start_offset, batch_size, draft_token_num, device):
    """SGLang's ``assign_extend_cache_locs_uniform_func`` (a Triton kernel; no CPU path on a CUDA build)."""
    cols = start_offset[:, None] + torch.arange(draft_token_num)
    return req_to_token[req_pool_indices[:, None], cols].reshape(batch_size * draft_token_num).to(torch.int64)


def test_decode_view_and_result(monkeypatch):
    monkeypatch.setattr("sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func", cache_locs)
    mr = Runner()
    seen = {}

    def init_new(batch, model_runner, return_hidden_states_before_norm):
        seen["batch"] = copy.copy(batch)
        seen["backend_at_init"] = model_runner.attn_backend
        return SimpleNamespace(tag="fb", bs=batch.seq_lens.shape[0])

    def forward(batch, forward_batch, is_verify):
        assert batch is None and is_verify  # no sampling inside: the step samples with the decode sampler
        seen["during"] = (mr.attn_backend, mr.decode_cuda_graph_runner)
        seen["published_before_forward"] = list(published)
        return SimpleNamespace(logits_output="logits", can_run_cuda_graph=True, routed_experts_output=None,
                               indexer_topk_output=None)

    monkeypatch.setattr("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", init_new)
    step = ds.DecodeStep(SimpleNamespace(model_runner=mr, forward_batch_generation=forward), "decode-backend",
                         "decode-graphs")
    b = spec_batch()
    before = dict(vars(b))
    published = []
    out = step.run(b, on_publish=published.append)

    d = seen["batch"]
    assert d.forward_mode == ForwardMode.DECODE and d.spec_algorithm == SpeculativeAlgorithm.NONE and d.spec_info is None
    assert torch.equal(d.input_ids, b.spec_info.bonus_tokens)  # the last bonus token is this step's input
    # its KV slot: the one SGLang's speculative decode preparation allocated at the request's next position
    want = mr.req_to_token_pool.req_to_token[b.req_pool_indices, b.seq_lens]
    assert torch.equal(d.out_cache_loc, want)
    assert d.seq_lens.tolist() == [6, 10, 3] and d.seq_lens_cpu.tolist() == [6, 10, 3] and d.seq_lens_sum == 19
    assert seen["backend_at_init"] == "decode-backend" and seen["during"] == ("decode-backend", "decode-graphs")
    assert (mr.attn_backend, mr.decode_cuda_graph_runner) == ("verify-backend", "verify-graphs")  # restored
    assert vars(b) == before  # the scheduler's batch keeps its speculative view

    # the one-node verify's result: the root accepted, one sampled token, lengths + 1
    assert out.next_token_ids.dtype == torch.int32 and out.next_token_ids.tolist() == [7, 8, 9]
    assert out.accept_lens.dtype == torch.int32 and out.accept_lens.tolist() == [1, 1, 1]
    assert out.new_seq_lens.tolist() == [6, 10, 3] and out.speculative_num_draft_tokens == 1
    # the new lengths are published before the forward is launched (the scheduler's next step waits for them)
    assert len(seen["published_before_forward"]) == 1 and published[0] is out.new_seq_lens
    bonus = out.next_draft_input.bonus_tokens
    # the sampler's own tensor (int64 where greedy: the FutureMap's dtype, no cast in its stash)
    assert bonus.dtype == mr.sampled.dtype == torch.int64 and bonus.tolist() == [7, 8, 9]
    assert bonus.data_ptr() != out.next_token_ids.data_ptr()  # separate memory: either may be written alone
    assert out.can_run_cuda_graph and step.steps == 1
    assert d.seq_lens is out.new_seq_lens  # one tensor of the new lengths for the forward and the result
    # the accept lengths are views of one kept buffer: no new tensor a step, grown for a larger batch
    again = step.run(spec_batch())
    assert again.accept_lens.data_ptr() == out.accept_lens.data_ptr() and again.accept_lens.tolist() == [1, 1, 1]
    mr.sampled = torch.tensor([4, 5, 6], dtype=torch.int32)  # a sampler that returns int32 (non-greedy sampling)
    own = step.run(spec_batch())
    assert own.next_token_ids.tolist() == own.next_draft_input.bonus_tokens.tolist() == [4, 5, 6]
    assert own.next_token_ids.data_ptr() != own.next_draft_input.bonus_tokens.data_ptr()  # still separate memory
    mr.sampled = torch.arange(70, 170)
    big = step.run(spec_batch(bs=3, seq_lens=torch.full((100,), 3), seq_lens_cpu=torch.full((100,), 3),
                              seq_lens_sum=300, req_pool_indices=torch.zeros(100, dtype=torch.int64),
                              spec_info=SimpleNamespace(bonus_tokens=torch.zeros(100, dtype=torch.int32))))
    assert big.accept_lens.tolist() == [1] * 100 and big.next_token_ids.tolist() == list(range(70, 170))


def test_the_decode_step_hands_its_slots_over_before_its_forward(monkeypatch):
    """``on_slots`` gets the forward's own ``out_cache_loc`` (the tokens' KV slots), before the forward is launched:
    the worker zeroes the MTP entries there without a second lookup."""
    monkeypatch.setattr("sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func", cache_locs)
    mr = Runner()
    seen, slots = {}, []

    def init_new(batch, model_runner, return_hidden_states_before_norm):
        seen["out_cache_loc"] = batch.out_cache_loc
        return SimpleNamespace(tag="fb", bs=batch.seq_lens.shape[0])

    def forward(batch, forward_batch, is_verify):
        seen["slots_before_forward"] = len(slots)
        return SimpleNamespace(logits_output="logits", can_run_cuda_graph=True, routed_experts_output=None,
                               indexer_topk_output=None)

    monkeypatch.setattr("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", init_new)
    step = ds.DecodeStep(SimpleNamespace(model_runner=mr, forward_batch_generation=forward), "b", "g")
    b = spec_batch()
    step.run(b, on_slots=slots.append)
    assert len(slots) == 1 and seen["slots_before_forward"] == 1 and slots[0] is seen["out_cache_loc"]
    assert torch.equal(slots[0], mr.req_to_token_pool.req_to_token[b.req_pool_indices, b.seq_lens])


def test_the_decode_step_zeroes_the_mtp_rows_in_its_preparation_launch(monkeypatch):
    """With the MTP layers' buffers (``zero_kv``) the step's slots, its new lengths and the zeroing of those rows come
    from its preparation (lumotree.ops.decode_prep), before the forward; SGLang's slot lookup does not run."""
    def no_lookup(**kw):
        raise AssertionError("SGLang's slot lookup ran")

    monkeypatch.setattr("sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func", no_lookup)
    mr = Runner()
    k, v = torch.ones(2000, 2, 4), torch.ones(2000, 3)
    seen = {}

    def init_new(batch, model_runner, return_hidden_states_before_norm):
        seen["out_cache_loc"], seen["seq_lens"] = batch.out_cache_loc, batch.seq_lens
        return SimpleNamespace(tag="fb", bs=batch.seq_lens.shape[0])

    def forward(batch, forward_batch, is_verify):
        seen["zeroed_before_forward"] = int((k.sum((1, 2)) == 0).sum())
        return SimpleNamespace(logits_output="logits", can_run_cuda_graph=True, routed_experts_output=None,
                               indexer_topk_output=None)

    monkeypatch.setattr("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", init_new)
    step = ds.DecodeStep(SimpleNamespace(model_runner=mr, forward_batch_generation=forward), "b", "g")
    b = spec_batch()
    out = step.run(b, on_publish=lambda lens: None, zero_kv=[(k, v)])
    want = mr.req_to_token_pool.req_to_token[b.req_pool_indices, b.seq_lens]
    assert torch.equal(seen["out_cache_loc"], want) and seen["zeroed_before_forward"] == 3
    assert not k[want].any() and not v[want].any() and int((v == 0).all(1).sum()) == 3  # those rows only
    assert seen["seq_lens"] is out.new_seq_lens and out.new_seq_lens.tolist() == [6, 10, 3]


def ngram_batch(bs=3, n=4, **kw):
    """A batch of SGLang's NGRAM loop as a decode step finds it: the last step's accepted tokens, rows of ``n``."""
    accept = torch.tensor([[4, 5, 0, 0], [6, 0, 0, 0], [7, 8, 9, 10]][:bs], dtype=torch.int32)[:, :n]
    spec = SimpleNamespace(accept_tokens=accept.reshape(-1).clone(),
                           accept_lens=torch.tensor([2, 1, 4][:bs], dtype=torch.int32))
    return spec_batch(bs, **{"spec_algorithm": SpeculativeAlgorithm.NGRAM, "spec_info": spec, **kw})


def test_ngram_decode_view_and_result(monkeypatch):
    """LUMOTREE_SUFFIX's no-draft step: the input of each row is the last token the previous step accepted
    (gathered on the device), and the result is in the NGRAM loop's layout -- rows of ``draft_token_num``
    with the sampled token first, accept lengths 1, lengths + 1 -- also as the next step's draft input."""
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    monkeypatch.setattr("sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func", cache_locs)
    mr = Runner()
    seen = {}

    def init_new(batch, model_runner, return_hidden_states_before_norm):
        seen["batch"] = copy.copy(batch)
        return SimpleNamespace(tag="fb", bs=batch.seq_lens.shape[0])

    monkeypatch.setattr("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", init_new)
    published = []

    def forward(batch, forward_batch, is_verify):
        seen["published_before_forward"] = len(published)
        return SimpleNamespace(logits_output="logits", can_run_cuda_graph=True, routed_experts_output=None,
                               indexer_topk_output=None)

    step = ds.DecodeStep(SimpleNamespace(model_runner=mr, forward_batch_generation=forward), "decode-backend", None)
    b = ngram_batch()
    assert ds.DecodeStep.serves_ngram(b, 4) and not ds.DecodeStep.serves(b)
    out = step.run_ngram(b, 4, on_publish=published.append)
    assert seen["published_before_forward"] == 1 and published[0] is out.new_seq_lens
    d = seen["batch"]
    assert d.forward_mode == ForwardMode.DECODE and d.input_ids.tolist() == [5, 6, 10]
    assert torch.equal(d.out_cache_loc, mr.req_to_token_pool.req_to_token[b.req_pool_indices, b.seq_lens])
    assert out.speculative_num_draft_tokens == 4
    assert out.next_token_ids.dtype == torch.int32
    assert out.next_token_ids.view(3, 4).tolist() == [[7, 0, 0, 0], [8, 0, 0, 0], [9, 0, 0, 0]]
    assert out.accept_lens.tolist() == [1, 1, 1] and out.new_seq_lens.tolist() == [6, 10, 3]
    nxt = out.next_draft_input
    assert isinstance(nxt, NgramVerifyInput) and nxt.draft_token_num == 4
    assert torch.equal(nxt.accept_tokens, out.next_token_ids) and torch.equal(nxt.accept_lens, out.accept_lens)
    assert torch.equal(nxt.new_seq_lens, out.new_seq_lens)
    # the step after it: a decode step again reads the token just sampled
    b2 = ngram_batch(spec_info=SimpleNamespace(accept_tokens=nxt.accept_tokens, accept_lens=nxt.accept_lens))
    step.run_ngram(b2, 4)
    assert seen["batch"].input_ids.tolist() == [7, 8, 9]


@pytest.mark.parametrize("change", [
    {},
    {"forward_mode": ForwardMode.IDLE},
    {"spec_info": None},
    {"spec_info": SimpleNamespace(accept_tokens=None, accept_lens=torch.ones(3, dtype=torch.int32))},
    {"spec_info": SimpleNamespace(accept_tokens=torch.zeros(12, dtype=torch.int32), accept_lens=None)},
    {"spec_info": SimpleNamespace(accept_tokens=torch.zeros(9, dtype=torch.int32),
                                  accept_lens=torch.ones(3, dtype=torch.int32))},  # rows of another width
    {"return_logprob": True},
    {"has_grammar": True},
], ids=["plain", "idle", "no-draft-input", "no-tokens", "no-lens", "other-width", "logprob", "grammar"])
def test_which_ngram_batches_decode(change):
    assert ds.DecodeStep.serves_ngram(ngram_batch(**change), 4) == (change == {})


def test_backend_restored_when_the_forward_fails(monkeypatch):
    monkeypatch.setattr("sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func", cache_locs)
    mr = Runner()
    monkeypatch.setattr("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
                        lambda batch, model_runner, return_hidden_states_before_norm: SimpleNamespace(tag="fb", bs=3))

    def forward(**kw):
        raise RuntimeError("out of memory")

    step = ds.DecodeStep(SimpleNamespace(model_runner=mr, forward_batch_generation=forward), "decode-backend", None)
    with pytest.raises(RuntimeError):
        step.run(spec_batch())
    assert (mr.attn_backend, mr.decode_cuda_graph_runner) == ("verify-backend", "verify-graphs")


@pytest.mark.parametrize("change", [
    {},
    {"forward_mode": ForwardMode.IDLE},
    {"spec_info": None},
    {"spec_info": SimpleNamespace(bonus_tokens=None)},
    {"return_logprob": True},
    {"return_hidden_states": True},
    {"has_grammar": True},
    {"sampling_info": SimpleNamespace(has_custom_logit_processor=True,
                                      penalizer_orchestrator=SimpleNamespace(is_required=False))},
    {"sampling_info": SimpleNamespace(has_custom_logit_processor=False,
                                      penalizer_orchestrator=SimpleNamespace(is_required=True))},
    {"multimodal_inputs": [None, object(), None]},
], ids=["plain", "idle", "no-draft-input", "no-bonus", "logprob", "hidden", "grammar", "custom-logits", "penalty",
        "multimodal"])
def test_which_batches_decode(change):
    assert ds.DecodeStep.serves(spec_batch(**change)) == (change == {})


def test_mrope_positions_on_the_device_as_sglang_builds_them(monkeypatch):
    """The decode step's M-RoPE positions of a text-only batch equal SGLang's own (built on the host from
    ``seq_lens_cpu``), and need no host lengths: SGLang's overlap scheduler gives a speculative batch none."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    monkeypatch.setattr("sglang.srt.model_executor.forward_batch_info.get_exec",
                        lambda: SimpleNamespace(deterministic=SimpleNamespace(rl_on_policy_target=None)))
    cls = ds.forward_batch_class()
    seq = torch.tensor([6, 10, 3])
    batch = SimpleNamespace(multimodal_inputs=[None, None, None])

    def fb(seq_lens_cpu):
        f = object.__new__(cls)
        f.forward_mode, f.seq_lens, f.seq_lens_cpu = ForwardMode.DECODE, seq, seq_lens_cpu
        f.positions = (seq - 1).to(torch.int32)
        return f

    ours = fb(None)
    ours._compute_mrope_positions(None, batch)
    theirs = fb(seq.clone())
    ForwardBatch._compute_mrope_positions(theirs, SimpleNamespace(device="cpu"), batch)
    theirs = theirs.mrope_positions.to(ours.mrope_positions.device)
    assert ours.mrope_positions.dtype == theirs.dtype and torch.equal(ours.mrope_positions, theirs)
    with pytest.raises(AttributeError):  # what SGLang's own does without host lengths
        ForwardBatch._compute_mrope_positions(fb(None), SimpleNamespace(device="cpu"), batch)


def test_spec_algorithm_restored_after_capture():
    mr = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE)
    with pytest.raises(ValueError):
        with ds._non_speculative(mr):
            assert mr.spec_algorithm == SpeculativeAlgorithm.NONE
            raise ValueError
    assert mr.spec_algorithm == SpeculativeAlgorithm.EAGLE


def worker(monkeypatch, decode_step):
    import sglang.srt.speculative.eagle_worker_v2 as ew
    from lumotree.sglang.worker import StepLedger, worker_class

    w = object.__new__(worker_class())
    w.calls = []

    def apply_runtime_state(state):
        w.speculative_num_steps = state

    def sglang_step(self, batch, *args, **kwargs):  # SGLang's loop: it asks the worker for the tree size too
        self.activate_step_by_batch(batch.seq_lens.shape[0])
        self.calls.append(("verify", self.speculative_num_steps))
        return "verify-result"

    monkeypatch.setattr(ew.EAGLEWorkerV2, "forward_batch_generation", sglang_step)
    w.apply_runtime_state = apply_runtime_state
    w.speculative_num_steps = 3
    w._tree_states = {0: 0, 3: 3}
    w._ledger = StepLedger(None, first=3)
    w._step_chosen = False
    w._decode_step = decode_step
    w._stub_skipped_draft_extend = lambda batch, out: w.calls.append(("stub", out))
    return w


@pytest.mark.parametrize("plain", [True, False], ids=["plain-batch", "logprob-batch"])
def test_worker_serves_no_draft_steps_as_decode_steps(monkeypatch, plain):
    class Step:
        serves = staticmethod(ds.DecodeStep.serves)

        def run(self, batch, on_publish=None, on_slots=None, zero_kv=None):
            on_publish(batch.seq_lens + 1)
            return SimpleNamespace(new_seq_lens=batch.seq_lens + 1)

    w = worker(monkeypatch, Step())
    w.tree_policy = w._ledger.policy = TreeSizePolicy([0])  # pinned to no draft
    published = []
    out = w.forward_batch_generation(spec_batch(return_logprob=not plain), on_publish=published.append)
    assert len(w._ledger.pending) == 1  # one choice per step, though SGLang's loop asks again
    if plain:
        assert w.calls == [("stub", out)] and published[0].tolist() == [6, 10, 3]
    else:  # the one-node verify serves what a decode step does not
        assert out == "verify-result" and w.calls == [("verify", 0)] and not published
    w.tree_policy = w._ledger.policy = TreeSizePolicy([3])  # a drafted step never decodes
    w.calls.clear()
    assert w.forward_batch_generation(spec_batch()) == "verify-result" and w.calls == [("verify", 3)]
    assert len(w._ledger.pending) == 2


def test_lumotree_prefill_publishes_its_lengths_before_sglang_s_forward(monkeypatch):
    """The EAGLE V2 loop publishes a prefill's lengths after its target forward; LUMOTREE's worker publishes them
    before it (they are the batch's input lengths) and SGLang's loop gets no callback."""
    import sglang.srt.speculative.eagle_worker_v2 as ew

    monkeypatch.setattr("lumotree.sglang.finish.admit_batch", lambda batch: None)
    w = worker(monkeypatch, None)
    events = []

    def sglang_step(self, batch, on_publish=None, **kwargs):
        events.append(("forward", on_publish))
        return "prefill-result"

    monkeypatch.setattr(ew.EAGLEWorkerV2, "forward_batch_generation", sglang_step)
    b = spec_batch()
    b.forward_mode = ForwardMode.EXTEND
    assert w.forward_batch_generation(b, on_publish=lambda lens: events.append(("publish", lens.tolist()))) == \
        "prefill-result"
    assert events == [("publish", b.seq_lens.tolist()), ("forward", None)]


def test_warm_prep_launches_the_served_variant_once_on_scratch_tensors(monkeypatch):
    """Start-up: the preparation kernel compiled in the variant serving launches (the request map's dtype, int64 rows
    and lengths, the first buffer pair's dtypes) by one launch on one-row scratch tensors -- not on the pool's own;
    a no-op where the request map is not on a device that compiles."""
    from sglang.srt.model_executor import forward_batch_info

    calls, positions = [], []
    monkeypatch.setattr(ds.ops, "decode_prep", lambda rt, rows, seq, kv: calls.append((rt, rows, seq, kv))
                        or (rows.clone(), seq + 1))
    monkeypatch.setattr(forward_batch_info, "clamp_position", positions.append)  # the one init_new calls
    mr = Runner()
    step = ds.DecodeStep(SimpleNamespace(model_runner=mr), "b", "g")
    k, v = torch.ones(50, 2, 4, dtype=torch.bfloat16), torch.ones(50, 3, dtype=torch.float16)
    step.warm_prep([(k, v), (k, v)])
    assert calls == [] and positions == []  # the request map is on the CPU
    step.warm_prep([(k, v), (k, v)], devices=("cpu",))
    (lens,) = positions  # SGLang's decode position kernel, on the lengths the preparation returned: int64
    assert lens.dtype == torch.int64 and lens.tolist() == [1]
    (rt, rows, seq, kv), = calls
    assert rt.shape == (1, 16) and rt.dtype == mr.req_to_token_pool.req_to_token.dtype and not rt.any()
    assert rows.dtype == seq.dtype == torch.int64 and rows.tolist() == seq.tolist() == [0]
    assert len(kv) == 1 and kv[0][0].shape == (1, 2, 4) and kv[0][0].dtype == torch.bfloat16
    assert kv[0][1].shape == (1, 3) and kv[0][1].dtype == torch.float16 and kv[0][0].data_ptr() != k.data_ptr()


def test_warm_positions_times_the_call_and_survives_a_failure(caplog):
    import logging

    seen = []
    assert ds.warm_positions(torch.ones(1, dtype=torch.int64), clamp=seen.append) >= 0 and len(seen) == 1

    def broken(lens):
        raise RuntimeError("nvcc not found")

    with caplog.at_level(logging.WARNING, logger=ds.logger.name):
        assert ds.warm_positions(torch.ones(1, dtype=torch.int64), clamp=broken) is None
    assert "could not be built ahead (RuntimeError: nvcc not found)" in caplog.text


def test_the_decode_graphs_compile_sglangs_compiled_functions_afresh(monkeypatch):
    """While the decode graphs are captured an SGLang function compiled with automatic dynamic shapes is a fresh
    compile of itself: its first shape compiles static although the original has gone dynamic (the verify graphs
    called it first); the original is back after, and a function that is not compiled is left alone."""
    import functools
    import sys
    import types

    kinds = []

    def backend(gm, example_inputs):  # which variant dynamo compiled: a dynamic one takes the sizes as SymInts
        kind = "dynamic" if any(isinstance(a, torch.SymInt) for a in example_inputs) else "static"

        def run(*args):
            kinds.append(kind)
            return gm(*args)
        return run

    def sum_reduce(x, out, scale):
        torch.sum(x, dim=1, out=out)
        out.mul_(scale)

    def call(mod, n):
        x = torch.randn(n, 10, 8)
        out = torch.empty(n, 8)
        mod.reduce(x, out, 2.0)
        assert torch.allclose(out, x.sum(1) * 2.0)
        return kinds[-1]

    torch._dynamo.reset()
    mod = types.ModuleType("lumotree_test_compiled")
    mod.reduce = torch.compile(sum_reduce, backend=backend)
    mod.plain = sum_reduce
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert [call(mod, n) for n in (16, 8, 32)] == ["static", "dynamic", "dynamic"]  # the verify graphs' calls
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    original = mod.reduce
    with ds.fresh_compiled(((mod.__name__, "reduce"), (mod.__name__, "plain"), ("lumotree_no_such_module", "f"))) \
            as copies:
        assert mod.reduce is not original and copies == [mod.reduce] and mod.plain is sum_reduce
        assert [call(mod, n) for n in (32, 24, 32)] == ["static", "dynamic", "dynamic"]  # as no speculation's graphs
    assert mod.reduce is original and call(mod, 32) == "dynamic"
    assert ds.fresh_copy(sum_reduce) is None
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

    assert (fused_moe.__name__, "moe_sum_reduce_torch_compile") in ds.DECODE_COMPILED
    assert ds.fresh_copy(fused_moe.moe_sum_reduce_torch_compile) is not None  # SGLang's is a compiled function


def test_the_decode_graphs_are_captured_with_the_fresh_compiles(monkeypatch):
    """``DecodeStep.build_target`` captures its decode graphs while SGLang's compiled MoE sum-reduce is a fresh compile
    of itself, keeps the copy with the graph runner (its graphs hold the copy's kernels) and puts SGLang's back."""
    import contextlib

    import sglang.srt.speculative.eagle_worker_v2 as ew
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

    original = fused_moe.moe_sum_reduce_torch_compile
    seen = {}

    class GraphRunner:
        capture_bs = [1, 2]

        def __init__(self, mr, attn_backend, speculative_num_steps, speculative_num_draft_tokens):
            seen["during"] = fused_moe.moe_sum_reduce_torch_compile
            seen["spec"] = mr.spec_algorithm

    mr = SimpleNamespace(spec_algorithm="EAGLE", server_args=SimpleNamespace(),
                         _decode_cuda_graph_runner_cls=lambda: GraphRunner,
                         req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(2, 8, dtype=torch.int32)))
    monkeypatch.setattr(ew, "check_cuda_graph_backend", lambda phase, backend: False)
    monkeypatch.setattr(ds, "new_attention_backend", lambda model_runner: "decode-backend")
    step = ds.DecodeStep.build_target(SimpleNamespace(model_runner=mr), None, contextlib.nullcontext())
    assert seen["during"] is not original and seen["during"] in step.graph_runner.lumotree_compiled
    assert fused_moe.moe_sum_reduce_torch_compile is original and mr.spec_algorithm == "EAGLE"
    assert str(seen["spec"]).endswith("NONE")  # captured as a non-speculative runner's decode graphs


def test_a_step_after_which_every_request_has_ended_serves_no_draft_without_a_decision(monkeypatch):
    """A decode step whose requests all end with it (the last of a batch that ends together; under the overlap
    scheduler also the extra step after it) keeps no draft's token and measures nothing: the worker serves it no
    draft and the policy is not asked (a probe started there held no running request). Under the overlap scheduler
    the step launched before -- a decode step of the same requests -- adds a token the host does not count yet."""
    class Step:
        serves = staticmethod(ds.DecodeStep.serves)

        def run(self, batch, on_publish=None, on_slots=None, zero_kv=None):
            return SimpleNamespace(new_seq_lens=batch.seq_lens + 1)

    monkeypatch.setattr("lumotree.sglang.finish.admit_batch", lambda batch: None)
    w = worker(monkeypatch, Step())
    w.tree_policy = w._ledger.policy = TreeSizePolicy([0, 3])
    decided = []
    w.tree_policy.choose = lambda batch: decided.append(batch) or 3

    def req(out, max_new=6):
        return SimpleNamespace(output_ids=[1] * out, finished=lambda: False,
                               sampling_params=SimpleNamespace(max_new_tokens=max_new), req_pool_idx=0)

    def step(outs, overlap=True, **kw):
        w.calls.clear()
        out = w.forward_batch_generation(spec_batch(reqs=[req(o, **kw) for o in outs], enable_overlap=overlap))
        return "verify" if out == "verify-result" else "decode"

    assert step([4, 3]) == "verify" and len(decided) == 1  # 4 + 1: the 5th of 6 (nothing in flight before it)
    assert step([4, 4]) == "decode" and len(decided) == 1  # 4 + 1 in flight + 1: both end; no decision
    assert w._ledger.pending[-1][0] == 0 and not w.tree_policy.warm
    assert step([4, 3]) == "verify" and len(decided) == 2  # the second request has a token to go after it
    assert step([5, 5], overlap=False) == "decode" and len(decided) == 2  # in step: 5 + 1
    assert step([4, 4], overlap=False) == "verify" and len(decided) == 3  # no token in flight: 4 + 1 < 6
    w._ledger.interrupt()  # a prefill launched in between: the requests' last step is processed
    assert step([4, 4]) == "verify" and len(decided) == 4
    assert step([3, 3], max_new=None) == "verify" and len(decided) == 5  # no length limit: not certain
    w.tree_policy = w._ledger.policy = TreeSizePolicy([3])  # no draft is no candidate: the tree is served
    assert step([5, 5]) == "verify"
