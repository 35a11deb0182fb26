"""The benchmark-only controlled-acceptance drafter: driven through a simulated NGRAM loop (host
drafting, greedy tree verification against a known target, accepted tokens fed back), its accept
length follows the set probability once the prompt's continuation is known."""
import random

import numpy as np
import pytest

from lumotree.sglang.oracle import OracleCorpus, first_child_chain


def greedy_accept(tokens, mask, target_next):
    """Greedy tree verification: walk from the root, at each node take the child whose token equals
    the target's next token. ``target_next(i)`` is the target's token after accepting i drafts."""
    n = len(tokens)
    parents = [max((j for j in range(i) if mask[i, j]), default=-1) for i in range(n)]
    node, acc = 0, []
    while True:
        want = target_next(len(acc))
        kids = [c for c in range(n) if parents[c] == node and tokens[c] == want]
        if not kids:
            return acc + [want]  # accepted drafts + the bonus token
        node = kids[0]
        acc.append(int(tokens[node]))


def run(corpus, rid, prompt, truth, steps):
    ctx = list(prompt)
    lens = []
    for _ in range(steps):
        toks, mask = corpus.batch_get([rid], [ctx[-64:]], [len(ctx)])
        n = corpus.n
        out = len(ctx) - len(prompt)
        got = greedy_accept(toks, mask.reshape(n, n), lambda a: truth[out + a])
        assert got == truth[out: out + len(got)]  # verification is exact whatever the drafts
        ctx += got
        lens.append(len(got))
    corpus.erase_match_state([rid])
    return lens


@pytest.mark.parametrize("p", [0.0, 0.6, 1.0])
def test_accept_length_follows_p(p):
    rng = random.Random(1)
    prompt = [rng.randrange(50000) for _ in range(80)]
    truth = [rng.randrange(50000) for _ in range(4000)]
    c = OracleCorpus(draft_token_num=8, p=p, topk=2, depth=4)
    depth = len(c.chain) - 1
    first = run(c, "warm", prompt, truth, 1200)  # learns 1200 tokens of the continuation
    assert np.mean(first) < 1.05  # nothing known yet: random drafts are rejected
    measured = run(c, "measured", prompt, truth, 200)
    expect = 1 + sum(p ** j for j in range(1, depth + 1))
    assert abs(np.mean(measured) - expect) < 0.15, (np.mean(measured), expect)


def test_tree_shape_and_reset():
    c = OracleCorpus(draft_token_num=6, p=0.5, topk=2, depth=3)
    assert c.chain[0] == 0 and len(c.chain) >= 2 and first_child_chain([-1, 0, 0, 1]) == [0, 1, 3]
    toks, mask = c.batch_get(["a"], [[1, 2, 3]], [3])
    assert toks.shape == (6,) and toks[0] == 3 and mask.shape == (36,)
    c.reset()
    assert not c.continuations and not c._seen
    with pytest.raises(ValueError):
        OracleCorpus(4, p=1.5, topk=2, depth=2)
