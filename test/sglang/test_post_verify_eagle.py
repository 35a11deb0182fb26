"""LUMOTREE's drafted chain step with its post-verify work through :mod:`lumotree.sglang.post_verify`
(:func:`~lumotree.sglang.post_verify.eagle_verify_step`) against SGLang 0.5.17's own ``run_eagle_verify`` on the same
batch (CPU: the eager path, which is what a CUDA graph captures; the replay's input copies and output layout with a
stand-in graph here, the graph itself on the GPU, ``test_served_post_verify_graph_gpu.py``).

The state commit is an SGLang function on device pools: both steps call it through the same recorder here, and the
test compares what it was handed."""
import contextlib
import functools
import os
import random
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
import sglang.srt.speculative.eagle_utils as eu  # noqa: E402
import sglang.srt.speculative.eagle_worker_common as ewc  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from lumotree.sglang import draft_oracle, post_verify  # noqa: E402
from lumotree.sglang.patches.eagle_sample_end import eagle_sample_end  # noqa: E402
from lumotree.sglang.select import verify_tree_greedy  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_post_verify import VOCAB, requests  # noqa: E402  (the requests and their finish table)


def fill_bonus(accept_tokens, accept_lens, bonus_tokens, stride, bs):
    """SGLang's ``fill_bonus_tokens`` (a Triton kernel) in torch: each row's last accepted token."""
    rows = torch.arange(bs)
    bonus_tokens.copy_(accept_tokens.view(bs, stride)[rows, accept_lens.long() - 1].to(bonus_tokens.dtype))


class Recorder:
    def __init__(self):
        self.calls = []

    def commit(self, target_worker, batch, accept_lens, accept_index, draft_token_num):
        self.calls.append((batch.seq_lens.clone(), batch.req_pool_indices.clone(), accept_lens.clone(),
                           accept_index.clone(), draft_token_num))


@pytest.fixture
def sglang_calls(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(ewc, "commit_mamba_states_after_verify", rec.commit)
    monkeypatch.setattr(ewc, "fill_bonus_tokens_func", fill_bonus)
    monkeypatch.setattr(ewc, "eagle_prepare_for_verify", lambda vi, pool, batch, tw: ("verify batch", False))
    monkeypatch.setattr(eu, "verify_tree_greedy_func", verify_tree_greedy)  # LumoTree's hook on a LUMOTREE server
    monkeypatch.setattr(ewc, "eagle_sample", functools.partial(eagle_sample_end, eu.eagle_sample))  # and its clamp
    return rec


def make_case(seed, bs, steps, finished):
    """A fake EAGLE V2 worker and a decode batch of ``bs`` requests drafted as ``steps``-step chains; the target's
    logits follow each chain for a random number of levels (runs of accepted drafts)."""
    rng = random.Random(seed)
    n = steps + 1
    draft = torch.tensor([rng.randrange(VOCAB) for _ in range(bs * n)], dtype=torch.int64)
    logits = torch.randn(bs * n, VOCAB)
    for b in range(bs):
        for i in range(rng.randrange(n)):  # levels whose next draft the target agrees with
            logits[b * n + i, draft[b * n + i + 1]] += 10.0
    nxt = torch.tensor([[i + 1 if i + 1 < n else -1 for i in range(n)]] * bs, dtype=torch.int64)
    seq_lens, rows, pool = requests(rng, bs, finished)

    def make():
        si = SimpleNamespace(is_all_greedy=True, acc_additive_penalties=None, acc_scaling_penalties=None,
                             logit_bias=None, has_custom_logit_processor=False, penalizer_orchestrator=None)
        vi = SimpleNamespace(draft_token=draft.clone(), retrieve_index=torch.arange(bs * n).reshape(bs, n),
                             retrieve_next_token=nxt.clone(), retrieve_next_sibling=torch.full((bs, n), -1),
                             draft_token_num=n, max_tree_depth=n, tree_topk=1, draft_probs=None)
        batch = SimpleNamespace(reqs=[SimpleNamespace(rid=f"r{b}") for b in range(bs)], seq_lens=seq_lens.clone(),
                                req_pool_indices=rows.clone(), device="cpu", forward_mode=ForwardMode.DECODE,
                                sampling_info=si, has_grammar=False, return_logprob=False, return_hidden_states=False,
                                mamba_track_indices=None, req_to_token_pool=pool, spec_info=vi,
                                input_ids=draft.clone(), out_cache_loc=torch.arange(100, 100 + bs * n))
        target = SimpleNamespace(forward_batch_generation=lambda batch, forward_batch, is_verify: SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits.clone()), routed_experts_output=None,
            indexer_topk_output=None))
        worker = SimpleNamespace(
            device="cpu", topk=1, speculative_num_steps=steps, speculative_num_draft_tokens=n, target_worker=target,
            req_to_token_pool=pool, plan_stream=None, plan_stream_ctx=contextlib.nullcontext(),
            token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: SimpleNamespace()))
        return worker, batch
    return make


