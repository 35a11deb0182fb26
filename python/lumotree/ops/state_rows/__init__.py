"""Copying whole state rows between a prefill's chunk states and the state pool (a prompt-interior state kept for the
radix cache, :mod:`lumotree.sglang.prompt_state`): ``naive.py`` (torch indexing, the definition) and ``triton.py``
(one launch); :mod:`lumotree.ops` dispatches between them."""
import math


def rows_contiguous_layout(shape, strides) -> bool:
    """:func:`rows_contiguous` of a tensor of ``shape`` and ``strides`` (e.g. ``h.shape[1:]``, ``h.stride()[1:]``: a
    view's, without making it). Each row is contiguous as ``torch.Tensor.is_contiguous`` reads it (dimensions of size
    1 at any stride; an empty row is contiguous), and rows do not overlap. Why from the layout: a GDN layer's prefill
    checks its chunk states and its pool on every tracked prefill, and the views these checks made (``x[0]``, ~10 a
    layer) were host work on a prefill whose forward waits for its host (27B shapes at batch 1, one H100: the prefill's
    GPU idle 84 % of the forward)."""
    if len(shape) < 1:
        return False
    row = tuple(shape[1:])
    size = math.prod(row)
    if shape[0] > 1 and strides[0] < size:
        return False
    if shape[0] == 0 or size == 0:
        return True
    expected = 1
    for n, st in zip(reversed(row), reversed(tuple(strides[1:]))):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def rows_contiguous(x) -> bool:
    """Whether each row ``x[j]`` (dim 0) of ``x`` is one contiguous block, the rows at any stride: the layout the
    kernel copies (a prefill's chunk states, one layer's view of the state pool; not SGLang's page-major envelope)."""
    return rows_contiguous_layout(tuple(x.shape), x.stride())
