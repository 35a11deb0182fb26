"""The MTP-path draft oracle (benchmark only): its injection against a per-row Python reference on
random trees, greedy verification of the injected trees accepting exactly the drawn run, the
recorded continuation round trip (prefill, verify runs, a second request with the same prompt),
slot reuse, and the environment switch."""
import random
from types import SimpleNamespace

import pytest
import torch

from lumotree.sglang import draft_oracle
from lumotree.sglang.draft_oracle import DraftOracle, uniform


def random_tree(rng, n, levels):
    """Parents (node 0 the root, parents before children, depth <= levels), first-child links."""
    parents, depth = [-1], [0]
    for i in range(1, n):
        cand = [j for j in range(i) if depth[j] < levels]
        p = rng.choice(cand)
        parents.append(p)
        depth.append(depth[p] + 1)
    first = [-1] * n
    for i in range(n - 1, 0, -1):
        first[parents[i]] = i
    return parents, depth, first


def children(parents, u):
    return [i for i in range(1, len(parents)) if parents[i] == u]


def reference_inject(tokens, parents, depth, first, truth, known, key, o, p, levels):
    """One row, in Python: ``truth[t]`` the recorded output index ``t`` (known for ``t < known``)."""
    tokens = list(tokens)
    if not (0 <= o < known and truth[o] == tokens[0]):
        return tokens
    k = 0
    while k < levels and o + k + 1 < known and float(uniform(torch.tensor(key), torch.tensor(o + k + 1))) < p:
        k += 1
    chain, u = [], 0
    for _ in range(levels):
        u = first[u] if u >= 0 else -1
        chain.append(u)
    for i in range(1, len(tokens)):
        d = depth[i]
        if d > levels or o + d >= known:
            continue
        if i in chain and d <= k:
            tokens[i] = truth[o + d]
        elif tokens[i] == truth[o + d]:
            tokens[i] = truth[o + d] - 1 if truth[o + d] > 0 else 1
    return tokens


def greedy_accepts(tokens, parents, depth, truth, o):
    """Drafts greedy verification accepts when the target's greedy output is ``truth``."""
    u, acc = 0, 0
    while True:
        nxt = [c for c in children(parents, u) if tokens[c] == truth[o + depth[u] + 1]]
        if not nxt:
            return acc
        u, acc = nxt[0], acc + 1


def setup(rng, bs, n, levels, p, vocab=50, plen=7, known=40):
    oracle = DraftOracle(p, rows=bs + 3, device="cpu", slots=bs, max_len=64)
    truths, keys, rows, os_, trees, toks, pos = [], [], [], [], [], [], []
    for b in range(bs):
        row = b + 2
        truth = [rng.randrange(vocab) for _ in range(known)]
        slot = b
        oracle.row_slot[row], oracle.row_plen[row] = slot, plen
        oracle.row_end[row] = 64 if b % 3 else rng.randrange(8, 40)  # some requests asked for fewer outputs
        oracle.cont[slot, :known] = torch.tensor(truth)
        oracle.filled[slot] = known if b % 5 else rng.randrange(known)  # some rows know less
        key = rng.randrange(1 << 31)
        oracle.slot_key[slot] = key
        o = rng.randrange(known)
        tree = random_tree(rng, n, levels)
        t = [rng.randrange(vocab) for _ in range(n)]
        t[0] = truth[o] if b % 7 else (truth[o] + 1) % vocab  # some roots are not the recorded token
        for i in range(1, n):  # drafts that match the truth by chance, to be made wrong
            if rng.random() < 0.3 and o + tree[1][i] < known:
                t[i] = truth[o + tree[1][i]]
        truths.append(truth), keys.append(key), rows.append(row), os_.append(o), trees.append(tree), toks.append(t)
        pos.append([1000 + plen + o + d for d in tree[1]])
    return oracle, truths, keys, rows, os_, trees, toks, pos


