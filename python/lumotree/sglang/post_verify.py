"""A drafted step's work after the verify forward, replayed as one CUDA graph per batch size
(LUMOTREE_SUFFIX: SGLang's NGRAM loop with LumoTree's verify and commit).

After the target's verify forward SGLang's NGRAM loop runs, eagerly and for every drafted step: the greedy tree
walk (``eagle_sample``: the argmax, LumoTree's selection op, and LumoTree's clamp of each run at its request's end),
the state commit (``commit_mamba_states_after_verify``: the commit's step indices, LumoTree's replay commit and the
conv-window scatters), the accepted tokens (``predict[accept_index]``) and the move of their KV
(``move_accept_tokens_to_target_kvcache``) -- some 40 small launches from Python, ~0.8 ms of the scheduler's thread
per step on the H200 machine at any batch size of the tiny model (step timer, run ``1-8-agents`` of
``benchmark/results/agents_h200.json``), for a GPU that computes them in tens of microseconds.

:class:`PostVerifyGraphs` runs that sequence (:func:`post_verify`, the same SGLang and LumoTree calls in SGLang's
order) eagerly the first time a batch of a given size and tree size is verified through a CUDA graph, then captures
it into a CUDA graph of its own and replays it for every later such step: the step's few changing inputs (its
lengths, request rows, KV slots, prefix-cache snapshot rows) are copied into the graph's buffers, and the outputs
are copied out in one launch. Everything else the sequence reads is the same memory at every step -- the verify
graph's logits and state indices for the batch's bucket, the NGRAM worker's per-batch-size draft buffers, the
verify's scratch, the state and KV pools -- which each replay checks (:meth:`PostVerifyGraphs._pointers`) before it
trusts the graph.

Only plain greedy batches whose verify ran on a CUDA graph take this path (:meth:`PostVerifyGraphs.serves`); the
others (sampling, log-probabilities, grammars, penalties, a verify without a graph) keep SGLang's step unchanged.
"""
from __future__ import annotations

import logging
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


class _Graph:
    """One captured :func:`post_verify`: its input buffers, its outputs packed in one int32 buffer, and the
    addresses of everything else it reads."""

    def __init__(self, graph, inputs: Dict[str, Optional[torch.Tensor]], packed: torch.Tensor, split, pointers):
        self.graph = graph
        self.inputs = inputs
        self.packed = packed
        self.split = split  # (bs, n, W)
        self.pointers = pointers


class PostVerifyGraphs:
    """The post-verify sequence (:func:`post_verify`) of a LUMOTREE_SUFFIX server's drafted steps as one CUDA graph
    per (tree size, batch size): captured at the second such step (the first runs eagerly, which also compiles its
    Triton kernels), replayed after (module docstring). ``stats``: steps replayed, run eagerly, graphs captured."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.graphs: Dict[tuple, _Graph] = {}
        self.seen = set()
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

    def _pointers(self, target_worker, batch, verify_input, logits) -> tuple:
        """The addresses of what a captured graph reads besides its inputs: the logits, the draft buffers, the
        attention backend's state indices and verify scratch, the request table, the finish table."""
        backend = target_worker.model_runner.attn_backend
        lin = getattr(backend, "linear_attn_backend", None)
        md = getattr(lin, "forward_metadata", None)
        scratch = getattr(lin, "scratch", None)
        rows = getattr(batch.req_to_token_pool, "lumotree_finished", None)
        ts = (logits, verify_input.draft_token, verify_input.retrieve_index, verify_input.retrieve_next_token,
              verify_input.retrieve_next_sibling, batch.req_to_token_pool.req_to_token,
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
            return post_verify(target_worker, batch, verify_input, logits, allocator)
        n, bs = verify_input.draft_token_num, batch.seq_lens.shape[0]
        key = (n, bs, batch.mamba_track_indices is not None, id(target_worker.model_runner.attn_backend))
        g = self.graphs.get(key)
        if g is not None:
            if g.pointers == self._pointers(target_worker, batch, verify_input, logits):
                return self._replay(g, batch)
            # the memory moved (never seen so far): this key runs eagerly from now on -- capturing again would cost a
            # capture per step if it kept moving
            self.stats["stale"] += 1
            del self.graphs[key]
            self.eager_only.add(key)
            if self.stats["stale"] == 1:
                logger.warning("LUMOTREE_SUFFIX: memory a post-verify CUDA graph reads moved (%d requests x %d nodes); "
                               "that size runs eagerly", bs, n)
        self.stats["eager"] += 1
        out = post_verify(target_worker, batch, verify_input, logits, allocator)
        if self.failed is None and key not in self.eager_only:
            if key in self.seen:
                self._capture(key, target_worker, batch, verify_input, logits, allocator)
            else:
                self.seen.add(key)
        return out

    def _replay(self, g: _Graph, batch):
        ins = g.inputs
        ins["seq_lens"].copy_(batch.seq_lens)
        ins["req_pool_indices"].copy_(batch.req_pool_indices)
        ins["out_cache_loc"].copy_(batch.out_cache_loc)
        if ins["mamba_track_indices"] is not None:
            ins["mamba_track_indices"].copy_(batch.mamba_track_indices)
        g.graph.replay()
        self.stats["replays"] += 1
        bs, n, w = g.split
        out = g.packed.clone()
        predict, lens, index, tokens = out.split((bs * n, bs, bs * w, bs * w))
        return predict, lens, index.view(bs, w), tokens

    def _capture(self, key, target_worker, batch, verify_input, logits, allocator) -> None:
        bs, n = key[1], key[0]
        track = batch.mamba_track_indices
        ins = dict(seq_lens=batch.seq_lens.clone(), req_pool_indices=batch.req_pool_indices.clone(),
                   out_cache_loc=batch.out_cache_loc.clone(),
                   mamba_track_indices=track.clone() if track is not None else None)
        view = SimpleNamespace(seq_lens=ins["seq_lens"], req_pool_indices=ins["req_pool_indices"],
                               out_cache_loc=ins["out_cache_loc"], mamba_track_indices=ins["mamba_track_indices"],
                               forward_mode=batch.forward_mode, req_to_token_pool=batch.req_to_token_pool,
                               reqs=batch.reqs, device=batch.device)
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
                    predict, lens, index, tokens = post_verify(target_worker, view, verify_input, logits, allocator)
                    w = index.shape[1]
                    packed = torch.cat([predict.to(torch.int32), lens.to(torch.int32),
                                        index.to(torch.int32).flatten(), tokens.to(torch.int32)])
                finally:
                    graph.capture_end()
        except Exception as e:  # a launch that cannot be captured: this server's steps stay eager
            self.failed = repr(e)
            logger.warning("LUMOTREE_SUFFIX: the post-verify step could not be captured as a CUDA graph (%s); "
                           "it runs eagerly", self.failed)
            return
        finally:
            current.wait_stream(self.stream)
        self.graphs[key] = _Graph(graph, ins, packed, (bs, n, w),
                                  self._pointers(target_worker, batch, verify_input, logits))
        self.stats["captures"] += 1
        logger.info("LUMOTREE_SUFFIX: post-verify CUDA graph captured for %d requests x %d nodes (%d graphs)",
                    bs, n, len(self.graphs))


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
