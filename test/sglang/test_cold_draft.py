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
