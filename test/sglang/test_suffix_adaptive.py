"""LUMOTREE_SUFFIX's adaptive tree size (``lumotree.sglang.suffix``): each decode step of SGLang's NGRAM loop
serves the suffix tree or no draft, as :class:`~lumotree.sglang.adaptive.TreeSizePolicy` chooses from the
device's step times and the measured acceptance; a no-draft step is a decode forward
(``DecodeStep.run_ngram``), requests that left the batch leave the corpus then too, and the candidates come from
the flags. On CPU with SGLang's NGRAM worker replaced (its C++ n-gram ops need sgl_kernel's CUDA build);
the served step is ``test_served_no_draft_gpu.py``."""
import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from lumotree.sglang import adaptive  # noqa: E402
from lumotree.sglang.adaptive import TreeSizePolicy  # noqa: E402

N = 4


def ngram_base(monkeypatch, calls):
    """SGLang's NGRAM worker class, or a stand-in of the same name where it cannot be imported; its forward
    (the drafted step: host drafts, tree verify) records the call."""
    try:
        from sglang.srt.speculative.ngram_worker import NGRAMWorker
    except ImportError:
        NGRAMWorker = type("NGRAMWorker", (), {})
        monkeypatch.setitem(sys.modules, "sglang.srt.speculative.ngram_worker", SimpleNamespace(NGRAMWorker=NGRAMWorker))

    def verify(self, batch, on_publish=None):
        calls.append(("tree", batch.seq_lens.shape[0]))
        return "verify-result"

    monkeypatch.setattr(NGRAMWorker, "forward_batch_generation", verify, raising=False)
    return NGRAMWorker


class Corpus:
    def __init__(self):
        self.erased = []

    def erase_match_state(self, rids):
        self.erased.append(sorted(rids))


class Step:
    """``DecodeStep`` as the worker calls it."""

    def __init__(self, serves=True):
        self.ran = []
        self._serves = serves

    def serves_ngram(self, batch, n):
        return self._serves and n == N

    def run_ngram(self, batch, n, on_publish=None):
        self.ran.append(batch.seq_lens.shape[0])
        if on_publish is not None:
            on_publish(batch.seq_lens + 1)
        return SimpleNamespace(new_seq_lens=batch.seq_lens + 1, next_token_ids=None)


def worker(monkeypatch, candidates, step=None, clock=None):
    from lumotree.sglang.suffix import ngram_worker
    from lumotree.sglang.worker import StepLedger

    calls = []
    ngram_base(monkeypatch, calls)
    w = object.__new__(ngram_worker(lambda sa: None))
    w.calls, w.draft_token_num, w.ngram_corpus = calls, N, Corpus()
    w._overlap_consistent, w._prev_decode_rids = False, set()
    w.tree_policy = TreeSizePolicy(candidates)
    w._ledger = StepLedger(w.tree_policy, False, adaptive.SUFFIX_TREE, event=clock.event if clock else None)
    w._decode_step = step if step is not None else Step()
    return w


def batch(rids, mode=ForwardMode.DECODE, out=0, max_new=64):
    """A batch of requests ``rids``, each ``out`` tokens into its ``max_new``."""
    n = len(rids)
    reqs = [SimpleNamespace(rid=r, output_ids=[1] * out, finished=lambda: False,
                            sampling_params=SimpleNamespace(max_new_tokens=max_new)) for r in rids]
    return SimpleNamespace(forward_mode=mode, reqs=reqs, seq_lens=torch.arange(n) + 5,
                           req_pool_indices=torch.arange(n), is_extend_in_batch=False, req_to_token_pool=None)


def test_pinned_to_no_draft_every_decode_step_decodes(monkeypatch):
    w = worker(monkeypatch, [0])
    published = []
    out = w.forward_batch_generation(batch(["a", "b", "c"]), on_publish=published.append)
    assert w._decode_step.ran == [3] and w.calls == [] and published[0].tolist() == [6, 7, 8]
    assert out.new_seq_lens.tolist() == [6, 7, 8]
    # a request left: it leaves the corpus at this no-draft step, as a verify would have it leave
    w.forward_batch_generation(batch(["a", "c"]))
    assert w.ngram_corpus.erased == [["b"]] and w._prev_decode_rids == {"a", "c"}
    assert [e[0] for e in w._ledger.pending] == [0, 0]
    # their results: nothing drafted, so no acceptance sample
    w.on_verify_complete_cpu([0, 0, 0])
    w.on_verify_complete_cpu([0, 0])
    assert w.tree_policy.accept is None and not w._ledger.pending


