"""Where a request ends, on the device (``lumotree.sglang.finish``), on CPU, against SGLang's own
``Req.update_finish_state`` over random requests and speculative steps: the accepted-run clamp (the run
ends at the token the host finishes on, so nothing is trimmed; runs of running requests unchanged) and
its hook into ``eagle_sample``; the overlap scheduler's marks (a row marked exactly at the step the host
finishes the request, never a running one), the state-index mask, the host fallback, the worker's
bookkeeping and the backend's masking, and SGLang's argument resolution (overlap with ``no_buffer``).
Served behaviour (cached states equal to a fresh prefill) is ``benchmark/serving/cache_consistency.py``
on the GPU."""
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
from sglang.srt.managers.schedule_batch import (  # noqa: E402
    FINISH_ABORT, FINISH_LENGTH, FINISH_MATCHED_STR, FINISH_MATCHED_TOKEN, Req)
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from lumotree.sglang import finish  # noqa: E402
from lumotree.sglang.finish import FinishedRows, trusts_device_finish  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CKPT = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
VOCAB = 12


def make_req(rng, i):
    sp = SamplingParams(max_new_tokens=rng.randint(1, 12), stop_token_ids=rng.sample(range(VOCAB), rng.randint(0, 2)),
                        ignore_eos=rng.random() < 0.2)
    sp.normalize(None)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))]
    return Req(f"r{i}", "", prompt, sp, eos_token_ids={rng.randrange(VOCAB)}, vocab_size=VOCAB)


@pytest.mark.parametrize("seed", range(6))
def test_device_rule_marks_exactly_the_step_sglang_finishes_a_request(seed):
    rng = random.Random(seed)
    stride, slots = 4, 16
    fin = FinishedRows(slots, "cpu")
    reqs = [make_req(rng, i) for i in range(8)]
    pool = torch.tensor(rng.sample(range(slots), len(reqs)))
    fin.done[pool] = True  # slots of earlier requests: admission must reset them
    fin.admit(reqs, pool)
    assert not fin.done[pool].any()
    # the prefill samples each request's first token
    seq = torch.tensor([len(r.origin_input_ids) for r in reqs])
    first = torch.tensor([rng.randrange(VOCAB) for _ in reqs])
    for r, t in zip(reqs, first.tolist()):
        r.output_ids.append(t)
        r.update_finish_state(1)
    fin.mark_step(pool, first, torch.ones(len(reqs), dtype=torch.int32), seq, 1)
    assert fin.done[pool].tolist() == [r.finished() for r in reqs]
    for _ in range(16):  # speculative decode steps: each row accepts 1..stride tokens (drafts + bonus)
        live = [i for i, r in enumerate(reqs) if not r.finished()]
        if not live:
            break
        acc = torch.tensor([rng.randint(1, stride) for _ in live], dtype=torch.int32)
        toks = torch.tensor([rng.randrange(VOCAB) for _ in range(len(live) * stride)])
        seq[live] += acc.long()
        for j, i in enumerate(live):
            new = toks[j * stride: j * stride + int(acc[j])].tolist()
            reqs[i].output_ids.extend(new)
            reqs[i].update_finish_state(len(new))
        fin.mark_step(pool[live], toks, acc, seq[live], stride)
        assert fin.done[pool].tolist() == [r.finished() for r in reqs], [
            (r.finished_reason, r.output_ids, r.sampling_params.max_new_tokens) for r in reqs]
        # the same launch tells which of the step's rows still run after it (the adaptive ledger's sample rows)
        assert fin.step_live.tolist() == [not reqs[i].finished() for i in live]
    # what the host may trust of each finished request: its slot was left by its last step
    assert all(trusts_device_finish(r) for r in reqs if r.finished())


def clone_req(r):
    sp = SamplingParams(max_new_tokens=r.sampling_params.max_new_tokens,
                        stop_token_ids=list(r.sampling_params.stop_token_ids or ()),
                        ignore_eos=r.sampling_params.ignore_eos)
    sp.normalize(None)
    c = Req(r.rid + "'", "", list(r.origin_input_ids), sp, eos_token_ids=set(r.eos_token_ids or ()), vocab_size=VOCAB)
    c.output_ids = list(r.output_ids)
    return c


