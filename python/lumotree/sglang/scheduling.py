"""Which SGLang scheduler a LumoTree server runs with the radix cache on: SGLang's overlap scheduler
with the ``no_buffer`` state cache, the state of each request a step finished skipped on the device by
the step in flight (:func:`overlap_applies`, :mod:`lumotree.sglang.finish`), so that only committed
GDN state is cached (:func:`consistent_prefix_cache`). Where that skip does not apply
(``--enable-mixed-chunk``, ``--enable-deterministic-inference``) the synchronous scheduler with the
same cache.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# the algorithms whose workers mark the rows each step finished (lumotree.sglang.finish.forward_marked)
OVERLAP_ALGORITHMS = ("LUMOTREE", "LUMOTREE_SUFFIX", "LUMOTREE_ORACLE")

_EXTRA_BUFFER_WHY = ("SGLang 0.5.17's overlap scheduler with its extra_buffer state cache serves speculative requests "
                     "cached hybrid states that differ from a fresh prefill (SGLang's NEXTN too)")


def _algorithm(server_args) -> str:
    return str(getattr(server_args, "speculative_algorithm", None) or "").upper()


def overlap_applies(server_args) -> bool:
    """Whether this server runs SGLang's overlap scheduler with LumoTree's consistent ``no_buffer`` cache:
    a LUMOTREE, LUMOTREE_SUFFIX or LUMOTREE_ORACLE server with the radix cache and the overlap scheduler on,
    page size 1, and none of what needs the synchronous one: ``--enable-mixed-chunk`` (admission resets a
    batch's rows), ``--enable-deterministic-inference``."""
    algo = _algorithm(server_args)
    if algo not in OVERLAP_ALGORITHMS:
        return False
    return not (getattr(server_args, "disable_radix_cache", False)
                or getattr(server_args, "disable_overlap_schedule", False)
                or (getattr(server_args, "page_size", None) or 1) > 1
                or getattr(server_args, "enable_deterministic_inference", False)
                or getattr(server_args, "enable_mixed_chunk", False))


def turns_overlap_off(server_args, warn: bool = False) -> bool:
    """Whether :func:`consistent_prefix_cache` turns the overlap scheduler off for these arguments: radix
    cache on, overlap on, page size 1, and :func:`overlap_applies` false. ``warn``: say why where a page
    size > 1 keeps SGLang's own (inconsistent) cache."""
    if getattr(server_args, "disable_radix_cache", False) or getattr(server_args, "disable_overlap_schedule", False):
        return False
    if (getattr(server_args, "page_size", None) or 1) > 1:
        if warn:
            logger.warning("LumoTree: --page-size %s needs SGLang's extra_buffer state cache and its overlap scheduler: "
                           "%s. Use --page-size 1 (or --disable-radix-cache) for consistent prefix caching.",
                           server_args.page_size, _EXTRA_BUFFER_WHY)
        return False
    return not overlap_applies(server_args)


def overlap_consistent(server_args) -> bool:
    """Whether this (resolved) server runs the overlap scheduler with LumoTree's consistent cache:
    :func:`overlap_applies` and SGLang's ``no_buffer`` state cache in force."""
    return overlap_applies(server_args) and getattr(server_args, "mamba_radix_cache_strategy", None) == "no_buffer"


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


def consistent_prefix_cache(server_args) -> bool:
    """Only committed GDN state is cached. With the radix cache on a LumoTree server takes SGLang's
    ``no_buffer`` state-cache strategy and keeps the overlap scheduler where :func:`overlap_applies`
    (the finished-row skip of :mod:`lumotree.sglang.finish`), else runs the synchronous scheduler
    (what SGLang's own ``auto`` resolves to with ``--disable-overlap-schedule``). Returns whether it
    changed the arguments.

    Why not SGLang's own pairing: with the overlap scheduler SGLang 0.5.17 caches hybrid-model states
    through its ``extra_buffer`` strategy, and under speculative decoding the states it serves back
    from the cache differ from a fresh prefill of the same key -- SGLang's own NEXTN too
    (``benchmark/results/cache_consistency_h200.json``). ``--disable-radix-cache`` needs neither;
    ``--page-size`` > 1 needs SGLang's ``extra_buffer`` strategy: kept, with a warning."""
    if overlap_applies(server_args):
        _declare(server_args, dict(mamba_radix_cache_strategy="no_buffer"), "_lumotree_overlap_consistent_cache")
        logger.info("LumoTree: radix cache on: SGLang's overlap scheduler with the no_buffer state cache; the state "
                    "of a request that finished in the previous step is skipped by the step in flight "
                    "(lumotree.sglang.finish).")
        return True
    if not turns_overlap_off(server_args, warn=True):
        return False
    _declare(server_args, dict(disable_overlap_schedule=True, mamba_radix_cache_strategy="no_buffer"),
             "_lumotree_consistent_prefix_cache")
    logger.info("LumoTree: radix cache on, and this server needs the synchronous scheduler (--enable-mixed-chunk or "
                "--enable-deterministic-inference): --disable-overlap-schedule with the no_buffer state cache.")
    return True


# LUMOTREE_SUFFIX's default prefill batching: SGLang's queue-based prefill delayer, a prefill held until a tenth of the
# running batch is queued, at most 20 ms (and SGLang's own cap of 30 scheduler passes)
PREFILL_DELAYER_QUEUE_MIN_RATIO = 0.1
PREFILL_DELAYER_MAX_DELAY_MS = 20.0


def default_prefill_delayer(server_args) -> bool:
    """A LUMOTREE_SUFFIX server batches its one-request prefills: SGLang's prefill delayer
    (``--enable-prefill-delayer --prefill-delayer-queue-min-ratio 0.1 --prefill-delayer-max-delay-ms 20``) unless
    the user gave any of those flags (``--prefill-delayer-max-delay-ms 0`` alone serves without it), on one GPU
    (``--tp-size`` / ``--dp-size`` / ``--pp-size`` 1: more ranks would gather the delayer's state on every pass), with
    the overlap scheduler (SGLang's delayer needs it) and no disaggregation. Returns whether it turned it on.

    Why: closed-loop agents send their next turn one at a time as their replies end, and every prefill stops the
    whole running batch; a server whose drafts make the sessions cycle faster meets more of them. At 32 concurrent
    agents (tiny model, H200, the servers taking turns in one run; ``docs/performance.md``) the delayer served
    LUMOTREE_SUFFIX 1.13x -> 1.27x no speculation (its prefill intervals 904 -> 539, their time 15.2 -> 9.9 s over
    three repeats) and p95 turn latency 1.37 -> 1.13 s (no speculation's 1.22), while no speculation with it made
    0.99x (p95 0.96 s). With the delayer's per-pass gather skipped on one GPU
    (:mod:`lumotree.sglang.patches.prefill_delayer_gather`) and its verdict asked before the waiting queue is ranked
    (:mod:`lumotree.sglang.patches.prefill_delayer_early`), LUMOTREE_SUFFIX served 1.39x no speculation and 1.44x
    SGLang's NGRAM at 16 draft tokens, p95 0.93 s against 1.04 (run ``32-agents-early-delayer``). Below ten running
    requests the queue trigger never holds a prefill (a tenth of the batch rounds to none). SGLang's slot trigger
    comes with the delayer (a prefill held up to 30 passes while fewer slots are free than the largest recent prefill
    batch): a default without it was served beside this one and made 32 agents 17 % slower, their p95 above no
    speculation's (runs ``32-agents-slot-trigger``, ``8-agents-slot-trigger``), and was removed."""
    if (getattr(server_args, "enable_prefill_delayer", False)
            or getattr(server_args, "prefill_delayer_queue_min_ratio", None) is not None
            or getattr(server_args, "prefill_delayer_max_delay_ms", None) is not None):
        return False
    if ((getattr(server_args, "tp_size", 1) or 1) > 1 or (getattr(server_args, "dp_size", 1) or 1) > 1
            or (getattr(server_args, "pp_size", 1) or 1) > 1 or getattr(server_args, "disable_overlap_schedule", False)
            or str(getattr(server_args, "disaggregation_mode", "null") or "null") != "null"):
        return False
    # plain fields: SGLang's declaration pipeline takes only the fields its publish gate lists, and no pass of it
    # writes these
    server_args.enable_prefill_delayer = True
    server_args.prefill_delayer_queue_min_ratio = PREFILL_DELAYER_QUEUE_MIN_RATIO
    server_args.prefill_delayer_max_delay_ms = PREFILL_DELAYER_MAX_DELAY_MS
    logger.info("LUMOTREE_SUFFIX: SGLang's prefill delayer on (queue min ratio %s, at most %s ms): one-request "
                "prefills batch; --prefill-delayer-max-delay-ms 0 alone serves without it",
                PREFILL_DELAYER_QUEUE_MIN_RATIO, PREFILL_DELAYER_MAX_DELAY_MS)
    return True


def check_prefill_delayer(server_args) -> None:
    """Raises ``ValueError`` naming the flag when ``--enable-prefill-delayer`` meets a server that runs without the
    overlap scheduler (``--disable-overlap-schedule``, or the synchronous scheduler LumoTree chooses for
    ``--enable-deterministic-inference`` / ``--enable-mixed-chunk``, :func:`consistent_prefix_cache`): SGLang 0.5.17's
    delayer asserts the overlap scheduler when the scheduler starts, after the weights load."""
    if getattr(server_args, "enable_prefill_delayer", False) and getattr(server_args, "disable_overlap_schedule", False):
        raise ValueError("--enable-prefill-delayer needs SGLang's overlap scheduler, and this server runs the "
                         "synchronous one (--disable-overlap-schedule, or LumoTree's choice for "
                         "--enable-deterministic-inference / --enable-mixed-chunk with the radix cache): drop "
                         "--enable-prefill-delayer")


def publish_prefill_early(batch, args: tuple, kwargs: dict) -> tuple:
    """A speculative worker's prefill under SGLang's overlap scheduler: publish the batch's lengths before its
    forward is launched, and return ``(args, kwargs)`` for SGLang's worker without the ``on_publish`` callback (it
    is called once, here). Any other batch, or no callback: ``(args, kwargs)`` unchanged.

    Why: before it launches a speculative step, the overlap scheduler waits for the previous step's publish of its
    lengths (``FutureMap.resolve_seq_lens_cpu``: a copy from the device gated on the publish event, then a host
    sync). SGLang's NGRAM worker publishes a prefill's lengths after its target forward (its EAGLE V2 worker after
    the target forward, before the draft-extend), so the next batch's preparation and launch wait for the whole
    prefill. A prefill's lengths are its input lengths (SGLang's speculative V2 convention: the length before this
    step's tokens), known before the forward. Device order is unchanged: the scheduler's stream waits for the
    forward before it writes anything the forward reads (its WAR barrier)."""
    positional = kwargs.get("on_publish") is None and bool(args)
    on_publish = args[0] if positional else kwargs.get("on_publish")
    mode = batch.forward_mode
    if on_publish is None or not mode.is_extend() or mode.is_target_verify():
        return args, kwargs
    from lumotree.sglang.patches.future_map_host_lengths import publish_known

    publish_known(on_publish, batch.seq_lens.clone(), getattr(batch, "req_pool_indices_cpu", None),
                  getattr(batch, "seq_lens_cpu", None))  # the host holds them: the next step need not wait for a copy
    if positional:
        return (None, *args[1:]), kwargs
    return args, {**kwargs, "on_publish": None}
