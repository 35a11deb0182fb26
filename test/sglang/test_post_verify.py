"""LUMOTREE_SUFFIX's drafted step with its post-verify work through :mod:`lumotree.sglang.post_verify` against
SGLang 0.5.17's own ``NGRAMWorker.forward_batch_generation`` on the same batch (CPU: the eager path, which is what a
CUDA graph captures; the graph's replay is tested on the GPU, ``test_served_post_verify_graph_gpu.py``).

The state commit and the KV move are SGLang functions on device pools: both steps call them through the same
recorders here, and the test compares what they were handed."""
import functools
import importlib
import random
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("sglang")
import sglang.srt.speculative.eagle_utils as eu  # noqa: E402
import sglang.srt.speculative.spec_utils as su  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from lumotree.sglang import post_verify  # noqa: E402
from lumotree.sglang.finish import FinishedRows  # noqa: E402
from lumotree.sglang.patches.eagle_sample_end import eagle_sample_end  # noqa: E402
from lumotree.sglang.select import verify_tree_greedy  # noqa: E402
from lumotree.sglang.suffix import batch_tree_arrays  # noqa: E402

VOCAB = 12
NGRAM = "sglang.srt.speculative.ngram_worker"
nw = None  # SGLang's NGRAM worker module (the fixture below)


@pytest.fixture(autouse=True)
def ngram_module(monkeypatch):
    """SGLang's ``ngram_worker`` module, imported with a stand-in for the one CUDA op it imports at module level
    (``sgl_kernel.speculative``: this CPU machine's sgl_kernel has no build), and dropped again after the test."""
    global nw
    if NGRAM not in sys.modules:
        stub = types.ModuleType("sgl_kernel.speculative")
        stub.reconstruct_indices_from_tree_mask = None  # the draft preparation is the test's own
        monkeypatch.setitem(sys.modules, "sgl_kernel.speculative", stub)
        monkeypatch.setitem(sys.modules, NGRAM, importlib.import_module(NGRAM))
    nw = sys.modules[NGRAM]
    yield nw


def random_tree(rng, n):
    """A draft tree of ``n`` nodes (parents numbered before children) and its tokens."""
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return [rng.randrange(VOCAB) for _ in range(n)], parents


class Recorder:
    def __init__(self):
        self.calls = []

    def commit(self, target_worker, batch, accept_lens, accept_index, draft_token_num):
        self.calls.append(("commit", batch.seq_lens.clone(), accept_lens.clone(), accept_index.clone(), draft_token_num))

    def move(self, batch, accept_index, num_correct, allocator):
        self.calls.append(("move", batch.out_cache_loc.clone(), accept_index.clone(), num_correct.clone()))


def requests(rng, bs, finished):
    """``bs`` requests' lengths, request-pool rows and pool; ``finished``: LumoTree's finish table with a stop token at
    every row and a length limit two tokens on at row 0."""
    seq_lens = torch.tensor([rng.randrange(20, 40) for _ in range(bs)], dtype=torch.int64)
    rows = torch.randperm(16)[:bs].to(torch.int64)
    pool = SimpleNamespace(req_to_token=torch.zeros(16, 64, dtype=torch.int32))
    if finished:
        table = FinishedRows.of(pool)
        for b in range(bs):  # a stop token at every row, a length limit at one
            table.stop[rows[b], 0] = rng.randrange(VOCAB)
            table.max_len[rows[b]] = int(seq_lens[b]) + (2 if b == 0 else 100)
            table.ruled[rows[b]] = True
    return seq_lens, rows, pool


def make_case(seed, bs, n, finished):
    """A fake NGRAM worker and a decode batch of ``bs`` requests with ``n``-node drafts; the target's logits agree
    with a random child's token at most nodes (runs of several accepted drafts)."""
    rng = random.Random(seed)
    trees = [random_tree(rng, n) for _ in range(bs)]
    tokens, mask = batch_tree_arrays(trees, n)
    next_token, next_sibling = nw._derive_tree_links(mask.reshape(bs, n, n), bs, n)
    logits = torch.randn(bs * n, VOCAB)
    for b, (toks, parents) in enumerate(trees):
        for i in range(n):
            kids = [j for j in range(n) if parents[j] == i]
            if kids and rng.random() < 0.8:
                logits[b * n + i, toks[rng.choice(kids)]] += 10.0
    seq_lens, rows, pool = requests(rng, bs, finished)

    def prepare(batch):
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.out_cache_loc = torch.arange(100, 100 + bs * n, dtype=torch.int64)
        batch.spec_info = nw.NgramVerifyInput(
            draft_token=torch.from_numpy(tokens), custom_mask=torch.from_numpy(mask), positions=None,
            retrieve_index=torch.arange(bs * n, dtype=torch.int64).reshape(bs, n),
            retrieve_next_token=next_token, retrieve_next_sibling=next_sibling, draft_token_num=n)

    def make():
        reqs = [SimpleNamespace(rid=f"r{b}") for b in range(bs)]
        si = SimpleNamespace(is_all_greedy=True, acc_additive_penalties=None, acc_scaling_penalties=None,
                             logit_bias=None, has_custom_logit_processor=False, penalizer_orchestrator=None)
        batch = SimpleNamespace(reqs=reqs, seq_lens=seq_lens.clone(), req_pool_indices=rows.clone(), device="cpu",
                                forward_mode=ForwardMode.DECODE, sampling_info=si, has_grammar=False,
                                return_logprob=False, return_hidden_states=False, mamba_track_indices=None,
                                req_to_token_pool=pool, spec_info=SimpleNamespace(), grammar_needs_sync=lambda: False)
        erased = []
        worker = SimpleNamespace(
            device="cpu", draft_token_num=n, speculative_num_draft_tokens=n, enable_overlap=True,
            _prepare_for_speculative_decoding=prepare, _update_ngram_corpus=lambda b: None,
            _prev_decode_rids={"gone", "r0"}, ngram_corpus=SimpleNamespace(erase_match_state=erased.extend),
            token_to_kv_pool_allocator="allocator", erased=erased,
            target_worker=SimpleNamespace(forward_batch_generation=lambda b, is_verify: SimpleNamespace(
                logits_output=SimpleNamespace(next_token_logits=logits.clone()), can_run_cuda_graph=False)))
        return worker, batch
    return make


