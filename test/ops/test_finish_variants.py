"""The finish rule's kernels compile one variant whatever the offset of the step inputs SGLang hands them: Triton's own
argument binder for sm_90 (no GPU needed) gives the same compile key for step inputs on and off the 16-byte grid."""
import pytest
import torch

triton = pytest.importorskip("triton")


class _Ptr:
    """What Triton's binder reads of a tensor argument: its address and dtype."""

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def _binder(kernel):
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(kernel.signature, kernel.params, CUDABackend(GPUTarget("cuda", 90, 32)))


# per kernel: its arguments (name -> dtype, or an int), and its constexprs
u8, i32, i64 = torch.uint8, torch.int32, torch.int64
CASES = {
    "mark_finished_fwd_kernel": (dict(p_done=u8, p_stop=i64, p_max_len=i64, p_ruled=u8, p_rows=i64, p_tok=i32,
                                      p_acc=i32, p_len=i64, p_live=u8, stride=4, stop_stride=16),
                                 dict(S=16, BLOCK_J=4, HAS_LIVE=True)),
    "clamp_run_fwd_kernel": (dict(p_stop=i64, p_max_len=i64, p_ruled=u8, p_rows=i64, p_seq=i64, p_predict=i32,
                                  p_acc=i32, p_index=i64, p_out=i32, W=4, stop_stride=16),
                             dict(S=16, BLOCK_W=4)),
    "mask_finished_fwd_kernel": (dict(p_idx=i32, p_done=u8, p_rows=i64, n=8, idx_stride=1), dict(BLOCK=256)),
}


def _key(kernel, args, consts, off_grid):
    bound = [(_Ptr(0x10000 + (4 if name in off_grid else 0), a) if isinstance(a, torch.dtype) else a)
             for name, a in args.items()]
    return _binder(kernel)(*bound, **consts)[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_step_input_off_the_16_byte_grid_compiles_no_new_variant(name):
    from lumotree.ops.finish import triton as ft

    kernel, (args, consts) = getattr(ft, name), CASES[name]
    assert list(args) == [p.name for p in kernel.params if not p.is_constexpr]  # the cases follow the signature
    inputs = ft.STEP_INPUTS[name]
    assert set(inputs) < set(args)
    base = _key(kernel, args, consts, ())
    for arg in inputs:  # each step input alone, then all of them, off the grid
        assert _key(kernel, args, consts, (arg,)) == base, arg
    assert _key(kernel, args, consts, inputs) == base
    # the finish tables are LumoTree's own allocations: still specialised (the check above can tell)
    table = next(a for a, t in args.items() if isinstance(t, torch.dtype) and a not in inputs)
    assert _key(kernel, args, consts, (table,)) != base