def test_the_tree_is_sglang_s_ngram_step_and_its_acceptance_feeds_the_policy(monkeypatch):
    w = worker(monkeypatch, [1])
    assert w.forward_batch_generation(batch(["a", "b"])) == "verify-result"
    assert w.calls == [("tree", 2)] and w._decode_step.ran == []
    w.on_verify_complete_cpu([3, 1])
    assert w.tree_policy.accept == 2.0


def test_a_batch_a_decode_step_cannot_serve_gets_the_tree(monkeypatch):
    """Logprobs, grammars, penalties...: the policy's no draft is served as the tree, and timed as the tree."""
    w = worker(monkeypatch, [0], step=Step(serves=False))
    assert w.forward_batch_generation(batch(["a"])) == "verify-result"
    assert w._ledger.pending[-1][0] == adaptive.SUFFIX_TREE and w._ledger.clock._open[-1][2] == adaptive.SUFFIX_TREE


class AdmittingCorpus(Corpus):
    """A corpus whose requests ``indexing`` are still being admitted; a drafted step leaves their rows undrafted."""

    def __init__(self, indexing):
        super().__init__()
        self.indexing, self.undrafted = set(indexing), []

    def admitting(self, rids):
        return bool(rids) and all(r in self.indexing for r in rids)


def test_a_step_whose_requests_are_all_still_admitting_decodes(monkeypatch):
    """The tree chosen, but every request's admission is still indexing (it would draft nothing): a decode step,
    timed as one; with one request indexed the tree is served."""
    from lumotree.sglang import step_timing

    monkeypatch.setattr(step_timing, "_on", True)  # the benchmark's timer: such steps apart from the chosen ones
    for part in ("nodraft", "nodraft_admitting"):
        monkeypatch.setattr(step_timing.TIMERS[part], "samples", __import__("collections").defaultdict(list))
    w = worker(monkeypatch, [1])
    w.ngram_corpus = AdmittingCorpus({"a", "b"})
    w.forward_batch_generation(batch(["a", "b"]))
    assert w._decode_step.ran == [2] and w.calls == [] and w._ledger.pending[-1][0] == 0
    assert {p: len(step_timing.TIMERS[p].samples[2]) for p in ("nodraft", "nodraft_admitting")} == {
        "nodraft": 1, "nodraft_admitting": 1}
    assert w.forward_batch_generation(batch(["a", "b", "c"])) == "verify-result" and w.calls == [("tree", 3)]
    w = worker(monkeypatch, [1], step=Step(serves=False))  # a batch a decode step cannot serve: the tree
    w.ngram_corpus = AdmittingCorpus({"a"})
    assert w.forward_batch_generation(batch(["a"])) == "verify-result"


class WaitingCorpus(AdmittingCorpus):
    """An admitting corpus whose bounded wait (``wait_admitting``) sees the indexing of ``done_within`` finish."""

    def __init__(self, indexing, done_within):
        super().__init__(indexing)
        self.done_within, self.waits = set(done_within), []

    def wait_admitting(self, rids):
        rids = list(rids)
        self.waits.append(rids)
        self.indexing -= self.done_within
        return self.admitting(rids)


def test_a_step_whose_requests_are_all_admitting_waits_for_their_indexing_before_it_decodes(monkeypatch):
    """The tree chosen and every request still admitting: the worker lets the corpus wait (bounded) for their
    indexing; done within it, the step drafts; not done, it is a decode step."""
    w = worker(monkeypatch, [1])
    w.ngram_corpus = WaitingCorpus({"a"}, done_within={"a"})
    assert w.forward_batch_generation(batch(["a"])) == "verify-result" and w.calls == [("tree", 1)]
    assert w.ngram_corpus.waits == [["a"]]
    w = worker(monkeypatch, [1])
    w.ngram_corpus = WaitingCorpus({"a"}, done_within=())
    w.forward_batch_generation(batch(["a"]))
    assert w._decode_step.ran == [1] and w.calls == [] and w._ledger.pending[-1][0] == 0


