"""GPU test of the finish rule's table on CUDA (``lumotree.sglang.finish.FinishedRows``): a prefill's admission --
one pinned block, one copy, index copies from its strided columns -- writes the same rows as on CPU, and a
prefill's marks with the table's ``ones`` equal those with fresh ones, and the rows they leave running are the
same (python3 -m pytest -q -m gpu on the H200)."""
import random

import pytest
import torch

pytest.importorskip("sglang")
from lumotree.sglang.finish import MAX_STOP_IDS, FinishedRows  # noqa: E402

from test_finish import make_req  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seed", range(3))
def test_admission_and_prefill_marks_on_cuda_equal_cpu(seed):
    rng = random.Random(seed)
    slots = 64
    cpu, gpu = FinishedRows(slots, "cpu"), FinishedRows(slots, "cuda")
    for t in (cpu, gpu):
        t.done.fill_(True)  # earlier requests' marks: admission resets them
        t.stop.fill_(7)
    for step in range(5):
        reqs = [make_req(rng, 100 * step + i) for i in range(rng.randint(1, 9))]
        pool = torch.tensor(rng.sample(range(slots), len(reqs)), dtype=torch.int32)
        cpu.admit(reqs, pool)
        gpu.admit(reqs, pool.cuda())
        toks = torch.tensor([rng.randrange(12) for _ in reqs])
        seq = torch.tensor([len(r.origin_input_ids) for r in reqs])
        cpu.mark_step(pool, toks, torch.ones(len(reqs), dtype=torch.int32), seq, 1)
        gpu.mark_step(pool.cuda(), toks.cuda(), gpu.ones[:len(reqs)], seq.cuda(), 1)
        assert torch.equal(cpu.step_live, gpu.step_live.cpu()), step  # the rows still running, from the same launch
    torch.cuda.synchronize()
    for name in ("stop", "max_len", "ruled", "done"):
        assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), name
    assert cpu.stop.shape == (slots, MAX_STOP_IDS) and bool(cpu.ruled.any())