@pytest.mark.parametrize("seed", range(6))
def test_clamped_run_ends_where_a_non_speculative_server_finishes(seed):
    """A tree verify's run (root + accepted drafts, then the bonus) cut at its first finishing token ends
    exactly where SGLang finishes the request when it gets the run's tokens one at a time (as without
    speculation), and the host then has nothing to trim. (Given the whole run at once SGLang checks
    the length first and can keep tokens past a stop token.) A run that finishes nothing is unchanged."""
    rng = random.Random(100 + seed)
    n, width, slots = 5, 4, 8  # 5 tree nodes per request, runs of up to 4 tokens
    fin = FinishedRows(slots, "cpu")
    reqs = [make_req(rng, i) for i in range(6)]
    pool = torch.tensor(rng.sample(range(slots), len(reqs)))
    for r in reqs:  # some output already, the end in reach of this step
        r.output_ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))]
        r.sampling_params.max_new_tokens = len(r.output_ids) + rng.randint(1, 5)
    fin.admit(reqs, pool)
    seq = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs])
    predict = torch.tensor([rng.randrange(VOCAB) for _ in range(len(reqs) * n)])
    lens = torch.tensor([rng.randint(1, width) for _ in reqs], dtype=torch.int32)
    index = torch.full((len(reqs), width), -1, dtype=torch.int32)
    for b in range(len(reqs)):  # the run's nodes: the root, then accepted nodes anywhere in the tree
        index[b, :lens[b]] = torch.tensor([b * n] + rng.sample(range(b * n + 1, b * n + n), int(lens[b]) - 1))
    full_runs = [predict[index[b, :lens[b]].long()].tolist() for b in range(len(reqs))]
    new = fin.clamp_run(pool, seq, predict, lens.clone(), index)
    for b, r in enumerate(reqs):
        one_by_one = clone_req(r)
        for t in full_runs[b]:
            one_by_one.output_ids.append(t)
            one_by_one.update_finish_state(1)
            if one_by_one.finished():
                break
        run = predict[index[b, :new[b]].long()].tolist()
        assert (index[b, new[b]:] == -1).all()
        assert run == full_runs[b][:len(one_by_one.output_ids) - len(r.output_ids)], (full_runs[b], run)
        cut = clone_req(r)
        cut.output_ids += run
        cut.update_finish_state(len(run))
        assert cut.finished() == one_by_one.finished()
        if cut.finished():
            assert type(cut.finished_reason) is type(one_by_one.finished_reason)
            assert cut.finished_len in (None, len(cut.output_ids))  # nothing past the end to trim


def test_eagle_sample_hook_clamps_only_admitted_pools():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from lumotree.sglang.patches.eagle_sample_end import eagle_sample_end

    rng = random.Random(5)
    req = make_req(rng, 0)
    req.sampling_params.ignore_eos, req.sampling_params.max_new_tokens = True, 2
    req.output_ids = [1]
    predict = torch.tensor([4, 5, 6, 7])

    def original(verify_input, batch, *a, **k):
        return predict, torch.tensor([3], dtype=torch.int32), torch.tensor([[0, 1, 2]], dtype=torch.int32)

    pool = SimpleNamespace()
    batch = SimpleNamespace(req_to_token_pool=pool, forward_mode=ForwardMode.TARGET_VERIFY,
                            req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([len(req.origin_input_ids)]))
    _, lens, index = eagle_sample_end(original, None, batch)
    assert lens.tolist() == [3] and index.tolist() == [[0, 1, 2]]  # no table: SGLang's run
    FinishedRows.of(SimpleNamespace(req_to_token=torch.zeros(4, 2))).admit([req], torch.tensor([1]))
    pool.lumotree_finished = FinishedRows(4, "cpu")
    pool.lumotree_finished.admit([req], torch.tensor([1]))
    _, lens, index = eagle_sample_end(original, None, batch)
    assert lens.tolist() == [1] and index.tolist() == [[0, -1, -1]]  # output full after one more token


