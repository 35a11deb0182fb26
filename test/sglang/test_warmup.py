"""The start-up compile of SGLang's speculative-decode slot kernel (``lumotree.sglang.warmup``), without a GPU: the
buckets, and that its compile-only calls carry what Triton specialises a real call of SGLang's on -- each pointer's
dtype and 16-byte alignment, and the two ``tl.constexpr`` values -- for the calls SGLang's own decode preparation
(``eagle_prepare_for_decode``, driven here on the CPU) makes at every batch size."""
from types import SimpleNamespace

import pytest
import torch

from lumotree.sglang import warmup


def test_buckets_reach_the_pools_rows():
    assert warmup.buckets(1) == [1]
    assert warmup.buckets(2) == [1, 2]
    assert warmup.buckets(443) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert warmup.buckets(512)[-1] == 512 and warmup.buckets(513)[-1] == 1024


def test_nothing_is_compiled_for_a_pool_off_the_gpu():
    calls = []
    kernel = SimpleNamespace(warmup=lambda *a, **k: calls.append(a))
    pool = SimpleNamespace(req_to_token=torch.zeros(4, 16, dtype=torch.int32))
    assert warmup.warm_spec_decode_slots(pool, kernel=kernel) is None and calls == []
    assert warmup.warm_spec_decode_slots(SimpleNamespace(), kernel=kernel) is None and calls == []


class _OnDevice(torch.Tensor):
    """A CPU tensor that reads as a CUDA one (the warm-up's check), so that its calls can be recorded here."""

    @property
    def is_cuda(self):
        return True


def key(args):
    """What Triton specialises a call on: per tensor its dtype and whether its pointer is 16-byte aligned; the
    constexpr values (the kernel's last two parameters) as they are."""
    *ptrs, pool_len, bs_upper = args
    return tuple((t.dtype, t.data_ptr() % 16 == 0) for t in ptrs), pool_len, bs_upper


def warmed(rows, pool_len):
    calls = []
    kernel = SimpleNamespace(warmup=lambda *a, grid: calls.append((key(a), grid)))
    table = torch.Tensor._make_subclass(_OnDevice, torch.zeros(rows, pool_len, dtype=torch.int32))
    out = warmup.warm_spec_decode_slots(SimpleNamespace(req_to_token=table), kernel=kernel)
    assert all(grid == (1,) for _, grid in calls)
    return out, {k for k, _ in calls}


def test_a_kernel_that_cannot_be_compiled_ahead_leaves_the_server_starting(caplog):
    """SGLang's kernel changed (another signature, say): the warm-up says so and returns; the server starts."""
    def warmup_call(*a, grid):
        raise TypeError("warmup() got an unexpected argument")
    table = torch.Tensor._make_subclass(_OnDevice, torch.zeros(8, 16, dtype=torch.int32))
    with caplog.at_level("WARNING", logger="lumotree.sglang.warmup"):
        out = warmup.warm_spec_decode_slots(SimpleNamespace(req_to_token=table),
                                            kernel=SimpleNamespace(warmup=warmup_call))
    assert out is None and "could not be compiled ahead (TypeError" in caplog.text


def test_every_bucket_is_compiled_for_both_alignments_of_the_slots():
    out, keys = warmed(443, 64)
    assert out["buckets"] == warmup.buckets(443) and out["variants"] == 20 and len(keys) == 20
    assert {k[2] for k in keys} == set(warmup.buckets(443)) and {k[1] for k in keys} == {64}
    assert {k[0][4][1] for k in keys} == {True, False}  # out_cache_loc, aligned and 8 bytes off
    assert all(all(a for _, a in k[0][:4]) for k in keys)  # the others aligned