@pytest.fixture
def sglang_calls(monkeypatch, ngram_module):
    rec = Recorder()
    for mod in (nw, su):  # SGLang's step calls them by the names ngram_worker imported, post_verify through spec_utils
        monkeypatch.setattr(mod, "commit_mamba_states_after_verify", rec.commit)
        monkeypatch.setattr(mod, "move_accept_tokens_to_target_kvcache", rec.move)
        monkeypatch.setattr(mod, "record_stream_for_v2_verify", lambda *a: None)
    monkeypatch.setattr(eu, "verify_tree_greedy_func", verify_tree_greedy)  # LumoTree's hook on a LUMOTREE server
    monkeypatch.setattr(nw, "eagle_sample", functools.partial(eagle_sample_end, eu.eagle_sample))  # and its clamp
    return rec


@pytest.mark.parametrize("seed,bs,n,finished", [(0, 1, 8, False), (1, 4, 8, True), (2, 8, 16, True),
                                                 (3, 3, 32, False)])
def test_the_post_verify_step_is_sglang_s_ngram_step(sglang_calls, seed, bs, n, finished):
    make = make_case(seed, bs, n, finished)
    published = [[], []]
    results, calls, erased = [], [], []
    for k, run in enumerate((
            lambda w, b: nw.NGRAMWorker.forward_batch_generation(w, b, on_publish=published[0].append),
            lambda w, b: post_verify.ngram_verify_step(w, post_verify.PostVerifyGraphs("cpu"), b,
                                                       on_publish=published[1].append))):
        worker, batch = make()
        sglang_calls.calls.clear()
        results.append(run(worker, batch))
        calls.append(list(sglang_calls.calls))
        erased.append(sorted(worker.erased))
        assert batch.forward_mode == ForwardMode.DECODE
    ref, got = results
    for name in ("next_token_ids", "accept_lens", "new_seq_lens"):
        assert torch.equal(getattr(ref, name), getattr(got, name)), name
    for name in ("accept_tokens", "accept_lens", "new_seq_lens", "draft_token_num"):
        a, b = getattr(ref.next_draft_input, name), getattr(got.next_draft_input, name)
        assert (torch.equal(a, b) if torch.is_tensor(a) else a == b), name
    assert ref.speculative_num_draft_tokens == got.speculative_num_draft_tokens
    assert torch.equal(published[0][0], published[1][0])
    assert erased[0] == erased[1] == ["gone"]
    assert [c[0] for c in calls[0]] == [c[0] for c in calls[1]] == ["commit", "move"]
    for a, b in zip(calls[0], calls[1]):
        for x, y in zip(a[1:], b[1:]):
            assert (torch.equal(x, y) if torch.is_tensor(x) else x == y), a[0]
    lens = ref.accept_lens
    assert lens.max() > 1  # drafts were accepted
    if finished:
        assert int(lens[0]) <= 2  # row 0's length limit cut its run


def test_only_plain_greedy_batches_take_the_post_verify_path():
    def batch(**kw):
        si = dict(is_all_greedy=True, acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None,
                  has_custom_logit_processor=False, penalizer_orchestrator=None)
        b = dict(forward_mode=ForwardMode.DECODE, spec_info=object(), return_logprob=False,
                 return_hidden_states=False, has_grammar=False)
        for k, v in kw.items():
            (si if k in si else b)[k] = v
        return SimpleNamespace(sampling_info=SimpleNamespace(**si), **b)

    serves = post_verify.PostVerifyGraphs.serves
    assert serves(batch())
    for bad in (dict(is_all_greedy=False), dict(return_logprob=True), dict(has_grammar=True),
                dict(logit_bias=torch.zeros(1, VOCAB)), dict(acc_additive_penalties=torch.zeros(1, VOCAB)),
                dict(has_custom_logit_processor=True), dict(return_hidden_states=True)):
        assert not serves(batch(**bad)), bad


