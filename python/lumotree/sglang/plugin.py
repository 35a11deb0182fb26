"""``register()``: the SGLang entry point of LumoTree (group ``sglang.srt.plugins``).

What it registers (idempotent; SGLang calls it in the launcher and again in every scheduler
process):

- ``SpeculativeAlgorithm.register("LUMOTREE", ...)`` with :class:`LumoTreeSpecAlgo`: the model's
  own MTP layer drafts a tree exactly as ``NEXTN`` does (SGLang's EAGLE V2 worker), and the
  hybrid GDN layers are verified and committed by LumoTree (:mod:`lumotree.sglang.backend`):
  no per-node state snapshots are allocated.
- When a LUMOTREE server is being started (``LUMOTREE_SGLANG_ACTIVE=1``, set by
  :meth:`LumoTreeSpecAlgo.handle_server_args` in the launcher and inherited by the scheduler
  processes), the backend classes are installed through SGLang's ``HookRegistry``
  (:mod:`lumotree.sglang.patches.gdn_backend_classes`), and greedy tree verification runs
  LumoTree's fused selection op (:mod:`lumotree.sglang.patches.verify_tree_greedy`). Other
  launches are untouched.

``LUMOTREE_SUFFIX`` (:mod:`lumotree.sglang.suffix`) is the model-free variant: SGLang's NGRAM loop
with LumoTree's suffix-tree drafter, for agent workloads and for models without an MTP layer.

With ``--enable-deterministic-inference`` a LUMOTREE / LUMOTREE_SUFFIX server verifies
*decode-exactly* (:mod:`lumotree.sglang.exact`): every draft node is computed as the one-token decode
at its position, so greedy outputs equal the server without speculation (same flags) token for token.

Validation (:func:`validate_server_args`) fails at argument parsing, before any weights load:
non-hybrid models, unsupported layer types (named), a model without an MTP layer, and flags
LUMOTREE cannot honour (also those the decode-exact mode cannot: :func:`lumotree.sglang.exact.validate`).
"""
from __future__ import annotations

import logging
import os

from lumotree.sglang.scheduling import consistent_prefix_cache, turns_overlap_off  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

ALGORITHM = "LUMOTREE"
SUFFIX_ALGORITHM = "LUMOTREE_SUFFIX"  # model-free suffix drafting, no MTP head needed
ENV_ACTIVE = "LUMOTREE_SGLANG_ACTIVE"
GDN_LAYER_TYPES = {"linear_attention"}
SUPPORTED_LAYER_TYPES = {"linear_attention", "full_attention", "attention"}  # SGLang names full attention "attention"
HYBRID_MODEL_TYPES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"}
MAX_DRAFT_TOKENS = 64  # the tree-masked chunk verify holds a request's tree as one [N, N] block
# The merged MTP + suffix tree, removed: on the agent benchmark (8 agents, one H200 shared by five servers) it served
# 0.83x no speculation against LUMOTREE_SUFFIX's 1.34x and LUMOTREE's 0.92x (benchmark/results/exact_agents_h200.json)
REMOVED_ENV = {"LUMOTREE_SUFFIX_MERGE": "the merged MTP + suffix draft tree was removed: it served slower than "
                                        f"--speculative-algorithm {SUFFIX_ALGORITHM} alone (0.83x no speculation "
                                        f"against 1.34x at 8 agents); serve that, or {ALGORITHM} for the MTP tree",
               "LUMOTREE_SUFFIX_MERGE_SLOTS": "the merged MTP + suffix draft tree it sized was removed"}

_registered = False


def _text_config(cfg):
    return getattr(cfg, "text_config", None) or cfg


