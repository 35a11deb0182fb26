"""LUMOTREE_SUFFIX's draft-tree size per batch bucket (lumotree.sglang.suffix_sizes): the table, the graphs a
smaller size captures, the swap of the NGRAM worker's state around a drafted step, and the result laid out at the
server's stride."""
from types import SimpleNamespace

import pytest
import torch

from lumotree.sglang import suffix_sizes
from lumotree.sglang.suffix_sizes import VerifySize, bucket_sizes, graph_bs_for, size_for, sizes_of, widen_result

# SGLang 0.5.17's default decode graph sizes up to 48 (a speculative server sized for 48 requests)
DEFAULT_BS_48 = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48]


def test_bucket_sizes_follow_the_verify_token_budget():
    assert bucket_sizes(1, 512, 32, 4) == {1: 32}
    assert bucket_sizes(48, 512, 32, 4) == {1: 32, 2: 32, 4: 32, 8: 32, 16: 32, 32: 16, 64: 8}
    assert bucket_sizes(200, 512, 32, 4)[256] == 4
    assert bucket_sizes(32, 256, 32, 4) == {1: 32, 2: 32, 4: 32, 8: 32, 16: 16, 32: 8}
    with pytest.raises(ValueError):
        bucket_sizes(0, 512, 32, 4)


def test_size_for_a_batch_is_its_buckets():
    sizes = bucket_sizes(48, 512, 32, 4)
    assert [size_for(sizes, b, 32) for b in (1, 16, 17, 32, 33, 48)] == [32, 32, 16, 16, 8, 8]
    assert size_for(sizes, 100, 32) == 8  # beyond the table (more requests than the server was sized for): its last
    assert size_for(None, 40, 16) == 16


def test_one_size_servers_keep_sglangs_loop_as_it_is():
    assert sizes_of(SimpleNamespace()) is None
    assert sizes_of(SimpleNamespace(lumotree_suffix_sizes={1: 32, 2: 32, 4: 32, 8: 32})) is None
    assert sizes_of(SimpleNamespace(lumotree_suffix_sizes={1: 32, 32: 16})) == {1: 32, 32: 16}


def test_a_smaller_size_captures_the_graphs_of_its_buckets():
    sizes = bucket_sizes(48, 512, 32, 4)
    assert graph_bs_for(sizes, 16, DEFAULT_BS_48) == [18, 20, 22, 24, 26, 28, 30, 32]
    assert graph_bs_for(sizes, 8, DEFAULT_BS_48) == [40, 44, 48]
    # the user's sizes: a batch of 17-32 pads up to 64, the next captured size
    assert graph_bs_for(bucket_sizes(64, 512, 32, 4), 16, [1, 8, 16, 64]) == [64]
    assert graph_bs_for(sizes, 16, [1, 2, 4, 8]) == []  # nothing captured for it: served without graphs
    assert graph_bs_for(sizes, 16, None) is None


def test_the_server_takes_the_largest_size_and_keeps_the_table():
    from lumotree.sglang.plugin import default_suffix_budget

    def sized(running, tokens=None, env=None):
        sa = SimpleNamespace(speculative_num_draft_tokens=tokens, max_running_requests=running)
        default_suffix_budget(sa, env or {})
        return sa.speculative_num_draft_tokens, sizes_of(sa)

    assert sized(8) == (32, None)  # one size: SGLang's loop as it is
    assert sized(32) == (32, None)  # 1,024 verify tokens per step: 32 nodes up to 32 requests
    assert sized(64) == (32, {1: 32, 2: 32, 4: 32, 8: 32, 16: 32, 32: 32, 64: 16})
    assert sized(None)[1][64] == 16  # SGLang's NGRAM default of 48 running requests
    assert sized(200)[1][128] == 8 and sized(200)[1][256] == 4
    assert sized(32, env={"LUMOTREE_SUFFIX_TOKENS_PER_STEP": "512"}) == (32, {1: 32, 2: 32, 4: 32, 8: 32, 16: 32,
                                                                            32: 16})
    assert sized(8, tokens=6) == (6, None)  # given: one size at every batch
    assert sized(32, env={"LUMOTREE_SUFFIX_TOKENS_PER_STEP": "256"}) == (32, {1: 32, 2: 32, 4: 32, 8: 32, 16: 16,
                                                                            32: 8})
    with pytest.raises(ValueError, match="LUMOTREE_SUFFIX_TOKENS_PER_STEP must be a positive integer"):
        sized(32, env={"LUMOTREE_SUFFIX_TOKENS_PER_STEP": "lots"})


