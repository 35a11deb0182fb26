"""LUMOTREE_SUFFIX's draft-tree size per batch bucket: large trees for small batches, small ones for
large batches, in one server.

Why: a verify's cost grows with ``batch x nodes`` while a decode step's hardly does, so the tree a
step can afford shrinks as the batch grows -- but SGLang's NGRAM loop, which LUMOTREE_SUFFIX serves
through, has one tree size per server (``--speculative-num-draft-tokens``: its buffers, its verify
CUDA graphs, the KV slots the scheduler allocates per request and step). Sized for the batch the
server is sized for, a server of 32 requests drafted 16-node trees at any load, and 8 concurrent
agents were served at 1.09x no speculation against 1.35-1.42x with 32-node trees (tiny model,
H200, ``benchmark/results/agents_h200.json``); a server with SGLang's default batch limit (48)
drafted 8-node trees even for a single request.

How: the server is configured with the largest size (SGLang's loop, its graphs and its KV
allocation are for that one), and :func:`bucket_sizes` gives each batch bucket (powers of two, as
CUDA graphs pad) its size by the same rule as before -- ``LUMOTREE_SUFFIX_TOKENS_PER_STEP`` (1,024)
verify tokens per step, at most 32 nodes. For every smaller size the worker builds a
:class:`VerifySize` at start-up: an attention backend and target-verify CUDA graphs of that many
tokens per request (at the captured batch sizes of its buckets), and the NGRAM worker's per-batch
buffers for it. A drafted step of a batch whose bucket takes a smaller size runs SGLang's own
NGRAM verify with that state swapped in (:meth:`VerifySize.active`, nothing captured while
serving), the drafter drafting that many nodes, and its result is laid out at the server's stride
(:func:`widen_result`): every speculative input the scheduler holds, merges and filters has the
largest size's stride, whatever step made it. The GDN layers need nothing of their own: LumoTree's
verify and commit take the node count of each step, and its scratch is sized for the largest tree.

Not for batches SGLang's verify treats on its own terms (logprobs, grammars, penalties, custom
logit processors: :func:`lumotree.sglang.decode_step.DecodeStep._plain`): they draft the largest
tree. The adaptive tree size (:mod:`lumotree.sglang.adaptive`) still chooses per step between the
bucket's tree and no draft; its step times are kept per bucket, so each bucket's are of its size.
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Dict, List, Optional, Sequence

import torch

from lumotree.sglang.adaptive import bucket

logger = logging.getLogger(__name__)

SIZES_ATTR = "lumotree_suffix_sizes"  # on server_args: {bucket: nodes}, set where the server chose the sizes


def bucket_sizes(max_running: int, tokens_per_step: int, max_nodes: int, min_nodes: int) -> Dict[int, int]:
    """``{bucket: draft nodes}`` for every bucket up to the one holding ``max_running`` requests:
    :func:`lumotree.drafters.suffix.adaptive_budget` of the bucket."""
    from lumotree.drafters.suffix import adaptive_budget

    if max_running < 1:
        raise ValueError(f"max_running must be >= 1, got {max_running}")
    out, b = {}, 1
    while True:
        out[b] = adaptive_budget(b, tokens_per_step=tokens_per_step, max_nodes=max_nodes, min_nodes=min_nodes)
        if b >= max_running:
            return out
        b *= 2


def size_for(sizes: Optional[Dict[int, int]], batch: int, largest: int) -> int:
    """The draft nodes of a step of ``batch`` requests: its bucket's size (beyond the table, its largest bucket's;
    ``largest`` without one)."""
    if not sizes:
        return largest
    b = min(bucket(batch), max(sizes))
    return min(largest, sizes.get(b, largest))


def sizes_of(server_args) -> Optional[Dict[int, int]]:
    """The server's per-bucket sizes when it has more than one, else ``None`` (one tree size: the flag's)."""
    sizes = getattr(server_args, SIZES_ATTR, None)
    if not sizes or len(set(sizes.values())) < 2:
        return None
    return {int(b): int(n) for b, n in sizes.items()}


def graph_bs_for(sizes: Dict[int, int], nodes: int, cuda_graph_bs: Optional[Sequence[int]]) -> Optional[List[int]]:
    """The captured batch sizes a :class:`VerifySize` of ``nodes`` needs: those of the configured list whose bucket
    takes ``nodes``, and the next captured size above them (a batch pads up to a captured size; the largest batch
    of the buckets may lie above the last size inside them). ``None`` (graphs off) stays ``None``."""
    if cuda_graph_bs is None:
        return None
    mine = [b for b, n in sizes.items() if n == nodes]
    lo, hi = min(mine) // 2, max(mine)  # batches lo+1 .. hi take this size
    listed = sorted(set(int(b) for b in cuda_graph_bs))
    inside = [b for b in listed if lo < b <= hi]
    above = [b for b in listed if b > hi]
    if (not inside or inside[-1] < hi) and above:
        inside.append(above[0])
    return inside


@contextlib.contextmanager
def draft_tokens_spec(nodes: int):
    """SGLang's speculative config read as ``nodes`` draft tokens per request while a verify state is built (the
    attention backend reads it, e.g. the Triton backend's ``num_draft_tokens``); restored after."""
    from sglang.srt.runtime_context import get_context, get_spec

    keep = get_spec().speculative_num_draft_tokens
    get_context().override("lumotree.suffix_sizes.capture", speculative_num_draft_tokens=nodes)
    try:
        yield
    finally:
        get_context().override("lumotree.suffix_sizes.restore", speculative_num_draft_tokens=keep)


