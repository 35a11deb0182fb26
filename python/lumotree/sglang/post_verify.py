"""A drafted step's work after the verify forward, replayed as one CUDA graph per batch size
(LUMOTREE_SUFFIX: SGLang's NGRAM loop with LumoTree's verify and commit; LUMOTREE's chains: SGLang's EAGLE V2 loop).

After the target's verify forward SGLang's NGRAM loop runs, eagerly and for every drafted step: the greedy tree
walk (``eagle_sample``: the argmax, LumoTree's selection op, and LumoTree's clamp of each run at its request's end),
the state commit (``commit_mamba_states_after_verify``: the commit's step indices, LumoTree's replay commit and the
conv-window scatters), the accepted tokens (``predict[accept_index]``) and the move of their KV
(``move_accept_tokens_to_target_kvcache``) -- some 40 small launches from Python, ~0.8 ms of the scheduler's thread
per step on the H200 machine at any batch size of the tiny model (step timer, run ``1-8-agents`` of
``benchmark/results/agents_h200.json``), for a GPU that computes them in tens of microseconds.

:class:`PostVerifyGraphs` runs that sequence (:func:`post_verify`, the same SGLang and LumoTree calls in SGLang's
order) eagerly for the first steps of a given batch size and tree size verified through a CUDA graph
(:attr:`PostVerifyGraphs.CAPTURE_AT`), then captures it into a CUDA graph of its own and replays it for every later
such step: the step's few changing inputs (its lengths, request rows, KV slots, prefix-cache snapshot rows) are
copied into the graph's buffers, and the outputs are copied out in one launch. Everything else the sequence reads is
the same memory at every step -- the verify graph's logits and state indices for the batch's bucket, the NGRAM
worker's per-batch-size draft buffers, the verify's scratch, the state and KV pools -- which each replay checks
(:meth:`PostVerifyGraphs._pointers`) before it trusts the graph.

Only plain greedy batches whose verify ran on a CUDA graph take this path (:meth:`PostVerifyGraphs.serves`); the
others (sampling, log-probabilities, grammars, penalties, a verify without a graph) keep SGLang's step unchanged.

LUMOTREE's chains (``--speculative-eagle-topk 1``) take the same path through :class:`EagleVerifyGraphs` and
:func:`eagle_verify_step`: after its verify forward SGLang's EAGLE V2 step (``run_eagle_verify``) samples
(``eagle_sample``: the argmax, LumoTree's selection op and its clamp at each request's end), commits the states
(``commit_mamba_states_after_verify``: LumoTree's replay commit) and gathers the accepted and bonus tokens -- on one
H100 (Qwen3-Next MoE shape, 12 layers) 0.75 ms of the scheduler's thread per drafted step at batch 8 (``sample`` +
``state_commit``, ``benchmark/results/moe_step_parts_h100.json``, before these graphs). Its draft tree's tensors are
the draft's new ones at every step, so a graph takes them as inputs (copied in, as the batch's lengths and rows are);
the benchmark's draft oracle forces the verify's logits before the graph
(:func:`lumotree.sglang.draft_oracle.force_planned`), not inside it. Served at the MoE shape on two H100s
(``benchmark/results/serving_speed_moe_b1_128_h100.json``: 1.19x / 1.18-1.20x no speculation at batch 1 / 8 against
1.16x / 1.16x before, other machines); the drafted step with them has not been timed by parts.
"""
from __future__ import annotations

import copy
import logging
import math
from types import SimpleNamespace
from typing import Dict, Optional, Tuple

import torch

logger = logging.getLogger(__name__)


