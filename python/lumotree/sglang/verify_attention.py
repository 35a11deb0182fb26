"""Full-attention verify of LUMOTREE's chains through SGLang's split-KV verify kernel, on CUDA.

Why: SGLang's Triton backend verifies a draft's full-attention layers with its *prefill* kernel
(``extend_attention_fwd``): per request and query head it walks the whole prefix serially, its query
tile padded for 4 draft tokens. On the H200 (27B shapes, batch 32, 3-step chain) its 8 calls took
2.0-2.4 ms of a drafted step whose kernels take ~17.5 ms, against 0.18 ms for a decode step's attention
(``benchmark/results/profile_steps_h200.json``: ``_fwd_kernel`` against ``_fwd_grouped_kernel_stage1``;
``profile_bs32_h200.json``).
SGLang 0.5.17 ships a flash-decode style kernel for exactly this case -- a causal chain (topk 1):
``sglang.kernels.ops.attention.verify_splitkv``, the prefix split across parallel programs and merged
by log-sum-exp with the draft-draft block -- but enables it only on AMD gfx95 (``use_verify_splitkv``;
its kernels are written to run on NVIDIA too). LumoTree's default tree is that chain.

What: for a LUMOTREE server whose verify tree is a chain (``--speculative-eagle-topk 1``; not the
merged MTP + suffix tree, not the decode-exact mode, which has its own attention) each hybrid backend
of the target model turns ``use_verify_splitkv`` on for its Triton full-attention backend, after a
start-up check on the device (:func:`check_on_device`): the kernel, run eagerly and replayed from a
CUDA graph, must equal ``extend_attention_fwd`` on a small problem of the model's head shapes, and be
the faster of the two on a batch-32 verify (timed there, from CUDA graphs). A failed check leaves
SGLang's path and logs why, with the times. The kernel's scratch starts finite
(:mod:`lumotree.sglang.patches.verify_splitkv_scratch`).

Greedy outputs of the default mode may differ from SGLang's prefill-kernel path in the last bits (a
different summation order); the decode-exact mode is unaffected. Memory: the kernel's fp32 scratch is
``max requests x query heads x splits (16 under CUDA graphs) x 4 x head_dim`` floats per draft length,
allocated at the first verify (27B shapes, 128 requests: 192 MB), outside SGLang's static memory share.
**Not yet measured served**: whether the served step gets faster, and by how much, is open.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional, Tuple

import torch

logger = logging.getLogger(__name__)

CHECK_ATOL = 3e-2  # bf16 outputs of N(0, 1) keys and values: rounding is ~4e-3


def applies(server_args) -> bool:
    """Whether a server's verify tree is a chain LUMOTREE may verify with the split-KV kernel."""
    from lumotree.sglang.exact import exact_mode
    from lumotree.sglang.scheduling import merge_enabled

    algo = (getattr(server_args, "speculative_algorithm", None) or "").upper()
    return (algo == "LUMOTREE" and (getattr(server_args, "speculative_eagle_topk", None) or 1) == 1
            and not exact_mode(server_args) and not merge_enabled())


def enable(hybrid_backend, server_args) -> bool:
    """Turn SGLang's split-KV verify on for ``hybrid_backend``'s full-attention backend where it
    applies and the device check passes; returns whether it is on."""
    fa = hybrid_backend.full_attn_backend
    if not applies(server_args) or type(fa).__name__ != "TritonAttnBackend" or not hybrid_backend.full_attn_layers:
        return False
    if getattr(fa, "use_verify_splitkv", False):
        return True
    layer = hybrid_backend.full_attn_layers[0]
    kbuf, vbuf = fa.token_to_kv_pool.get_key_buffer(layer), fa.token_to_kv_pool.get_value_buffer(layer)
    if not kbuf.is_cuda:
        return False
    ok, why = check_on_device(fa.num_head, kbuf.shape[-2], kbuf.shape[-1], vbuf.shape[-1], kbuf.dtype,
                              str(kbuf.device))
    fa.use_verify_splitkv = ok
    if ok:
        logger.info("LumoTree: chain verify attention by SGLang's split-KV kernel (%s)", why)
    else:
        logger.warning("LumoTree: SGLang's split-KV verify kernel not used (%s); chain verify attention by its "
                       "prefill kernel", why)
    return ok


@functools.lru_cache(maxsize=None)
def check_on_device(h_q: int, h_kv: int, head_dim: int, v_head_dim: int, dtype, device: str,
                    n: int = 4) -> Tuple[bool, str]:
    """The split-KV verify against ``extend_attention_fwd`` at these head shapes and ``n`` draft tokens:
    equal on a small chain problem (3 requests, prefixes of 5 / 37 / 300 keys), eagerly and replayed from
    a CUDA graph, and faster on a batch-32 verify of 512-token prefixes (each kernel timed from a CUDA
    graph). Returns ``(ok, what was seen)``; any exception is a failed check."""
    try:
        return _check(h_q, h_kv, head_dim, v_head_dim, dtype, torch.device(device), n)
    except Exception as e:  # a kernel that does not compile or capture here: SGLang's path stays
        return False, f"check raised {type(e).__name__}: {str(e)[:300]}"


