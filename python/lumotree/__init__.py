"""LumoTree: tree speculative decoding for hybrid (Gated DeltaNet + attention) language models.

Environment variables:
    LUMOTREE_OPS         ``naive`` forces the fp32 reference ops even on CUDA tensors, and the Python
                         suffix drafter instead of the C++ one.
    LUMOTREE_NO_EXTENSION  (build time) skip compiling the extensions in csrc/ (CUDA selection, C++ drafter).
    LUMOTREE_DEMO_MODEL  checkpoint directory ``lumotree demo`` uses (default: the repository's
                         benchmark/models/tiny-hybrid when present).
    LUMOTREE_BENCH_ORACLE_P  benchmark only: registers the controlled-acceptance algorithms
                         LUMOTREE_ORACLE / NGRAM_ORACLE with this per-token acceptance probability.
    LUMOTREE_BENCH_DRAFT_ORACLE_P  benchmark only: LUMOTREE and NEXTN servers' MTP drafts rewritten
                         before each verify so that each level is accepted with this probability
                         (``lumotree.sglang.draft_oracle``).
    LUMOTREE_BENCH_DRAFT_TIMING  ``1`` (benchmark only): NGRAM and LUMOTREE_SUFFIX servers log the host
                         time of each step's draft preparation per batch bucket
                         (``lumotree.sglang.draft_timing``; ``agents_bench.py --draft-timing``).
    LUMOTREE_BENCH_JIT_LOG  ``1`` (benchmark only): a server logs every Triton kernel it compiles, with
                         the time it took (``lumotree.sglang.jit_log``; ``agents_bench.py --jit-log``).
    LUMOTREE_BENCH_STEP_TIMING  ``1`` (benchmark only): any server logs its decode steps' wall time on the
                         scheduler's thread by parts (``lumotree.sglang.step_timing``; ``bench_spec.py
                         --step-timing``); ``LUMOTREE_BENCH_STEP_TIMING_EVERY=N``: samples per logged median
                         (default 128).
    LUMOTREE_BENCH_STALL_DUMP_S  ``S`` (benchmark only): a server dumps its threads' stacks when a
                         scheduler call (``run_batch``, ``process_batch_result``) runs over S seconds
                         (``lumotree.sglang.stall_dump``; ``bench_spec.py --diagnose``).
    LUMOTREE_SGLANG_CHECK  ``1`` (diagnostics, with ``--disable-cuda-graph``): every served verify
                         and commit is cross-checked against SGLang's own tree-verify kernel;
                         ``LUMOTREE_SGLANG_CHECK_REPORT=FILE`` / ``LUMOTREE_SGLANG_CHECK_DUMP=DIR``
                         write the report / the failing inputs. LUMOTREE_SUFFIX servers then also
                         verify full attention with LumoTree's kernel (checked against SGLang's).
    LUMOTREE_SUFFIX_TOKENS_PER_STEP  verify tokens per step a LUMOTREE_SUFFIX server sizes its draft
                         tree for when ``--speculative-num-draft-tokens`` is not given (default 1024:
                         tree = 1024 / batch nodes per batch bucket, a power of two in [4, 32]).
    LUMOTREE_SGLANG_SELECT  ``0`` keeps SGLang's greedy tree verification in LUMOTREE servers
                         (default: LumoTree's fused selection op).
    LUMOTREE_SGLANG_ACTIVE  (set by the plugin, not by users) ``1`` while a LUMOTREE /
                         LUMOTREE_SUFFIX server starts: its scheduler processes install the backend.
"""
__version__ = "0.1.0"

from lumotree.tree import TreeDescriptor  # noqa: E402  (torch only; SGLang is imported lazily)

__all__ = ["TreeDescriptor", "__version__"]