def sglang_step(worker, batch):
    return ewc.run_eagle_verify(
        batch, target_worker=worker.target_worker, req_to_token_pool=worker.req_to_token_pool,
        token_to_kv_pool_allocator=worker.token_to_kv_pool_allocator, plan_stream=worker.plan_stream,
        plan_stream_ctx=worker.plan_stream_ctx, topk=worker.topk, num_steps=worker.speculative_num_steps,
        num_draft_tokens=worker.speculative_num_draft_tokens, device=worker.device, metadata_ready_pre_pad=False,
        finalize_tree_path=True)


@pytest.mark.parametrize("seed,bs,steps,finished", [(0, 1, 3, False), (1, 4, 3, True), (2, 8, 5, True),
                                                     (3, 3, 1, False)])
def test_the_chain_s_post_verify_step_is_sglang_s_eagle_verify(sglang_calls, seed, bs, steps, finished):
    make = make_case(seed, bs, steps, finished)
    results, calls = [], []
    for run in (sglang_step, lambda w, b: post_verify.eagle_verify_step(w, post_verify.EagleVerifyGraphs("cpu"), b)):
        worker, batch = make()
        assert post_verify.EagleVerifyGraphs.serves_eagle(worker, batch)
        sglang_calls.calls.clear()
        results.append(run(worker, batch))
        calls.append(list(sglang_calls.calls))
    ref, got = results
    for name in ("next_token_ids", "accept_lens", "new_seq_lens"):
        assert torch.equal(getattr(ref, name), getattr(got, name)), name
        assert getattr(ref, name).dtype == getattr(got, name).dtype, name
    assert torch.equal(ref.next_draft_input.bonus_tokens, got.next_draft_input.bonus_tokens)
    assert ref.speculative_num_draft_tokens == got.speculative_num_draft_tokens
    assert ref.can_run_cuda_graph == got.can_run_cuda_graph
    assert len(calls[0]) == len(calls[1]) == 1
    for x, y in zip(calls[0][0], calls[1][0]):
        assert (torch.equal(x, y) if torch.is_tensor(x) else x == y)
    lens = ref.accept_lens
    assert lens.max() > 1 or bs == 1  # drafts were accepted
    if finished:
        assert int(lens[0]) <= 2  # row 0's length limit cut its run


def test_only_plain_greedy_chains_take_the_graph_path():
    worker, batch = make_case(4, 2, 3, False)()
    serves = post_verify.EagleVerifyGraphs.serves_eagle
    assert serves(worker, batch)
    assert not serves(SimpleNamespace(**{**vars(worker), "topk": 2}), batch)  # a tree: SGLang compacts its path
    kv = SimpleNamespace(clear_unaccepted_c128_draft_states=lambda *a: None)
    assert not serves(SimpleNamespace(**{**vars(worker), "token_to_kv_pool_allocator": SimpleNamespace(
        get_kvcache=lambda: kv)}), batch)
    batch.sampling_info.is_all_greedy = False
    assert not serves(worker, batch)


def test_a_replay_copies_the_step_s_inputs_and_returns_the_outputs_in_their_shapes():
    """:meth:`EagleVerifyGraphs._replay` with a stand-in graph: the batch's lengths and rows and the draft's tree go
    into the graph's buffers before the replay; the packed outputs come back as (predict, lens, index, bonus)."""
    make = make_case(5, 2, 3, False)
    worker, batch = make()
    graphs = post_verify.EagleVerifyGraphs("cpu")
    vi = batch.spec_info
    ins = {k: (t.clone().zero_() if t is not None else None) for k, t in graphs._inputs_of(batch, vi).items()}
    assert set(ins) == {"seq_lens", "req_pool_indices", "mamba_track_indices", "draft_token", "retrieve_index",
                        "retrieve_next_token", "retrieve_next_sibling"}
    packed = torch.zeros(8 + 2 + 8 + 2, dtype=torch.int32)

    def replay():  # what the captured sequence would read: its buffers
        packed.copy_(torch.cat([ins["draft_token"], ins["seq_lens"], ins["retrieve_index"].flatten(),
                                ins["req_pool_indices"]]).to(torch.int32))

    g = post_verify._Graph(SimpleNamespace(replay=replay), ins, packed, [(8,), (2,), (2, 4), (2,)], ())
    predict, lens, index, bonus = graphs._replay(g, batch, vi)
    assert torch.equal(predict, vi.draft_token.to(torch.int32)) and torch.equal(lens, batch.seq_lens.to(torch.int32))
    assert index.shape == (2, 4) and torch.equal(index, vi.retrieve_index.to(torch.int32))
    assert torch.equal(bonus, batch.req_pool_indices.to(torch.int32))
    assert graphs.stats["replays"] == 1
    assert predict.data_ptr() != packed.data_ptr()  # a copy: the next replay does not overwrite this step's outputs