@pytest.mark.parametrize("n,levels", [(6, 3), (8, 3), (4, 1), (16, 5)])
def test_injection_equals_the_reference(n, levels):
    rng = random.Random(n * 10 + levels)
    bs, p = 24, 0.7
    oracle, truths, keys, rows, os_, trees, toks, pos = setup(rng, bs, n, levels, p)
    oracle.row_plen[torch.tensor(rows)] = oracle.row_plen[torch.tensor(rows)] + 1000  # positions start at 1000 + plen
    draft = torch.tensor(sum(toks, []), dtype=torch.int64)
    positions = torch.tensor(sum(pos, []), dtype=torch.int64)
    first = torch.tensor([t[2] for t in trees], dtype=torch.int32)
    oracle.inject(draft, positions, first, torch.tensor(rows, dtype=torch.int32), levels)
    for b in range(bs):
        parents, depth, fst = trees[b]
        known = int(oracle.filled[b])
        want = reference_inject(toks[b], parents, depth, fst, truths[b], known, keys[b], os_[b], p, levels)
        assert draft.view(bs, n)[b].tolist() == want, b


def test_greedy_verification_accepts_the_drawn_run_at_rate_p():
    """Injected trees accept exactly k drafts (the leading successes); over many positions the mean
    accepted drafts is p + p^2 + p^3 where the chain is 3 deep."""
    rng = random.Random(1)
    p, levels, n = 0.8, 3, 6
    total, count = 0, 0
    for trial in range(60):
        oracle, truths, keys, rows, os_, trees, toks, pos = setup(rng, 16, n, levels, p, known=64)
        oracle.filled[:] = 64
        for b in range(16):  # a 3-deep first-child chain, the other nodes children of the root
            trees[b] = ([-1, 0, 1, 2] + [0] * (n - 4), [0, 1, 2, 3] + [1] * (n - 4), [1, 2, 3, -1] + [-1] * (n - 4))
            os_[b] = rng.randrange(60)
            toks[b][0] = truths[b][os_[b]]
            pos[b] = [7 + os_[b] + d for d in trees[b][1]]
        draft = torch.tensor(sum(toks, []), dtype=torch.int64)
        oracle.inject(draft, torch.tensor(sum(pos, [])), torch.tensor([t[2] for t in trees]),
                      torch.tensor(rows), levels)
        for b in range(16):
            parents, depth, _ = trees[b]
            acc = greedy_accepts(draft.view(16, n)[b].tolist(), parents, depth, truths[b], os_[b])
            want = 0
            while want < levels and float(uniform(torch.tensor(int(oracle.slot_key[b])),
                                                  torch.tensor(os_[b] + want + 1))) < p:
                want += 1
            assert acc == want
            total, count = total + acc, count + 1
    assert abs(total / count - (p + p * p + p ** 3)) < 0.15, total / count


def greedy_walk(tokens, parents, predict):
    """SGLang's greedy tree verification of one row: from the root, the first child (in node order) whose
    token is the target's greedy choice at its parent; returns (accepted drafts, bonus token)."""
    u, acc = 0, 0
    while True:
        nxt = [c for c in children(parents, u) if tokens[c] == predict[u]]
        if not nxt:
            return acc, predict[u]
        u, acc = nxt[0], acc + 1