def post_verify(target_worker, batch, verify_input, logits: torch.Tensor, allocator) -> Tuple[torch.Tensor, ...]:
    """SGLang 0.5.17's NGRAM loop after the verify forward, for a plain greedy batch: what ``eagle_sample``
    (greedy branch, with LumoTree's clamp of each run at its request's end), ``commit_mamba_states_after_verify``,
    ``predict[accept_index]`` and ``move_accept_tokens_to_target_kvcache`` compute, in that order, through the same
    functions (module attributes, so LumoTree's hooks on them apply).

    Args:
        target_worker: SGLang's ``TpModelWorker`` of the target.
        batch: the step's ``ScheduleBatch`` (or a view with its ``seq_lens``, ``req_pool_indices``,
            ``out_cache_loc``, ``mamba_track_indices``, ``forward_mode``, ``req_to_token_pool``).
        verify_input: the step's ``NgramVerifyInput``.
        logits (torch.Tensor): `[bs * n, vocab]` the verify's logits.
        allocator: the token-to-KV pool allocator.

    Returns:
        ``(predict [bs * n] int32, accept_lens [bs] int32 (drafts + bonus), accept_index [bs, W] int32,
        accept_tokens [bs * W] int32)``.
    """
    import sglang.srt.speculative.eagle_utils as eu
    import sglang.srt.speculative.spec_utils as su

    n = verify_input.draft_token_num
    bs = batch.seq_lens.shape[0]
    device = logits.device
    target_predict = torch.argmax(logits, dim=-1).reshape(bs, n)
    candidates = verify_input.draft_token.reshape(bs, n)
    predict = torch.zeros(bs * n, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, verify_input.max_tree_depth), -1, dtype=torch.int32, device=device)
    num_correct = torch.empty((bs,), dtype=torch.int32, device=device)
    predict, accept_index, num_correct = eu.verify_tree_greedy_func(
        predicts=predict, accept_index=accept_index, accept_token_num=num_correct, candidates=candidates,
        retrieve_index=verify_input.retrieve_index, retrieve_next_token=verify_input.retrieve_next_token,
        retrieve_next_sibling=verify_input.retrieve_next_sibling, target_predict=target_predict,
        topk=verify_input.tree_topk)
    accept_lens = num_correct + 1
    rows = getattr(batch.req_to_token_pool, "lumotree_finished", None)
    if rows is not None:  # lumotree.sglang.patches.eagle_sample_end: each run ends at its request's end
        accept_lens = rows.clamp_run(batch.req_pool_indices, batch.seq_lens, predict, accept_lens, accept_index)
    su.commit_mamba_states_after_verify(target_worker, batch, accept_lens, accept_index, n)
    accept_tokens = predict[accept_index].flatten()
    su.move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, allocator)
    return predict, accept_lens, accept_index, accept_tokens


