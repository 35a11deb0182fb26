"""A finished request's state is never advanced: length limits, stop tokens, the worker mixin."""
from types import SimpleNamespace

import torch

from lumotree.sglang import finish_guard as fg


def req(prompt_len, max_new, stops=(), ignore_eos=False, eos=(), tok_eos=None):
    tokenizer = SimpleNamespace(eos_token_id=tok_eos, additional_stop_token_ids=None) if tok_eos is not None else None
    return SimpleNamespace(origin_input_ids=[0] * prompt_len, eos_token_ids=set(eos), tokenizer=tokenizer,
                           sampling_params=SimpleNamespace(max_new_tokens=max_new, stop_token_ids=set(stops),
                                                           ignore_eos=ignore_eos))


def info(reqs, seq_lens, tokens=None, pool_rows=None):
    batch = SimpleNamespace(seq_lens=torch.tensor(seq_lens), req_pool_indices=pool_rows,
                            spec_info=SimpleNamespace(draft_token=tokens) if tokens is not None else None)
    return fg.FinishInfo(batch, torch.tensor(fg.length_limits(reqs)), fg.stop_table(reqs))


def test_length_limits_and_stop_tables():
    reqs = [req(10, 4, stops=[7]), req(7, 1, eos=[2], tok_eos=3), req(3, None, stops=[7], ignore_eos=True)]
    assert fg.length_limits(reqs) == [13, 7, fg.NO_LIMIT]
    assert fg.stop_ids(reqs[0]) == [7] and fg.stop_ids(reqs[1]) == [2, 3] and fg.stop_ids(reqs[2]) == []
    assert fg.stop_table(reqs).tolist() == [[7, -1], [2, 3], [-1, -1]]
    assert fg.stop_table([req(1, 1)]).tolist() == [[-1]]


def test_length_finished_requests_are_skipped():
    reqs = [req(10, 4), req(7, 1), req(3, None)]
    steps = torch.tensor([5, 2, 3])
    # pre-verify KV length = prompt + outputs - 1 (the last output is the next input): request 0 with
    # 3 outputs (12) is running, with 4 (13) it is complete; request 1 is complete after its prefill
    assert info(reqs, [12, 7, 10**6]).filter(steps, None, None, None)[0].tolist() == [5, -1, 3]
    last, track = info(reqs, [13, 6, 0]).filter(steps, torch.tensor([1, 1, -1]), None, None)
    assert last.tolist() == [-1, 2, 3] and track.tolist() == [-1, 1, -1]
    # padded batches: only the first len(steps) rows count
    assert info(reqs, [0, 0, 99]).filter(steps[:2], None, None, None)[0].tolist() == [5, 2]


def test_stop_tokens_end_a_request_for_the_following_steps():
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]])  # request 0: a tree (path to node 3: 0 1 3); 1: a chain
    reqs = [req(5, 100, stops=[9]), req(5, 100, stops=[9])]
    slots = torch.zeros(8, dtype=torch.bool)
    pool = torch.tensor([6, 2])
    # step N: request 0 accepts 0 -> 1 -> 3 with a stop token at node 1; node 2 (a stop too) is off its path;
    # request 1 has a stop token only beyond its last accepted node
    tokens = torch.tensor([[4, 9, 9, 5], [4, 5, 6, 9]]).reshape(-1)
    last, _ = info(reqs, [20, 20], tokens, pool).filter(torch.tensor([3, 2]), None, parents, slots)
    assert last.tolist() == [3, 2]  # this step still commits both
    assert slots.tolist() == [False] * 6 + [True, False]  # request 0 (pool row 6) has ended
    # step N+1 (launched before SGLang saw the end): request 0 is skipped; request 1's root (the last
    # step's bonus token) is a stop token: it ended in step N, skipped too; nothing else changes
    tokens = torch.tensor([[5, 1, 2, 3], [9, 1, 2, 3]]).reshape(-1)
    last, _ = info(reqs, [23, 23], tokens, pool).filter(torch.tensor([1, 1]), None, parents, slots)
    assert last.tolist() == [-1, -1] and slots.tolist() == [False] * 6 + [True, False]
    # ignore_eos: stop tokens do not end it
    free = [req(5, 100, stops=[9], ignore_eos=True)] * 2
    tokens = torch.tensor([[9, 9, 9, 9], [9, 9, 9, 9]]).reshape(-1)
    slots2 = torch.zeros(8, dtype=torch.bool)
    last, _ = info(free, [20, 20], tokens, pool).filter(torch.tensor([3, 3]), None, None, slots2)
    assert last.tolist() == [3, 3] and not slots2.any()
    # a batch without any stop token skips the tree work, with the same answer
    quiet = fg.FinishInfo(SimpleNamespace(seq_lens=torch.tensor([20, 20]), req_pool_indices=pool,
                                          spec_info=SimpleNamespace(draft_token=tokens)),
                          torch.tensor([99, 99]), fg.stop_table(free), any_stop=False)
    assert quiet.filter(torch.tensor([3, 3]), None, None, slots2)[0].tolist() == [3, 3]


