"""GPU test of the device finish rule's kernels (python3 -m pytest -q -m gpu test on the H200): the Triton kernels and
the CUDA ops (csrc/finish/finish.cu; the device's install builds the extension, so a missing op fails here)."""
import pytest
import torch

from finish_cases import compare_finish_rule

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("impl", ["triton", "cuda"])
def test_finish_rule_kernels_match_the_reference_on_cuda(impl):
    from lumotree import ops

    if impl == "cuda":
        assert ops.cuda_op("mark_finished") and ops.cuda_op("mask_finished"), "the CUDA extension lacks the finish ops"
    compare_finish_rule("cuda", impl)


def test_finish_ops_are_the_cuda_ones_where_built_and_refuse_bad_inputs():
    from lumotree import ops
    from lumotree.ops.finish import cuda

    assert ops.cuda_op("mark_finished")
    done = torch.zeros(4, dtype=torch.bool, device="cuda")
    rows = torch.tensor([1, 2], device="cuda")
    idx = torch.tensor([5, 6], device="cuda")
    done[2] = True
    ops.mask_finished(idx, done, rows)  # the dispatch (CUDA op where built)
    assert idx.tolist() == [5, -1]
    with pytest.raises(RuntimeError, match="int32 or int64"):
        cuda.mask_finished(idx.float(), done, rows)
    with pytest.raises(RuntimeError, match="must be on"):
        cuda.mask_finished(idx, done, rows.cpu())