@pytest.mark.parametrize("bs, allocated", [(1, 0), (3, 0), (5, 1), (8, 1), (100, 3)])
def test_the_warmed_keys_hold_the_calls_sglangs_decode_preparation_makes(monkeypatch, bs, allocated):
    """SGLang's ``eagle_prepare_for_decode`` on a batch of ``bs`` requests, its allocator's free list advanced by
    ``allocated`` slots before (an odd count leaves the slots 8 bytes off 16): the kernel call it makes is one of the
    warmed ones."""
    pytest.importorskip("sglang")
    import sglang.srt.mem_cache.allocation as allocation
    import sglang.srt.speculative.eagle_utils as eu
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    seen = []

    class Launch:
        def __getitem__(self, grid):
            return lambda *args: seen.append(key(args))

    monkeypatch.setattr(allocation, "_is_cpu", False)  # the CUDA path: SGLang's Triton kernel (recorded)
    monkeypatch.setattr(allocation, "assign_req_to_token_pool", Launch())
    monkeypatch.setattr(eu, "get_alloc_reserve_per_decode", lambda *a: 4)
    pool_len, rows = 64, 128
    allocator = TokenToKVPoolAllocator(4096, torch.int32, "cpu", kvcache=None, need_sort=False)
    if allocated:
        allocator.alloc(allocated)
    table = torch.zeros(rows, pool_len, dtype=torch.int32)
    req_to_token_pool = SimpleNamespace(req_to_token=table, write=lambda *a: None)
    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=2), kv_committed_len=2, decode_batch_idx=0)
            for _ in range(bs)]
    batch = SimpleNamespace(
        maybe_evict_swa=lambda: None, batch_size=lambda: bs, reqs=reqs, device="cpu",
        sampling_info=SimpleNamespace(penalizer_orchestrator=SimpleNamespace(is_required=False)),
        token_to_kv_pool_allocator=allocator, req_to_token_pool=req_to_token_pool,
        tree_cache=SimpleNamespace(token_to_kv_pool_allocator=allocator, evict=lambda *a, **k: None,
                                   is_tree_cache=lambda: False, supports_mamba=lambda: False),
        req_pool_indices=torch.tensor(list(range(1, bs + 1)), dtype=torch.int64))
    monkeypatch.setattr(allocation, "evict_from_tree_cache", lambda *a, **k: None)
    try:
        eu.eagle_prepare_for_decode(batch)
    except Exception:  # what follows the allocation needs a real batch; the kernel call is made by then
        pass
    assert len(seen) == 1, seen
    _, keys = warmed(rows, pool_len)
    assert seen[0] in keys, (seen[0], sorted(keys, key=str)[:4])
    assert seen[0][2] == warmup.buckets(bs)[-1]
    assert seen[0][0][4][1] == (allocated % 2 == 0)  # the slots' alignment follows the free list's offset


def test_the_verify_kernels_are_launched_at_every_width_on_one_scratch_row():
    """``warm_verify_kernels``: the slot kernel once per draft-token count, the bonus token and the run clamp once per
    accepted-run width, each on one row of the dtypes a served verify hands them (SGLang's ``eagle_prepare_for_verify``
    and ``eagle_verify_step``: int64 rows and lengths, int32 tokens, accept lengths and accept index); off the GPU,
    nothing."""
    calls = []

    def assign(**k):
        calls.append(("assign", k["draft_token_num"], k["batch_size"], k["req_pool_indices"].dtype,
                      k["start_offset"].dtype, k["req_to_token"] is table))

    def fill(tokens, acc, bonus, stride, bs):
        calls.append(("fill", stride, bs, tuple(tokens.shape), tokens.dtype, acc.dtype, bonus.dtype))

    def clamp(rows, seq, predict, acc, index):
        calls.append(("clamp", tuple(index.shape), rows.dtype, seq.dtype, predict.dtype, acc.dtype, index.dtype))

    table = torch.Tensor._make_subclass(_OnDevice, torch.zeros(8, 16, dtype=torch.int32))
    out = warmup.warm_verify_kernels(SimpleNamespace(req_to_token=table), [4, 1, 4], [1, 4], funcs=(assign, fill, clamp))
    assert out["draft_tokens"] == [1, 4] and out["accept_widths"] == [1, 4]
    i64, i32 = torch.int64, torch.int32
    assert calls == [("assign", 1, 1, i64, i64, True), ("assign", 4, 1, i64, i64, True),
                     ("fill", 1, 1, (1, 1), i32, i32, i32), ("clamp", (1, 1), i64, i64, i32, i32, i32),
                     ("fill", 4, 1, (1, 4), i32, i32, i32), ("clamp", (1, 4), i64, i64, i32, i32, i32)]
    calls.clear()
    cpu = SimpleNamespace(req_to_token=torch.zeros(8, 16, dtype=torch.int32))
    assert warmup.warm_verify_kernels(cpu, [1], [1], funcs=(assign, fill, clamp)) is None and calls == []


