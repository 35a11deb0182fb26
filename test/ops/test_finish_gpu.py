"""GPU test of the device finish rule's kernels (python3 -m pytest -q -m gpu test on the H200)."""
import pytest

from finish_cases import compare_finish_rule

pytestmark = pytest.mark.gpu


def test_finish_rule_kernels_match_the_reference_on_cuda():
    compare_finish_rule("cuda")