def check_model_config(hf_config, model_path: str = "the model", require_mtp: bool = True,
                       algorithm: str = ALGORITHM) -> None:
    """Raise ``ValueError`` unless ``hf_config`` is a hybrid GDN model LUMOTREE can serve."""
    cfg = _text_config(hf_config)
    mtype = getattr(cfg, "model_type", None)
    archs = getattr(hf_config, "architectures", None) or [mtype]
    # SGLang's Qwen3-Next / Qwen3.5 configs derive the layer pattern (``layers_block_type``) from
    # full_attention_interval; other configs carry transformers' ``layer_types``
    types = list(getattr(cfg, "layers_block_type", None) or getattr(cfg, "layer_types", None) or [])
    if not any(t in GDN_LAYER_TYPES for t in types):
        raise ValueError(
            f"--speculative-algorithm {algorithm} serves hybrid Gated DeltaNet models (Qwen3.5, Qwen3-Next); "
            f"{model_path} is {archs[0]} (model_type={mtype!r}) with no 'linear_attention' layers. "
            f"Use NEXTN/EAGLE for this model.")
    bad = sorted(set(types) - SUPPORTED_LAYER_TYPES)
    if bad:
        where = [i for i, t in enumerate(types) if t in bad]
        raise ValueError(
            f"--speculative-algorithm {algorithm}: {model_path} has layer types {bad} (layers {where[:8]}"
            f"{'...' if len(where) > 8 else ''}); LumoTree's backend serves only 'linear_attention' "
            f"(Gated DeltaNet) and 'full_attention' layers.")
    if mtype not in HYBRID_MODEL_TYPES:
        raise ValueError(f"--speculative-algorithm {algorithm}: model_type {mtype!r} is not a Qwen3.5 / Qwen3-Next "
                         f"hybrid ({sorted(HYBRID_MODEL_TYPES)}); its GDN layers may differ.")
    mtp = getattr(cfg, "mtp_num_hidden_layers", None) or getattr(cfg, "num_nextn_predict_layers", None) or 0
    if require_mtp and mtp < 1:
        raise ValueError(
            f"--speculative-algorithm {algorithm} drafts with the model's own MTP layer, and {model_path} has none "
            f"(mtp_num_hidden_layers / num_nextn_predict_layers unset or 0); --speculative-algorithm "
            f"{SUFFIX_ALGORITHM} drafts without one.")


def validate_server_args(server_args, algorithm: str = ALGORITHM) -> None:
    """Early, clear errors. Runs inside ``ServerArgs.__post_init__`` (before weights load)."""
    sa = server_args
    if sa.speculative_draft_model_path not in (None, sa.model_path):
        source = "the target's own MTP layer" if algorithm == ALGORITHM else "suffix tries"
        raise ValueError(f"--speculative-algorithm {algorithm} drafts with {source}; "
                         f"--speculative-draft-model-path ({sa.speculative_draft_model_path}) is not supported.")
    check_model_config(sa.get_model_config().hf_config, sa.model_path, require_mtp=algorithm == ALGORITHM,
                       algorithm=algorithm)
    if getattr(sa, "enable_linear_replayssm", False):
        raise ValueError(f"--speculative-algorithm {algorithm} is incompatible with --enable-linear-replayssm "
                         "(the decode ring owns the same state storage with another protocol).")
    if getattr(sa, "speculative_adaptive", False):
        if algorithm not in (ALGORITHM, SUFFIX_ALGORITHM):
            raise ValueError(f"--speculative-adaptive: the adaptive tree size serves --speculative-algorithm "
                             f"{ALGORITHM} and {SUFFIX_ALGORITHM}; {algorithm} drafts a fixed tree size.")
        # LUMOTREE's and LUMOTREE_SUFFIX's tree size is adaptive by default (lumotree.sglang.adaptive); SGLang's
        # own controller (EAGLE chains) must not run as well
        object.__setattr__(sa, "speculative_adaptive", False)
    if getattr(sa, "disaggregation_mode", "null") not in (None, "null"):
        raise ValueError(f"--speculative-algorithm {algorithm} does not support PD disaggregation "
                         f"(--disaggregation-mode {sa.disaggregation_mode}).")
    if getattr(sa, "pp_size", 1) != 1:
        raise ValueError(f"--speculative-algorithm {algorithm} does not support pipeline parallelism (--pp-size).")
    if algorithm != ALGORITHM and getattr(sa, "speculative_ngram_max_bfs_breadth", 2) < 2:
        # SGLang hands the GDN backend the tree links only when topk (= the BFS breadth) > 1, and
        # the suffix drafter branches whatever the breadth
        raise ValueError(f"--speculative-algorithm {algorithm} drafts trees: --speculative-ngram-max-bfs-breadth "
                         f"must be >= 2 (got {sa.speculative_ngram_max_bfs_breadth}).")
    n = sa.speculative_num_draft_tokens
    if n is not None and n > MAX_DRAFT_TOKENS:
        raise ValueError(f"--speculative-num-draft-tokens {n}: LUMOTREE verifies trees of at most "
                         f"{MAX_DRAFT_TOKENS} nodes per request.")
    dtype = getattr(sa, "mamba_ssm_dtype", None)
    if dtype not in (None, "float32"):
        raise ValueError(f"--speculative-algorithm {algorithm} keeps the GDN state in fp32 "
                         f"(got --mamba-ssm-dtype {dtype}).")
    for name, why in REMOVED_ENV.items():
        if name in os.environ:
            raise ValueError(f"{name} is set: {why}. Unset it.")
    if sa.device not in ("cuda", None):
        raise ValueError(f"--speculative-algorithm {algorithm} runs its GDN kernels on CUDA (got --device {sa.device}).")
    from lumotree.sglang import exact

    if exact.exact_mode(sa):
        exact.validate(sa, algorithm)


