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