def test_verify_kernels_that_cannot_be_launched_ahead_leave_the_server_starting(caplog):
    def assign(**k):
        raise TypeError("assign_extend_cache_locs_uniform_func() got an unexpected keyword argument")

    table = torch.Tensor._make_subclass(_OnDevice, torch.zeros(8, 16, dtype=torch.int32))
    with caplog.at_level("WARNING", logger="lumotree.sglang.warmup"):
        out = warmup.warm_verify_kernels(SimpleNamespace(req_to_token=table), [1], [1],
                                         funcs=(assign, None, None))
    assert out is None and "could not be compiled ahead (TypeError" in caplog.text


def _slot_pool(fuse=True, on_device=True):
    """A mamba pool as ``warm_slot_copies`` reads it: whether it fuses its slot ops, and its conv descriptor."""
    def t(*values):
        x = torch.tensor(values, dtype=torch.int64)
        return torch.Tensor._make_subclass(_OnDevice, x) if on_device else x
    desc = SimpleNamespace(ptr=t(1 << 20, 2 << 20), feat=t(24576, 96), layer_stride=t(9000, 9000),
                           slot_stride=t(30, 30), max_feat_blocks=24)
    return SimpleNamespace(_should_fuse_slot_ops=lambda: fuse, _conv_slot_desc=desc)


def _binder(kernel):
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(kernel.signature, kernel.params, CUDABackend(GPUTarget("cuda", 90, 32)))


def test_the_mamba_slot_kernels_are_compiled_for_every_variant_their_index_offsets_select():
    """SGLang's fused slot copy and clear, warmed through their own signatures: the compile keys Triton's sm_90 binder
    gives the warmed arguments are every key an index tensor on or off the 16-byte grid can select (copy: source and
    destination, 4; clear: 2), and nothing is launched."""
    pytest.importorskip("triton")
    from sglang.srt.mem_cache import mamba_slot_fused as msf

    calls = {"copy": [], "clear": []}
    fake = {k: SimpleNamespace(warmup=lambda *a, grid, _k=k: calls[_k].append(a)) for k in calls}
    out = warmup.warm_slot_copies(_slot_pool(), copy_kernel=fake["copy"], clear_kernel=fake["clear"], block=msf._BLOCK)
    assert out["variants"] == 6 and len(calls["copy"]) == 4 and len(calls["clear"]) == 2
    for name, kernel in (("copy", msf._fused_slot_copy_kernel), ("clear", msf._fused_slot_clear_kernel)):
        bind = _binder(kernel)
        keys = {repr(bind(*a)[1]) for a in calls[name]}
        assert len(keys) == len(calls[name]), name  # each warmed call a variant of its own
        idx = [i for i, p in enumerate(kernel.params) if not p.is_constexpr][4:]  # the slot-index pointers
        assert [kernel.params[i].name for i in idx] == (["src_arr", "dst_arr"] if name == "copy" else ["index_arr"])
        seen = {tuple(calls[name][j][i].data_ptr() % 16 == 0 for i in idx) for j in range(len(calls[name]))}
        assert len(seen) == 2 ** len(idx), (name, seen)  # every alignment combination of the indices


def test_the_mamba_slot_kernels_are_not_warmed_where_the_pool_does_not_fuse_them():
    calls = []
    k = SimpleNamespace(warmup=lambda *a, grid: calls.append(a))
    assert warmup.warm_slot_copies(_slot_pool(fuse=False), k, k, 1024) is None
    assert warmup.warm_slot_copies(_slot_pool(on_device=False), k, k, 1024) is None
    assert warmup.warm_slot_copies(None, k, k, 1024) is None and calls == []
