"""GPU test of the no-draft step's preparation kernel (lumotree.ops.decode_prep; the interpreter run covers it on the
CPU: interpret_kernels.py)."""
import pytest

from decode_prep_cases import compare_decode_prep

pytestmark = pytest.mark.gpu


def test_decode_prep_kernel_matches_the_reference_on_cuda():
    compare_decode_prep("cuda")
