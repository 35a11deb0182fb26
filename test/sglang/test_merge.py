"""MTP + suffix branches in one served tree (lumotree.sglang.merge): SGLang's layout of the merged
tree (links, positions, attention-mask cells) == TreeDescriptor's, and the merge policy."""
import random
import types

import pytest
import torch

from lumotree import TreeDescriptor
from lumotree.sglang import merge
from lumotree.tree import parents_from_eagle


def random_parents(rng, B, N):
    return torch.tensor([[-1] + [rng.randrange(i) for i in range(1, N)] for _ in range(B)])


def test_eagle_links_equal_the_descriptor():
    rng = random.Random(0)
    par = random_parents(rng, 5, 9)
    tree = TreeDescriptor.from_parents(par)
    first, nxt = merge.eagle_links(par)
    assert torch.equal(first, tree.first_child) and torch.equal(nxt, tree.next_sibling)


@pytest.mark.parametrize("mode", [merge.FULL_MASK, merge.QLEN_ONLY])
def test_write_tree_mask_equals_sglang_layout(mode):
    rng = random.Random(1)
    B, N = 3, 6
    tree = TreeDescriptor.from_parents(random_parents(rng, B, N))
    seq_lens = torch.tensor([5, 1, 9])
    ref = tree.to_eagle(seq_lens)["custom_mask"] if mode == merge.FULL_MASK else tree.mask.flatten()
    mask = torch.ones_like(ref) if mode == merge.FULL_MASK else torch.zeros_like(ref)
    merge.write_tree_mask(mask, tree.mask, seq_lens, mode)
    assert torch.equal(mask, ref)
    with pytest.raises(NotImplementedError, match="bit-packed"):
        merge.write_tree_mask(mask, tree.mask, seq_lens, merge.QLEN_ONLY_BITPACKING)


def fake_verify_input(mtp_parents, mtp_tokens, seq_lens):
    tree = TreeDescriptor.from_parents(mtp_parents)
    e = tree.to_eagle(seq_lens)
    return types.SimpleNamespace(draft_token=mtp_tokens.flatten().clone(), positions=e["positions"].clone(),
                                 retrieve_index=e["retrieve_index"], retrieve_next_token=e["retrieve_next_token"].clone(),
                                 retrieve_next_sibling=e["retrieve_next_sibling"].clone(),
                                 custom_mask=e["custom_mask"].clone())


def paths(tokens, parents):
    out, p = set(), []
    for t, q in zip(tokens, parents):
        p.append(() if q < 0 else p[q] + (t,))
        out.add(p[-1])
    return out


def test_merge_rebuilds_the_verify_input_consistently():
    N = 6
    # request 0: its context repeats "1 2 3 4", so its suffix draft after "... 4" proposes 1 -> 2 -> 3
    # request 1: no repetition, no suffix draft: its MTP tree stays whole
    ctx = [[9, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4], [5, 6, 7, 8]]
    mtp_par = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 0, 4]])
    mtp_tok = torch.tensor([[4, 1, 7, 8, 2, 6], [8, 11, 12, 13, 14, 15]])
    seq_lens = torch.tensor([len(c) for c in ctx])
    vi = fake_verify_input(mtp_par, mtp_tok, seq_lens)
    m = merge.SuffixMerge(N, slots=3, max_spec=3)
    m.merge(vi, seq_lens, merge.FULL_MASK, ["a", "b"], ctx)
    tok = vi.draft_token.view(2, N)
    par = parents_from_eagle(vi.retrieve_next_token, vi.retrieve_next_sibling)
    tree = TreeDescriptor.from_parents(par)  # validates: a tree, parents first
    assert torch.equal(vi.positions, (seq_lens[:, None] + tree.depth).flatten())
    assert torch.equal(vi.custom_mask, tree.to_eagle(seq_lens)["custom_mask"])
    # the first N - S = 3 MTP nodes (root, 1, 7); the suffix branch 1 -> 2 -> 3 merged onto them (MTP
    # also had 1 -> 2); the next MTP node (1 -> 8) fills the last slot, 7 -> 6 does not fit
    assert paths(tok[0].tolist(), par[0].tolist()) == {(), (1,), (7,), (1, 2), (1, 2, 3), (1, 8)}
    assert tok[0, 0] == 4 and tok[1, 0] == 8
    assert paths(tok[1].tolist(), par[1].tolist()) == paths(mtp_tok[1].tolist(), mtp_par[1].tolist())
    assert m.steps == 1 and m.suffix_draft_nodes == 3


def test_merge_tracks_requests_and_retires_them():
    m = merge.SuffixMerge(4, slots=2)
    m.observe("a", [1, 2, 3])
    m.observe("a", [1, 2, 3, 4, 5])
    assert m.drafter.context("a") == [1, 2, 3, 4, 5]
    m.observe("a", [7])  # a shorter list: the request was restarted
    assert m.drafter.context("a") == [7]
    m.forget(["b"])
    assert m.drafter.context("a") == [] and "a" not in m._seen
    with pytest.raises(ValueError, match="slots"):
        merge.SuffixMerge(4, slots=4)


def test_hook_wraps_sglangs_builder(monkeypatch):
    from lumotree.sglang.patches import eagle_verify_input

    N = 4
    vi = fake_verify_input(torch.tensor([[-1, 0, 1, 0]]), torch.tensor([[3, 1, 2, 9]]), torch.tensor([6]))
    calls = []

    def original(*a, **kw):
        calls.append(kw["num_draft_tokens"])
        return vi

    monkeypatch.setattr(merge, "_STATE", None)
    hooked = eagle_verify_input.wrap(original)
    req = types.SimpleNamespace(rid="r", origin_input_ids=[1, 2, 3, 1, 2], output_ids=[3])
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False), seq_lens=torch.tensor([6]),
                                  reqs=[req])
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=types.SimpleNamespace(verify_mask=None)))
    out = hooked(batch, None, None, None, None, None, target_worker=worker, topk=2, num_steps=3, num_draft_tokens=N,
                 tree_mask_mode=merge.FULL_MASK, device="cpu")
    assert out is vi and calls == [N]
    par = parents_from_eagle(vi.retrieve_next_token, vi.retrieve_next_sibling)
    assert (1, 2) in paths(vi.draft_token.tolist(), par[0].tolist())  # "3 -> 1 -> 2" seen before
    assert merge._STATE.steps == 1


def test_suffix_branches_stay_within_the_accepted_path_length():
    """SGLang keeps num_steps + 1 accepted tokens per step: deeper suffix nodes would never be
    accepted, so the drafter stops at num_steps below the root."""
    ctx = [[7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7]]
    vi = fake_verify_input(torch.tensor([[-1, 0, 0, 0, 0, 0, 0, 0]]), torch.tensor([[7, 9, 10, 11, 12, 13, 14, 15]]),
                           torch.tensor([15]))
    m = merge.SuffixMerge(8, slots=6, max_spec=2)
    m.merge(vi, torch.tensor([15]), merge.FULL_MASK, ["a"], ctx)
    par = parents_from_eagle(vi.retrieve_next_token, vi.retrieve_next_sibling)
    assert TreeDescriptor.from_parents(par).depth.max() == 2
    assert (1, 2) in paths(vi.draft_token.tolist(), par[0].tolist())