# a verify input's draft tree: the drafted tokens and the tree's links
DRAFT_TREE = ("draft_token", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")


class _Graph:
    """One captured :func:`post_verify`: its input buffers, its outputs packed in one int32 buffer, and the
    addresses of everything else it reads."""

    def __init__(self, graph, inputs: Dict[str, Optional[torch.Tensor]], packed: torch.Tensor, split, pointers):
        self.graph = graph
        self.inputs = inputs
        self.packed = packed
        self.split = split  # the outputs' shapes, in order
        self.pointers = pointers


class PostVerifyGraphs:
    """The post-verify sequence (:func:`post_verify`) of a LUMOTREE_SUFFIX server's drafted steps as one CUDA graph
    per (tree size, batch size): captured at the :data:`CAPTURE_AT`-th such step (the ones before run eagerly, the
    first of them also compiling its Triton kernels), replayed after (module docstring). ``stats``: steps replayed,
    run eagerly, graphs captured."""

    # the step of a (tree size, batch size) key that captures its graph. Why not the second: where drafts miss, a key
    # runs only in the adaptive policy's probes (a warm one-node step and one or two drafted steps each, at least 128
    # steps apart), so capturing at its second step spent a capture inside a probe of a tree that is not
    # served; a tree that is served reaches this count within its first steps, at ~0.65 ms of host work per eager step
    # more than a replay (0.75-0.8 against 0.09-0.14 ms, module docstring). A capture does not slow the host work after
    # it: a decode-like host loop ran at the same speed before and after one (benchmark/serving/capture_host_loop.py,
    # one H100); the slow served steps once seen after a capture fell in the server's first seconds after its start
    # on a fresh machine, which are slow with or without one (docs/performance.md)
    CAPTURE_AT = 16

    # the step's tensors a graph takes as inputs (copied into its buffers at each replay): the batch's, the draft's
    BATCH_INPUTS = ("seq_lens", "req_pool_indices", "out_cache_loc", "mamba_track_indices")
    SPEC_INPUTS: Tuple[str, ...] = ()
    NAME = "LUMOTREE_SUFFIX"

    def __init__(self, device):
        self.device = torch.device(device)
        self.graphs: Dict[tuple, _Graph] = {}
        self.seen: Dict[tuple, int] = {}  # steps run eagerly per key while not captured (CAPTURE_AT)
        self.eager_only = set()  # keys whose memory moved under a captured graph: never captured again
        self.pool = None
        self.stream = None
        self.failed = None  # the first capture error: no more captures after it (the steps run eagerly)
        self.stats = dict(replays=0, eager=0, captures=0, stale=0)

    @staticmethod
    def serves(batch) -> bool:
        """Whether ``batch`` (a decode batch about to be drafted) is one :func:`post_verify` computes as SGLang's
        loop would: greedy, no log-probabilities, grammar, penalties, logit bias, custom processor or multimodal
        input, no simulated acceptance."""
        from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN

        from lumotree.sglang.decode_step import DecodeStep

        si = batch.sampling_info
        return (si is not None and si.is_all_greedy and DecodeStep._plain(batch) and SIMULATE_ACC_LEN <= 0
                and si.acc_additive_penalties is None and si.acc_scaling_penalties is None and si.logit_bias is None)

    def _logits(self, logits) -> torch.Tensor:
        """The verify's logits tensor of what :meth:`run` is handed (here the tensor itself)."""
        return logits

    def _pointers(self, target_worker, batch, verify_input, logits) -> tuple:
        """The addresses of what a captured graph reads besides its inputs: the logits, the draft's tree (those of its
        tensors that are not inputs), the attention backend's state indices and verify scratch, the request table, the
        finish table."""
        backend = target_worker.model_runner.attn_backend
        lin = getattr(backend, "linear_attn_backend", None)
        md = getattr(lin, "forward_metadata", None)
        scratch = getattr(lin, "scratch", None)
        rows = getattr(batch.req_to_token_pool, "lumotree_finished", None)
        tree = tuple(getattr(verify_input, k) for k in DRAFT_TREE if k not in self.SPEC_INPUTS)
        ts = (self._logits(logits), *tree, batch.req_to_token_pool.req_to_token,
              getattr(md, "mamba_cache_indices", None), getattr(md, "retrieve_parent_token", None),
              getattr(scratch, "k", None), getattr(lin, "verify_intermediate_state_indices", None),
              getattr(rows, "stop", None))
        return (id(backend),) + tuple(None if t is None else (t.data_ptr(), tuple(t.shape)) for t in ts)

    def run(self, target_worker, batch, verify_input, logits, allocator, on_graph: bool):
        """:func:`post_verify` of this step: replayed where a graph of its key is captured and reads the same memory,
        else eagerly (and then captured, ``on_graph``: the verify ran on a CUDA graph, so its logits and state
        indices are the bucket's static buffers). Returns its outputs (fresh tensors)."""
        if not on_graph:
            self.stats["eager"] += 1
            return self._sequence(target_worker, batch, verify_input, logits, allocator)
        n, bs = verify_input.draft_token_num, batch.seq_lens.shape[0]
        key = (n, bs, batch.mamba_track_indices is not None, id(target_worker.model_runner.attn_backend))
        g = self.graphs.get(key)
        if g is not None:
            if g.pointers == self._pointers(target_worker, batch, verify_input, logits):
                return self._replay(g, batch, verify_input)
            # the memory moved (never seen so far): this key runs eagerly from now on -- capturing again would cost a
            # capture per step if it kept moving
            self.stats["stale"] += 1
            del self.graphs[key]
            self.eager_only.add(key)
            if self.stats["stale"] == 1:
                logger.warning("%s: memory a post-verify CUDA graph reads moved (%d requests x %d nodes); "
                               "that size runs eagerly", self.NAME, bs, n)
        self.stats["eager"] += 1
        out = self._sequence(target_worker, batch, verify_input, logits, allocator)
        if self.failed is None and key not in self.eager_only:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] >= self.CAPTURE_AT:
                self._capture(key, target_worker, batch, verify_input, logits, allocator)
        return out

    def _sequence(self, target_worker, batch, verify_input, logits, allocator) -> Tuple[torch.Tensor, ...]:
        """The work a graph captures (run eagerly where none replays): :func:`post_verify`."""
        return post_verify(target_worker, batch, verify_input, logits, allocator)

    def _inputs_of(self, batch, verify_input):
        """The step's input tensors by name (``None`` where the step has none)."""
        got = {k: getattr(batch, k, None) for k in self.BATCH_INPUTS}
        got.update({k: getattr(verify_input, k, None) for k in self.SPEC_INPUTS})
        return got

    def _views(self, batch, verify_input, ins):
        """The batch and draft a capture runs on: their input tensors the graph's buffers ``ins``."""
        view = SimpleNamespace(seq_lens=ins["seq_lens"], req_pool_indices=ins["req_pool_indices"],
                               out_cache_loc=ins["out_cache_loc"], mamba_track_indices=ins["mamba_track_indices"],
                               forward_mode=batch.forward_mode, req_to_token_pool=batch.req_to_token_pool,
                               reqs=batch.reqs, device=batch.device)
        return view, verify_input

    def _replay(self, g: _Graph, batch, verify_input=None):
        for name, t in self._inputs_of(batch, verify_input).items():
            if g.inputs[name] is not None:
                g.inputs[name].copy_(t)
        g.graph.replay()
        self.stats["replays"] += 1
        out = g.packed.clone()
        parts = out.split([math.prod(shape) for shape in g.split])
        return tuple(t.view(shape) for t, shape in zip(parts, g.split))

    def _capture(self, key, target_worker, batch, verify_input, logits, allocator) -> None:
        bs, n = key[1], key[0]
        ins = {k: (t.clone() if t is not None else None) for k, t in self._inputs_of(batch, verify_input).items()}
        view, view_input = self._views(batch, verify_input, ins)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(device=self.device)
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    outs = self._sequence(target_worker, view, view_input, logits, allocator)
                    shapes = [tuple(t.shape) for t in outs]
                    packed = torch.cat([t.to(torch.int32).flatten() for t in outs])
                finally:
                    graph.capture_end()
        except Exception as e:  # a launch that cannot be captured: this server's steps stay eager
            self.failed = repr(e)
            logger.warning("%s: the post-verify step could not be captured as a CUDA graph (%s); "
                           "it runs eagerly", self.NAME, self.failed)
            return
        finally:
            current.wait_stream(self.stream)
        self.graphs[key] = _Graph(graph, ins, packed, shapes,
                                  self._pointers(target_worker, batch, verify_input, logits))
        self.stats["captures"] += 1
        logger.info("%s: post-verify CUDA graph captured for %d requests x %d nodes (%d graphs)",
                    self.NAME, bs, n, len(self.graphs))


