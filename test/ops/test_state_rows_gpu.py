"""GPU test of the state-row copy kernel (lumotree.ops.state_rows; the interpreter run covers it on the CPU:
interpret_kernels.py)."""
import pytest

from state_rows_cases import compare_state_rows

pytestmark = pytest.mark.gpu


def test_state_row_copy_kernel_matches_the_reference_on_cuda():
    compare_state_rows("cuda")
