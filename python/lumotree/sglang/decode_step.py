"""The no-draft step of a LUMOTREE server as SGLang's own decode forward.

When the adaptive tree size (:mod:`lumotree.sglang.adaptive`) picks no draft, SGLang's EAGLE V2 loop
would still run a one-node *verify*: verify preparation, a TARGET_VERIFY graph, the tree sampler,
acceptance bookkeeping and the tree-path compaction -- on the H200 (27B shapes, batch 1) ~3.5 ms of
host work before the forward is even launched, against ~1.5 ms for a decode step. A one-node tree
is a decode step: its root (the last bonus token) is always accepted and one token is sampled from
the target's logits. So :class:`DecodeStep` runs it as one -- the target model in DECODE mode,
through decode CUDA graphs captured for it at start-up with its own attention backend, sampled
by SGLang's decode sampler -- and hands SGLang's scheduler the result a one-node verify would have
produced (accept length 1, the sampled token as the next bonus token, sequence lengths + 1).

The KV slot of the token is the one SGLang's speculative decode preparation allocated for the
root (``req_to_token[req, seq_len]``); the GDN layers update each request's pool row in place
(SGLang's decode conv and recurrence), so there is nothing to commit.

Served only where a decode step is exactly what the one-node verify computes
(:meth:`DecodeStep.serves`): text-only requests (their M-RoPE positions built on the device, so that
the step needs no host lengths, which SGLang's overlap scheduler does not have; :func:`forward_batch_class`)
without logprobs, hidden states, grammars, penalties or custom
logit processors (their verify path applies these in its own way), and with SGLang's
``no_buffer`` state cache (the ``extra_buffer`` cache's interval snapshots come from the verify's
commit; :func:`lumotree.sglang.backend.one_token_decode`). Any other batch takes the one-node verify.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from typing import Optional

import torch

from lumotree import ops
from lumotree.sglang import step_timing

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _non_speculative(model_runner):
    """While the decode graphs are captured the target model runner reads as non-speculative:
    SGLang's graph runner captures TARGET_VERIFY graphs for any speculative algorithm."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    spec = model_runner.spec_algorithm
    model_runner.spec_algorithm = SpeculativeAlgorithm.NONE
    try:
        yield
    finally:
        model_runner.spec_algorithm = spec


@contextlib.contextmanager
def capture_sizes(server_args, cuda_graph_bs):
    """While a graph runner is built: SGLang captures its graphs at ``cuda_graph_bs`` (``None``: as configured).

    Why here and not through ``EAGLEWorkerV2._override_worker_state(cuda_graph_bs=...)``: that writes the
    resolved config bag (``get_exec().graph.cuda_graph_bs_decode``), but SGLang 0.5.17's graph runners take
    their sizes from ``server_args.cuda_graph_config.decode.bs`` (``get_batch_sizes_to_capture``), so the
    override did not reach them -- a LUMOTREE server's one-node verify and no-draft decode graphs were captured
    at all 35 sizes of the speculative list (server log, 27B shapes, H200)."""
    if cuda_graph_bs is None or not cuda_graph_bs:
        yield
        return
    phase = server_args.cuda_graph_config.decode
    keep = phase.bs
    phase.bs = sorted(set(int(b) for b in cuda_graph_bs))
    try:
        yield
    finally:
        phase.bs = keep


# SGLang functions compiled by ``torch.compile`` with automatic dynamic shapes that a decode forward calls, as
# ``(module, attribute)``; :func:`fresh_compiled` gives each its own compile cache while the decode graphs are captured
DECODE_COMPILED = (("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe", "moe_sum_reduce_torch_compile"),)