def ngram_verify_step(worker, graphs: PostVerifyGraphs, batch, on_publish=None):
    """SGLang 0.5.17's ``NGRAMWorker.forward_batch_generation`` for a decode batch that
    :meth:`PostVerifyGraphs.serves`: the same draft preparation and verify forward, then :func:`post_verify` through
    ``graphs``, then the same lengths' publish, corpus bookkeeping and result."""
    import sglang.srt.speculative.ngram_worker as nw
    from sglang.srt.utils.async_probe import sanitize_nan_logits

    from lumotree.sglang import step_timing

    t = step_timing.lap_size(None, 0, 0.0)  # sections timed only in the benchmark
    fwd_stream = torch.get_device_module(worker.device).current_stream()
    nw.record_stream_for_v2_verify(batch, None, fwd_stream)
    bs = len(batch.reqs)
    nw.set_time_batch(batch.reqs, "set_spec_draft_start_time", trace_only=True)
    t = step_timing.lap_size("dv_pre", bs, t)
    worker._prepare_for_speculative_decoding(batch)
    nw.set_time_batch(batch.reqs, "set_spec_draft_end_time", trace_only=True)
    step_timing.lap_size("dv_prepare", bs, t)
    verify_input = batch.spec_info
    result = worker.target_worker.forward_batch_generation(batch, is_verify=True)
    logits_output, can_run_cuda_graph = result.logits_output, result.can_run_cuda_graph
    t = step_timing.lap_size(None, 0, 0.0)
    sanitize_nan_logits(logits_output.next_token_logits, "verify: target model logits")
    step_timing.lap_size("dv_sanitize", bs, t)

    predict, accept_lens, accept_index, accept_tokens = step_timing.measure_size(
        "post_verify", bs, graphs.run, worker.target_worker, batch, verify_input, logits_output.next_token_logits,
        worker.token_to_kv_pool_allocator, bool(can_run_cuda_graph))
    t = step_timing.lap_size(None, 0, 0.0)
    new_seq_lens = batch.seq_lens + accept_lens
    if on_publish is not None:
        on_publish(new_seq_lens)
    worker._update_ngram_corpus(batch)
    cur_rids = {req.rid for req in batch.reqs}
    departed = worker._prev_decode_rids - cur_rids
    if departed:
        worker.ngram_corpus.erase_match_state(list(departed))
    worker._prev_decode_rids = cur_rids
    batch.forward_mode = nw.ForwardMode.DECODE
    next_draft_input = nw.NgramVerifyInput(draft_token_num=worker.draft_token_num, new_seq_lens=new_seq_lens,
                                           accept_tokens=accept_tokens, accept_lens=accept_lens)
    out = nw.GenerationBatchResult(
        logits_output=logits_output, next_token_ids=accept_tokens, can_run_cuda_graph=can_run_cuda_graph,
        accept_lens=accept_lens, new_seq_lens=new_seq_lens, next_draft_input=next_draft_input,
        speculative_num_draft_tokens=worker.speculative_num_draft_tokens)
    step_timing.lap_size("dv_tail", bs, t)
    return out