def test_mask_rows_sets_finished_rows_to_the_padding_sentinel():
    fin = FinishedRows(8, "cpu")
    fin.done[torch.tensor([2, 5])] = True
    rows = torch.tensor([40, 41, 42, 43, -1])  # graph-padded: the last row already -1
    fin.mask_rows(rows, torch.tensor([1, 2, 3, 5]))
    assert rows.tolist() == [40, -1, 42, -1, -1]


def test_marks_stay_until_the_slot_is_admitted_again():
    rng = random.Random(0)
    fin = FinishedRows(4, "cpu")
    req = make_req(rng, 0)
    req.sampling_params.max_new_tokens = 2
    fin.admit([req], torch.tensor([3]))
    n = len(req.origin_input_ids)
    fin.mark_step(torch.tensor([3]), torch.tensor([0, 0]), torch.tensor([1], dtype=torch.int32), torch.tensor([n + 1]), 2)
    assert fin.done[3]
    # the step in flight: its (discarded) outputs do not clear the mark
    fin.mark_step(torch.tensor([3]), torch.tensor([1, 1]), torch.tensor([1], dtype=torch.int32), torch.tensor([n]), 2)
    assert fin.done[3]
    fin.admit([make_req(rng, 1)], torch.tensor([3]))
    assert not fin.done[3]


def test_requests_the_device_rule_does_not_cover():
    rng = random.Random(1)
    fin = FinishedRows(4, "cpu")
    grammar = make_req(rng, 0)
    grammar.grammar = object()  # the grammar may cut accepted tokens: not device-ruled
    many = make_req(rng, 1)
    many.sampling_params.stop_token_ids = set(range(100, 100 + finish.MAX_STOP_IDS + 1))
    fin.admit([grammar, many], torch.tensor([0, 1]))
    assert fin.ruled[:2].tolist() == [False, False]
    fin.mark_step(torch.tensor([0, 1]), torch.arange(2), torch.ones(2, dtype=torch.int32), torch.tensor([10 ** 6] * 2), 1)
    assert not fin.done[:2].any()
    for r in (grammar, many):
        r.finished_reason = FINISH_LENGTH(length=1)
        r.output_ids = [0] * 20
        assert not trusts_device_finish(r)


def test_host_fallback_keeps_other_finishes_out_of_the_cache():
    rng = random.Random(2)
    r = make_req(rng, 0)
    r.sampling_params.ignore_eos = False
    r.sampling_params.stop_token_ids = {5}
    r.output_ids = [1, 5]
    r.finished_reason = FINISH_MATCHED_TOKEN(matched=5)
    assert trusts_device_finish(r)
    r.finished_reason = FINISH_MATCHED_STR(matched="\n")
    assert not trusts_device_finish(r)
    r.finished_reason = FINISH_ABORT("client went away")
    assert not trusts_device_finish(r)
    r.finished_reason = FINISH_LENGTH(length=99)  # a length limit other than max_new_tokens
    r.sampling_params.max_new_tokens = 99
    assert not trusts_device_finish(r)


def test_worker_admits_marks_and_skips_untrusted_inserts():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from lumotree.sglang.worker import worker_class

    rng = random.Random(3)
    w = object.__new__(worker_class())
    w._overlap_consistent = False  # the synchronous scheduler: requests admitted (the run clamp), no marks
    pool0 = SimpleNamespace(req_to_token=torch.zeros(6, 4, dtype=torch.int32))
    w._forward = lambda batch, *a, **k: SimpleNamespace(next_token_ids=torch.tensor([1]))
    r0 = make_req(rng, 9)
    w.forward_batch_generation(SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=[r0], req_pool_indices=torch.tensor([2]),
                                               req_to_token_pool=pool0, seq_lens=torch.tensor([3])))
    assert pool0.lumotree_finished.ruled[2] == (len(finish.stop_token_ids(r0)) <= finish.MAX_STOP_IDS)
    w._overlap_consistent = True
    pool = SimpleNamespace(req_to_token=torch.zeros(6, 4, dtype=torch.int32))
    reqs = [make_req(rng, i) for i in range(2)]
    for r in reqs:
        r.sampling_params.ignore_eos, r.sampling_params.max_new_tokens = True, 3
    lens = torch.tensor([len(r.origin_input_ids) for r in reqs])
    outs = iter([SimpleNamespace(next_token_ids=torch.tensor([1, 2])),  # prefill
                 SimpleNamespace(next_token_ids=torch.tensor([1, 1, 2, 2]), accept_lens=torch.tensor([2, 1]),
                                 new_seq_lens=lens + torch.tensor([2, 1]), speculative_num_draft_tokens=2)])
    w._forward = lambda batch, *a, **k: next(outs)
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=reqs, req_pool_indices=torch.tensor([4, 1]),
                            req_to_token_pool=pool, seq_lens=lens)
    w.forward_batch_generation(batch)
    fin = pool.lumotree_finished
    assert fin.ruled[[4, 1]].all() and not fin.done.any()
    batch.forward_mode = ForwardMode.DECODE
    w.forward_batch_generation(batch)
    # request 0 has 1 + 2 tokens = max_new_tokens: finished; request 1 has 2
    assert fin.done[[4, 1]].tolist() == [True, False]
    r = reqs[0]
    r.output_ids = [1, 1, 1]
    r.finished_reason = FINISH_LENGTH(length=3)
    w.prepare_for_kv_cache_release(r)
    assert not getattr(r, "skip_radix_cache_insert", False)
    r.finished_reason = FINISH_MATCHED_STR(matched="x")
    w.prepare_for_kv_cache_release(r)
    assert r.skip_radix_cache_insert


