"""``rows_contiguous`` read from the layout (no views) against its definition on views: every row ``x[j]`` one
contiguous block (``torch.Tensor.is_contiguous``) and rows not overlapping."""
import itertools

import pytest
import torch

from lumotree.ops.state_rows import rows_contiguous, rows_contiguous_layout


def by_views(x) -> bool:
    """The definition, on a view of the first row."""
    return (x.dim() >= 1 and (x.shape[0] <= 1 or x.stride(0) >= x[0].numel())
            and (x.shape[0] == 0 or x[0].is_contiguous()))


def layouts():
    base = torch.zeros(4, 3, 5, 6)
    yield "contiguous", base
    yield "pool layer view", torch.zeros(2, 4, 3, 5, 6)[1]
    yield "chunk states h[0]", torch.zeros(1, 4, 3, 5, 6)[0]
    yield "row slice (rows at a larger stride)", base[::2]
    yield "last dims swapped", base.transpose(2, 3)
    yield "swapped then made contiguous then swapped back", base.transpose(2, 3).contiguous().transpose(2, 3)
    yield "column slice", base[:, :, :, :3]
    yield "one row", base[:1]
    yield "no rows", base[:0]
    yield "empty rows", torch.zeros(4, 0, 5)
    yield "size-1 dims at odd strides", torch.zeros(4, 1, 5, 1).as_strided((4, 1, 5, 1), (5, 99, 1, 7))
    yield "expanded rows (stride 0: overlapping)", torch.zeros(1, 3, 5).expand(4, 3, 5)
    yield "rows overlapping by a stride smaller than a row", torch.zeros(40).as_strided((4, 3, 2), (3, 2, 1))
    yield "two rows overlapping", torch.zeros(10).as_strided((2, 3, 2), (3, 2, 1))
    yield "empty rows at odd strides", torch.zeros(1).as_strided((4, 0, 5), (5, 3, 7))
    yield "one-dimensional", torch.zeros(7)
    yield "one-dimensional strided", torch.zeros(14)[::2]
    yield "scalar", torch.zeros(())
    for perm in itertools.permutations(range(4)):
        yield f"permuted {perm}", base.permute(*perm)


@pytest.mark.parametrize("name,x", list(layouts()), ids=[n for n, _ in layouts()])
def test_layout_reading_matches_the_definition_on_views(name, x):
    assert rows_contiguous(x) == by_views(x) == rows_contiguous_layout(tuple(x.shape), x.stride())


def test_a_view_s_layout_needs_no_view():
    """``h[0]`` of chunk states ``[1, chunks, Hv, V, K]`` read from ``h.shape[1:]``, ``h.stride()[1:]``."""
    h = torch.zeros(1, 4, 3, 5, 6)
    assert rows_contiguous_layout(tuple(h.shape[1:]), h.stride()[1:]) == by_views(h[0]) is True
    g = torch.zeros(1, 4, 3, 6, 5).transpose(3, 4)
    assert rows_contiguous_layout(tuple(g.shape[1:]), g.stride()[1:]) == by_views(g[0]) is False