def eagle_post_verify(target_worker, batch, verify_input, logits_output, num_draft_tokens: int):
    """SGLang 0.5.17's ``run_eagle_verify`` after the verify forward, for a plain greedy chain batch: ``eagle_sample``,
    ``commit_mamba_states_after_verify``, the accepted tokens' gather and the bonus tokens, through the names
    ``run_eagle_verify`` calls (``eagle_worker_common``'s, so LumoTree's hooks on them apply).

    Returns:
        ``(predict [bs * n] int32, accept_lens [bs] int32, accept_index [bs, W] int32, bonus_tokens [bs] int32)``.
    """
    import sglang.srt.speculative.eagle_worker_common as ewc

    bs = batch.seq_lens.shape[0]
    predict, accept_lens, accept_index = ewc.eagle_sample(verify_input, batch, logits_output)
    ewc.commit_mamba_states_after_verify(target_worker, batch, accept_lens, accept_index, num_draft_tokens)
    accept_tokens = predict[accept_index]
    bonus_tokens = torch.empty_like(accept_lens, dtype=torch.int32)
    ewc.fill_bonus_tokens_func(accept_tokens, accept_lens, bonus_tokens, accept_index.shape[1], bs)
    return predict, accept_lens, accept_index, bonus_tokens


class EagleVerifyGraphs(PostVerifyGraphs):
    """:func:`eagle_post_verify` of a LUMOTREE chain server's drafted steps as one CUDA graph per (tree size, batch
    size), as :class:`PostVerifyGraphs` does for LUMOTREE_SUFFIX. ``logits`` is here the verify's
    ``LogitsProcessorOutput`` (``eagle_sample`` takes it whole); the draft tree's tensors are inputs."""

    BATCH_INPUTS = ("seq_lens", "req_pool_indices", "mamba_track_indices")
    SPEC_INPUTS = DRAFT_TREE
    NAME = "LUMOTREE"

    @staticmethod
    def serves_eagle(worker, batch) -> bool:
        """Whether ``batch``'s drafted step is one :func:`eagle_verify_step` computes as SGLang's ``run_eagle_verify``
        would: :meth:`PostVerifyGraphs.serves`, a chain (``topk`` 1: no tree-path compaction), and a KV cache without
        SGLang's per-step clear of unaccepted draft states."""
        kv = worker.token_to_kv_pool_allocator.get_kvcache()
        return (worker.topk == 1 and PostVerifyGraphs.serves(batch)
                and getattr(kv, "clear_unaccepted_c128_draft_states", None) is None)

    def _sequence(self, target_worker, batch, verify_input, logits_output, allocator):
        return eagle_post_verify(target_worker, batch, verify_input, logits_output, verify_input.draft_token_num)

    def _views(self, batch, verify_input, ins):
        view, spec = copy.copy(batch), copy.copy(verify_input)  # every other field as the step's own
        for name in self.BATCH_INPUTS:
            setattr(view, name, ins[name])
        for name in self.SPEC_INPUTS:
            setattr(spec, name, ins[name])
        return view, spec

    def _logits(self, logits_output) -> torch.Tensor:
        return logits_output.next_token_logits


