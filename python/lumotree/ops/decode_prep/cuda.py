"""A no-draft decode step's preparation as a registered CUDA op (``torch.ops.lumotree.decode_prep``,
csrc/decode_prep/decode_prep.cu): the definition is :mod:`lumotree.ops.decode_prep.naive`.

Why beside :mod:`lumotree.ops.decode_prep.triton`: it runs outside the CUDA graphs on every no-draft step, host-bound
at small batches, where a Triton launch cost the host 38 us a call on an H100 host
(``benchmark/results/launch_cost_h100.json``), a registered op's call a few. :func:`lumotree.ops.decode_prep` takes
this where the extension is built.
"""
from __future__ import annotations

import torch

from lumotree.ops.decode_prep.triton import outputs, zero_further


def decode_prep(req_to_token, req_pool_indices, seq_lens, zero_kv=()):
    loc, new, pairs = outputs(req_to_token, seq_lens, zero_kv)
    if pairs is None:
        return loc, new
    first = pairs[0] if pairs else (None, None)
    torch.ops.lumotree.decode_prep(req_to_token, req_pool_indices, seq_lens, loc, new, first[0], first[1])
    zero_further(pairs, loc)
    return loc, new