@pytest.mark.parametrize("n,levels", [(6, 3), (4, 3), (16, 5)])
def test_forced_logits_accept_exactly_the_drawn_run_whatever_the_target_computes(n, levels):
    """The verify's logits forced by the injection's plan: greedy verification accepts exactly the k drawn
    levels and emits the recorded continuation, its bonus the recorded next output -- for any logits the
    target produced (its own greedy choices differ from the recording here, as they can on another pass's
    numerics). Rows without injection keep the target's choice."""
    rng = random.Random(n + levels)
    bs, p, vocab = 24, 0.7, 50
    oracle, truths, keys, rows, os_, trees, toks, pos = setup(rng, bs, n, levels, p, vocab=vocab)
    oracle.row_plen[torch.tensor(rows)] += 1000
    draft = torch.tensor(sum(toks, []), dtype=torch.int64)
    plan = oracle.inject(draft, torch.tensor(sum(pos, []), dtype=torch.int64),
                         torch.tensor([t[2] for t in trees], dtype=torch.int32), torch.tensor(rows), levels)
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(bs * n, vocab, generator=g) * 5
    own = logits.argmax(-1).view(bs, n)
    assert draft_oracle.force(logits, plan, n)
    predict = logits.argmax(-1).view(bs, n)
    forced_rows = 0
    for b in range(bs):
        parents, depth, _ = trees[b]
        tokens = draft.view(bs, n)[b].tolist()
        known, o = int(oracle.filled[b]), os_[b]
        injected = 0 <= o < known and truths[b][o] == toks[b][0]
        if not injected:
            assert predict[b].tolist() == own[b].tolist()
            continue
        forced_rows += 1
        k = 0
        while k < levels and o + k + 1 < known and float(uniform(torch.tensor(keys[b]), torch.tensor(o + k + 1))) < p:
            k += 1
        chain_len, u = 0, 0
        while chain_len < k:  # the first-child chain may be shorter than k
            nxt = children(parents, u)
            if not nxt:
                break
            u, chain_len = nxt[0], chain_len + 1
        acc, bonus = greedy_walk(tokens, parents, predict[b].tolist())
        assert acc == chain_len, (b, acc, k, chain_len)
        if chain_len == k and o + k + 1 < known:
            assert bonus == truths[b][o + k + 1]
    assert forced_rows > bs // 2
    assert not draft_oracle.force(torch.zeros(bs * n + 1, vocab), plan, n)  # not the plan's batch: untouched


def test_sampling_hook_forces_the_plan_of_this_steps_injection_once():
    oracle = DraftOracle(0.5, rows=4, device="cpu", slots=2, max_len=8)
    node = torch.tensor([[0, 1], [-1, -1]])
    oracle.plan = (node, torch.tensor([[3, 4], [-1, -1]]))
    pool = SimpleNamespace(req_to_token=torch.zeros(4, 8), lumotree_draft_oracle=oracle)
    batch = SimpleNamespace(req_to_token_pool=pool, forward_mode=SimpleNamespace(is_idle=lambda: False))
    seen = []

    def original(vi, b, lo, *a):
        seen.append(lo.next_token_logits.argmax(-1).tolist())
        return "sampled"

    lo = SimpleNamespace(next_token_logits=torch.zeros(4, 6))
    vi = SimpleNamespace(draft_token_num=2)
    import os
    os.environ[draft_oracle.ENV_P] = "0.5"
    try:
        assert draft_oracle.sample(original, vi, batch, lo) == "sampled"
        assert seen[-1] == [3, 4, 0, 0] and oracle.plan is None
        draft_oracle.sample(original, vi, batch, lo)  # no new injection: nothing more forced
        assert lo.next_token_logits[0, 3] == draft_oracle.FORCE_BOOST
    finally:
        del os.environ[draft_oracle.ENV_P]