def configure_server_args(server_args) -> None:
    """LUMOTREE's own settings, applied after SGLang's EAGLE/NEXTN handling.

    * ``enable_linear_replayssm_spec = True``: SGLang's only pool layout without the per-node
      ``intermediate_ssm`` snapshot buffer. The ring buffers that layout keeps per state slot are
      released by LumoTree's backend, which keeps the draft tokens' raw k, v, g, beta -- the replay
      commit's input -- in its own scratch, one row per running request
      (:func:`lumotree.sglang.backend.adopt_pool`); SGLang's chain-only fold is switched off. Set
      here, after SGLang's linear-chain-only check of the flag, which applies to its fold and not
      to LumoTree's tree verify.
    * ``mamba_ssm_dtype = float32`` (state math in fp32).
    * ``LUMOTREE_SGLANG_ACTIVE=1`` so the scheduler processes install the backend classes.
    * :func:`consistent_prefix_cache`: the ``no_buffer`` state cache when the radix cache is on (overlap kept).
    * :func:`~lumotree.sglang.scheduling.check_prefill_delayer`: ``--enable-prefill-delayer`` refused, by name, on a
      server that runs the synchronous scheduler.
    """
    server_args.enable_linear_replayssm_spec = True
    if server_args.mamba_ssm_dtype is None:
        server_args.mamba_ssm_dtype = "float32"
    os.environ[ENV_ACTIVE] = "1"
    consistent_prefix_cache(server_args)
    from lumotree.sglang.scheduling import check_prefill_delayer

    check_prefill_delayer(server_args)  # after the scheduler is chosen
    logger.info("LumoTree: tree verify with boundary-free chunk kernel + accepted-path replay commit; "
                "no per-node SSM snapshots (num_draft_tokens=%s, topk=%s)",
                server_args.speculative_num_draft_tokens, server_args.speculative_eagle_topk)


def _worker_factory(server_args):
    """The worker: SGLang's EAGLE V2 worker (MTP drafting, tree building, selection, KV bookkeeping),
    with LumoTree's backend doing the GDN verify and commit underneath, and the adaptive tree size
    (:mod:`lumotree.sglang.worker`)."""
    if getattr(server_args, "enable_multi_layer_eagle", False):
        from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2

        return MultiLayerEagleWorkerV2
    from lumotree.sglang.worker import worker_class

    return worker_class()  # adaptive where adaptive_tree_size allows it, else the configured tree


