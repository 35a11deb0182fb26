"""GPU: after ``lumotree.sglang.warmup.warm_spec_decode_slots``, SGLang's speculative-decode slot writes at any batch
size up to the pool's rows, with their slots aligned or 8 bytes off, compile nothing more (Triton's in-memory kernel
cache of ``assign_req_to_token_pool`` does not grow) and write what they should."""
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_slot_writes_after_the_warmup_compile_nothing():
    pytest.importorskip("sglang")
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool, assign_req_to_token_pool_func
    from triton.runtime import driver

    from lumotree.sglang import warmup

    rows, pool_len = 40, 96
    table = torch.zeros(rows, pool_len, dtype=torch.int32, device="cuda")
    pool = type("Pool", (), {"req_to_token": table})()
    out = warmup.warm_spec_decode_slots(pool)
    assert out["buckets"] == [1, 2, 4, 8, 16, 32, 64]
    cache = assign_req_to_token_pool.device_caches[driver.active.get_current_device()][0]
    compiled = len(cache)
    assert compiled >= out["variants"]
    free = torch.arange(1, 10_000, dtype=torch.int64, device="cuda")  # an allocator's free list
    taken = 0
    for bs in (1, 3, 5, 8, 17, 40):
        for skip in (0, 1):  # the slots a view at an even or an odd offset of the free list
            taken += skip
            req = torch.arange(bs, dtype=torch.int64, device="cuda")
            cur = torch.full((bs,), 2, dtype=torch.int32, device="cuda")
            nxt = cur + 3
            slots = free[taken:taken + 3 * bs]
            assert (slots.data_ptr() % 16 == 0) == (taken % 2 == 0)
            assign_req_to_token_pool_func(req, table, cur, nxt, slots, bs)
            torch.cuda.synchronize()
            assert torch.equal(table[:bs, 2:5].reshape(-1).long(), slots), bs
            taken += 3 * bs
    assert len(cache) == compiled  # every call found its kernel compiled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_verify_kernels_after_the_warmup_compile_nothing():
    """After ``warm_verify_kernels`` at widths 1 and 4, the verify's slot kernel, bonus-token kernel and run clamp at
    those widths and any batch size compile nothing more (their Triton caches do not grow) and give what they
    should."""
    pytest.importorskip("sglang")
    from sglang.kernels.ops.speculative.cache_locs import (assign_extend_cache_locs_uniform,
                                                           assign_extend_cache_locs_uniform_func)
    from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens, fill_bonus_tokens_func
    from triton.runtime import driver

    from lumotree.ops.finish.triton import clamp_run_fwd_kernel
    from lumotree.sglang import warmup
    from lumotree.sglang.finish import FinishedRows

    rows, pool_len = 40, 96
    table = torch.arange(rows * pool_len, dtype=torch.int32, device="cuda").view(rows, pool_len)
    pool = type("Pool", (), {"req_to_token": table})()
    out = warmup.warm_verify_kernels(pool, [1, 4], [1, 4])
    assert out is not None and out["draft_tokens"] == [1, 4]
    dev = driver.active.get_current_device()
    caches = [k.device_caches[dev][0] for k in (assign_extend_cache_locs_uniform, fill_bonus_tokens,
                                                 clamp_run_fwd_kernel)]
    sizes = [len(c) for c in caches]
    fin = FinishedRows.of(pool)
    for bs in (1, 3, 8):
        for n in (1, 4):
            req = torch.arange(bs, dtype=torch.int64, device="cuda")
            seq = torch.full((bs,), 5, dtype=torch.int64, device="cuda")
            loc = assign_extend_cache_locs_uniform_func(req, table, seq, bs, n, "cuda")
            predict = torch.arange(bs * n, dtype=torch.int32, device="cuda")
            idx = torch.arange(bs * n, dtype=torch.int32, device="cuda").view(bs, n)
            acc = torch.full((bs,), n, dtype=torch.int32, device="cuda")
            bonus = torch.empty(bs, dtype=torch.int32, device="cuda")
            fill_bonus_tokens_func(predict[idx], acc, bonus, n, bs)
            new = fin.clamp_run(req, seq, predict, acc, idx)  # no row is ruled: nothing cut
            torch.cuda.synchronize()
            assert torch.equal(loc.view(bs, n).long(), table[:bs, 5:5 + n].long()), (bs, n)
            assert torch.equal(bonus, predict.view(bs, n)[:, -1]) and torch.equal(new, acc), (bs, n)
    assert [len(c) for c in caches] == sizes  # every call found its kernel compiled