def test_widen_result_lays_the_accepted_tokens_out_at_the_servers_stride():
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    toks = torch.tensor([5, 6, 0, 7, 0, 0], dtype=torch.int32)  # 2 requests x 3 nodes, 2 and 1 accepted
    lens, seq = torch.tensor([2, 1]), torch.tensor([10, 20])
    res = SimpleNamespace(next_token_ids=toks, speculative_num_draft_tokens=8,
                          next_draft_input=NgramVerifyInput(draft_token_num=3, new_seq_lens=seq, accept_tokens=toks,
                                                            accept_lens=lens))
    out = widen_result(res, 2, 3, 8)
    assert out.next_token_ids.tolist() == [5, 6, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]
    assert out.next_token_ids.dtype == torch.int32 and out.speculative_num_draft_tokens == 8
    nxt = out.next_draft_input
    assert nxt.draft_token_num == 8 and nxt.accept_tokens is out.next_token_ids
    assert nxt.accept_lens is lens and nxt.new_seq_lens is seq
    # the scheduler's filter of the next input reads rows of its stride
    nxt.filter_batch(torch.tensor([1]))
    assert nxt.accept_tokens.tolist() == [7, 0, 0, 0, 0, 0, 0, 0] and nxt.accept_lens.tolist() == [1]
    assert widen_result(res, 2, 8, 8) is res  # the server's size: as it is


def _worker(nodes=8):
    mr = SimpleNamespace(attn_backend="server-backend", decode_cuda_graph_runner="server-graphs")
    w = SimpleNamespace(draft_token_num=nodes, _target_worker=SimpleNamespace(model_runner=mr),
                        ngram_corpus=SimpleNamespace(n=nodes))
    for k in suffix_sizes._VIEWS:
        setattr(w, k, f"server-{k}")
    return w, mr


def test_a_smaller_size_is_swapped_in_for_its_step_and_out_after():
    w, mr = _worker()
    views = suffix_sizes.batch_views(4, 2, "cpu")
    vs = VerifySize(2, "small-backend", "small-graphs", views)
    with vs.active(w):
        assert w.draft_token_num == 2 and w.ngram_corpus.n == 2
        assert mr.attn_backend == "small-backend" and mr.decode_cuda_graph_runner == "small-graphs"
        assert w.positions_batch[3].shape == (6,) and w.tree_mask_batch[3].shape == (12,)
        assert w.retrieve_indexes_batch[3].shape == (3, 2) and w.retrieve_indexes_batch[3].is_contiguous()
    assert (w.draft_token_num, w.ngram_corpus.n, mr.attn_backend, mr.decode_cuda_graph_runner) == (
        8, 8, "server-backend", "server-graphs")
    assert all(getattr(w, k) == f"server-{k}" for k in suffix_sizes._VIEWS)
    with pytest.raises(RuntimeError):  # restored when the step fails too
        with VerifySize(2, "small-backend", None, views).active(w):
            assert mr.decode_cuda_graph_runner is None  # no graphs of its own: eager, not the server's 8-node graphs
            raise RuntimeError("verify failed")
    assert w.draft_token_num == 8 and mr.attn_backend == "server-backend"
    assert w.positions_batch == "server-positions_batch"
    assert vs.steps == 1


