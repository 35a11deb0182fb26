"""GPU test of the no-draft step's preparation (lumotree.ops.decode_prep): the Triton kernel (the interpreter run covers
it on the CPU: interpret_kernels.py) and the CUDA op (csrc/decode_prep/decode_prep.cu; the device's install builds the
extension, so a missing op fails here)."""
import pytest
import torch

from decode_prep_cases import compare_decode_prep

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("impl", ["triton", "cuda"])
def test_decode_prep_kernel_matches_the_reference_on_cuda(impl):
    from lumotree import ops

    if impl == "cuda":
        assert ops.cuda_op("decode_prep"), "the CUDA extension lacks decode_prep"
    compare_decode_prep("cuda", impl)


def test_decode_prep_op_refuses_bad_inputs():
    from lumotree.ops.decode_prep import cuda

    r2t = torch.arange(12, dtype=torch.int32, device="cuda").view(3, 4)
    rows, seq = torch.tensor([2], device="cuda"), torch.tensor([1], device="cuda")
    loc, new = cuda.decode_prep(r2t, rows, seq)
    assert loc.tolist() == [9] and new.tolist() == [2]
    with pytest.raises(RuntimeError, match="int32 or int64"):
        cuda.decode_prep(r2t, rows.float(), seq)
    with pytest.raises(ValueError, match="unit column stride"):
        cuda.decode_prep(r2t.t(), rows, seq)
    k = torch.ones(12, 8, device="cuda")
    with pytest.raises(ValueError, match="contiguous"):
        cuda.decode_prep(r2t, rows, seq, [(k[:, ::2], k[:, ::2])])