def _answer_as(builtin: str):
    """``__getattr__`` for a plugin algorithm: SGLang's scheduler also calls builtin-specific methods
    that CustomSpecAlgo does not declare (e.g. ``carries_draft_hidden_states``); answer them as the
    builtin algorithm ``builtin`` does."""
    def __getattr__(self, name):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(getattr(SpeculativeAlgorithm, builtin), name)

    return __getattr__


def _spec_class():
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class LumoTreeSpecAlgo(CustomSpecAlgo):
        """Behaves as EAGLE/NEXTN in SGLang's scheduler (``is_eagle``), so drafting, tree building
        and KV handling follow the NEXTN path; the GDN state path is LumoTree's."""

        def is_eagle(self) -> bool:
            return True

        def need_topk(self) -> bool:
            return True

        __getattr__ = _answer_as("EAGLE")

        def handle_server_args(self, server_args) -> None:
            from sglang.srt.arg_groups.speculative_hook import _handle_eagle_family

            from lumotree.sglang.capacity import take_running_cap

            take_running_cap(server_args, ALGORITHM)  # before SGLang's, which sets 48 where the flag is absent
            _handle_eagle_family(server_args)
            configure_server_args(server_args)
            from lumotree.sglang.worker import take_no_speculation_graph_sizes

            take_no_speculation_graph_sizes(server_args)
            from lumotree.sglang.adaptive import (adaptive_tree_size, candidate_steps, check_fixed_tree_config,
                                                  policy_settings)
            from lumotree.sglang.request_choice import settings_of

            if adaptive_tree_size(server_args):  # a bad --speculative-adaptive-config fails here
                logger.info("LumoTree: adaptive tree size over %s draft steps (0 = no draft), %s",
                            candidate_steps(server_args), policy_settings(server_args))
                settings_of(server_args)  # LUMOTREE_SUFFIX's alone: a LUMOTREE server with it fails here
            else:
                check_fixed_tree_config(server_args)  # asking a fixed-tree server to choose fails here

    return LumoTreeSpecAlgo


def validate_suffix_server_args(server_args) -> None:
    validate_server_args(server_args, SUFFIX_ALGORITHM)


SUFFIX_TOKENS_ENV = "LUMOTREE_SUFFIX_TOKENS_PER_STEP"
SUFFIX_TOKENS_PER_STEP = 1024  # the default of SUFFIX_TOKENS_ENV
NGRAM_DEFAULT_RUNNING = 48  # what SGLang's NGRAM argument handling sets when --max-running-requests is absent
SUFFIX_MAX_NODES = 32