def fresh_copy(compiled):
    """A new ``torch.compile`` of the function ``compiled`` wraps (its ``_torchdynamo_orig_callable``), under a new
    code object and name: dynamo keys its compiled variants and its automatic-dynamic record by the code object and
    by ``(file, line, name)``, so the copy starts as the original did -- its first shape compiled static -- whatever
    the original has compiled since. ``None`` where ``compiled`` is not a compiled function."""
    import types

    orig = getattr(compiled, "_torchdynamo_orig_callable", None)
    code = getattr(orig, "__code__", None)
    if code is None:
        return None
    code = code.replace(co_name=code.co_name + "_lumotree_decode")
    fn = types.FunctionType(code, orig.__globals__, code.co_name, orig.__defaults__, orig.__closure__)
    fn.__kwdefaults__ = getattr(orig, "__kwdefaults__", None)
    return torch.compile(fn)


@contextlib.contextmanager
def fresh_compiled(names=DECODE_COMPILED):
    """While the no-draft step's decode graphs are captured, each of SGLang's functions ``names`` (``(module,
    attribute)``, :data:`DECODE_COMPILED`) is a fresh compile of itself (:func:`fresh_copy`); the originals are back
    after. Yields the copies (the caller keeps them alive with the graphs that hold their kernels).

    Why: with ``torch.compile``'s automatic dynamic shapes a function compiles its first shape static and, at the
    next shape, a dynamic variant that is looked up first from then on. No speculation's server first calls SGLang's
    MoE sum-reduce (``moe_sum_reduce_torch_compile``, up to 32 tokens) in its decode graph at batch 32, so that graph
    holds the static kernel; a LUMOTREE server has called it in its verify graphs before, so its decode graph at
    batch 32 held the dynamic one: 6.05 against 3.10 us a launch, 12 launches a step, +35 us of a 5.9 ms step
    (Qwen3-Next MoE shape, an H200's profiles). With a fresh copy the decode graphs are compiled in the order no
    speculation's are: the same kernel at the same time in both servers' graphs, and LUMOTREE's decode graph no
    longer than no speculation's (``benchmark/results/no_draft_step_gaps_h100.json``)."""
    import importlib

    swapped, copies = [], []
    try:
        for mod_name, attr in names:
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            orig = getattr(mod, attr, None)
            copy_ = fresh_copy(orig) if orig is not None else None
            if copy_ is None:
                continue
            setattr(mod, attr, copy_)
            swapped.append((mod, attr, orig))
            copies.append(copy_)
        yield copies
    finally:
        for mod, attr, orig in reversed(swapped):
            setattr(mod, attr, orig)


def new_attention_backend(model_runner):
    """A new attention backend of ``model_runner`` (its own workspace), as SGLang builds one per runtime state, built
    under whatever speculative config the caller has set; the runner's ``init_new_workspace`` as it was after."""
    keep = model_runner.init_new_workspace
    try:
        return model_runner._get_attention_backend(init_new_workspace=True)
    finally:
        model_runner.init_new_workspace = keep