_VIEWS = ("retrieve_indexes_batch", "retrieve_next_token_batch", "retrieve_next_sibling_batch", "positions_batch",
          "draft_tokens_batch", "tree_mask_batch")


def batch_views(max_bs: int, nodes: int, device) -> Dict[str, list]:
    """SGLang's NGRAM worker's per-batch-size buffers (``NGRAMWorker._init_preallocated_tensors``) for ``nodes`` draft
    tokens per request: ``{attribute: [view for bs 0 .. max_bs]}``."""
    retrieve = [torch.empty((max_bs, nodes), dtype=torch.int64, device=device) for _ in range(3)]
    positions = torch.empty((max_bs * nodes,), dtype=torch.int64, device=device)
    drafts = torch.empty((max_bs * nodes,), dtype=torch.int64, device=device)
    mask = torch.empty((max_bs * nodes * nodes,), dtype=torch.bool, device=device)
    views = {k: [] for k in _VIEWS}
    for bs in range(max_bs + 1):
        for k, t in zip(_VIEWS[:3], retrieve):
            views[k].append(t[:bs, :])
        views["positions_batch"].append(positions[:bs * nodes])
        views["draft_tokens_batch"].append(drafts[:bs * nodes])
        views["tree_mask_batch"].append(mask[:bs * nodes * nodes])
    return views


class VerifySize:
    """A smaller draft-tree size of a LUMOTREE_SUFFIX server: its attention backend and target-verify graph runner
    (``None`` without CUDA graphs) and the NGRAM worker's per-batch buffers for it."""

    def __init__(self, nodes: int, attn_backend, graph_runner, views: Dict[str, list]):
        self.nodes = nodes
        self.attn_backend = attn_backend
        self.graph_runner = graph_runner
        self.views = views
        self.steps = 0  # drafted steps served (diagnostics, tests)

    @classmethod
    def build(cls, worker, nodes: int, cuda_graph_bs) -> "VerifySize":
        """Built beside ``worker`` (SGLang's NGRAM worker) for ``nodes`` tokens per request, its graphs captured at
        ``cuda_graph_bs`` (``None``: without graphs)."""
        import sglang.srt.speculative.eagle_worker_v2 as ew

        from lumotree.sglang.decode_step import capture_sizes, new_attention_backend

        mr = worker._target_worker.model_runner
        tic = time.perf_counter()
        with draft_tokens_spec(nodes):
            backend = new_attention_backend(mr)
            runner = None
            if cuda_graph_bs and not ew.check_cuda_graph_backend(ew.Phase.DECODE, ew.Backend.DISABLED):
                with capture_sizes(mr.server_args, cuda_graph_bs):
                    runner = mr._decode_cuda_graph_runner_cls()(
                        mr, attn_backend=backend, speculative_num_steps=worker.speculative_num_steps,
                        speculative_num_draft_tokens=nodes)
        views = batch_views(worker.max_batch_size, nodes, worker.device)
        logger.info("LUMOTREE_SUFFIX: %d-node verify state (%s) -- built in %.1f s", nodes,
                    "CUDA graphs for batch sizes %s" % (runner.capture_bs,) if runner is not None else "no CUDA graphs",
                    time.perf_counter() - tic)
        return cls(nodes, backend, runner, views)

    @contextlib.contextmanager
    def active(self, worker):
        """While a drafted step of this size runs through ``worker`` (SGLang's NGRAM worker): its draft-token count,
        buffers, the drafter's budget, the model runner's attention backend and graph runner are this size's."""
        mr = worker._target_worker.model_runner
        corpus = worker.ngram_corpus
        keep = dict(draft_token_num=worker.draft_token_num, **{k: getattr(worker, k) for k in _VIEWS})
        keep_mr = mr.attn_backend, mr.decode_cuda_graph_runner
        keep_n = getattr(corpus, "n", None)
        worker.draft_token_num = self.nodes
        for k, v in self.views.items():
            setattr(worker, k, v)
        # no graphs of its own (graphs off, or no captured size in its buckets): eager, never another size's graphs
        mr.attn_backend, mr.decode_cuda_graph_runner = self.attn_backend, self.graph_runner
        if keep_n is not None:
            corpus.n = self.nodes
        self.steps += 1
        try:
            yield
        finally:
            for k, v in keep.items():
                setattr(worker, k, v)
            mr.attn_backend, mr.decode_cuda_graph_runner = keep_mr
            if keep_n is not None:
                corpus.n = keep_n


def widen_result(result, bs: int, nodes: int, stride: int):
    """The result of a drafted step of ``nodes`` tokens per request laid out at the server's ``stride``: its accepted
    tokens (``next_token_ids`` and the next step's input) in rows of ``stride``, each row's first ``nodes`` as they
    were, the rest zeros (read by no one: a row's accept length is at most ``nodes``). The scheduler reads a
    result's tokens by its ``speculative_num_draft_tokens`` (the server's), and merges and filters speculative
    inputs by their ``draft_token_num``: all of them the server's."""
    if nodes == stride:
        return result
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    wide = torch.nn.functional.pad(result.next_token_ids.view(bs, nodes), (0, stride - nodes)).view(-1)
    result.next_token_ids = wide
    result.speculative_num_draft_tokens = stride
    nxt = result.next_draft_input
    result.next_draft_input = NgramVerifyInput(draft_token_num=stride, new_seq_lens=nxt.new_seq_lens,
                                               accept_tokens=wide, accept_lens=nxt.accept_lens)
    return result
