"""Patch: LumoTree's NGRAM-loop workers (LUMOTREE_SUFFIX, the benchmark's LUMOTREE_ORACLE) build the full
tree-verify mask in one pass instead of SGLang's per-request loop.

Why: SGLang 0.5.17's ``NGRAMWorker._prepare_for_speculative_decoding`` builds the verify's full attention
mask (``USE_FULL_MASK``) with four torch calls per request -- a ``[n, seq_len]`` float ``ones``, a host-to-device
copy of the request's tree block, a cat, a cast -- and one cat over the batch, on the scheduler's thread before
every verify (its own TODO: "the for loop here leads to significant overhead in large batch size"). With agent
traffic (32 requests, prompts of thousands of tokens) that is ~130 launches and 32 host copies per step, and
the float ``ones`` and cats were the largest GPU kernels of SGLang's NGRAM step in the 8-agent profile. The mask
is consumed only by SGLang's attention where it verifies (LumoTree's tree verify attention reads the ancestor
mask instead), but it must stay exact for those layers and for the in-server cross-check.

And where every full-attention layer of the server's verifies runs LumoTree's tree verify attention (the default
for LUMOTREE_SUFFIX on SGLang's Triton backend), no kernel reads the full mask at all: the layout is skipped
(:class:`lumotree.sglang.verify_attention.FullMaskUse`).

How: around SGLang's method, ``USE_FULL_MASK`` (a module constant of ``sglang.srt.speculative.ngram_worker``)
reads False for the call, so SGLang leaves the compact ``[B * n * n]`` tree mask in ``spec_info.custom_mask``;
then :func:`lumotree.tree.full_verify_mask` lays out the same full mask from it (one fill, one index copy, one
scatter), from the same host ``seq_lens_cpu`` SGLang's loop reads. Only for the workers that call
:func:`prepare_with_full_mask` (LumoTree's own algorithms; SGLang's NGRAM and the benchmark's NGRAM_ORACLE peer
keep SGLang's loop); where SGLang would not build the full mask (its CPU path, or the constant already False)
the method runs unchanged. The scheduler's thread is the only caller, so the constant is restored before anything
else reads it.

Remove when: SGLang builds the full mask without a per-request loop (or lets the attention backend take the
compact mask).
"""
from __future__ import annotations

import contextlib
import importlib

MODULE = "sglang.srt.speculative.ngram_worker"
TARGET = MODULE + ".USE_FULL_MASK"


@contextlib.contextmanager
def _compact_mask(module):
    old = module.USE_FULL_MASK
    module.USE_FULL_MASK = False
    try:
        yield
    finally:
        module.USE_FULL_MASK = old


def applies(module) -> bool:
    """Whether SGLang's method would build the full mask here (so there is a loop to replace)."""
    return bool(getattr(module, "USE_FULL_MASK", False)) and not getattr(module, "_is_cpu", True)


def prepare_with_full_mask(prepare, batch, draft_token_num: int, module=None, full: bool = True) -> None:
    """``prepare(batch)`` (SGLang's ``_prepare_for_speculative_decoding``) with the compact mask, then the
    full mask laid out in one pass into ``batch.spec_info.custom_mask``. ``full=False``: no attention kernel of the
    verify reads the full mask (:func:`lumotree.sglang.verify_attention.full_mask_unused`), so the compact
    ``[B * n * n]`` tree mask SGLang left stays there (the Triton backend copies it into its graph buffer, which
    no kernel then reads)."""
    if module is None:
        module = importlib.import_module(MODULE)
    if not applies(module):
        prepare(batch)
        return
    with _compact_mask(module):
        prepare(batch)
    if not full or not batch.forward_mode.is_target_verify():  # prefill / idle: SGLang built no verify input
        return
    from lumotree.sglang import step_timing
    from lumotree.tree import full_verify_mask

    t = step_timing.lap_size(None, 0, 0.0)  # timed only in the benchmark
    spec = batch.spec_info
    spec.custom_mask = full_verify_mask(spec.custom_mask, batch.seq_lens_cpu, draft_token_num)
    step_timing.lap_size("dv_mask", len(batch.seq_lens_cpu), t)