@functools.cache
def forward_batch_class():
    """SGLang's ``ForwardBatch`` whose decode M-RoPE positions (Qwen3.5 is an M-RoPE model) are built on
    the device: the token's position on all three axes, which is what SGLang's
    ``_compute_mrope_positions`` builds per request on the host from ``seq_lens_cpu`` for text -- a loop of
    small tensors per step, and a lookup SGLang's overlap scheduler cannot serve: a speculative batch
    there has no host lengths (``seq_lens_cpu`` is ``None``). Text-only batches only:
    :meth:`DecodeStep.serves` leaves multimodal ones to the one-node verify."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    class DecodeForwardBatch(ForwardBatch):
        def _compute_mrope_positions(self, model_runner, batch):
            if not self.forward_mode.is_decode():
                return super()._compute_mrope_positions(model_runner, batch)
            self.mrope_positions = self.positions.to(torch.int64)[None].repeat(3, 1)

    return DecodeForwardBatch


def warm_positions(seq_lens, clamp=None) -> Optional[float]:
    """One call of SGLang's decode position kernel on ``seq_lens`` (``clamp``: the function in its place, tests), which
    builds its just-in-time module for their dtype (:meth:`DecodeStep.warm_prep`): its seconds, or ``None`` where it
    raised (logged, not raised: the kernel then builds at the first no-draft step, as before)."""
    tic = time.perf_counter()
    try:
        if clamp is None:
            from sglang.srt.model_executor import forward_batch_info

            clamp = forward_batch_info.clamp_position
        clamp(seq_lens)
    except Exception as e:  # a compile ahead of time is not worth a server
        logger.warning("LumoTree: SGLang's decode position kernel could not be built ahead (%s: %s); it builds at the "
                       "first no-draft step", type(e).__name__, e)
        return None
    took = time.perf_counter() - tic
    if took > 0.5:  # a build (a load from SGLang's JIT cache takes milliseconds)
        logger.info("LumoTree: SGLang's decode position kernel built in %.1f s, before serving", took)
    return took


class DecodeStep:
    """The target's decode forward for a LUMOTREE no-draft step (see the module docstring)."""

    def __init__(self, target_worker, attn_backend, graph_runner):
        self.target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.attn_backend = attn_backend
        self.graph_runner = graph_runner
        self.steps = 0  # decode steps served (diagnostics, tests)
        self._ones_buf = None  # int32 ones the results' accept lengths are views of (:meth:`_ones`)

    @classmethod
    def build(cls, worker, cuda_graph_bs=None) -> "DecodeStep":
        """An attention backend and decode CUDA graphs of the target model, beside the worker's
        runtime states (``worker``: the EAGLE V2 worker; ``cuda_graph_bs``: the batch sizes the
        states capture, ``None`` for SGLang's default)."""
        return cls.build_target(worker._target_worker, cuda_graph_bs,
                                worker._override_worker_state(0, 1, cuda_graph_bs=cuda_graph_bs))

    @classmethod
    def build_target(cls, target_worker, cuda_graph_bs=None, override=None) -> "DecodeStep":
        """:meth:`build` for any speculative worker: ``override`` is the context in which the backend and the
        graphs are built as for a server without drafts (default :func:`one_token_spec`, SGLang's speculative
        config reading no draft steps and one token per request, as ``EAGLEWorkerV2._override_worker_state(0, 1)``
        sets it)."""
        import sglang.srt.speculative.eagle_worker_v2 as ew

        mr = target_worker.model_runner
        tic = time.perf_counter()
        with override if override is not None else one_token_spec(cuda_graph_bs):
            backend = new_attention_backend(mr)
            runner = None
            if not ew.check_cuda_graph_backend(ew.Phase.DECODE, ew.Backend.DISABLED):
                with _non_speculative(mr), capture_sizes(mr.server_args, cuda_graph_bs), fresh_compiled() as compiled:
                    runner = mr._decode_cuda_graph_runner_cls()(
                        mr, attn_backend=backend, speculative_num_steps=0, speculative_num_draft_tokens=1)
                runner.lumotree_compiled = compiled  # the graphs hold their kernels
        logger.info("LumoTree: no-draft steps run as decode steps (%s) -- built in %.1f s",
                    "decode CUDA graphs for batch sizes %s" % (runner.capture_bs,) if runner is not None
                    else "no CUDA graphs", time.perf_counter() - tic)
        step = cls(target_worker, backend, runner)
        step.warm_prep()  # (the variant without MTP entries; the worker warms its own: MtpEntries.raw_pairs)
        return step

    def warm_prep(self, zero_kv=(), devices=("cuda",)) -> None:
        """Compile the preparation kernel (:func:`lumotree.ops.decode_prep`) in the variant serving launches -- the
        request map's dtype, int64 rows and lengths, the buffers' dtypes -- by one launch on scratch tensors, and
        SGLang's decode position kernel (``forward_batch_info.clamp_position``, which ``ForwardBatch.init_new`` of a
        decode batch calls on its int64 lengths) by one call on them, so that the first no-draft step compiles
        neither while its requests wait. Nothing on ``devices`` other than the request map's: a no-op (the torch
        reference).

        Why the position kernel: it is a just-in-time CUDA module (``sglang.kernels.ops.attention.clamp_position``,
        built by nvcc through tvm-ffi, not Triton), which no verify meets (a verify's positions come with its draft).
        Where SGLang's JIT cache was cold -- a LUMOTREE server started first on a fresh machine -- the first no-draft
        step stood 8-9 s in its build (thread stacks of the stall, Qwen3-Next MoE shape, one H100:
        ``benchmark/results/moe_cold_start_h100.json``); that step came in the warm-up request there, but a policy
        that drafts first meets it while serving."""
        rt = self.model_runner.req_to_token_pool.req_to_token
        if rt.device.type not in devices:
            return
        one = torch.zeros(1, dtype=torch.int64, device=rt.device)
        kv = [(torch.zeros((1, *k.shape[1:]), dtype=k.dtype, device=k.device),
               torch.zeros((1, *v.shape[1:]), dtype=v.dtype, device=v.device)) for k, v in list(zero_kv)[:1]]
        _, new_lens = ops.decode_prep(torch.zeros((1, rt.shape[1]), dtype=rt.dtype, device=rt.device), one,
                                      one.clone(), kv)
        warm_positions(new_lens)

    @staticmethod
    def serves(batch) -> bool:
        """Whether this batch's no-draft step is a plain decode step (see the module docstring)."""
        spec = batch.spec_info
        return (DecodeStep._plain(batch) and spec is not None and getattr(spec, "bonus_tokens", None) is not None)

    @staticmethod
    def serves_ngram(batch, draft_token_num: int) -> bool:
        """:meth:`serves` for SGLang's NGRAM loop: the last step's accepted tokens (``accept_tokens`` ``[bs *
        draft_token_num]``, ``accept_lens``) are on the batch, the last of each row being this step's input."""
        spec = batch.spec_info
        tokens, lens = getattr(spec, "accept_tokens", None), getattr(spec, "accept_lens", None)
        return (DecodeStep._plain(batch) and tokens is not None and lens is not None
                and lens.shape[0] == batch.seq_lens.shape[0] and tokens.numel() == lens.shape[0] * draft_token_num)

    @staticmethod
    def _plain(batch) -> bool:
        si = batch.sampling_info
        return (not batch.forward_mode.is_idle() and batch.spec_info is not None
                and not batch.return_logprob and not batch.return_hidden_states and not batch.has_grammar
                and all(m is None for m in (getattr(batch, "multimodal_inputs", None) or ()))
                and si is not None and not si.has_custom_logit_processor
                and not (si.penalizer_orchestrator is not None and si.penalizer_orchestrator.is_required))

    @contextlib.contextmanager
    def _active(self):
        mr = self.model_runner
        keep = mr.attn_backend, mr.decode_cuda_graph_runner
        mr.attn_backend, mr.decode_cuda_graph_runner = self.attn_backend, self.graph_runner
        try:
            yield
        finally:
            mr.attn_backend, mr.decode_cuda_graph_runner = keep

    def _decode(self, batch, tokens, on_publish=None, on_slots=None, zero_kv=None):
        """The target's decode forward of ``batch`` on ``tokens`` (SGLang's speculative V2 conventions: ``seq_lens``
        excludes the last accepted token, which is this step's input) and its sampled tokens, and the lengths after
        it: ``(out, fb, sampled, new_seq_lens)`` (``sampled``: the sampler's tokens, its dtype).

        ``on_publish`` (SGLang's overlap scheduler: its ``FutureMap.publish`` of the step's new lengths) is called
        with ``seq_lens + 1`` *before* the forward is launched: a decode step's lengths do not depend on its
        results. Why: the scheduler's next step waits for the publish on the device before it launches anything
        (``resolve_seq_lens_cpu``, a speculative batch's host lengths); published after the forward, the next step's
        preparation and launch could start only once this step's forward was done, so the device idled for the
        host's launch work at every step -- no speculation's scheduler launches step N+1 while step N runs. SGLang's
        EAGLE V2 worker likewise publishes as soon as its lengths are known (between the verify and the draft-extend).

        ``on_slots`` is called with the tokens' KV slots (``req_to_token[row, seq_len]``, the forward's
        ``out_cache_loc``) before the forward is launched: the worker zeroes the MTP layer's entries there
        (:meth:`lumotree.sglang.mtp_entries.MtpEntries.clear_slots`) without looking the slots up again. Without it
        (or with ``zero_kv``, the MTP layers' ``(k, v)`` buffers: :attr:`MtpEntries.raw_pairs`) the slots, the new
        lengths and those entries' zeroing are one launch (:func:`lumotree.ops.decode_prep`)."""
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_uniform_func
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from lumotree.sglang.patches.future_map_host_lengths import publish_known

        t = step_timing.lap(None, None, 0.0)  # sections timed only in the benchmark
        bs = batch.seq_lens.shape[0]
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        fused = on_slots is None or zero_kv is not None
        if fused:  # slots, lengths + 1 and the MTP entries' zeroing: one launch
            loc, new_seq_lens = ops.decode_prep(req_to_token, batch.req_pool_indices, batch.seq_lens, zero_kv or ())
        else:
            new_seq_lens = batch.seq_lens + 1
        if on_publish is not None:  # the host holds these lengths too: the next step need not wait for their copy
            publish_known(on_publish, new_seq_lens, getattr(batch, "req_pool_indices_cpu", None),
                          batch.seq_lens_cpu + 1 if batch.seq_lens_cpu is not None else None)
        dec = copy.copy(batch)  # the scheduler's batch keeps its speculative view
        dec.forward_mode = ForwardMode.DECODE
        dec.spec_algorithm = SpeculativeAlgorithm.NONE
        dec.spec_info = None
        dec.input_ids = tokens
        if fused:
            dec.out_cache_loc = loc
        else:
            dec.out_cache_loc = assign_extend_cache_locs_uniform_func(
                req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token, start_offset=batch.seq_lens,
                batch_size=bs, draft_token_num=1, device=batch.device)
            on_slots(dec.out_cache_loc)
        dec.seq_lens = new_seq_lens  # (read-only for the forward: one tensor for both)
        dec.seq_lens_cpu = batch.seq_lens_cpu + 1 if batch.seq_lens_cpu is not None else None
        dec.seq_lens_sum = batch.seq_lens_sum + bs if batch.seq_lens_sum is not None else None
        t = step_timing.lap("nd_prep", batch, t)
        with self._active():
            fb = forward_batch_class().init_new(dec, self.model_runner, return_hidden_states_before_norm=False)
            t = step_timing.lap("nd_init", batch, t)
            out = self.target_worker.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)
            t = step_timing.lap("nd_forward", batch, t)
        self.steps += 1
        sampled = self.model_runner.sample(out.logits_output, fb)
        step_timing.lap("nd_sample", batch, t)
        return out, fb, sampled, new_seq_lens

    def _ones(self, bs: int, device) -> torch.Tensor:
        """``[bs]`` int32 ones: a view of a buffer kept across steps (the results' accept lengths, read-only where
        SGLang's loop and LumoTree's finished-row mark read them), grown as batches grow."""
        buf = self._ones_buf
        if buf is None or buf.shape[0] < bs or buf.device != torch.device(device):
            buf = self._ones_buf = torch.ones(max(bs, 2 * (buf.shape[0] if buf is not None else 32)),
                                              dtype=torch.int32, device=device)
        return buf[:bs]

    @staticmethod
    def _result(batch, out, fb, next_token_ids, new_seq_lens, stride: int, next_draft_input, accept_lens=None):
        """The scheduler's result of a decode step: accept lengths 1 (``accept_lens``, default new ones), lengths
        ``new_seq_lens`` (+ 1), ``next_token_ids`` in rows of ``stride``; ``next_draft_input(accept_lens,
        new_seq_lens)`` the loop's input for the next step."""
        from sglang.srt.managers.utils import GenerationBatchResult

        if accept_lens is None:
            accept_lens = torch.ones(batch.seq_lens.shape[0], dtype=torch.int32, device=next_token_ids.device)
        return GenerationBatchResult(
            logits_output=out.logits_output, next_token_ids=next_token_ids, can_run_cuda_graph=out.can_run_cuda_graph,
            speculative_num_draft_tokens=stride, next_draft_input=next_draft_input(accept_lens, new_seq_lens),
            accept_lens=accept_lens, new_seq_lens=new_seq_lens,
            routed_experts_output=out.routed_experts_output, indexer_topk_output=out.indexer_topk_output,
            extra_keep_alive_refs=[fb])

    def run(self, batch, on_publish=None, on_slots=None, zero_kv=None):
        """One decode step of an EAGLE V2 ``batch`` (its input the draft input's last bonus token); returns the
        one-node verify's result. ``on_publish``, ``on_slots``, ``zero_kv``: see :meth:`_decode`."""
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        out, fb, sampled, seq = self._decode(batch, batch.spec_info.bonus_tokens, on_publish, on_slots, zero_kv)
        t = step_timing.lap(None, None, 0.0)
        # the result's tokens (int32, a new tensor) and the next input's: the sampler's own, separate memory, in its
        # dtype -- int64 where greedy, the overlap scheduler's FutureMap's, whose stash then casts nothing
        predict, bonus = sampled.to(torch.int32, copy=True), sampled
        result = self._result(batch, out, fb, predict, seq, 1, lambda lens, seq: EagleDraftInput(bonus_tokens=bonus),
                              accept_lens=self._ones(predict.shape[0], predict.device))
        step_timing.lap("nd_result", batch, t)
        return result

    def run_ngram(self, batch, draft_token_num: int, on_publish=None):
        """One decode step of a batch of SGLang's NGRAM loop (:meth:`serves_ngram`), its result as the loop's:
        ``next_token_ids`` / ``accept_tokens`` ``[bs * draft_token_num]`` with each row's sampled token first,
        accept lengths 1, sequence lengths + 1 (what a verify that accepts only its root returns). The input
        token of a row is the last one the previous step accepted, gathered on the device: under the overlap
        scheduler it is not on the host yet."""
        from sglang.srt.speculative.ngram_info import NgramVerifyInput

        spec, bs, n = batch.spec_info, batch.seq_lens.shape[0], draft_token_num
        last = (spec.accept_lens.to(torch.int64) - 1).clamp_min_(0)
        root = spec.accept_tokens.view(bs, n).gather(1, last[:, None]).squeeze(1)
        out, fb, sampled, new_seq_lens = self._decode(batch, root, on_publish)
        t = step_timing.lap(None, None, 0.0)
        accept_tokens = torch.zeros(bs, n, dtype=torch.int32, device=sampled.device)
        accept_tokens[:, 0] = sampled
        accept_tokens = accept_tokens.view(-1)
        result = self._result(batch, out, fb, accept_tokens, new_seq_lens, n, lambda lens, seq: NgramVerifyInput(
            draft_token_num=n, new_seq_lens=seq, accept_tokens=accept_tokens, accept_lens=lens))
        step_timing.lap("nd_result", batch, t)
        return result


@contextlib.contextmanager
def one_token_spec(cuda_graph_bs=None):
    """SGLang's speculative config read as no draft steps and one token per request (and, where given, decode
    graphs at ``cuda_graph_bs``) while a decode step's backend and graphs are built, as
    ``EAGLEWorkerV2._override_worker_state(0, 1)`` sets it for its runtime states; restored after."""
    from sglang.srt.runtime_context import get_context, get_exec, get_spec

    keep = dict(speculative_num_steps=get_spec().speculative_num_steps,
                speculative_num_draft_tokens=get_spec().speculative_num_draft_tokens)
    graphs = dict(cuda_graph_bs_decode=get_exec().graph.cuda_graph_bs_decode,
                  disable_cuda_graph=get_exec().graph.disable_cuda_graph)
    get_context().override("lumotree.decode_step.capture", speculative_num_steps=0, speculative_num_draft_tokens=1,
                           **({"cuda_graph_bs_decode": list(cuda_graph_bs)} if cuda_graph_bs else {}))
    try:
        yield
    finally:
        get_context().override("lumotree.decode_step.restore", **keep, **(graphs if cuda_graph_bs else {}))