def test_a_drafted_step_verifies_its_buckets_tree_and_answers_at_the_servers_stride(monkeypatch):
    """The worker's drafted step: a batch whose bucket takes a smaller tree runs SGLang's NGRAM forward with that
    size swapped in, and its result comes back at the server's stride; a batch of the server's size, or one that
    is not plain (logprobs), runs SGLang's forward as it is."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    from test_finish import ngram_base  # its stand-in for SGLang's NGRAM worker where its C++ ops are not built

    NGRAMWorker = ngram_base(monkeypatch)
    from lumotree.sglang.suffix import ngram_worker

    seen = []

    def forward(self, batch, *a, **k):
        n, bs = self.draft_token_num, batch.seq_lens.shape[0]
        seen.append((n, self._target_worker.model_runner.attn_backend))
        toks = torch.arange(bs * n, dtype=torch.int32)
        return SimpleNamespace(next_token_ids=toks, speculative_num_draft_tokens=8, next_draft_input=NgramVerifyInput(
            draft_token_num=n, new_seq_lens=batch.seq_lens + 1, accept_tokens=toks, accept_lens=torch.ones(bs)))

    monkeypatch.setattr(NGRAMWorker, "forward_batch_generation", forward)
    w = object.__new__(ngram_worker(lambda sa: None))
    stub, mr = _worker(8)
    w.__dict__.update(stub.__dict__)
    w._ledger = None
    w._sizes = {1: 8, 2: 8, 4: 4}
    w._verify_sizes = {4: VerifySize(4, "small-backend", None, suffix_sizes.batch_views(4, 4, "cpu"))}
    si = SimpleNamespace(has_custom_logit_processor=False, penalizer_orchestrator=None)

    def batch(bs, logprob=False):
        return SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=torch.arange(bs) + 5, spec_info=object(),
                               return_logprob=logprob, return_hidden_states=False, has_grammar=False,
                               sampling_info=si, reqs=[])

    out = w._forward(batch(3))
    assert seen[-1] == (4, "small-backend") and w.draft_token_num == 8 and mr.attn_backend == "server-backend"
    assert out.next_token_ids.view(3, 8)[:, :4].tolist() == torch.arange(12).view(3, 4).tolist()
    assert out.next_draft_input.draft_token_num == 8
    out = w._forward(batch(2))  # bucket 2: the server's size
    assert seen[-1] == (8, "server-backend") and out.next_token_ids.numel() == 16
    out = w._forward(batch(3, logprob=True))  # not plain: SGLang's one size
    assert seen[-1] == (8, "server-backend") and out.next_draft_input.draft_token_num == 8


def test_draft_preparation_reads_the_last_steps_tokens_at_their_stride():
    """The last step's accepted tokens are in rows of the server's stride while this step drafts a smaller tree:
    the splice reads each request's own row, and the drafts come at the step's size."""
    from lumotree.sglang.suffix import SuffixCorpus, prepare_draft_tokens

    def run(stride_now):
        w = SimpleNamespace(draft_token_num=stride_now, max_trie_depth=64, enable_overlap=True,
                            ngram_corpus=SuffixCorpus(stride_now))
        reqs = [SimpleNamespace(rid="a", origin_input_ids=[1, 2, 3, 1, 2], output_ids=[3]),
                SimpleNamespace(rid="b", origin_input_ids=[7, 8, 9, 7], output_ids=[8])]
        prev = torch.tensor([1, 2, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0])  # rows of 8: "1 2" and "9" accepted
        spec = SimpleNamespace(accept_tokens=prev, accept_lens=torch.tensor([2, 1]), draft_token_num=8)
        toks, mask = prepare_draft_tokens(w, SimpleNamespace(reqs=reqs, grammar_needs_sync=lambda: False,
                                                             spec_info=spec))
        return toks.reshape(2, stride_now), w

    small, w = run(4)
    assert small[:, 0].tolist() == [2, 9]  # each request's root: the last token of its own row
    assert small[0, 1] == 3 and small[1, 1] == 7  # "1 2" was followed by 3, "9" by 7
    assert w.ngram_corpus.drafter.context("b") == [7, 8, 9, 7, 8, 9]
    large, _ = run(8)
    assert large[:, 0].tolist() == [2, 9]