def test_backend_masks_decode_and_verify_rows_only():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from lumotree.sglang.backend import LumoTreeGDNBackend

    be = object.__new__(LumoTreeGDNBackend)
    be.finished = FinishedRows(4, "cpu")
    be.finished.done[2] = True
    for mode, want in ((ForwardMode.DECODE, [7, -1]), (ForwardMode.TARGET_VERIFY, [7, -1]), (ForwardMode.EXTEND, [7, 8])):
        md = SimpleNamespace(mamba_cache_indices=torch.tensor([7, 8]))
        be._skip_finished(md, torch.tensor([1, 2]), mode)
        assert md.mamba_cache_indices.tolist() == want, mode
    be.finished = None  # the synchronous scheduler: nothing masked
    md = SimpleNamespace(mamba_cache_indices=torch.tensor([7, 8]))
    assert be._skip_finished(md, torch.tensor([1, 2]), ForwardMode.DECODE).mamba_cache_indices.tolist() == [7, 8]


SCRIPT = r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
from lumotree.sglang.scheduling import overlap_consistent
base = ["--model-path", sys.argv[1], "--device", "cuda"]  # parsing only: nothing touches a GPU
for extra in (["--speculative-algorithm", "LUMOTREE"], ["--speculative-algorithm", "LUMOTREE_SUFFIX"],
              ["--speculative-algorithm", "LUMOTREE", "--disable-overlap-schedule"]):
    sa = prepare_server_args(base + extra)
    print("RESULT", sa.disable_overlap_schedule, sa.mamba_radix_cache_strategy, overlap_consistent(sa))
"""


def test_lumotree_overlap_resolves_to_overlap_with_the_no_buffer_cache():
    """SGLang's own argument resolution keeps the overlap scheduler and takes the no_buffer state cache
    for LUMOTREE and LUMOTREE_SUFFIX (its check refusing the pair is bypassed for them alone); with
    --disable-overlap-schedule SGLang resolves its own (synchronous) cache."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    out = subprocess.run([sys.executable, "-c", SCRIPT, CKPT], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines == ["False no_buffer True", "False no_buffer True", "True auto False"], \
        out.stdout[-2000:] + out.stderr[-4000:]


def ngram_base(monkeypatch):
    """SGLang's NGRAM worker class, or where its C++ n-gram ops are not built (this CPU machine; the GPU
    machine has them) a stand-in of the same name: the tests replace its forward anyway."""
    try:
        from sglang.srt.speculative.ngram_worker import NGRAMWorker
    except ImportError:
        NGRAMWorker = type("NGRAMWorker", (), {"forward_batch_generation": lambda self, batch, *a, **k: None})
        monkeypatch.setitem(sys.modules, "sglang.srt.speculative.ngram_worker", SimpleNamespace(NGRAMWorker=NGRAMWorker))
    return NGRAMWorker