def default_suffix_budget(server_args, env=os.environ) -> None:
    """``LUMOTREE_SUFFIX`` without ``--speculative-num-draft-tokens``: draft-tree sizes per batch bucket
    (:mod:`lumotree.sglang.suffix_sizes`), :func:`lumotree.drafters.suffix.adaptive_budget` of each bucket up to
    ``--max-running-requests`` with ``LUMOTREE_SUFFIX_TOKENS_PER_STEP`` (default 1,024) verify tokens per step, at
    most ``SUFFIX_MAX_NODES`` (32) -- 32 nodes for batches of up to 32 requests, 16 at 33-64, 8 at 65-128, 4 from
    129 on. The server's ``--speculative-num-draft-tokens`` becomes the largest of them (SGLang's NGRAM loop, its
    graphs and its KV allocation are for that one); the table is kept on ``server_args`` for the worker, which
    builds a verify state for each smaller size. Why 1,024: at 32 concurrent agents (tiny model, H200, the servers
    taking turns in one run, ``docs/performance.md``) 32-node trees served 1.22x no speculation against 1.17x with
    the 16 nodes that 512 tokens gave, faster in each of the three repeats, p95 turn latency 0.95 s against 1.19
    (confirmed over five repeats on another machine: 1.07x). The cap: the served verify at 64 nodes costs 4-6x that
    at 16 (``served_forms_h200.json``, the GDN verify at 27B heads), while with the drafter's current settings 64 nodes
    would draft 18 / 16 % more tokens per step at 1 / 8 agents on the flags-alone token streams (CPU replay,
    ``benchmark/drafters/acceptance_replay.py --nodes 32,64``); 64 nodes not served yet (``agents_bench.py``
    configuration ``lumotree-suffix-64``). An explicit flag is kept as given: one size at every batch."""
    if server_args.speculative_num_draft_tokens is not None:
        return
    from lumotree.sglang.suffix_sizes import SIZES_ATTR, bucket_sizes

    raw = env.get(SUFFIX_TOKENS_ENV, str(SUFFIX_TOKENS_PER_STEP))
    try:
        tokens = int(raw)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise ValueError(f"{SUFFIX_TOKENS_ENV} must be a positive integer (verify tokens per step), got {raw!r}")
    running = server_args.max_running_requests or NGRAM_DEFAULT_RUNNING
    sizes = bucket_sizes(running, tokens, max_nodes=SUFFIX_MAX_NODES, min_nodes=4)
    server_args.speculative_num_draft_tokens = max(sizes.values())
    setattr(server_args, SIZES_ATTR, sizes)
    logger.info("LUMOTREE_SUFFIX: draft nodes per request by batch bucket %s (%d verify tokens per step over up to "
                "%d running requests; set --speculative-num-draft-tokens for one size)", sizes, tokens, running)


def _suffix_worker_factory(server_args):
    from lumotree.sglang.suffix import worker_class

    return worker_class()


def _suffix_spec_class(lumotree_backend: bool = True, size_tree: bool = True):
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class LumoTreeSuffixSpecAlgo(CustomSpecAlgo):
        """Behaves as NGRAM in SGLang's scheduler (draft-free loop, host drafting); the drafts come
        from LumoTree's suffix tries (or the benchmark oracle) and the GDN state path is LumoTree's
        (``lumotree_backend``) or SGLang's own."""

        def is_ngram(self) -> bool:
            return True

        def has_draft_kv(self) -> bool:
            return False

        __getattr__ = _answer_as("NGRAM")

        def handle_server_args(self, server_args) -> None:
            from sglang.srt.arg_groups.speculative_hook import _handle_ngram

            from lumotree.sglang.suffix import DEFAULT_CONTEXT

            if server_args.speculative_ngram_max_trie_depth == 18:  # SGLang's default: too short a context
                server_args.speculative_ngram_max_trie_depth = DEFAULT_CONTEXT
            if size_tree:  # LUMOTREE_SUFFIX (the benchmark oracles keep SGLang's NGRAM defaults)
                default_suffix_budget(server_args)
            _handle_ngram(server_args)
            if lumotree_backend:
                configure_server_args(server_args)
            if size_tree:
                from lumotree.sglang.scheduling import default_prefill_delayer

                default_prefill_delayer(server_args)  # after configure_server_args: it reads the scheduler chosen
                from lumotree.sglang.adaptive import (adaptive_tree_size, candidate_steps, check_fixed_tree_config,
                                                      policy_settings)
                from lumotree.sglang.request_choice import settings_of

                if adaptive_tree_size(server_args):  # a bad --speculative-adaptive-config fails here
                    by_requests = settings_of(server_args)
                    logger.info("LUMOTREE_SUFFIX: adaptive, %s per decode step (0 = no draft, 1 = the suffix tree), %s%s",
                                candidate_steps(server_args), policy_settings(server_args),
                                "" if by_requests is None else f", chosen by each request's acceptance: {by_requests}")
                else:
                    check_fixed_tree_config(server_args)  # asking a fixed-tree server to choose fails here

    return LumoTreeSuffixSpecAlgo