def test_recorded_continuation_serves_a_second_request_with_the_same_prompt():
    oracle = DraftOracle(1.0, rows=8, device="cpu", slots=4, max_len=32)
    prompt = [5, 6, 7, 8]
    first = SimpleNamespace(origin_input_ids=prompt, req_pool_idx=1)
    oracle.admit([first])
    rows = torch.tensor([1])
    oracle.record(rows, torch.tensor([4]), torch.tensor([20]), None, 1, prefill=True)  # output 0 = 20
    # a verify from root (output 0, position 4) accepting 3 tokens (stride 6): outputs 1-3
    oracle.record(rows, torch.tensor([4]), torch.tensor([21, 22, 23, 0, 0, 0]), torch.tensor([3]), 6, prefill=False)
    # a no-draft step from root output 3 (position 7): output 4
    oracle.record(rows, torch.tensor([7]), torch.tensor([24]), torch.tensor([1]), 1, prefill=False)
    assert oracle.cont[0, :5].tolist() == [20, 21, 22, 23, 24] and int(oracle.filled[0]) == 5
    # the same prompt again, in another row: p = 1 puts the continuation on the chain
    second = SimpleNamespace(origin_input_ids=list(prompt), req_pool_idx=3)
    other = SimpleNamespace(origin_input_ids=[9, 9], req_pool_idx=2)
    oracle.admit([other, second])
    assert int(oracle.filled[0]) == 5 and int(oracle.row_slot[3]) == 0 and int(oracle.row_slot[2]) == 1
    draft = torch.tensor([21, 99, 99, 99, 22, 99], dtype=torch.int32)  # root = output 1, chain 1 -> 2 -> 3
    first_child = torch.tensor([[1, 2, 3, -1, -1, -1]], dtype=torch.int32)
    positions = torch.tensor([5, 6, 7, 8, 6, 7])
    oracle.inject(draft, positions, first_child, torch.tensor([3]), 3)
    assert draft.tolist() == [21, 22, 23, 24, 21, 99]  # node 4 (depth 1, not on the chain) clashed: made wrong
    assert draft.dtype == torch.int32
    # beyond what is known the chain keeps the draft's own tokens
    draft = torch.tensor([23, 99, 99, 99, 99, 99])
    oracle.inject(draft, torch.tensor([7, 8, 9, 10, 8, 9]), first_child, torch.tensor([3]), 3)
    assert draft.tolist() == [23, 24, 99, 99, 99, 99]
    # a root that is not the recorded token: no injection
    draft = torch.tensor([50, 99, 99, 99, 22, 99])
    oracle.inject(draft, positions, first_child, torch.tensor([3]), 3)
    assert draft.tolist() == [50, 99, 99, 99, 22, 99]


def test_a_finished_requests_extra_step_is_not_recorded():
    """SGLang's overlap scheduler runs a request that finished in step N through step N+1 too (the host drops its
    token; LumoTree masks its state rows, so the token is no continuation). The benchmark's one-token prefill passes
    finish at their prefill: their extra step must not overwrite output 1 of the prompt's recorded continuation."""
    oracle = DraftOracle(1.0, rows=4, device="cpu", slots=2, max_len=16)
    prompt = [5, 6, 7, 8]

    def req(row, max_new):
        return SimpleNamespace(origin_input_ids=list(prompt), req_pool_idx=row,
                               sampling_params=SimpleNamespace(max_new_tokens=max_new))

    oracle.admit([req(1, 4)])
    rows = torch.tensor([1])
    oracle.record(rows, torch.tensor([4]), torch.tensor([20]), None, 1, prefill=True)
    oracle.record(rows, torch.tensor([4]), torch.tensor([21, 22, 23, 0]), torch.tensor([3]), 4, prefill=False)
    # its own extra step (output 4: past the 4 it asked for) writes nothing
    oracle.record(rows, torch.tensor([7]), torch.tensor([0]), torch.tensor([1]), 1, prefill=False)
    assert oracle.cont[0, :5].tolist() == [20, 21, 22, 23, 0] and int(oracle.filled[0]) == 4
    oracle.admit([req(2, 1)])  # the same prompt, one token asked for: its prefill, then the extra no-draft step
    rows = torch.tensor([2])
    oracle.record(rows, torch.tensor([4]), torch.tensor([20]), None, 1, prefill=True)
    oracle.record(rows, torch.tensor([4]), torch.tensor([0]), torch.tensor([1]), 1, prefill=False)
    oracle.record(rows, torch.tensor([4]), torch.tensor([0, 0, 0, 0]), torch.tensor([2]), 4, prefill=False)
    assert oracle.cont[0, :4].tolist() == [20, 21, 22, 23] and int(oracle.filled[0]) == 4


def test_a_reused_slot_starts_empty():
    oracle = DraftOracle(1.0, rows=4, device="cpu", slots=2, max_len=8)
    for i, prompt in enumerate(([1], [2], [3])):
        req = SimpleNamespace(origin_input_ids=prompt, req_pool_idx=i)
        oracle.admit([req])
        oracle.record(torch.tensor([i]), torch.tensor([1]), torch.tensor([10 + i]), None, 1, prefill=True)
    assert oracle.row_slot.tolist()[:3] == [0, 1, 0] and oracle.cont[0, 0] == 12
    again = SimpleNamespace(origin_input_ids=[1], req_pool_idx=3)  # the first prompt left the table
    oracle.admit([again])
    assert int(oracle.row_slot[3]) == 1 and int(oracle.filled[1]) == 0


