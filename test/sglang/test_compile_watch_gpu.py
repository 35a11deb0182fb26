"""GPU: Triton calls the compile counter (``lumotree.sglang.compile_watch``) for each compile of a new
specialisation and not for a launch its in-memory cache serves."""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.gpu


@triton.jit
def _fill(out, value, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.full((BLOCK,), value, tl.float32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_each_new_specialisation_counts_once():
    from lumotree.sglang import compile_watch

    count = compile_watch.install()
    assert count is not None
    out = torch.empty(64, device="cuda")
    before = count()
    _fill[(1,)](out, 1.0, BLOCK=16)
    assert count() == before + 1
    _fill[(1,)](out, 2.0, BLOCK=16)  # the same specialisation: Triton's in-memory cache
    assert count() == before + 1
    _fill[(1,)](out, 3.0, BLOCK=32)  # a new constexpr: compiled
    torch.cuda.synchronize()
    assert count() == before + 2 and out[:32].eq(3.0).all()