def _register_oracle(SpeculativeAlgorithm, get_spec, p: float) -> None:
    """Benchmark-only controlled-acceptance algorithms (lumotree.sglang.oracle), when
    ``LUMOTREE_BENCH_ORACLE_P`` is set: LUMOTREE_ORACLE (LumoTree's GDN path) and NGRAM_ORACLE
    (SGLang's own), same NGRAM loop, trees and acceptance."""
    from lumotree.sglang import oracle

    for name, ours in (("LUMOTREE_ORACLE", True), ("NGRAM_ORACLE", False)):
        if get_spec(name) is None:
            SpeculativeAlgorithm.register(
                name, supports_overlap=True,
                validate_server_args=(lambda sa, n=name: validate_server_args(sa, n)) if ours else None,
                spec_class=_suffix_spec_class(lumotree_backend=ours, size_tree=False))(lambda sa: oracle.worker_class(p))


def register() -> None:
    """Entry point. Idempotent."""
    global _registered
    if _registered:
        return
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    if get_spec(ALGORITHM) is None:
        SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=True, validate_server_args=validate_server_args,
                                      spec_class=_spec_class())(_worker_factory)
    if get_spec(SUFFIX_ALGORITHM) is None:
        SpeculativeAlgorithm.register(SUFFIX_ALGORITHM, supports_overlap=True,
                                      validate_server_args=validate_suffix_server_args,
                                      spec_class=_suffix_spec_class())(_suffix_worker_factory)
    from lumotree.sglang.patches import no_buffer_overlap  # SGLang's check, unchanged for all but LumoTree's overlap servers

    no_buffer_overlap.install()
    # the prefill delayer on one rank: its gather skipped, its verdict on a pass with nothing to prefill built without
    # tensors, and asked before the scheduler's ranking: every launch
    from lumotree.sglang.patches import prefill_delayer_early, prefill_delayer_gather, prefill_delayer_idle

    prefill_delayer_gather.install()
    prefill_delayer_idle.install()
    prefill_delayer_early.install()
    if os.environ.get(ENV_ACTIVE) == "1":  # before the step timer's hook on the same method, which then times it too
        from lumotree.sglang.patches import future_map_cold_rows, future_map_host_lengths, state_slots_as_no_spec

        future_map_host_lengths.install()
        future_map_cold_rows.install()
        state_slots_as_no_spec.install()
    if os.environ.get("LUMOTREE_BENCH_ORACLE_P"):
        _register_oracle(SpeculativeAlgorithm, get_spec, float(os.environ["LUMOTREE_BENCH_ORACLE_P"]))
    from lumotree.sglang import draft_oracle  # benchmark only: a no-op unless LUMOTREE_BENCH_DRAFT_ORACLE_P is set

    draft_oracle.install()
    from lumotree.sglang import draft_timing  # benchmark only: a no-op unless LUMOTREE_BENCH_DRAFT_TIMING=1

    draft_timing.install()
    from lumotree.sglang import step_timing  # benchmark only: a no-op unless LUMOTREE_BENCH_STEP_TIMING=1

    step_timing.install()
    from lumotree.sglang import jit_log  # benchmark only: a no-op unless LUMOTREE_BENCH_JIT_LOG=1

    jit_log.install()
    from lumotree.sglang import stall_dump  # benchmark only: a no-op unless LUMOTREE_BENCH_STALL_DUMP_S is set

    stall_dump.install()
    if os.environ.get(ENV_ACTIVE) == "1":
        from lumotree.sglang.patches import (draft_tree_whole, eagle_sample_end, gdn_backend_classes,
                                             prompt_state_batch, prompt_state_cache, prompt_state_run,
                                             verify_tree_greedy)

        gdn_backend_classes.install()
        draft_tree_whole.install()
        verify_tree_greedy.install()
        eagle_sample_end.install()
        # prompt-interior states in the no_buffer radix cache (lumotree.sglang.prompt_state)
        prompt_state_batch.install()
        prompt_state_run.install()
        prompt_state_cache.install()
    _registered = True