def test_suffix_worker_admits_requests_for_the_run_clamp(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    NGRAMWorker = ngram_base(monkeypatch)
    from lumotree.sglang.suffix import ngram_worker

    calls = []
    monkeypatch.setattr(NGRAMWorker, "forward_batch_generation", lambda self, batch, *a, **k: calls.append(batch) or "out")
    w = object.__new__(ngram_worker(lambda sa: None))
    pool = SimpleNamespace(req_to_token=torch.zeros(4, 2, dtype=torch.int32))
    req = make_req(random.Random(7), 0)
    req.sampling_params.ignore_eos, req.sampling_params.max_new_tokens = True, 5
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=[req], req_pool_indices=torch.tensor([3]),
                            req_to_token_pool=pool, seq_lens=torch.tensor([len(req.origin_input_ids)]))
    assert w.forward_batch_generation(batch) == "out" and calls == [batch]
    assert pool.lumotree_finished.ruled[3] and pool.lumotree_finished.max_len[3] == len(req.origin_input_ids) + 4


def test_suffix_worker_marks_finished_rows_under_overlap(monkeypatch):
    """LUMOTREE_SUFFIX with the overlap scheduler's consistent cache: SGLang's NGRAM results (a prefill's
    ``[bs]`` tokens; a verify's rows of ``speculative_num_draft_tokens``, accepted tokens first) mark
    the rows that finished, and untrusted finishes stay out of the cache."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    NGRAMWorker = ngram_base(monkeypatch)
    from lumotree.sglang.suffix import ngram_worker

    rng = random.Random(11)
    reqs = [make_req(rng, i) for i in range(2)]
    for r in reqs:
        r.sampling_params.ignore_eos, r.sampling_params.max_new_tokens = True, 4
    lens = torch.tensor([len(r.origin_input_ids) for r in reqs])
    outs = iter([SimpleNamespace(next_token_ids=torch.tensor([5, 6]), accept_lens=torch.ones(2, dtype=torch.int32),
                                 new_seq_lens=lens.clone(), speculative_num_draft_tokens=3),  # prefill
                 SimpleNamespace(next_token_ids=torch.tensor([1, 2, 3, 4, 0, 0]), accept_lens=torch.tensor([3, 1]),
                                 new_seq_lens=lens + torch.tensor([3, 1]), speculative_num_draft_tokens=3)])
    monkeypatch.setattr(NGRAMWorker, "forward_batch_generation", lambda self, batch, *a, **k: next(outs))
    w = object.__new__(ngram_worker(lambda sa: None))
    w._overlap_consistent = True
    pool = SimpleNamespace(req_to_token=torch.zeros(6, 2, dtype=torch.int32))
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=reqs, req_pool_indices=torch.tensor([5, 0]),
                            req_to_token_pool=pool, seq_lens=lens)
    w.forward_batch_generation(batch)
    fin = pool.lumotree_finished
    assert not fin.done.any()
    batch.forward_mode = ForwardMode.DECODE
    w.forward_batch_generation(batch)
    assert fin.done[[5, 0]].tolist() == [True, False]  # 1 + 3 tokens = max_new_tokens; 1 + 1 not yet
    r = reqs[1]
    r.output_ids, r.finished_reason = [1, 2], FINISH_MATCHED_STR(matched="x")
    w.prepare_for_kv_cache_release(r)
    assert r.skip_radix_cache_insert


def test_admit_batch_admits_prefill_batches_only():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    pool = SimpleNamespace(req_to_token=torch.zeros(4, 2, dtype=torch.int32))
    req = make_req(random.Random(8), 0)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=[req], req_pool_indices=torch.tensor([2]),
                            req_to_token_pool=pool)
    finish.admit_batch(batch)
    assert not hasattr(pool, "lumotree_finished")
    batch.forward_mode = ForwardMode.EXTEND
    finish.admit_batch(batch)
    assert pool.lumotree_finished.max_len[2] == len(req.origin_input_ids) + req.sampling_params.max_new_tokens - 1


def test_commit_of_a_clamped_run_ends_at_its_last_kept_node():
    """SGLang's own commit step indices (``_verify_commit_step_indices``, what LumoTree's replay commit
    receives) from a clamped run: the last node kept, so the state ends where the cached key ends."""
    from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

    rng = random.Random(11)
    n = 6
    req = make_req(rng, 0)
    req.sampling_params.ignore_eos, req.sampling_params.stop_token_ids = False, {3}
    req.eos_token_ids = set()
    req.output_ids = [1]
    fin = FinishedRows(4, "cpu")
    fin.admit([req], torch.tensor([2]))
    # run: root(node 0) -> node 2 -> node 4 -> node 5, tokens predicted there 7, 3 (stop), 8, 9
    predict = torch.tensor([7, 0, 3, 0, 8, 9])
    index = torch.tensor([[0, 2, 4, 5]], dtype=torch.int32)
    lens = fin.clamp_run(torch.tensor([2]), torch.tensor([len(req.origin_input_ids)]), predict,
                         torch.tensor([4], dtype=torch.int32), index)
    assert lens.tolist() == [2] and index.tolist() == [[0, 2, -1, -1]]  # tokens 7, 3: the stop is the bonus
    last, _ = _verify_commit_step_indices(batch=SimpleNamespace(mamba_track_indices=None), accept_index=index,
                                          accept_lens=lens, draft_token_num=n)
    assert last.tolist() == [2]  # the commit replays root -> node 2 (token 7); the stop token has no KV


def test_suffix_worker_prepares_drafts_through_lumotree_and_inserts_nothing(monkeypatch):
    """The NGRAM loop's draft preparation of a LUMOTREE_SUFFIX worker is LumoTree's (the request's view handed
    over as the corpus needs it) and its post-verify corpus insert does nothing (the host corpus keeps what it
    observed)."""
    ngram_base(monkeypatch)
    from lumotree.sglang.suffix import SuffixCorpus, ngram_worker

    w = object.__new__(ngram_worker(lambda sa: None))
    w.draft_token_num, w.max_trie_depth, w.enable_overlap = 4, 4096, True
    w.ngram_corpus = SuffixCorpus(4)
    req = SimpleNamespace(rid="a", origin_input_ids=[1, 2, 3, 1, 2], output_ids=[3])
    batch = SimpleNamespace(reqs=[req], grammar_needs_sync=lambda: False,
                            spec_info=SimpleNamespace(accept_tokens=torch.tensor([1, 2, 0, 0]),
                                                      accept_lens=torch.tensor([2])))
    toks, mask = w._prepare_draft_tokens(batch)
    assert toks.shape == (4,) and mask.shape == (16,)
    assert toks[0] == 2 and toks[1] == 3  # root: the spliced last token; "1 2" was followed by 3
    assert w.ngram_corpus._seen["a"] == 8 and w.prev_accept_lens == [2]
    w._update_ngram_corpus(batch)
    assert w.ngram_corpus._seen["a"] == 8


def _req_at(max_new, out, rid="r"):
    sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
    sp.normalize(None)
    req = Req(rid, "", [1, 2, 3], sp, eos_token_ids={0}, vocab_size=VOCAB)
    req.output_ids = list(range(1, out + 1))
    return req


@pytest.mark.parametrize("lag", [0, 1])
def test_a_step_ends_its_batch_only_where_every_request_is_certain_to_end_with_it(lag):
    """The step's one token at least, after ``lag`` tokens not yet on the host: a request ``max_new - 1 - lag``
    tokens in ends with it, one token less does not; every request must, or have finished already."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    last = 5 - 1 - lag  # output tokens on the host at the step that brings the request to its 5th
    assert finish.ends_after_step([_req_at(5, last)], lag)
    assert finish.ends_after_step([_req_at(5, last + 1), _req_at(7, 6 - lag)], lag)
    assert not finish.ends_after_step([_req_at(5, last - 1)], lag)
    assert not finish.ends_after_step([_req_at(5, last), _req_at(9, last)], lag)  # one request goes on
    done = _req_at(9, 2)
    done.finished_reason = FINISH_LENGTH(length=2)  # finished (the overlap scheduler's extra step still holds it)
    assert finish.ends_after_step([done, _req_at(5, last)], lag)
    assert not finish.ends_after_step([], lag) and not finish.ends_after_step(None, lag)
    free = _req_at(5, last)
    free.sampling_params.max_new_tokens = None  # no length limit: never certain
    assert not finish.ends_after_step([free], lag)
