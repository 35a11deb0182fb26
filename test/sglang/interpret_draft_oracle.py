"""The draft oracle's kernels (lumotree.sglang.draft_oracle_kernels) in Triton's CPU interpreter
against its torch forms (called by test_draft_oracle.py in a subprocess: TRITON_INTERPRET must be set
before import)."""
import copy
import os
import random
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from lumotree.sglang import draft_oracle_kernels as kern  # noqa: E402
from test_draft_oracle import setup  # noqa: E402


def injection():
    changed = 0
    for n, levels, dt in ((6, 3, torch.int64), (8, 3, torch.int32), (4, 1, torch.int64), (16, 5, torch.int32)):
        rng = random.Random(n * 10 + levels)
        bs = 24
        oracle, truths, keys, rows, os_, trees, toks, pos = setup(rng, bs, n, levels, 0.7)
        oracle.row_plen[torch.tensor(rows)] += 1000
        draft = torch.tensor(sum(toks, []), dtype=dt)
        positions = torch.tensor(sum(pos, []), dtype=torch.int64)
        first = torch.tensor([t[2] for t in trees], dtype=torch.int32).view(bs, n)
        rows_t = torch.tensor(rows, dtype=torch.int32)
        d1, d2 = draft.clone(), draft.clone()
        plan1 = oracle.inject(d1, positions, first, rows_t, levels)
        plan2 = kern.inject(oracle, d2, positions, first, rows_t, levels)
        assert torch.equal(d1, d2), (n, levels, (d1 != d2).nonzero())
        assert torch.equal(plan1[0], plan2[0]) and torch.equal(plan1[1], plan2[1]), (n, levels)
        assert (plan1[0] >= 0).any()
        changed += int((d1 != draft).sum())
    assert changed > 0


def recording():
    rng = random.Random(3)
    oracle, *_ = setup(rng, 6, 4, 3, 0.7)
    o2 = copy.deepcopy(oracle)
    g = torch.Generator().manual_seed(4)
    for step in range(8):
        bs, stride = 5, 4
        rows = torch.randperm(6, generator=g)[:bs] + 2
        seq = torch.randint(7, 40, (bs,), generator=g)
        if step % 3 == 0:
            tokens = torch.randint(0, 50, (bs,), generator=g).to(torch.int32)
            oracle.record(rows, seq, tokens, None, 1, prefill=True)
            kern.record(o2, rows, seq, tokens, None, 1, prefill=True)
        else:
            tokens = torch.randint(0, 50, (bs * stride,), generator=g)
            acc = torch.randint(1, stride + 1, (bs,), generator=g).to(torch.int32)
            oracle.record(rows, seq, tokens, acc, stride, prefill=False)
            kern.record(o2, rows, seq, tokens, acc, stride, prefill=False)
        assert torch.equal(oracle.cont[:-1, :-1], o2.cont[:-1, :-1]), step
        assert torch.equal(oracle.filled[:-1], o2.filled[:-1]), step


def threshold():
    from lumotree.sglang.draft_oracle import uniform

    idx = torch.arange(5000)
    bits = (uniform(torch.tensor(12345), idx) * (1 << 24)).long()
    for p in (0.0, 0.3, 0.8, 1.0):
        assert torch.equal(uniform(torch.tensor(12345), idx) < p, bits < kern.threshold(p)), p


if __name__ == "__main__":
    threshold()
    injection()
    recording()
    print("oracle kernels == torch forms")
