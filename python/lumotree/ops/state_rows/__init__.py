"""Copying whole state rows between a prefill's chunk states and the state pool (a prompt-interior state kept for the
radix cache, :mod:`lumotree.sglang.prompt_state`): ``naive.py`` (torch indexing, the definition) and ``triton.py``
(one launch); :mod:`lumotree.ops` dispatches between them."""


def rows_contiguous(x) -> bool:
    """Whether each row ``x[j]`` (dim 0) of ``x`` is one contiguous block, the rows at any stride: the layout the
    kernel copies (a prefill's chunk states, one layer's view of the state pool; not SGLang's page-major envelope)."""
    return (x.dim() >= 1 and (x.shape[0] <= 1 or x.stride(0) >= x[0].numel())
            and (x.shape[0] == 0 or x[0].is_contiguous()))