def test_without_a_cuda_graph_verify_every_step_runs_eagerly_and_nothing_is_captured(sglang_calls):
    make = make_case(5, 2, 8, True)
    graphs = post_verify.PostVerifyGraphs("cpu")
    for _ in range(3):
        worker, batch = make()
        post_verify.ngram_verify_step(worker, graphs, batch)
    assert graphs.stats == dict(replays=0, eager=3, captures=0, stale=0) and not graphs.graphs


def test_the_graph_key_s_memory_is_checked_before_a_replay():
    """A captured graph is replayed only while everything it reads besides its inputs is where it was captured."""
    make = make_case(6, 2, 8, False)
    worker, batch = make()
    worker.target_worker.model_runner = SimpleNamespace(attn_backend=SimpleNamespace())
    graphs = post_verify.PostVerifyGraphs("cpu")
    nw_prepare = worker._prepare_for_speculative_decoding
    nw_prepare(batch)
    logits = torch.zeros(2 * 8, VOCAB)
    p = graphs._pointers(worker.target_worker, batch, batch.spec_info, logits)
    assert p == graphs._pointers(worker.target_worker, batch, batch.spec_info, logits)
    assert p != graphs._pointers(worker.target_worker, batch, batch.spec_info, logits.clone())
    assert np.array_equal(batch.spec_info.draft_token.numpy().shape, (16,))


def test_a_size_whose_memory_moved_under_its_graph_runs_eagerly_from_then_on(sglang_calls, monkeypatch):
    """A captured graph (here a stand-in that counts its replays) is replayed while what it reads besides its inputs
    is where it was captured; once that moved, the size runs eagerly and is never captured again."""
    make = make_case(7, 2, 8, False)
    graphs = post_verify.PostVerifyGraphs("cpu")
    where = ["here"]
    monkeypatch.setattr(graphs, "_pointers", lambda *a: (where[0],))
    captures, replays = [], []
    monkeypatch.setattr(graphs, "_capture", lambda key, *a: captures.append(key) or graphs.graphs.__setitem__(
        key, post_verify._Graph(SimpleNamespace(replay=lambda: replays.append(1)), None, None, None, ("here",))))
    monkeypatch.setattr(graphs, "_replay", lambda g, b, vi=None: (g.graph.replay(), "replayed")[1])

    def step():
        worker, batch = make()
        worker.target_worker.model_runner = SimpleNamespace(attn_backend=None)
        worker.target_worker.forward_batch_generation = lambda b, is_verify: SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=torch.zeros(16, VOCAB)), can_run_cuda_graph=True)
        worker._prepare_for_speculative_decoding(batch)
        return graphs.run(worker.target_worker, batch, batch.spec_info, torch.zeros(16, VOCAB), "allocator", True)

    n = graphs.CAPTURE_AT
    outs = [step() for _ in range(n + 1)]  # eager, ..., eager + capture, replay
    assert len(captures) == 1 and replays == [1] and outs[n] == "replayed" and "replayed" not in outs[:n]
    where[0] = "moved"
    outs = [step() for _ in range(3)]  # eager from now on
    assert "replayed" not in outs and len(captures) == 1 and replays == [1] and not graphs.graphs
    assert graphs.stats["stale"] == 1 and graphs.stats["eager"] == n + 3


def test_a_key_is_captured_at_its_capture_at_th_step_whatever_runs_between(sglang_calls, monkeypatch):
    """A (tree size, batch size) key that runs now and then -- an adaptive policy's probes where drafts miss -- stays
    eager until it has run ``CAPTURE_AT`` times; other keys' steps between its runs neither advance nor reset its count,
    and each key is captured once, at its own ``CAPTURE_AT``-th step."""
    graphs = post_verify.PostVerifyGraphs("cpu")
    monkeypatch.setattr(graphs, "_pointers", lambda *a: ("here",))
    captures = []
    monkeypatch.setattr(graphs, "_capture", lambda key, *a: captures.append(key) or graphs.graphs.__setitem__(
        key, post_verify._Graph(SimpleNamespace(replay=lambda: None), None, None, None, ("here",))))
    monkeypatch.setattr(graphs, "_replay", lambda g, b, vi=None: "replayed")
    monkeypatch.setattr(graphs, "_sequence", lambda *a: "eager")
    runner = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=None))

    def step(bs, nodes):
        batch = SimpleNamespace(seq_lens=torch.zeros(bs), mamba_track_indices=None)
        return graphs.run(runner, batch, SimpleNamespace(draft_token_num=nodes), None, "allocator", True)

    n = graphs.CAPTURE_AT
    assert n > 2  # a probe's one or two drafted steps do not capture
    probe = []
    for i in range(n - 1):  # a probe of key (4, 1) between served steps of key (4, 8)
        probe.append(step(1, 4))
        for _ in range(3):
            step(8, 4)
    assert probe == ["eager"] * (n - 1) and captures == [(4, 8, False, id(None))]
    assert step(1, 4) == "eager" and captures[-1] == (4, 1, False, id(None))  # its n-th: eager, then captured
    assert step(1, 4) == "replayed" and step(8, 4) == "replayed" and len(captures) == 2