def test_path_mask():
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    assert fg.path_mask(parents, torch.tensor([3]), 5).tolist() == [[True, True, False, True, False]]
    assert fg.path_mask(None, torch.tensor([2]), 5).tolist() == [[True, True, True, False, False]]
    assert not fg.path_mask(parents, torch.tensor([-1]), 5).any()


class FakeWorker:
    def __init__(self, lin):
        self.target_worker = SimpleNamespace(model_runner=SimpleNamespace(
            attn_backend=SimpleNamespace(linear_attn_backend=lin)))
        self.seen = []

    def forward_batch_generation(self, batch, *args, **kwargs):
        lin = self.target_worker.model_runner.attn_backend.linear_attn_backend
        self.seen.append(lin.finish_limits)
        if kwargs.get("fail"):
            raise RuntimeError("boom")
        return "result"


def batch(decode=True):
    return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: decode), reqs=[req(5, 2), req(4, 9, stops=[3])],
                           seq_lens=torch.tensor([5, 4]), req_pool_indices=torch.tensor([1, 3]))


def test_the_worker_hands_the_limits_to_lumotree_backend_per_decode_step():
    cls = fg.guarded(FakeWorker)
    assert fg.guarded(FakeWorker) is cls and issubclass(cls, FakeWorker) and cls.__mro__[1] is fg.FinishGuard
    lin = SimpleNamespace(lumotree=True, finish_limits=None, finished_slots=torch.ones(5, dtype=torch.bool))
    w = cls(lin)
    b = batch()
    assert w.forward_batch_generation(b) == "result"
    got = w.seen[-1]
    assert got.batch is b and got.limits.tolist() == [6, 12] and got.stops.tolist() == [[-1], [3]] and got.any_stop
    assert lin.finish_limits is None
    w.forward_batch_generation(batch(decode=False))  # prefill: nothing to guard; its pool rows start clean
    assert w.seen[-1] is None and lin.finished_slots.tolist() == [True, False, True, False, True]
    try:
        w.forward_batch_generation(b, fail=True)
    except RuntimeError:
        pass
    assert lin.finish_limits is None  # cleared even when the step fails
    other = SimpleNamespace(lumotree=False, finish_limits=None)  # SGLang's own backend (the oracle baseline)
    w2 = cls(other)
    w2.forward_batch_generation(b)
    assert w2.seen[-1] is None


def test_a_broken_batch_turns_the_guard_off_with_a_warning(caplog):
    cls = fg.guarded(FakeWorker)
    lin = SimpleNamespace(lumotree=True, finish_limits=None, finished_slots=None)
    b = batch()
    b.reqs = [SimpleNamespace(sampling_params=SimpleNamespace(max_new_tokens=4))]  # no prompt: not SGLang's Req
    fg._warned.clear()  # warned once per process; another test may have warned already
    with caplog.at_level("WARNING"):
        assert cls(lin).forward_batch_generation(b) == "result"
    assert "finish guard off" in caplog.text and lin.finish_limits is None


def test_guard_steps_on_the_backend(caplog):
    steps = torch.tensor([5, 2])
    be = SimpleNamespace(finish_limits=None, finished_slots=None, req_to_token_pool=SimpleNamespace(size=7))
    assert fg.guard_steps(be, steps, None, None)[0] is steps and be.finished_slots is None  # no guard this step
    be.finish_limits = info([req(5, 100), req(5, 1)], [20, 20])
    assert fg.guard_steps(be, steps, None, None)[0].tolist() == [5, -1] and be.finished_slots.shape == (8,)
    be.finish_limits = SimpleNamespace(filter=lambda *a: 1 / 0)  # a broken step: off, with a warning
    fg._warned.clear()  # warned once per process; another test may have warned already
    with caplog.at_level("WARNING"):
        assert fg.guard_steps(be, steps, None, None)[0] is steps
    assert "finish guard off" in caplog.text