def test_the_capture_views_carry_the_graph_s_buffers_and_the_step_s_other_fields():
    worker, batch = make_case(6, 2, 3, False)()
    graphs = post_verify.EagleVerifyGraphs("cpu")
    vi = batch.spec_info
    ins = {k: (t.clone() if t is not None else None) for k, t in graphs._inputs_of(batch, vi).items()}
    view, spec = graphs._views(batch, vi, ins)
    assert view.seq_lens is ins["seq_lens"] and view.req_pool_indices is ins["req_pool_indices"]
    assert spec.draft_token is ins["draft_token"] and spec.retrieve_next_token is ins["retrieve_next_token"]
    assert view.sampling_info is batch.sampling_info and spec.max_tree_depth == vi.max_tree_depth
    assert batch.seq_lens is not ins["seq_lens"] and vi.draft_token is not ins["draft_token"]  # the step's untouched


def test_the_oracle_forces_once_before_the_graph(monkeypatch):
    """The benchmark's draft oracle forces the verify's logits before :func:`eagle_verify_step`'s graph (a plan is a
    new tensor each step) and the ``eagle_sample`` hook inside it then forces nothing more."""
    oracle = SimpleNamespace(plan=(torch.tensor([[0, 1, -1]]), torch.tensor([[5, 7, 0]])))
    monkeypatch.setattr(draft_oracle, "_oracle_for", lambda batch: oracle)
    vi = SimpleNamespace(draft_token_num=3)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE)
    out = SimpleNamespace(next_token_logits=torch.zeros(3, VOCAB))
    draft_oracle.force_planned(vi, batch, out)
    assert oracle.plan is None
    expect = torch.zeros(3, VOCAB)
    expect[0, 5] = expect[1, 7] = draft_oracle.FORCE_BOOST
    assert torch.equal(out.next_token_logits, expect)
    seen = []
    draft_oracle.sample(lambda *a: seen.append(a[2].next_token_logits.clone()), vi, batch, out)
    assert torch.equal(seen[0], expect)  # not forced twice


def test_the_worker_verifies_through_the_graphs_where_they_serve(monkeypatch):
    """LUMOTREE's worker: a plain greedy chain batch of the configured tree size through
    :func:`~lumotree.sglang.post_verify.eagle_verify_step`; a grammar barrier, another tree size, no graphs (a server
    without CUDA graphs) or an unplain batch through SGLang's ``verify``."""
    import sglang.srt.speculative.eagle_worker_v2 as ew

    from lumotree.sglang.worker import worker_class

    cls = worker_class()
    monkeypatch.setattr(post_verify, "eagle_verify_step", lambda w, g, b: "graphs")
    monkeypatch.setattr(ew.EAGLEWorkerV2, "verify", lambda self, batch, grammar_barrier=None: "sglang")
    fake, batch = make_case(7, 2, 3, False)()

    def worker(**kw):  # the worker class's instance without SGLang's construction
        w = cls.__new__(cls)
        w.__dict__.update({**vars(fake), "_post_verify": post_verify.EagleVerifyGraphs("cpu"), **kw})
        return w

    assert worker().verify(batch) == "graphs"
    assert worker().verify(batch, grammar_barrier=object()) == "sglang"
    assert worker(speculative_num_draft_tokens=2).verify(batch) == "sglang"
    assert worker(_post_verify=None).verify(batch) == "sglang"
    batch.return_logprob = True
    assert worker().verify(batch) == "sglang"


def test_a_chain_graph_checks_the_logits_memory_but_not_the_draft_s_which_it_copies_in():
    worker, batch = make_case(8, 2, 3, False)()
    worker.target_worker.model_runner = SimpleNamespace(attn_backend=SimpleNamespace())
    graphs = post_verify.EagleVerifyGraphs("cpu")
    vi, out = batch.spec_info, SimpleNamespace(next_token_logits=torch.zeros(8, VOCAB))
    p = graphs._pointers(worker.target_worker, batch, vi, out)
    vi.draft_token, vi.retrieve_next_token = vi.draft_token.clone(), vi.retrieve_next_token.clone()  # a new draft
    assert graphs._pointers(worker.target_worker, batch, vi, out) == p
    out.next_token_logits = out.next_token_logits.clone()
    assert graphs._pointers(worker.target_worker, batch, vi, out) != p