def test_rows_that_drafted_nothing_leave_the_acceptance_sample(monkeypatch):
    """Requests whose admission was indexing drafted their root alone: they accept what a decode step gives, so the
    step's acceptance sample leaves them out (a step that drafted for none of its rows gives none)."""
    w = worker(monkeypatch, [1])

    def verify(self, b, on_publish=None):
        self.ngram_corpus.undrafted = [0, 2]
        return "verify-result"

    monkeypatch.setattr(ngram_base(monkeypatch, []), "forward_batch_generation", verify, raising=False)
    w.ngram_corpus = AdmittingCorpus(set())
    w.forward_batch_generation(batch(["a", "b", "c"]))
    assert w._ledger.pending[-1][3] == {0, 2}
    w.on_verify_complete_cpu([0, 6, 0])
    assert w.tree_policy.accept == 6.0


def test_prefills_and_idle_batches_end_a_step_s_time_sample(monkeypatch):
    monkeypatch.setattr("lumotree.sglang.finish.admit_batch", lambda batch: None)  # the run clamp: test_finish.py
    w = worker(monkeypatch, [0, 1])
    w.forward_batch_generation(batch(["a"]))
    assert w._ledger.clock._open[-1][3]  # the step's time counts until something else runs
    w.forward_batch_generation(batch(["b"], ForwardMode.EXTEND))
    assert w.calls[-1] == ("tree", 1)  # SGLang's forward runs the prefill
    assert not w._ledger.clock._open[-1][3] and len(w._ledger.pending) == 1
    w.forward_batch_generation(batch(["a", "b"]))
    w.forward_batch_generation(batch([], ForwardMode.IDLE))
    assert not w._ledger.clock._open[-1][3] and len(w._ledger.pending) == 2


@pytest.mark.parametrize("positional", [False, True], ids=["keyword", "positional"])
def test_a_prefill_publishes_its_lengths_before_sglang_s_forward(monkeypatch, positional):
    """Under the overlap scheduler a prefill's lengths (its input lengths) are published before SGLang's forward is
    launched, once, and SGLang's worker gets no callback to publish again after its forward; a decode step's tree
    keeps SGLang's own publish."""
    monkeypatch.setattr("lumotree.sglang.finish.admit_batch", lambda batch: None)  # the run clamp: test_finish.py
    monkeypatch.setattr("lumotree.sglang.suffix.admit_prefilled", lambda worker, batch: None)
    events = []
    w = worker(monkeypatch, [1])

    def forward(self, b, on_publish=None):
        events.append(("forward", on_publish))
        return "verify-result"

    monkeypatch.setattr(ngram_base(monkeypatch, []), "forward_batch_generation", forward, raising=False)

    def publish(lens):
        events.append(("publish", lens.tolist()))

    prefill = batch(["a", "b"], ForwardMode.EXTEND)
    if positional:
        w.forward_batch_generation(prefill, publish)
    else:
        w.forward_batch_generation(prefill, on_publish=publish)
    assert events == [("publish", [5, 6]), ("forward", None)]
    events.clear()
    w.forward_batch_generation(batch(["a", "b"]), on_publish=publish)  # the tree: SGLang's worker publishes
    assert events == [("forward", publish)]


def test_the_policy_drops_a_tree_that_does_not_pay_and_keeps_one_that_does(monkeypatch):
    """Served as a server would: step times from the device's clock, acceptance a step late. A tree step that
    costs 5x a decode step pays from 4 accepted drafts per request on: at 2 the bucket serves no draft, at 8 the
    tree."""
    from test_adaptive import DeviceClock

    for accepted, want in ((2, 0), (8, 1)):
        dev = DeviceClock()
        w = worker(monkeypatch, [0, 1], clock=dev)
        served = []
        for _ in range(40):
            bt = batch([f"r{i}" for i in range(32)])
            w.forward_batch_generation(bt)
            steps = w._ledger.pending[-1][0]
            served.append(steps)
            dev.now += 0.005 if steps else 0.001
            w.on_verify_complete_cpu([accepted if steps else 0] * 32)
        assert served[-10:] == [want] * 10, (accepted, served)


