"""A finished request's state is never advanced: the length limits, the step mask, the worker mixin."""
from types import SimpleNamespace

import torch

from lumotree.sglang import finish_guard as fg


def req(prompt_len, max_new):
    return SimpleNamespace(origin_input_ids=[0] * prompt_len, sampling_params=SimpleNamespace(max_new_tokens=max_new))


def test_length_limits_and_the_step_mask():
    reqs = [req(10, 4), req(7, 1), req(3, None)]
    assert fg.length_limits(reqs) == [13, 7, fg.NO_LIMIT]
    # pre-verify KV length = prompt + outputs - 1 (the last output is the next input): request 0 with
    # 3 outputs (12) is running, with 4 (13) it is complete; request 1 is complete after its prefill
    steps = torch.tensor([5, 2, 3])
    limits = torch.tensor(fg.length_limits(reqs))
    assert fg.unfinished_steps(steps, torch.tensor([12, 7, 10**6]), limits).tolist() == [5, -1, 3]
    assert fg.unfinished_steps(steps, torch.tensor([13, 6, 0]), limits).tolist() == [-1, 2, 3]
    # padded batches: only the first len(steps) rows count
    assert fg.unfinished_steps(steps[:2], torch.tensor([0, 0, 99]), limits).tolist() == [5, 2]


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
    return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: decode), reqs=[req(5, 2), req(4, 9)],
                           seq_lens=torch.tensor([5, 4]))


def test_the_worker_hands_the_limits_to_lumotree_backend_per_decode_step():
    cls = fg.guarded(FakeWorker)
    assert fg.guarded(FakeWorker) is cls and issubclass(cls, FakeWorker) and cls.__mro__[1] is fg.FinishGuard
    lin = SimpleNamespace(lumotree=True, finish_limits=None)
    w = cls(lin)
    b = batch()
    assert w.forward_batch_generation(b) == "result"
    got_batch, limits = w.seen[-1]
    assert got_batch is b and limits.tolist() == [6, 12] and lin.finish_limits is None
    w.forward_batch_generation(batch(decode=False))  # prefill: nothing to guard
    assert w.seen[-1] is None
    try:
        w.forward_batch_generation(b, fail=True)
    except RuntimeError:
        pass
    assert lin.finish_limits is None  # cleared even when the step fails
    other = SimpleNamespace(lumotree=False, finish_limits=None)  # SGLang's own backend (the oracle baseline)
    w2 = cls(other)
    w2.forward_batch_generation(b)
    assert w2.seen[-1] is None
