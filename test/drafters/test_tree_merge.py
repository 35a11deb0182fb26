"""The device form of draft merging and stale-draft re-rooting (lumotree.drafters.tree_merge) ==
their per-request references (merge_drafts, align_draft) on random trees; host-sync-free shapes."""
import random

import pytest
import torch

from lumotree.drafters.suffix import Draft, align_draft, merge_drafts
from lumotree.drafters.tree_merge import align_stale, merge_trees, to_lists


def random_draft(rng, n, vocab, root):
    """A tree of n nodes with distinct sibling tokens, monotone path scores (random in (0, 1])."""
    tokens, parents, scores = [root], [-1], [1.0]
    for i in range(1, n):
        p = rng.randrange(i)
        used = {tokens[j] for j in range(i) if parents[j] == p}
        choices = [t for t in range(vocab) if t not in used]
        if not choices:
            break
        tokens.append(rng.choice(choices))
        parents.append(p)
        scores.append(scores[p] * rng.uniform(0.05, 0.999))
    return Draft(tokens, parents, scores)


def batch(drafts, n):
    B = len(drafts)
    tok = torch.zeros(B, n, dtype=torch.long)
    par = torch.full((B, n), -1, dtype=torch.long)
    sc = torch.zeros(B, n)
    num = torch.tensor([len(d) for d in drafts])
    for b, d in enumerate(drafts):
        tok[b, :len(d)] = torch.tensor(d.tokens)
        par[b, :len(d)] = torch.tensor(d.parents)
        sc[b, :len(d)] = torch.tensor(d.scores)
        tok[b, len(d):] = 7777  # padding must be ignored
        par[b, len(d):] = torch.randint(0, max(1, len(d)), (n - len(d),))
    return tok, par, sc.double(), num


def paths(tokens, parents, scores):
    """{token path from the root: score} of a tree (order-free comparison)."""
    out, p = {}, []
    for i, (t, q) in enumerate(zip(tokens, parents)):
        p.append(() if q < 0 else p[q] + (t,))
        if q >= 0:
            out[p[-1]] = scores[i]
    return out, tokens[0]


def assert_valid(tok, par, num):
    for b in range(tok.shape[0]):
        assert par[b, 0] == -1
        for i in range(1, int(num[b])):
            assert 0 <= par[b, i] < i, (b, i, par[b].tolist())


@pytest.mark.parametrize("seed", range(6))
def test_merge_trees_equals_merge_drafts(seed):
    rng = random.Random(seed)
    B, budget = 5, 12
    mtp, suf = [], []
    for b in range(B):
        root = rng.randrange(4)
        vocab = rng.choice([3, 6, 40])  # small vocabularies: many shared paths
        mtp.append(random_draft(rng, rng.randint(1, 10), vocab, root))
        other_root = root if b != 3 else root + 100  # request 3: the second source has another root
        suf.append(random_draft(rng, rng.randint(1, 14), vocab, other_root))
    w = [1.0, 0.7]
    tree = merge_trees([batch(mtp, 10), batch(suf, 14)], budget, weights=w)
    tok, par, sc, num = tree
    assert tok.shape == (B, budget) and num.le(budget).all()
    assert_valid(tok, par, num)
    for b, (t, p, s) in enumerate(to_lists(tree)):
        srcs = [mtp[b]] if b == 3 else [mtp[b], suf[b]]
        ref = merge_drafts(srcs, budget, weights=w[:len(srcs)])
        got_paths, got_root = paths(t, p, s)
        ref_paths, ref_root = paths(ref.tokens, ref.parents, ref.scores)
        assert got_root == ref_root
        assert got_paths.keys() == ref_paths.keys(), (b, sorted(got_paths), sorted(ref_paths))
        for k in ref_paths:
            assert got_paths[k] == pytest.approx(ref_paths[k])
        assert s == sorted(s, reverse=True)  # best-first
        assert (tok[b, num[b]:] == t[0]).all() and (par[b, num[b]:] == -1).all()  # padding


def test_merge_trees_single_source_is_a_top_k_prune():
    rng = random.Random(3)
    d = random_draft(rng, 20, 50, 1)
    tree = merge_trees([batch([d], 20)], 8)
    (t, p, s), = to_lists(tree)
    ref = merge_drafts([d], 8)
    assert paths(t, p, s)[0].keys() == paths(ref.tokens, ref.parents, ref.scores)[0].keys()
    assert len(t) == 8


def test_merge_trees_rejects_bad_input():
    d = batch([Draft([1, 2], [-1, 0], [1.0, 0.5])], 2)
    with pytest.raises(ValueError, match="budget"):
        merge_trees([d], 0)
    with pytest.raises(ValueError, match="weights"):
        merge_trees([d, d], 4, weights=[1.0])
    with pytest.raises(ValueError, match=r"\[B, N\]"):
        merge_trees([(d[0][0], d[1], d[2], d[3])], 4)