def eagle_verify_step(worker, graphs: EagleVerifyGraphs, batch):
    """SGLang 0.5.17's ``run_eagle_verify`` (as ``EAGLEWorkerV2.verify`` calls it) for a batch that
    :meth:`EagleVerifyGraphs.serves_eagle`: the same verify preparation on the plan stream and verify forward, then
    :func:`eagle_post_verify` through ``graphs``, then the same result."""
    import sglang.srt.speculative.eagle_worker_common as ewc

    from lumotree.sglang import draft_oracle, step_timing

    target_worker = worker.target_worker
    fwd_stream = torch.get_device_module(worker.device).current_stream()
    verify_input = batch.spec_info
    ewc.record_stream_for_v2_verify(batch, verify_input, fwd_stream)
    bs = len(batch.seq_lens)
    with worker.plan_stream_ctx:
        verify_forward_batch, can_run_cuda_graph = ewc.eagle_prepare_for_verify(
            verify_input, worker.req_to_token_pool, batch, target_worker)
    ewc.record_stream_each((batch.input_ids, batch.out_cache_loc), fwd_stream)
    if worker.plan_stream:
        torch.get_device_module(worker.device).current_stream().wait_stream(worker.plan_stream)
        target_worker.model_runner.attn_backend.update_verify_buffers_to_fill_after_draft(
            verify_input, target_worker.model_runner.decode_cuda_graph_runner.bs if can_run_cuda_graph else None)
    out = target_worker.forward_batch_generation(batch=None, forward_batch=verify_forward_batch, is_verify=True)
    logits_output = out.logits_output
    ewc.maybe_detect_nan(logits_output.next_token_logits, "verify: target model logits")
    ewc.maybe_detect_inf(logits_output.next_token_logits, "verify: target model logits")
    draft_oracle.force_planned(verify_input, batch, logits_output)  # benchmark only: before the graph, not in it
    predict, accept_lens, accept_index, bonus_tokens = step_timing.measure_size(
        "post_verify", bs, graphs.run, target_worker, batch, verify_input, logits_output,
        worker.token_to_kv_pool_allocator, bool(can_run_cuda_graph))
    return ewc.GenerationBatchResult(
        logits_output=logits_output, next_token_ids=predict, can_run_cuda_graph=can_run_cuda_graph,
        speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
        next_draft_input=ewc.EagleDraftInput(bonus_tokens=bonus_tokens), accept_lens=accept_lens,
        new_seq_lens=batch.seq_lens + accept_lens, routed_experts_output=out.routed_experts_output,
        indexer_topk_output=out.indexer_topk_output, extra_keep_alive_refs=[verify_forward_batch])
