"""The first draft after a no-draft step (``lumotree.sglang.worker.cold_draft_input``): SGLang's own
tree selection (``select_top_k_tokens`` + ``organize_draft_results``, on CPU) from the stub keeps every
selected node's parent, the rule of SGLang's ``build_tree`` kernel (a node whose parent is not selected
is dropped with its "invalid eagle tree" warning). SGLang's zero stub breaks it."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
from draft_trees import orphans, select, softmaxes  # noqa: E402

from lumotree.sglang.worker import cold_draft_input  # noqa: E402


@pytest.mark.parametrize("topk, steps, nodes", [(2, 3, 6), (4, 3, 8), (2, 5, 10), (1, 3, 4)])
def test_the_tree_after_a_no_draft_step_is_whole(topk, steps, nodes):
    bs = 16
    stub = SimpleNamespace(topk_p=torch.zeros(bs, topk), topk_index=torch.zeros(bs, topk, dtype=torch.int64))
    cold_draft_input(stub, topk)
    assert stub.topk_p.shape == (bs, topk) and stub.topk_index.dtype == torch.int64
    assert all(len(set(r.tolist())) == topk for r in stub.topk_index)  # distinct first-level tokens
    for seed in range(4):
        assert orphans(*select(stub.topk_p, stub.topk_index, steps, nodes, softmaxes(bs, topk, seed=seed)), topk) == [0] * bs


def test_sglangs_zero_stub_selects_orphans():
    """What the stub replaces: from zero scores the selection ties everywhere and keeps orphans."""
    bs, topk = 16, 2
    zeros = torch.zeros(bs, topk)
    idx = torch.zeros(bs, topk, dtype=torch.int64)
    assert sum(sum(orphans(*select(zeros, idx, 3, 6, softmaxes(bs, topk, seed=s)), topk)) for s in range(4)) > 0


def test_worker_stub_is_sglangs_with_a_whole_tree(monkeypatch):
    """The worker's stub for a skipped draft-extend: SGLang's (its hidden-state zeros) with the first level
    of :func:`cold_draft_input`."""
    import sglang.srt.speculative.eagle_worker_v2 as ew

    from lumotree.sglang.worker import worker_class

    def sglang_stub(self, batch, out):
        out.next_draft_input.topk_p = torch.zeros(3, 2)
        out.next_draft_input.topk_index = torch.zeros(3, 2, dtype=torch.int64)
        out.next_draft_input.hidden_states = torch.zeros(3, 8)

    monkeypatch.setattr(ew.EAGLEWorkerV2, "_stub_skipped_draft_extend", sglang_stub)
    w = object.__new__(worker_class())
    w.topk = 2
    out = SimpleNamespace(next_draft_input=SimpleNamespace())
    w._stub_skipped_draft_extend(SimpleNamespace(), out)
    d = out.next_draft_input
    assert d.topk_p.tolist() == [[0.5, 0.25]] * 3 and d.topk_index.tolist() == [[0, 1]] * 3
    assert d.hidden_states.shape == (3, 8)


def test_overlap_stubs_are_the_cold_first_level_without_new_tensors_each_step():
    """Under the overlap scheduler the worker's stub comes from :class:`ColdStubs`: the values of
    :func:`cold_draft_input` and zero hidden states, as views of buffers kept across steps (the FutureMap copies
    them), grown when a batch outgrows them."""
    from lumotree.sglang.worker import ColdStubs

    stubs = ColdStubs(2, (8, torch.bfloat16), "cpu")
    a, b, c = (SimpleNamespace() for _ in range(3))
    stubs.fill(a, 3)
    stubs.fill(b, 5)
    want = SimpleNamespace(topk_p=torch.zeros(5, 2), topk_index=torch.zeros(5, 2, dtype=torch.int64))
    cold_draft_input(want, 2)
    assert torch.equal(b.topk_p, want.topk_p) and torch.equal(b.topk_index, want.topk_index)
    assert b.hidden_states.shape == (5, 8) and b.hidden_states.dtype == torch.bfloat16 and not b.hidden_states.any()
    assert a.topk_p.shape == (3, 2) and a.topk_p.data_ptr() == b.topk_p.data_ptr()  # no new tensor per step
    assert a.hidden_states.data_ptr() == b.hidden_states.data_ptr()
    stubs.fill(c, 100)  # outgrown: new buffers, same values
    assert c.topk_p.shape == (100, 2) and torch.equal(c.topk_p[:5], want.topk_p) and stubs.rows >= 100
    stubs = ColdStubs(4, (None, None), "cpu")  # a draft without a recurrent hidden state relays none
    stubs.fill(a, 2)
    assert a.hidden_states is None and a.topk_index.tolist() == [[0, 1, 2, 3]] * 2


@pytest.mark.parametrize("overlap", [True, False])
def test_worker_stub_shared_only_under_the_overlap_scheduler(monkeypatch, overlap):
    """The synchronous scheduler hands the draft input to the next step's draft itself: there the worker keeps
    SGLang's stub with :func:`cold_draft_input`'s own copies."""
    import sglang.srt.speculative.eagle_utils as eu
    import sglang.srt.speculative.eagle_worker_v2 as ew

    from lumotree.sglang.worker import worker_class

    sglang_calls = []
    monkeypatch.setattr(ew.EAGLEWorkerV2, "_stub_skipped_draft_extend",
                        lambda self, batch, out: sglang_calls.append(1) or setattr(
                            out.next_draft_input, "hidden_states", torch.zeros(3, 8)) or setattr(
                            out.next_draft_input, "topk_p", torch.zeros(3, 2)) or setattr(
                            out.next_draft_input, "topk_index", torch.zeros(3, 2, dtype=torch.int64)))
    monkeypatch.setattr(eu, "get_draft_recurrent_hidden_state_spec", lambda runner: (8, torch.float32))
    w = object.__new__(worker_class())
    w.topk, w.device, w._cold_stubs = 2, "cpu", None
    w._draft_worker = SimpleNamespace(draft_runner=None)
    from lumotree.sglang.patches import future_map_cold_rows as cr

    monkeypatch.setattr(cr, "_pending", None)
    monkeypatch.setattr(cr, "_stubs", None)
    batch = SimpleNamespace(enable_overlap=overlap, seq_lens=torch.zeros(3), req_pool_indices_cpu=torch.tensor([4, 1, 7]))
    outs = [SimpleNamespace(next_draft_input=SimpleNamespace()) for _ in range(2)]
    for out in outs:
        w._stub_skipped_draft_extend(batch, out)
    d0, d1 = (o.next_draft_input for o in outs)
    assert d1.topk_p.tolist() == [[0.5, 0.25]] * 3 and d1.topk_index.tolist() == [[0, 1]] * 3
    assert d1.hidden_states.shape == (3, 8)
    assert sglang_calls == ([] if overlap else [1, 1])
    assert (d0.topk_p.data_ptr() == d1.topk_p.data_ptr()) == overlap
    # overlap: the stub named, with its host rows, for the FutureMap's stash (patches.future_map_cold_rows)
    assert (cr._pending is not None and cr._pending[0] is d1.topk_p and cr._pending[1].tolist() == [4, 1, 7]) == overlap