def test_the_switch(monkeypatch):
    assert draft_oracle.probability({}) is None
    assert draft_oracle.probability({draft_oracle.ENV_P: "0.8"}) == 0.8
    for bad in ("x", "1.5", "-0.1"):
        with pytest.raises(ValueError, match=draft_oracle.ENV_P):
            draft_oracle.probability({draft_oracle.ENV_P: bad})
    assert draft_oracle.prompt_key([1, 2, 3]) == draft_oracle.prompt_key((1, 2, 3)) != draft_oracle.prompt_key([1, 2])


def test_hook_targets_are_sglangs():
    import pkgutil

    for target in (draft_oracle.DRAFT_TARGET, draft_oracle.SAMPLE_TARGET, draft_oracle.STEP_TARGET):
        assert callable(pkgutil.resolve_name(target)), target


class Mode:
    def __init__(self, extend=False, idle=False):
        self.extend, self.idle = extend, idle

    def is_extend(self):
        return self.extend

    def is_idle(self):
        return self.idle


def test_hooks_admit_record_and_inject(monkeypatch):
    """SGLang's step and draft methods wrapped as the hooks wrap them: a prefill admits and records,
    a verify records its accepted run, the next draft carries the continuation (p = 1)."""
    monkeypatch.setenv(draft_oracle.ENV_P, "1.0")
    pool = SimpleNamespace(req_to_token=torch.zeros(4, 16, dtype=torch.int32))
    req = SimpleNamespace(origin_input_ids=[3, 4, 5], req_pool_idx=2)
    rows = torch.tensor([2], dtype=torch.int32)
    prefill = SimpleNamespace(req_to_token_pool=pool, forward_mode=Mode(extend=True), reqs=[req],
                              seq_lens=torch.tensor([0]), req_pool_indices=rows)
    out = draft_oracle.forward_batch_generation(
        lambda self, b: SimpleNamespace(next_token_ids=torch.tensor([30])), None, prefill)
    assert out.next_token_ids.tolist() == [30]
    oracle = pool.lumotree_draft_oracle
    assert int(oracle.row_slot[2]) == 0 and oracle.cont[0, 0] == 30
    decode = SimpleNamespace(req_to_token_pool=pool, forward_mode=Mode(), reqs=[req], seq_lens=torch.tensor([3]),
                             req_pool_indices=rows)
    draft_oracle.forward_batch_generation(lambda self, b: SimpleNamespace(
        next_token_ids=torch.tensor([31, 32, 0, 0]), accept_lens=torch.tensor([2]), speculative_num_draft_tokens=4),
        None, decode)
    assert oracle.cont[0, :3].tolist() == [30, 31, 32] and int(oracle.filled[0]) == 3
    # a second request with the same prompt, drafting from output 0 (position 3): outputs 1, 2 on its chain
    again = SimpleNamespace(origin_input_ids=[3, 4, 5], req_pool_idx=1)
    oracle.admit([again])
    vi = SimpleNamespace(draft_token=torch.tensor([30, 7, 7, 7]), positions=torch.tensor([3, 4, 5, 6]),
                         retrieve_next_token=torch.tensor([[1, 2, 3, -1]]), spec_steps=3)
    batch = SimpleNamespace(req_to_token_pool=pool, forward_mode=Mode(), seq_lens=torch.tensor([3]),
                            req_pool_indices=torch.tensor([1]))
    assert draft_oracle.draft(lambda self, b: vi, None, batch) is vi
    assert vi.draft_token.tolist() == [30, 31, 32, 7]
    monkeypatch.delenv(draft_oracle.ENV_P)  # off: the hooks change nothing
    vi.draft_token = torch.tensor([30, 7, 7, 7])
    draft_oracle.draft(lambda self, b: vi, None, batch)
    assert vi.draft_token.tolist() == [30, 7, 7, 7]


