"""Which SGLang scheduler a LumoTree server runs: with the radix cache on, the synchronous one and the
``no_buffer`` state cache, so that only committed GDN state is cached (:func:`consistent_prefix_cache`);
with ``LUMOTREE_OVERLAP=1`` a LUMOTREE or LUMOTREE_SUFFIX server runs SGLang's overlap scheduler with
the ``no_buffer`` cache instead, finished requests' states skipped on the device (:func:`overlap_requested`,
:mod:`lumotree.sglang.finish`).

A module of its own below :mod:`lumotree.sglang.plugin` and :mod:`lumotree.sglang.merge`, which both
need it.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

OVERLAP_ENV = "LUMOTREE_OVERLAP"


_OVERLAP_WHY = ("SGLang 0.5.17's overlap scheduler (its extra_buffer state cache) serves speculative requests cached "
                "hybrid states that differ from a fresh prefill (SGLang's NEXTN too)")


def turns_overlap_off(server_args, env=os.environ, warn: bool = False) -> bool:
    """Whether :func:`consistent_prefix_cache` turns the overlap scheduler off for these arguments (radix
    cache on, overlap on, no ``LUMOTREE_OVERLAP=1``, page size 1); ``warn``: say why not where it keeps it."""
    if getattr(server_args, "disable_radix_cache", False) or getattr(server_args, "disable_overlap_schedule", False):
        return False
    if env.get(OVERLAP_ENV) == "1":
        if warn and not overlap_requested(server_args, env):
            logger.warning("LumoTree: %s=1 keeps the overlap scheduler: %s.", OVERLAP_ENV, _OVERLAP_WHY)
        return False
    if (getattr(server_args, "page_size", None) or 1) > 1:
        if warn:
            logger.warning("LumoTree: --page-size %s needs SGLang's extra_buffer state cache and its overlap scheduler: "
                           "%s. Use --page-size 1 (or --disable-radix-cache) for consistent prefix caching.",
                           server_args.page_size, _OVERLAP_WHY)
        return False
    return True


def overlap_requested(server_args, env=os.environ) -> bool:
    """``LUMOTREE_OVERLAP=1`` on a LUMOTREE or LUMOTREE_SUFFIX server with the radix cache and SGLang's
    overlap scheduler on, page size 1: the overlap scheduler with LumoTree's consistent ``no_buffer``
    cache (:mod:`lumotree.sglang.finish`; both workers mark the rows each step finished)."""
    algo = str(getattr(server_args, "speculative_algorithm", None) or "").upper()
    return (env.get(OVERLAP_ENV) == "1" and algo in ("LUMOTREE", "LUMOTREE_SUFFIX")
            and not getattr(server_args, "disable_radix_cache", False)
            and not getattr(server_args, "disable_overlap_schedule", False)
            and (getattr(server_args, "page_size", None) or 1) == 1
            and not getattr(server_args, "enable_deterministic_inference", False)
            and not getattr(server_args, "enable_mixed_chunk", False))  # admission resets a batch's rows


def overlap_consistent(server_args, env=os.environ) -> bool:
    """Whether this (resolved) server runs the overlap scheduler with LumoTree's consistent cache: the
    request of :func:`overlap_requested` and SGLang's ``no_buffer`` state cache in force."""
    return overlap_requested(server_args, env) and getattr(server_args, "mamba_radix_cache_strategy", None) == "no_buffer"


def _declare(server_args, fields: dict, name: str) -> None:
    """Set ``fields`` on ``server_args`` as SGLang's argument pipeline declares them (a pass ``name``)."""

    def declared(view) -> dict:
        return dict(fields)

    declared.__name__ = declared.__qualname__ = name
    try:  # SGLang resolves these in a declaration pipeline (last writer wins), materialized after this hook
        from sglang.srt.arg_groups.overrides import run_post_process_pass

        run_post_process_pass(server_args, declared)
    except ImportError:  # an SGLang without the pipeline: plain fields
        pass
    for k, v in fields.items():
        object.__setattr__(server_args, k, v)


def consistent_prefix_cache(server_args, env=os.environ) -> bool:
    """Only committed GDN state is cached: with the radix cache on, a LumoTree server runs SGLang's
    synchronous scheduler with the ``no_buffer`` state-cache strategy (what SGLang's own ``auto``
    resolves to with ``--disable-overlap-schedule``). Returns whether it changed the arguments.

    Why: with the overlap scheduler SGLang 0.5.17 caches hybrid-model states through its
    ``extra_buffer`` strategy, and under speculative decoding the states it serves back from the
    cache differ from a fresh prefill of the same key -- SGLang's own NEXTN too
    (``benchmark/results/cache_consistency_h200.json``: NEXTN tree with overlap 15/16 and 11/16 first tokens,
    logprob gaps up to 1.59; NEXTN, LUMOTREE and LUMOTREE_SUFFIX without it 16/16, gaps <= 0.073, the
    no-speculation server's own spread is 0.091). ``LUMOTREE_OVERLAP=1`` keeps the overlap scheduler
    with the ``no_buffer`` cache and LumoTree's finished-row skip (:func:`overlap_requested`; returns
    True, the arguments changed) where it applies, else SGLang's overlap scheduler and its cache, with
    the inconsistency warned; ``--disable-radix-cache`` needs neither. ``--page-size`` > 1 needs SGLang's ``extra_buffer`` strategy: kept, with a warning."""
    if overlap_requested(server_args, env):
        _declare(server_args, dict(mamba_radix_cache_strategy="no_buffer"), "_lumotree_overlap_consistent_cache")
        logger.warning("LumoTree: %s=1: SGLang's overlap scheduler with the no_buffer state cache; the state of a "
                       "request that finished in the previous step is skipped by the step in flight "
                       "(lumotree.sglang.finish). Not yet validated on a served model.", OVERLAP_ENV)
        return True
    if not turns_overlap_off(server_args, env, warn=True):
        return False
    _declare(server_args, dict(disable_overlap_schedule=True, mamba_radix_cache_strategy="no_buffer"),
             "_lumotree_consistent_prefix_cache")
    logger.info("LumoTree: radix cache on, so the synchronous scheduler (--disable-overlap-schedule) with the "
                "no_buffer state cache: %s. %s=1 keeps the overlap scheduler.", _OVERLAP_WHY, OVERLAP_ENV)
    return True