def test_candidates_from_the_flags(tmp_path):
    def args(cfg=None):
        path = None
        if cfg is not None:
            path = tmp_path / "cfg.json"
            path.write_text(json.dumps(cfg))
        return SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_num_steps=None,
                               speculative_adaptive_config=path and str(path))

    assert adaptive.candidate_steps(args()) == [0, 1]
    assert adaptive.candidate_steps(args({"candidate_steps": [1]})) == [1]
    assert adaptive.candidate_steps(args({"candidate_steps": [0]})) == [0]
    with pytest.raises(ValueError, match=r"--speculative-adaptive-config .*candidate_steps \[3\] cannot be served; "
                                         r"a LUMOTREE_SUFFIX server drafts its suffix tree \(1\) or none \(0\)"):
        adaptive.candidate_steps(args({"candidate_steps": [0, 3]}))
    with pytest.raises(ValueError, match="LUMOTREE_SUFFIX server reads"):
        adaptive.candidate_steps(args({"steps": [0]}))


def test_acceptance_leaves_out_rows_that_finished_before_or_in_the_step(monkeypatch):
    """Under the overlap scheduler's consistent cache a drafted step's acceptance sample counts only the rows still
    running after it: not those the step before finished (still in the batch), nor those this step finished (their
    run was cut at the request's end, so they accept what was left of the request). 32 agents whose turns end
    together otherwise read every turn's end as acceptance near zero."""
    from lumotree.sglang import finish
    from lumotree.sglang.finish import FinishedRows

    pool = SimpleNamespace(req_to_token=torch.zeros(8, 4, dtype=torch.int32))
    fin = FinishedRows.of(pool)
    fin.done[2] = True  # finished by the step before

    def forward_marked(consistent, batch, forward):
        out = forward()
        fin.done[5] = True  # this step's run reached the request's end (mark_step)
        return out

    monkeypatch.setattr(finish, "forward_marked", forward_marked)
    w = worker(monkeypatch, [1])
    w._ledger.consistent = True
    b = batch(["a", "b", "c", "d"])
    b.req_pool_indices, b.req_to_token_pool = torch.tensor([1, 2, 5, 6]), pool
    w.forward_batch_generation(b)
    w.on_verify_complete_cpu([4, 0, 1, 6])
    assert w.tree_policy.accept == 5.0  # rows 1 and 6 only


def test_the_served_choice_is_summarised_in_the_log(monkeypatch, caplog):
    """Every ``LOG_EVERY`` decode steps one line: how many drafted, the mean acceptance of the drafted steps'
    samples, the policy's step times -- what a served run's choice was, for comparison with a replay."""
    import logging

    from lumotree.sglang.worker import StepLedger

    monkeypatch.setattr(StepLedger, "LOG_EVERY", 4)
    w = worker(monkeypatch, [1])
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.worker"):
        for accepted in ([3, 1], [0, 2], [4, 4]):
            w.forward_batch_generation(batch(["a", "b"]))
            w.on_verify_complete_cpu(accepted)
        assert not [r for r in caplog.records if "last 4 decode steps" in r.getMessage()]
        w.forward_batch_generation(batch(["a", "b"]))
    lines = [r.getMessage() for r in caplog.records if "last 4 decode steps" in r.getMessage()]
    assert len(lines) == 1 and "4 drafted; accepted drafts per request 2.33 (mean of 3 drafted steps' samples)" in lines[0]


def test_the_per_request_choice_takes_the_batch_s_requests_and_their_own_acceptance(monkeypatch):
    """With the per-request choice (the default) the worker hands its ledger the batch's request ids; once both step times
    are measured the chooser decides: two requests that accepted nothing make the next step a decode step although
    the third copied 9 drafts, and a request's estimate comes from its own rows."""
    from lumotree.sglang.request_choice import RequestQuantile, RequestQuantileSettings

    w = worker(monkeypatch, [0, 1])
    c = w._ledger.chooser = RequestQuantile(RequestQuantileSettings(quantile=0.25, weight=1.0))
    for b, s in ((4, 0), (4, 1)):  # the policy's step times at the batch's bucket: a drafted step twice a decode step
        for _ in range(adaptive.MIN_SAMPLES):
            w.tree_policy.observe_time(b, s, 0.002 * (1 + s))
    w.forward_batch_generation(batch(["a", "b", "c"]))
    assert w.calls == [("tree", 3)] and w._ledger.pending[-1][4] == ["a", "b", "c"]  # the running mean: 4 drafts
    w.on_verify_complete_cpu([0, 9, 0])
    assert c.est == {"a": 0.0, "b": 9.0, "c": 0.0}
    w.forward_batch_generation(batch(["a", "b", "c"]))
    assert w.calls == [("tree", 3)] and w._decode_step.ran == [3]  # the quantile request gains nothing: no draft
    w.forward_batch_generation(batch(["b", "d"]))  # d is new: it starts from the running mean (3 drafts)
    assert w.calls[-1] == ("tree", 2)