@pytest.mark.parametrize("seed", range(6))
def test_align_stale_equals_align_draft(seed):
    rng = random.Random(100 + seed)
    B, N, A = 6, 16, 4
    drafts, acc, acc_len = [], torch.zeros(B, A, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    refs = []
    for b in range(B):
        d = random_draft(rng, rng.randint(1, N), 5, rng.randrange(5))
        drafts.append(d)
        # accepted tokens: a path of the tree (request 0 and 1: leaving it after one token; 2: none)
        path, node = [], 0
        for _ in range(rng.randint(1, A)):
            kids = [i for i in range(len(d)) if d.parents[i] == node]
            if not kids:
                break
            node = rng.choice(kids)
            path.append(d.tokens[node])
        if b < 2:
            path = (path[:1] or [d.tokens[0]]) + [99]
        if b == 2:
            path = []
        acc[b, :len(path)] = torch.tensor(path, dtype=torch.long) if path else acc[b, :0]
        acc[b, len(path):] = 55  # ignored
        acc_len[b] = len(path)
        refs.append(align_draft(d, path) if path else d)
    tree = align_stale(batch(drafts, N), acc, acc_len)
    tok, par, sc, num = tree
    assert_valid(tok, par, num)
    for b, (t, p, s) in enumerate(to_lists(tree)):
        assert t == refs[b].tokens and p == refs[b].parents, b
        assert s == pytest.approx(refs[b].scores)
    assert num[0] == 1 and num[1] == 1  # walked off the tree: the new root only
    assert tok[0, 0] == 99 and tok[1, 0] == 99


def test_align_stale_then_merge_with_the_mtp_tree():
    """The serving order: re-root the host's stale suffix draft, then merge with the MTP tree of
    the same (new) root under the budget."""
    host = Draft([5, 6, 7, 8, 9], [-1, 0, 1, 2, 1], [1.0, 0.9, 0.8, 0.7, 0.1])  # 5 -> 6 -> {7 -> 8, 9}
    suf = align_stale(batch([host], 5), torch.tensor([[6, 7]]), torch.tensor([2]))  # root 7, child 8
    assert to_lists(suf) == [([7, 8], [-1, 0], [1.0, pytest.approx(0.875)])]
    mtp = batch([Draft([7, 3, 8, 4], [-1, 0, 0, 1], [1.0, 0.6, 0.2, 0.5])], 4)
    (t, p, s), = to_lists(merge_trees([mtp, suf], 3))
    assert t == [7, 8, 3] and p == [-1, 0, 0] and s == pytest.approx([1.0, 0.875, 0.6])


def test_equal_scores_along_a_path_keep_parents_first():
    """Suffix drafts often continue with probability 1 (one continuation seen): a chain of equal
    scores must still come out parent before child, whatever the slot order of the sources."""
    chain = Draft([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0, 1.0])
    # the same chain given in reverse slot order is not a valid input (parents precede children),
    # but a second source that extends it deeper, with equal scores, puts its new nodes after A's
    deeper = Draft([1, 2, 3, 4, 5, 6, 7], [-1, 0, 1, 2, 3, 4, 5], [1.0] * 7)
    other = Draft([1, 9, 8], [-1, 0, 1], [1.0, 1.0, 1.0])
    tok, par, sc, num = merge_trees([batch([chain], 5), batch([other], 3), batch([deeper], 7)], 10)
    assert_valid(tok, par, num)
    assert int(num[0]) == 9
    assert sorted(paths(*to_lists((tok, par, sc, num))[0])[0]) == sorted(
        paths(*(lambda d: (d.tokens, d.parents, d.scores))(merge_drafts([chain, other, deeper], 10)))[0])


@pytest.mark.gpu
def test_merge_and_align_capture_in_a_cuda_graph():
    """No host synchronisation: both run inside a captured CUDA graph and replay with new inputs."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = random.Random(7)
    drafts = [random_draft(rng, 12, 6, 1) for _ in range(4)]
    host = [tuple(t.cuda() for t in batch(drafts, 12))]
    acc = torch.tensor([[d.tokens[1]] for d in drafts], device="cuda")
    acc_len = torch.ones(4, dtype=torch.long, device="cuda")
    mtp = tuple(t.cuda() for t in batch([random_draft(rng, 8, 6, d.tokens[1]) for d in drafts], 8))
    out = None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            align_stale(host[0], acc, acc_len)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = merge_trees([mtp, align_stale(host[0], acc, acc_len)], 10)
    g.replay()
    torch.cuda.synchronize()
    ref = merge_trees([tuple(t.cpu() for t in mtp), align_stale(tuple(t.cpu() for t in host[0]), acc.cpu(),
                                                                 acc_len.cpu())], 10)
    for a, b in zip(out, ref):
        assert torch.equal(a.cpu(), b.cpu()) if a.dtype != torch.float64 else torch.allclose(a.cpu(), b)


def test_max_depth_bound_gives_the_same_merge_when_it_covers_the_trees():
    rng = random.Random(11)
    a = [random_draft(rng, 10, 3, 0) for _ in range(3)]
    b = [random_draft(rng, 12, 3, 0) for _ in range(3)]
    full = merge_trees([batch(a, 10), batch(b, 12)], 9)
    depth = max(_depth(d) for d in b)
    bounded = merge_trees([batch(a, 10), batch(b, 12)], 9, max_depth=depth)
    for x, y in zip(full, bounded):
        assert torch.equal(x, y)


def _depth(d):
    best = 0
    for i in range(len(d)):
        k, j = 0, i
        while d.parents[j] >= 0:
            j, k = d.parents[j], k + 1
        best = max(best, k)
    return best