def _check(h_q, h_kv, head_dim, v_head_dim, dtype, device, n) -> Tuple[bool, str]:
    small = ChainProblem(h_q, h_kv, head_dim, v_head_dim, dtype, device, n, prefixes=(5, 37, 300))
    small.prefill()
    out = torch.full_like(small.ref, float("nan"))
    if not small.split_kv(out):
        return False, "the kernel declined the problem (can_handle)"
    eager = _gap(out, small.ref)
    graph = _captured(lambda: small.split_kv(out))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize(device)
    replayed = _gap(out, small.ref)
    if eager is None or replayed is None or max(eager, replayed) > CHECK_ATOL:
        return False, f"max |split-KV - prefill kernel| {eager} eager, {replayed} from a CUDA graph (tolerance {CHECK_ATOL})"
    # and faster, on a batch-32 verify of 512-token prefixes, each kernel replayed from a CUDA graph
    big = ChainProblem(h_q, h_kv, head_dim, v_head_dim, dtype, device, n, prefixes=(512,) * 32)
    big.prefill()
    t_split = graph_ms(lambda: big.split_kv(big.out), device)
    t_prefill = graph_ms(big.prefill, device)
    return t_split < t_prefill, (f"equal to the prefill kernel within {max(eager, replayed):.1e}; batch 32 x 512 "
                                 f"keys: {t_split * 1e3:.1f} us against {t_prefill * 1e3:.1f} us")


class ChainProblem:
    """A causal chain verify of ``n`` draft tokens a request (:func:`chain_problem`), run by either kernel."""

    def __init__(self, h_q, h_kv, head_dim, v_head_dim, dtype, device, n, prefixes):
        (self.q, self.k, self.v, self.kb, self.vb, self.qo, self.kvp, self.kvi), self.ref = chain_problem(
            h_q, h_kv, head_dim, v_head_dim, dtype, device, n, prefixes=prefixes, pool=max(512, 2 * sum(prefixes)))
        self.out = torch.empty_like(self.ref)
        self.chain = (None, True, None, n, 1.0, 1.0)  # no custom mask, causal, n tokens a request, no fp8 scales

    def prefill(self) -> None:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        extend_attention_fwd(self.q, self.k, self.v, self.ref, self.kb, self.vb, self.qo, self.kvp, self.kvi, *self.chain)

    def split_kv(self, out) -> bool:
        from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

        return verify_splitkv_fwd(self.q, self.k, self.v, out, self.kb, self.vb, self.qo, self.kvp, self.kvi,
                                  *self.chain, max_bs=self.qo.shape[0] - 1)


def _captured(fn, times: int = 1):
    fn()  # compiles, allocates the kernel's scratch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads' CUDA calls unaffected
        for _ in range(times):
            fn()
    return graph


def graph_ms(fn, device, calls: int = 10, replays: int = 5) -> float:
    """Milliseconds per call of ``fn``, ``calls`` of it captured in one CUDA graph (no launch gaps)."""
    graph = _captured(fn, calls)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / (calls * replays)


def chain_problem(h_q, h_kv, head_dim, v_head_dim, dtype, device, n, prefixes=(5, 37, 300), pool=512, seed=0):
    """``(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices)`` of a causal chain verify (``n``
    draft tokens a request) and an output buffer: random keys and values in a pool of ``pool`` slots,
    each request's prefix at scattered slots."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bs = len(prefixes)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    kb, vb = rnd(pool, h_kv, head_dim), rnd(pool, h_kv, v_head_dim)
    perm = torch.randperm(pool, generator=g)
    starts = torch.tensor((0,) + tuple(prefixes)).cumsum(0)
    kv_indices = torch.cat([perm[int(starts[i]):int(starts[i + 1])] for i in range(bs)]).to(device, torch.int64)
    kv_indptr = starts.to(device, torch.int32)
    qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=device)
    q, k, v = rnd(bs * n, h_q, head_dim), rnd(bs * n, h_kv, head_dim), rnd(bs * n, h_kv, v_head_dim)
    out = torch.empty(bs * n, h_q, v_head_dim, dtype=dtype, device=device)
    return (q, k, v, kb, vb, qo_indptr, kv_indptr, kv_indices), out


def _gap(out: torch.Tensor, ref: torch.Tensor) -> Optional[float]:
    if not torch.isfinite(out).all():
        return None
    return float((out.float() - ref.float()).abs().max())