def test_a_suffix_server_chooses_per_request_by_default_and_not_when_pinned(monkeypatch):
    """The worker's own construction: a LUMOTREE_SUFFIX server with its flags alone gets the per-request choice
    (lumotree.sglang.request_choice at its defaults) and a steady step clock on its ledger; pinned to one candidate,
    none; on two tensor-parallel GPUs the same, its ledger taking rank 0's step times (lumotree.sglang.shared_times);
    with data parallelism it serves its tree on every step (no policy)."""
    from lumotree.sglang import shared_times
    from lumotree.sglang.request_choice import RequestQuantileSettings
    from lumotree.sglang.suffix import ngram_worker

    base = ngram_base(monkeypatch, [])
    monkeypatch.setattr(base, "__init__", lambda self, server_args, *a, **k: setattr(self, "draft_token_num", N),
                        raising=False)

    def build(tmp=None, **kw):
        sa = SimpleNamespace(speculative_algorithm="LUMOTREE_SUFFIX", speculative_adaptive_config=tmp,
                             speculative_num_steps=0, speculative_num_draft_tokens=N, **kw)
        return ngram_worker(lambda server_args: Corpus())(sa)

    w = build()
    assert w.tree_policy.candidates == [0, 1] and w._ledger.chooser.settings == RequestQuantileSettings()
    assert w._ledger.clock.steady  # its drafted steps draft on the host: step times only within runs (StepClock)
    pinned = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "workloads", "no_draft.json")
    w = build(pinned)
    assert w.tree_policy.candidates == [0] and w._ledger.chooser is None
    made = []
    monkeypatch.setattr(shared_times, "for_server", lambda sa: made.append(sa.tp_size) or shared_times.SharedStepTimes())
    w = build(tp_size=2)
    assert w.tree_policy.candidates == [0, 1] and w._ledger.chooser is not None and made == [2]
    assert isinstance(w._ledger.shared, shared_times.SharedStepTimes)
    w = build(tp_size=2, dp_size=2)
    assert w.tree_policy is None and w._ledger is None


def test_a_step_after_which_every_request_has_ended_decodes_without_a_decision(monkeypatch):
    """As the LUMOTREE worker's (lumotree.sglang.finish.ends_after_step): the tree's drafts could not be kept and a
    probe started there would measure nothing -- the step decodes and the policy is not asked; under the overlap
    scheduler a decode step of the same requests launched before it adds a token the host does not count yet."""
    monkeypatch.setattr("lumotree.sglang.finish.admit_batch", lambda batch: None)  # the run clamp: test_finish.py
    w = worker(monkeypatch, [0, 1])
    decided = []
    w.tree_policy.choose = lambda b: decided.append(b) or 1
    w.forward_batch_generation(batch(["a", "b"], out=5, max_new=6))  # the 6th token: both end
    assert w._decode_step.ran == [2] and w.calls == [] and decided == []
    w.forward_batch_generation(batch(["a", "b"], out=4, max_new=6))  # the 5th: the tree
    assert w.calls == [("tree", 2)] and decided == [2]
    overlap = batch(["a", "b"], out=4, max_new=6)
    overlap.enable_overlap = True  # the step before is in flight: 4 + 1 + 1
    w.forward_batch_generation(overlap)
    assert w._decode_step.ran == [2, 2] and decided == [2]
    w.forward_batch_generation(batch(["c"], ForwardMode.EXTEND))  # a prefill in between: nothing in flight
    w.forward_batch_generation(overlap)
    assert w.calls[-1] == ("tree", 2) and w._decode_step.ran == [2, 2] and decided == [2, 2]