APPLY_SCRIPT = r"""
import os
from types import SimpleNamespace
import torch
os.environ["LUMOTREE_BENCH_DRAFT_ORACLE_P"] = "1.0"
from sglang.srt.plugins.hook_registry import HookRegistry
import sglang.srt.speculative.eagle_worker_v2 as w
from lumotree.sglang import draft_oracle

class Mode:
    def __init__(self, extend):
        self.extend = extend
    def is_extend(self):
        return self.extend
    def is_idle(self):
        return False

# SGLang's two methods, stood in before the hooks are applied (the real ones need a GPU worker)
def step(self, batch, *a, **k):
    if batch.forward_mode.is_extend():
        return SimpleNamespace(next_token_ids=torch.tensor([30]))
    return SimpleNamespace(next_token_ids=torch.tensor([31, 32, 0, 0]), accept_lens=torch.tensor([2]),
                           speculative_num_draft_tokens=4)
w.EAGLEWorkerV2.forward_batch_generation = step
w.EagleDraftWorker.draft = lambda self, batch: SimpleNamespace(
    draft_token=torch.tensor([30, 7, 7, 7]), positions=torch.tensor([3, 4, 5, 6]),
    retrieve_next_token=torch.tensor([[1, 2, 3, -1]]), spec_steps=3, draft_token_num=4)
import sglang.srt.speculative.eagle_utils as eu
eu.eagle_sample = lambda verify_input, batch, logits_output, grammar_mask=None: (
    logits_output.next_token_logits.argmax(-1).tolist())
draft_oracle.install()
HookRegistry.apply_hooks()
pool = SimpleNamespace(req_to_token=torch.zeros(4, 16, dtype=torch.int32))
req = SimpleNamespace(origin_input_ids=[3, 4, 5], req_pool_idx=2)
def batch(extend):
    return SimpleNamespace(req_to_token_pool=pool, forward_mode=Mode(extend), reqs=[req],
                           seq_lens=torch.tensor([0 if extend else 3]), req_pool_indices=torch.tensor([2]))
w.EAGLEWorkerV2.forward_batch_generation(None, batch(True))   # prefill: admitted, output 0 recorded
w.EAGLEWorkerV2.forward_batch_generation(None, batch(False))  # a verify: outputs 1, 2 recorded
vi = w.EagleDraftWorker.draft(None, batch(False))
print("RESULT", vi.draft_token.tolist())
# the verify's greedy choices forced along the drawn run: outputs 1, 2 (output 3 is not recorded yet)
print("FORCED", eu.eagle_sample(vi, batch(False), SimpleNamespace(next_token_logits=torch.zeros(4, 40))))
"""


def test_install_wraps_sglangs_methods():
    """With the variable set, SGLang's HookRegistry wraps the three functions as at start-up: a prefill and
    a verify through the wrapped step record the continuation, the wrapped draft carries it, the wrapped
    sampling forces the verify's greedy choices along it."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", APPLY_SCRIPT], capture_output=True, text=True, timeout=600)
    assert "RESULT [30, 31, 32, 7]" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    assert "FORCED [31, 32, 0, 0]" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]


def test_install_is_a_no_op_without_the_variable(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.delenv(draft_oracle.ENV_P, raising=False)
    before = {t: list(HookRegistry._hooks.get(t, []))
              for t in (draft_oracle.DRAFT_TARGET, draft_oracle.SAMPLE_TARGET, draft_oracle.STEP_TARGET)}
    draft_oracle.install()
    assert {t: list(HookRegistry._hooks.get(t, [])) for t in before} == before


def test_kernels_in_the_interpreter_equal_the_torch_forms():
    """The CUDA path's one-launch recording and injection (draft_oracle_kernels) against the torch ops
    above, in Triton's CPU interpreter (a subprocess: TRITON_INTERPRET must be set before import)."""
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "interpret_draft_oracle.py")
    out = subprocess.run([sys.executable, script], env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "oracle kernels == torch forms" in out.stdout
