"""The C++ suffix drafter (csrc/host/suffix_drafter.cc) against its Python reference
(lumotree.drafters.suffix.SuffixDrafter): the same drafts -- tokens, parents and scores, exactly --
through random request lifecycles (prompts, appends, rewinds, finishes, the global cache's eviction,
a next turn adopting a finished request's trie), and the same errors."""
import random

import pytest

from lumotree.drafters import suffix as S

pytestmark = pytest.mark.skipif(S._host_extension() is None, reason="lumotree._host not built")


def motif_tokens(rng, n, vocab=12):
    """Token streams with repeated motifs and variations: suffix tries that branch."""
    motifs = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 9))] for _ in range(4)]
    out = []
    while len(out) < n:
        m = list(rng.choice(motifs))
        if rng.random() < 0.3:
            m[rng.randrange(len(m))] = rng.randrange(vocab)
        out += m
    return out[:n]


def same(a, b):
    assert a.tokens == b.tokens and a.parents == b.parents and a.scores == b.scores, (a, b)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kw", [
    pytest.param(dict(max_match=4, max_spec=4, global_tokens=60, min_prob=0.0, retired_tokens=200), id="small"),
    pytest.param(dict(max_match=16, max_spec=16, global_tokens=1 << 16, min_prob=0.05, retired_tokens=1 << 15),
                 id="defaults"),
    # paths at the trie's depth go on from their last tokens' node (shallow tries: most chains reach the depth)
    pytest.param(dict(max_match=3, max_spec=2, global_tokens=60, min_prob=0.0, retired_tokens=200, rematch=3,
                      unseen=2.0, global_unseen=16.0), id="rematch"),
    pytest.param(dict(max_match=4, max_spec=1, global_tokens=60, min_prob=0.1, retired_tokens=200, rematch=2,
                      unseen=0.5), id="rematch-shorter"),
])
def test_native_drafts_equal_the_reference(seed, kw):
    rng = random.Random(seed)
    py, cc = S.SuffixDrafter(**kw), S.NativeSuffixDrafter(**kw)
    live, contexts, finished, serial, branched = [], {}, [], 0, 0
    for _ in range(160):
        op = rng.random()
        if not live or op < 0.12:
            rid = f"r{serial}"
            serial += 1
            if finished and rng.random() < 0.5:  # a next turn: the previous context + new tokens
                prompt = rng.choice(finished) + motif_tokens(rng, rng.randrange(1, 12))
            else:
                prompt = motif_tokens(rng, rng.randrange(1, 40))
            py.start(rid, prompt)
            cc.start(rid, prompt)
            live.append(rid)
            contexts[rid] = list(prompt)
        elif op < 0.55:
            rid = rng.choice(live)
            toks = motif_tokens(rng, rng.randrange(1, 6))
            py.append(rid, toks)
            cc.append(rid, toks)
            contexts[rid] += toks
        elif op < 0.62:
            rid = rng.choice(live)
            drop = rng.randrange(0, min(4, len(contexts[rid])) + 1)
            if drop < len(contexts[rid]):
                py.rewind(rid, drop)
                cc.rewind(rid, drop)
                del contexts[rid][len(contexts[rid]) - drop:]
        elif op < 0.72:
            rid = live.pop(rng.randrange(len(live)))
            out = contexts[rid][-rng.randrange(0, 20):]
            py.finish(rid, out)
            cc.finish(rid, out)
            finished.append(contexts.pop(rid))
        else:
            rid = rng.choice(live)
            budget = rng.choice([1, 2, 4, 8, 16])
            d = py.draft(rid, budget)
            same(d, cc.draft(rid, budget))
            branched += len(set(d.parents)) < len(d.parents) - 1  # some node has two children
        for rid in live:
            assert cc.context(rid) == py.context(rid) == contexts[rid]
    assert branched > 0  # the workload exercises branching trees, not only chains
    if live:
        batch = cc.step_batch(live, [], 8)
        for rid, (tokens, parents) in zip(live, batch):
            d = py.draft(rid, 8)
            assert (tokens, parents) == (d.tokens, d.parents)


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_batch_steps_on_threads_draft_as_request_by_request(seed, threads):
    """step_batch (a batch's appends + drafts in one call, the requests spread over the C++ drafter's threads) gives
    the reference's drafts of append + draft request by request, and the same contexts, through requests that come,
    rewind and finish (their tries retired and adopted by next turns) between the steps."""
    rng = random.Random(100 + seed)
    kw = dict(max_match=4, max_spec=6, global_tokens=300, min_prob=0.0, retired_tokens=2000)
    py, cc = S.SuffixDrafter(**kw), S.NativeSuffixDrafter(threads=threads, **kw)
    assert cc.threads == threads
    contexts, finished, serial, steps = {}, [], 0, 0
    for _ in range(60):
        while len(contexts) < 12 or rng.random() < 0.2:  # new requests, some of them next turns
            rid = f"r{serial}"
            serial += 1
            prompt = (rng.choice(finished) if finished and rng.random() < 0.5 else []) + motif_tokens(rng, rng.randrange(1, 60))
            py.start(rid, prompt)
            cc.start(rid, prompt)
            contexts[rid] = list(prompt)
        batch = rng.sample(sorted(contexts), rng.randrange(1, len(contexts) + 1))
        appends = [motif_tokens(rng, rng.randrange(0, 5)) for _ in batch]
        budget = rng.choice([1, 4, 8, 16])
        got, want = cc.step_batch(batch, appends, budget), []
        for rid, a in zip(batch, appends):  # the reference, one request after the other
            if a:
                py.append(rid, a)
            contexts[rid] += a
            d = py.draft(rid, budget)
            want.append((d.tokens, d.parents))
        assert [tuple(map(list, g)) for g in got] == want
        assert py.step_batch(batch, [], budget) == want  # the reference's own batch step, nothing appended
        steps += 1
        for rid in rng.sample(sorted(contexts), rng.randrange(0, 3)):
            if rng.random() < 0.5 and len(contexts[rid]) > 2:
                py.rewind(rid, 1)
                cc.rewind(rid, 1)
                contexts[rid].pop()
            else:
                out = contexts[rid][-rng.randrange(0, 20):]
                py.finish(rid, out)
                cc.finish(rid, out)
                finished.append(contexts.pop(rid))
        for rid in contexts:
            assert cc.context(rid) == py.context(rid) == contexts[rid]
    assert steps == 60


@pytest.mark.parametrize("n", [1, 2, 8, 16])
def test_batch_layout_in_cpp_equals_the_python_layout(n):
    """step_layout (a step's drafts laid out for SGLang's NGRAM worker in C++, per request on the drafter's threads)
    equals batch_tree_arrays of step_batch's drafts: the tokens with their padding, the ancestor-or-self masks."""
    import numpy as np

    from lumotree.sglang.suffix import batch_tree_arrays

    rng = random.Random(n)
    kw = dict(max_match=4, max_spec=6, global_tokens=300, min_prob=0.0, retired_tokens=0)
    a, b = S.NativeSuffixDrafter(threads=3, **kw), S.NativeSuffixDrafter(threads=1, **kw)
    rids = [f"r{i}" for i in range(10)]
    for i, rid in enumerate(rids):
        prompt = motif_tokens(rng, 1 + 7 * i)  # short contexts draft fewer than n nodes: padded
        a.start(rid, prompt)
        b.start(rid, prompt)
    for step in range(12):
        batch = rng.sample(rids, rng.randrange(1, len(rids) + 1))
        appends = [motif_tokens(rng, rng.randrange(0, 4)) for _ in batch]
        tokens, mask = a.step_layout(batch, appends, n)
        want = batch_tree_arrays(b.step_batch(batch, appends, n), n)
        assert tokens.dtype == np.int64 and mask.dtype == np.bool_
        assert np.array_equal(tokens, want[0]) and np.array_equal(mask, want[1])
    t, m = a.step_layout([], [], n)
    assert t.shape == (0,) and m.shape == (0,)
    with pytest.raises(KeyError, match="unknown request"):
        a.step_layout(["nobody"], [[1]], n)


@pytest.mark.parametrize("seed", range(4))
def test_batch_starts_on_threads_equal_starts_one_by_one(seed):
    """start_batch (a prefill batch's admissions: the adoptions one after the other, the prompts indexed on the C++
    drafter's threads) leaves the contexts, drafts and stats of the reference's starts one by one -- with next turns
    that continue a finished turn's trie, whose reply was re-tokenized (the old context parts from the prompt), whose
    window moved on, and new sessions in the same batch."""
    rng = random.Random(200 + seed)
    kw = dict(max_match=4, max_spec=6, global_tokens=400, min_prob=0.0, retired_tokens=1 << 14)
    py, cc = S.SuffixDrafter(**kw), S.NativeSuffixDrafter(threads=4, **kw)
    finished, serial = [], 0
    for _ in range(8):
        rids, prompts = [], []
        for _ in range(rng.randrange(1, 7)):
            kind = rng.random()
            if finished and kind < 0.4:  # the next turn: the whole finished context and more
                prompt = rng.choice(finished) + motif_tokens(rng, rng.randrange(1, 30))
            elif finished and kind < 0.55 and max(map(len, finished)) > 280:  # its reply re-tokenized: parts
                old = max(finished, key=len)
                prompt = old[:len(old) - rng.randrange(1, 10)] + [11] + motif_tokens(rng, rng.randrange(1, 30))
            elif finished and kind < 0.7:  # the window moved on: starts inside the old context
                old = rng.choice(finished)
                prompt = old[rng.randrange(1, max(2, len(old) - 300)):] + motif_tokens(rng, rng.randrange(1, 30))
            else:
                prompt = motif_tokens(rng, rng.randrange(1, 400))
            rids.append(f"r{serial}")
            prompts.append(prompt)
            serial += 1
        cc.start_batch(rids, prompts)
        for rid, prompt in zip(rids, prompts):
            py.start(rid, prompt)
        assert cc.stats == py.stats
        for rid, prompt in zip(rids, prompts):
            assert cc.context(rid) == py.context(rid) == prompt
            for budget in (4, 16):
                same(py.draft(rid, budget), cc.draft(rid, budget))
            more = motif_tokens(rng, rng.randrange(1, 40))
            py.append(rid, more)
            cc.append(rid, more)
            same(py.draft(rid, 8), cc.draft(rid, 8))
        for rid in rids:
            if rng.random() < 0.8:
                ctx = py.context(rid)
                py.finish(rid, ctx[-20:])
                cc.finish(rid, ctx[-20:])
                finished.append(ctx)
    assert py.stats["adopted"] > 0 and py.stats["starts"] == serial


@pytest.mark.parametrize("seed", range(6))
def test_adoption_among_sessions_sharing_a_system_prompt_equals_the_reference(seed):
    """Chat-shaped sessions as an agent server sees them: every prompt opens with the same system prompt (longer than
    the adoption overlap, so every other session's finished turn lines up with a next turn's start too) and every
    message with the same head token. A next turn continues its session's last context (whole, with its reply
    re-tokenized, or with the window moved on), sometimes opens with another token, and the store's size bound
    sometimes rules out the longest alignment: the C++ drafter adopts the trie the reference adopts (its bounded
    search compares the contexts' ends first and skips contexts too short to be chosen) -- the same stats, contexts
    and drafts, ties between equal alignments going to the older context."""
    rng = random.Random(300 + seed)
    head, system = 1, [1] + motif_tokens(rng, 299)
    kw = dict(max_match=4, max_spec=6, global_tokens=400, min_prob=0.0, retired_tokens=rng.choice([1 << 14, 3000]))
    py, cc = S.SuffixDrafter(**kw), S.NativeSuffixDrafter(**kw)
    last, serial = {}, 0

    def message(n):
        return [head] + [2 + t for t in motif_tokens(rng, n)]

    for _ in range(60):
        sess = rng.randrange(6)
        old = last.get(sess)
        kind = rng.random()
        if old is None:
            prompt = system + message(rng.randrange(5, 60))
        elif kind < 0.5:  # the next turn: the whole context, a new observation
            prompt = old + message(rng.randrange(5, 80))
        elif kind < 0.65:  # the reply re-tokenized: parts near the end
            prompt = old[:len(old) - rng.randrange(1, 8)] + message(rng.randrange(5, 40))
        elif kind < 0.8:  # the window moved on: from a message start inside the old context
            starts = [j for j, t in enumerate(old) if t == head and 0 < j < len(old) - 300]
            cut = rng.choice(starts) if starts else 0
            prompt = old[cut:] + message(rng.randrange(5, 40))
        elif kind < 0.9:  # opens with another token
            prompt = [7] + old[1:] + message(rng.randrange(5, 40))
        else:  # the same context again (a retry): ties with an equal context
            prompt = list(old)
        rid = f"r{serial}"
        serial += 1
        py.start(rid, prompt)
        cc.start(rid, prompt)
        assert cc.stats == py.stats
        assert cc.context(rid) == py.context(rid) == prompt
        same(py.draft(rid, 8), cc.draft(rid, 8))
        reply = [head] + motif_tokens(rng, rng.randrange(3, 30))
        py.append(rid, reply)
        cc.append(rid, reply)
        same(py.draft(rid, 8), cc.draft(rid, 8))
        last[sess] = py.context(rid)
        py.finish(rid, reply)
        cc.finish(rid, reply)
    assert py.stats["adopted"] > 10


@pytest.mark.parametrize("native", [False, True])
def test_the_longest_alignment_that_does_not_fit_leaves_the_choice_to_one_that_does(native):
    """A next turn whose longest alignment is a finished context whose trie holds more than that context (it adopted
    an older trie and was rewound) and would grow past ``retired_tokens``: the turn adopts the shorter finished
    context that fits, as the reference does -- a longest alignment that does not fit bounds nothing."""
    kw = dict(max_match=4, max_spec=6, global_tokens=400, min_prob=0.0, retired_tokens=750)
    d = S.NativeSuffixDrafter(**kw) if native else S.SuffixDrafter(**kw)
    prompt = list(range(1000, 1700))  # the last turn's prompt, 700 distinct tokens
    d.start("f", [9] + prompt[:300])
    d.finish("f", [])
    d.start("e", prompt[:350])  # adopts f's trie: prompt[:300] lies inside f's context, after its 9
    d.append("e", list(range(2000, 2100)))
    d.rewind("e", 100)  # its trie keeps the counts: 451 tokens for a context of 350
    d.start("g", prompt[:280])  # nothing to adopt while e runs
    d.finish("g", [])
    d.finish("e", [])  # the store: g (280 tokens), e (451)
    before = dict(d.stats)
    d.start("x", prompt)  # e lines up for 350 tokens but 451 + 350 > 750; g for 280, and 280 + 420 fits
    assert d.stats["adopted"] == before["adopted"] + 1
    assert d.stats["indexed_tokens"] - before["indexed_tokens"] == 700 - 280


@pytest.mark.parametrize("native", [False, True])
def test_batch_start_errors_change_nothing(native):
    d = S.NativeSuffixDrafter(max_match=4, max_spec=4, threads=4) if native else S.SuffixDrafter(max_match=4, max_spec=4)
    with pytest.raises(ValueError, match="twice in a batch"):
        d.start_batch(["a", "b", "a"], [[1], [2], [3]])
    with pytest.raises(ValueError, match="2 prompts for 3 requests"):
        d.start_batch(["a", "b", "c"], [[1], [2]])
    with pytest.raises(ValueError, match="non-negative"):
        d.start_batch(["a", "b"], [[1, 2], [3, -4]])
    assert d.stats == dict(starts=0, adopted=0, indexed_tokens=0)
    with pytest.raises(KeyError):
        d.draft("a", 4)
    d.start_batch(["a", "b"], [[1, 2], [3, 4]])
    assert d.context("b") == [3, 4] and d.stats["starts"] == 2


def test_a_forked_process_drafts_without_the_worker_threads():
    """A process forked from one with a threaded drafter has none of its worker threads: its batch calls run on the
    calling thread (the same drafts, no wait for threads that are not there) and the drafter goes without joining."""
    import os
    import time

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    d = S.NativeSuffixDrafter(max_match=4, max_spec=4, threads=3)
    rids = [f"r{i}" for i in range(6)]
    rng = random.Random(5)
    for rid in rids:
        d.start(rid, motif_tokens(rng, 40))
    want = d.step_batch(rids, [], 8)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if it drafted the same
        ok = False
        try:
            ok = d.step_batch(rids, [], 8) == want and d.step_batch(rids, [[1]] * 6, 8) is not None
            del d
        finally:
            os._exit(0 if ok else 1)
    deadline = time.time() + 60
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked process hung in a batch call")
    assert os.waitstatus_to_exitcode(status) == 0
    assert d.step_batch(rids, [], 8) == want  # the parent's threads still serve


@pytest.mark.parametrize("native", [False, True])
def test_batch_step_errors_change_nothing(native):
    """A batch step with an unknown request, a request twice, or appends that do not match the batch fails before
    any request changes; a bad token in one request's appends fails the call, raised from whichever thread met it."""
    d = S.NativeSuffixDrafter(max_match=4, max_spec=4, threads=4) if native else S.SuffixDrafter(max_match=4, max_spec=4)
    for i in range(6):
        d.start(f"r{i}", [1, 2, 3, i])
    with pytest.raises(KeyError, match="unknown request"):
        d.step_batch(["r0", "nobody"], [[5], [6]], 4)
    with pytest.raises(ValueError, match="twice in a batch"):
        d.step_batch(["r0", "r1", "r0"], [[5], [6], [7]], 4)
    with pytest.raises(ValueError, match="3 appends for 2 requests"):
        d.step_batch(["r0", "r1"], [[5], [6], [7]], 4)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        d.step_batch(["r0"], [[5]], 0)
    assert [d.context(f"r{i}") for i in range(6)] == [[1, 2, 3, i] for i in range(6)]
    with pytest.raises(ValueError, match="non-negative"):
        d.step_batch([f"r{i}" for i in range(6)], [[9]] * 5 + [[-1]], 4)
    assert d.step_batch(["r0", "r0"], [], 4) == d.step_batch(["r0"], [], 4) * 2  # drafting twice reads only


@pytest.mark.parametrize("native", [False, True])
def test_rematch_outside_the_trie_s_depth_and_negative_unseen_are_refused(native):
    cls = S.NativeSuffixDrafter if native else S.SuffixDrafter
    for bad in (-1, 9):
        with pytest.raises(ValueError, match="rematch must be in"):
            cls(max_match=4, max_spec=4, rematch=bad)
    cls(max_match=4, max_spec=4, rematch=8)  # the whole depth is a valid length
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="unseen must be >= 0"):
            cls(max_match=4, max_spec=4, unseen=bad)
        with pytest.raises(ValueError, match="unseen must be >= 0"):
            cls(max_match=4, max_spec=4, global_unseen=bad)


def test_native_errors_match_the_reference():
    cc = S.NativeSuffixDrafter(max_match=4, max_spec=4)
    with pytest.raises(KeyError, match="unknown request"):
        cc.draft("nobody", 4)
    with pytest.raises(KeyError, match="unknown request"):
        cc.append("nobody", [1])
    cc.start("a", [1, 2, 3])
    with pytest.raises(ValueError, match="budget must be >= 1"):
        cc.draft("a", 0)
    with pytest.raises(ValueError, match="cannot rewind 5"):
        cc.rewind("a", 5)
    with pytest.raises(ValueError, match="non-negative"):
        cc.append("a", [-1])
    with pytest.raises(ValueError, match="max_match and max_spec"):
        S.NativeSuffixDrafter(max_match=0)
    cc.start("empty", [])
    with pytest.raises(ValueError, match="no context"):
        cc.draft("empty", 4)


def test_served_corpus_uses_the_native_drafter_unless_forced(monkeypatch):
    from lumotree.sglang.suffix import SuffixCorpus

    assert isinstance(SuffixCorpus(8).drafter, S.NativeSuffixDrafter)
    monkeypatch.setenv("LUMOTREE_OPS", "naive")
    assert isinstance(SuffixCorpus(8).drafter, S.SuffixDrafter)


def test_served_corpus_batches_are_the_same_with_either_drafter(monkeypatch):
    """SGLang's NGRAM-loop view (batch_get over contexts that grow and move) gives the same token and
    mask arrays with the C++ drafter as with the Python one."""
    import numpy as np

    from lumotree.sglang.suffix import SuffixCorpus

    rng = random.Random(3)
    streams = {f"q{i}": motif_tokens(rng, 400) for i in range(6)}
    native = SuffixCorpus(8)
    native.threads = 3  # the step's requests on three threads, whatever this machine's CPUs
    native.reset()
    assert native.drafter.threads == 3
    monkeypatch.setenv("LUMOTREE_OPS", "naive")
    ref = SuffixCorpus(8)
    lens = {rid: 30 + 7 * i for i, rid in enumerate(streams)}
    for step in range(40):
        rids = [r for r in streams if (step + int(r[1:])) % 5]  # requests come and go
        for r in rids:
            lens[r] += rng.randrange(1, 5)
        args = (rids, [streams[r][max(0, lens[r] - 64):lens[r]] for r in rids], [lens[r] for r in rids])
        a, b = native.batch_get(*args), ref.batch_get(*args)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        if step % 9 == 8:
            native.erase_match_state(rids[:1])
            ref.erase_match_state(rids[:1])


def test_host_cost_benchmark_drafts_with_all_three_drafters(tmp_path, monkeypatch):
    """benchmark/drafters/suffix_host_cost.py: LumoTree's Python and C++ drafters and SGLang's NGRAM corpus
    (built just in time by SGLang) each draft every step of a small batch, and the rows are written."""
    import json
    import os
    import sys

    pytest.importorskip("lumotree._host")
    pytest.importorskip("tvm_ffi")
    here = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "drafters")
    monkeypatch.syspath_prepend(here)
    import suffix_host_cost as h

    seen = []
    get = h.SGLangNgram.batch_get

    def spy(self, rids, tokens, lens):
        out = get(self, rids, tokens, lens)
        seen.append(len(out[0]))
        return out

    monkeypatch.setattr(h.SGLangNgram, "batch_get", spy)
    out = tmp_path / "cost.json"
    monkeypatch.setattr(sys, "argv", ["suffix_host_cost.py", "--batches", "2", "--steps", "3", "--context", "300",
                                      "--out", str(out)])
    h.main()
    rows = json.loads(out.read_text())["rows"]
    assert [r["drafter"] for r in rows] == ["python", "c++", "sglang-ngram"]
    assert all(r["batch"] == 2 and r["step_ms_median"] > 0 for r in rows)
    assert seen == [2 * 8] * 4  # admission + 3 steps, 8 draft tokens per request


def test_host_cost_benchmark_worker_rows(tmp_path, monkeypatch):
    """``suffix_host_cost.py --worker``: the NGRAM loop's draft preparation per step -- LumoTree's worker, the same
    corpus under SGLang's own preparation (compiled from its source), SGLang's NGRAM worker -- rows written."""
    import json
    import os
    import sys

    pytest.importorskip("lumotree._host")
    pytest.importorskip("tvm_ffi")
    here = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "drafters")
    monkeypatch.syspath_prepend(here)
    import suffix_host_cost as h

    out = tmp_path / "worker.json"
    monkeypatch.setattr(sys, "argv", ["suffix_host_cost.py", "--worker", "--batches", "1,3", "--steps", "4",
                                      "--context", "300", "--nodes", "6", "--threads", "1,2", "--out", str(out)])
    h.main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["worker"], r.get("threads"), r["batch"]) for r in rows] == [
        (k, t, b) for k in ("lumotree-suffix", "lumotree-suffix-sglang-handover") for t in (1, 2) for b in (1, 3)] + [
        ("sglang-ngram", None, b) for b in (1, 3)]
    assert all(r["step_ms_median"] > 0 and r["admission_ms"] > 0 for r in rows)


def test_host_cost_benchmark_compares_drafter_settings_alternated(tmp_path, monkeypatch):
    """``suffix_host_cost.py --worker --drafter-kw ...``: LumoTree's worker rows per setting, alternated ``--repeat``
    times, each timed."""
    import json
    import os
    import sys

    pytest.importorskip("lumotree._host")
    here = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "drafters")
    monkeypatch.syspath_prepend(here)
    import suffix_host_cost as h

    out = tmp_path / "kw.json"
    monkeypatch.setattr(sys, "argv", ["suffix_host_cost.py", "--worker", "--batches", "4", "--steps", "3",
                                      "--context", "2000", "--nodes", "8", "--threads", "1",
                                      "--drafter-kw", '{"max_spec": 40, "rematch": 0}', "--drafter-kw", "{}",
                                      "--repeat", "2", "--out", str(out)])
    h.main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["repetition"], r["drafter_kw"]) for r in rows] == [
        (k, kw) for k in (0, 1) for kw in ({"max_spec": 40, "rematch": 0}, {})]
    # the wait for what the first step left indexing: 0.0 where the background indexing was done by then (seen in CI)
    assert all(r["admission_background_ms"] is not None and r["admission_background_ms"] >= 0
               and r["step_ms_median"] > 0 for r in rows)


def test_admission_replay_times_every_turn_s_admission(tmp_path):
    """benchmark/drafters/admission_replay.py: the agent sessions' turns admitted as the server hands them over."""
    import json

    mod = _drafters_script("admission_replay")
    out = tmp_path / "a.json"
    res = mod.main(["--agents", "2", "--sessions", "4", "--turns", "3", "--repeat", "1", "--window", "512",
                    "--threads", "2", "--out", str(out)])
    assert json.load(open(out)) == res
    one, batched = res["rows"]  # one start per turn; each round's turns in one start_batch call on 2 threads
    assert "threads" not in one and batched["threads"] == 2
    for row in (one, batched):
        assert row["agents"] == 2 and row["turns"] == 12 and 0 < row["median_ms"] <= row["p95_ms"]
    assert res["drafter"]["retired_tokens"] == 1 << 18


def test_admission_replay_compares_drafter_settings(tmp_path):
    """--drafter-kw: each setting's rows within each repetition, the same turns and adoptions (the settings change the
    tries, not which finished turn a prompt continues)."""
    mod = _drafters_script("admission_replay")
    res = mod.main(["--agents", "2", "--sessions", "4", "--turns", "3", "--repeat", "2", "--window", "512",
                    "--drafter-kw", '{"max_spec": 24, "rematch": 0}', "--drafter-kw", "{}"])
    kws = [r.get("drafter_kw") for r in res["rows"]]
    assert kws == [{"max_spec": 24, "rematch": 0}, {}] * 2 and [r["repeat"] for r in res["rows"]] == [0, 0, 1, 1]
    assert len({(r["turns"], r["stats"]["adopted"], r["stats"]["indexed_tokens"]) for r in res["rows"]}) == 1


def test_admission_replay_stage_times_the_scheduler_thread_s_share_with_the_served_replies(tmp_path):
    """--stage: each turn staged (timed), indexed and committed -- the same adoptions as one start per turn; --replies:
    the recorded replies are the turns' outputs (the next prompts hold them)."""
    import gzip
    import json

    mod = _drafters_script("admission_replay")
    import agents_bench as ab

    replies = {str(s["id"]): [f"reply {s['id']}-{t}: " + "tokens " * (5 + t) for t in range(3)]
               for s in ab.make_sessions(4, 3, 0)}
    path = tmp_path / "replies.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"none/32": replies}, f)
    common = ["--agents", "2", "--sessions", "4", "--turns", "3", "--repeat", "1", "--window", "512",
              "--replies", str(path)]
    staged = mod.main(common + ["--stage"])["rows"][0]
    started = mod.main(common)["rows"][0]
    assert staged["part"] == "stage_batch" and "part" not in started
    assert staged["turns"] == 12 and 0 < staged["median_ms"] <= staged["p95_ms"]
    assert staged["stats"] == started["stats"] and staged["stats"]["adopted"] > 0
    stand_ins = mod.main(common[:-2] + ["--stage"])["rows"][0]
    assert stand_ins["stats"]["indexed_tokens"] != staged["stats"]["indexed_tokens"]  # other outputs, other prompts
    with pytest.raises(SystemExit):
        mod.main(common + ["--stage", "--threads", "2"])


def test_host_ab_pairs_two_builds_step_by_step(tmp_path):
    """benchmark/drafters/host_ab.py: the installed build against itself (ratios near 1, every step and admission
    paired); drafters that draft differently are refused."""
    import json

    mod = _drafters_script("host_ab")
    so = S._host_extension().__file__
    out = tmp_path / "ab.json"
    res = mod.main([so, so, "--batch", "3", "--steps", "6", "--context", "300", "--global-outputs", "2",
                    "--threads", "1,2", "--out", str(out)])
    assert json.load(open(out)) == res and res["threads"] == [1, 2]
    assert res["step"]["count"] == 6 and res["admission"]["count"] == 3
    assert all(res[k]["a_median_ms"] > 0 and res[k]["b_over_a_median"] > 0 for k in ("step", "admission"))
    # each side its own module and classes -- not the installed one, not each other (two builds loaded under one
    # module name were one module: every pair had timed the first build against itself)
    a, b = mod._LOADED[-2:]
    assert len({id(a), id(b), id(S._host_extension())}) == 3
    assert len({id(a.SuffixDrafter), id(b.SuffixDrafter), id(S._host_extension().SuffixDrafter)}) == 3
    kw = dict(max_match=4, max_spec=6, global_tokens=400, retired_tokens=0)
    with pytest.raises(RuntimeError, match="drafted differently"):
        mod.paired(S.NativeSuffixDrafter(min_prob=0.0, **kw), S.NativeSuffixDrafter(min_prob=0.5, **kw),
                   batch=2, nodes=8, context=300, accept=3, steps=4, global_outputs=1)


def test_many_small_steps_on_four_threads_equal_one_thread():
    """The drafter's thread pool over many short calls (batches of 2-5: most of a call's indices taken before the
    threads wake, late threads finding the next call's): every step's layout equals the one-thread drafter's."""
    import numpy as np

    rng = random.Random(7)
    kw = dict(max_match=4, max_spec=6, global_tokens=400, min_prob=0.0, retired_tokens=0)
    one, four = S.NativeSuffixDrafter(threads=1, **kw), S.NativeSuffixDrafter(threads=4, **kw)
    rids = [f"r{i}" for i in range(5)]
    for rid in rids:
        prompt = motif_tokens(rng, 60)
        one.start(rid, prompt)
        four.start(rid, prompt)
    for step in range(400):
        batch = rids[:rng.randrange(2, 6)]
        appends = [motif_tokens(rng, rng.randrange(0, 4)) for _ in batch]
        a, b = one.step_layout(batch, appends, 8), four.step_layout(batch, appends, 8)
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), step


def _drafters_script(name):
    """``benchmark/drafters/<name>.py`` as a module."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "drafters", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _acceptance_replay():
    return _drafters_script("acceptance_replay")


def test_acceptance_replay_accepts_the_longest_matching_root_path():
    mod = _acceptance_replay()
    # root 0 -> 1 (a) -> 2 (b) -> 3 (c); root -> 4 (a) -> 5 (x): the first child that matches is followed
    tokens, parents = [9, 1, 2, 3, 1, 7], [-1, 0, 1, 2, 0, 4]
    assert mod.accepted(tokens, parents, [1, 2, 3, 4]) == 3
    assert mod.accepted(tokens, parents, [1, 2, 5]) == 2
    assert mod.accepted(tokens, parents, [1, 7]) == 1  # the matching sibling path is not searched past a match
    assert mod.accepted(tokens, parents, [5]) == 0
    assert mod.accepted(tokens, parents, []) == 0
    # SGLang's NGRAM layout: ancestor-or-self rows
    mask = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    assert mod.parents_from_mask(mask) == [-1, 0, 1, 0]


def test_acceptance_replay_replays_recorded_replies(tmp_path):
    """benchmark/drafters/acceptance_replay.py on recorded replies: every turn's output tokens are covered, each
    step takes at least the bonus token, and a drafter that copies a repeated reply accepts more per step."""
    import gzip
    import json
    import os
    import sys

    mod = _acceptance_replay()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "workloads"))
    import agents_bench as ab

    sessions = ab.make_sessions(2, 3, 0)
    reply = "def f(x):\n    return x + 1\n" * 6
    rep = tmp_path / "r.json.gz"
    with gzip.open(rep, "wt") as f:
        json.dump({"none/2": {str(s["id"]): [reply] * 3 for s in sessions}}, f)
    out = tmp_path / "a.json"
    res = mod.main(["--replies", str(rep), "--reference", "none/2", "--nodes", "1,16", "--ngram-nodes", "",
                    "--agents", "2", "--sessions", "2", "--turns", "3", "--max-tokens", "64", "--out", str(out)])
    assert json.load(open(out)) == res and res["turns"] == 6
    one, sixteen = res["rows"]
    assert one["nodes"] == 1 and one["tokens_per_step"] == 1.0  # the root alone: the bonus token per step
    assert sixteen["tokens"] == one["tokens"] and sixteen["tokens_per_step"] > 2.0


def test_headroom_measures_what_follows_the_root_in_the_context_and_finished_outputs():
    """acceptance_replay.Headroom: a continuation's copy length is its longest prefix that follows the root token in
    the request's context or a finished output (no copy across two outputs), capped; the summary's shares add up."""
    mod = _acceptance_replay()
    h = mod.Headroom(cap=4)
    h([1, 2, 3, 1, 2], [2, 3], [-1, 0], [3, 1, 9], 1)  # 2 3 1 occurs in the context, 2 3 1 9 does not: 2
    h([1, 2, 3, 1, 2], [2], [-1], [7, 7], 0)  # 2 7 occurs nowhere: 0
    h.finished([2, 7, 7, 7, 7, 7])
    h.finished([8])
    h([1, 2, 3, 1, 2], [2, 7], [-1, 0], [7, 7, 7, 7, 7, 7], 1)  # from the finished output, capped at 4
    h([5, 7], [7], [-1], [8], 0)  # 7 8 would span the two outputs: 0
    assert [r[1] for r in h.rows] == [2, 0, 4, 0]
    summary = h.summary(nodes=4)  # deepest: 3
    assert summary["request_steps"] == 4 and summary["nothing_to_copy"] == 0.5 and summary["no_draft"] == 0.5
    assert summary["copy_1_5"]["share"] == 0.5 and summary["copy_deepest_or_more"]["share"] == 0.25
    assert summary["copy_6_to_deepest"]["accepted_mean"] is None and summary["accepted_mean"] == 0.5


def test_acceptance_replay_headroom_rows(tmp_path):
    """--headroom beside each LumoTree row of a --concurrent replay (not NGRAM's); it needs --concurrent."""
    import gzip
    import json
    import os
    import sys

    mod = _acceptance_replay()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "workloads"))
    import agents_bench as ab

    sessions = ab.make_sessions(2, 2, 0)
    rep = tmp_path / "r.json.gz"
    with gzip.open(rep, "wt") as f:
        json.dump({"none/2": {str(s["id"]): ["def f(x):\n    return x + 1\n" * 4] * 2 for s in sessions}}, f)
    common = ["--replies", str(rep), "--reference", "none/2", "--nodes", "8", "--ngram-nodes", "", "--agents", "2",
              "--sessions", "2", "--turns", "2", "--max-tokens", "32"]
    row = mod.main(common + ["--concurrent", "--headroom"])["rows"][0]
    h = row["headroom"]
    # each step takes its accepted drafts and a bonus token, but a turn's last step no token past the reply's end
    assert h["request_steps"] == row["steps"] and h["accepted_mean"] < row["tokens_per_step"] <= h["accepted_mean"] + 1
    assert h["copy_deepest_or_more"]["share"] > 0  # a repeated reply: long copies
    with pytest.raises(SystemExit):
        mod.main(common + ["--headroom"])


def test_concurrent_replay_steps_the_agents_requests_together():
    """Requests running at once do not draft from each other's outputs (only finished turns reach the global cache),
    every output token is stepped exactly once, and a request still admitting drafts nothing."""
    mod = _acceptance_replay()
    reply = [5, 6, 7, 8, 9, 10, 11, 12] * 4
    per_session = [[([1, 2, 3, 4], list(reply)), ([1, 2, 3, 4, 0] + reply, list(reply))] for _ in range(2)]
    serial = mod.replay(mod.SuffixReplay(16), per_session, 2)
    together = mod.concurrent_replay(mod.SuffixReplay(16), per_session, 2)
    one_agent = mod.concurrent_replay(mod.SuffixReplay(16), per_session, 1)
    for got in (together, one_agent):
        assert got["tokens"] == serial[1] == 4 * (len(reply) - 1)  # every token after the prefill's, once
    # turn by turn, the second session's first turn drafts from the first's finished reply; stepped together not
    assert together["request_steps"] > serial[0]
    # one agent runs every turn after the one before it: as the turn-by-turn replay
    assert one_agent["request_steps"] == one_agent["steps"] == serial[0]
    assert together["steps"] < together["request_steps"]  # two requests per decode step while both run
    late = mod.concurrent_replay(mod.SuffixReplay(16), per_session, 2, admission_steps=3)
    assert late["tokens"] == together["tokens"] and late["request_steps"] > together["request_steps"]
    none = mod.concurrent_replay(mod.SuffixReplay(1), per_session, 2)  # the root alone: one token per request step
    assert none["request_steps"] == none["tokens"]
    assert len(mod.concurrent_replay(mod.SuffixReplay(1), per_session, 2, window=4)["windows"]) == none["steps"] // 4


def test_concurrent_replay_drafts_every_request_before_any_appends_its_step_s_tokens():
    """As a server's step: within a decode step no draft follows another request's append of that step (a drafter
    whose global cache saw running requests' tokens at once would otherwise draft tokens no server could have)."""
    mod = _acceptance_replay()
    calls = []

    class Recorder:
        def start(self, rid, prompt):
            calls.append(("start", rid))

        def draft(self, rid, context):
            calls.append(("draft", rid))
            return [context[-1]], [-1]

        def step(self, rid, tokens):
            calls.append(("step", rid))

        def finish(self, rid, output):
            calls.append(("finish", rid))

    per_session = [[([1, 2], [3, 4, 5, 6])] for _ in range(3)]
    mod.concurrent_replay(Recorder(), per_session, 3)
    kinds = [k for k, _ in calls if k in ("draft", "step")][3:]  # after the three prefills' steps
    for i in range(0, len(kinds) - 6, 6):
        assert kinds[i:i + 6] == ["draft"] * 3 + ["step"] * 3


@pytest.mark.parametrize("seed", range(6))
def test_native_global_window_evictions_and_compactions_draft_as_the_reference(seed):
    """A global window that fills many times over (each finish removing the oldest outputs, compactions when most
    nodes are removed ones): the same drafts from the global cache as the reference, at every finish (removed nodes'
    ids reused, so a re-matched path's depths must be the reused nodes' own)."""
    rng = random.Random(seed)
    kw = dict(max_match=3, max_spec=4, global_tokens=48, min_prob=0.0, retired_tokens=64, rematch=3 * (seed % 2),
              global_unseen=float(seed % 3))
    ref, nat = S.SuffixDrafter(**kw), S.NativeSuffixDrafter(**kw)
    for i in range(120):
        out = motif_tokens(rng, rng.randrange(2, 14), vocab=6)
        for d in (ref, nat):
            d.finish(f"x{i}", out)
        ctx = motif_tokens(rng, rng.randrange(1, 6), vocab=6)
        for d in (ref, nat):
            d.start("q", ctx)
        same(ref.draft("q", 8), nat.draft("q", 8))
        for d in (ref, nat):
            d.finish("q", [])


def test_global_window_benchmark_times_finishes_while_filling_and_full(tmp_path):
    """benchmark/drafters/global_window_cost.py: per window size, the finishes that fill it and those past it."""
    import json

    mod = _drafters_script("global_window_cost")
    out = tmp_path / "g.json"
    mod.main(["--global-tokens", "256,512", "--output", "16", "--finishes", "20", "--out", str(out)])
    res = json.load(open(out))
    assert res["command"].startswith("python3 benchmark/drafters/global_window_cost.py --global-tokens 256,512")
    assert [r["global_tokens"] for r in res["rows"]] == [256, 512]
    for r in res["rows"]:
        assert r["full_finishes"] == 20 and 0 < r["full_median_ms"] <= r["full_p99_ms"] <= r["full_max_ms"]


class HeldIndexing:
    """The C++ drafter with its ``index_async`` held until ``release`` is set: the batch is indexed (the C++
    ``index_staged``, which marks it ready) on a thread of the test's once released; ``indexed`` lists the batches in the
    order they were handed to ``index_staged``."""

    def __init__(self, real):
        import threading

        self.real, self.entered, self.release, self.indexed = real, threading.Event(), threading.Event(), []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def index_async(self, staged):
        import threading

        threading.Thread(target=self._index, args=(staged,), daemon=True).start()

    def _index(self, staged):
        self.entered.set()
        self.release.wait(10)
        self._run(staged)

    def _run(self, staged):  # recorded before index_staged marks the batch ready: a caller that waited sees it
        self.indexed.append(list(staged.rids))
        self.real.index_staged(staged)


def test_a_step_whose_requests_are_all_admitting_waits_a_bounded_time_for_their_indexing():
    """``SuffixCorpus.wait_admitting``: while the requests' indexing is held it waits out its timeout and says they are
    still admitting (the step then serves no draft); once the indexing completes within the wait they are committed
    and draft as if admitted in line. A request already indexed is not waited for."""
    import threading

    import numpy as np

    from lumotree.sglang.suffix import SuffixCorpus

    rng = random.Random(11)
    prompt = motif_tokens(rng, 300)
    inline, background = SuffixCorpus(8), SuffixCorpus(8)
    inline.admit("p", prompt, len(prompt))
    held = HeldIndexing(background._drafter)
    background.drafter = held
    background.admit_batch([("p", prompt, len(prompt))])
    assert held.entered.wait(10)
    assert background.wait_admitting(["p"], timeout=0.002) and not held.indexed  # held past the wait: still admitting
    threading.Timer(0.05, held.release.set).start()
    assert not background.wait_admitting(["p"], timeout=30)  # returns once the indexing is done and committed
    assert held.indexed == [["p"]] and not background._admitting
    a = background.batch_get(["p"], [prompt[-8:]], [len(prompt)])
    b = inline.batch_get(["p"], [prompt[-8:]], [len(prompt)])
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and background.undrafted == []
    assert not background.wait_admitting(["p"], timeout=30)  # nothing indexing: no wait


def test_prefill_admissions_are_indexed_in_the_background_and_drafted_once_committed():
    """SuffixCorpus.admit_batch stages a prefill batch's admissions (adoptions) on the caller's thread, indexes them
    on the background thread (the C++ drafter releases the GIL) and returns. A step that drafts meanwhile does not
    wait: the requests still indexing draft their root alone (laid out as a one-node draft, rows in ``undrafted``),
    the others draft as always; once indexed they are committed and draft as if admitted in line."""
    import numpy as np

    from lumotree.sglang.suffix import SuffixCorpus, batch_tree_arrays

    rng = random.Random(7)
    running = motif_tokens(rng, 300)
    prompts = {f"p{i}": motif_tokens(rng, 300) for i in range(5)}
    items = [(rid, toks, len(toks)) for rid, toks in prompts.items()]
    inline, background = SuffixCorpus(8), SuffixCorpus(8)
    for c in (inline, background):
        c.batch_get(["run"], [running[:280]], [280])
    for rid, toks, n in items:  # one by one, in line
        inline.admit(rid, toks, n)
    held = HeldIndexing(background._drafter)
    background.drafter = held
    background.admit_batch(items)  # returns while the indexing is held
    assert held.entered.wait(10) and not held.indexed and set(background._admitting) == set(prompts)
    assert background.admitting(list(prompts)) and not background.admitting(["run", *prompts])
    rids = ["run", *prompts]
    views = [running[270:290]] + [t[-8:] for t in prompts.values()]
    totals = [290] + [len(t) for t in prompts.values()]
    tokens, mask = background.batch_get(rids, views, totals)  # does not wait
    assert background.undrafted == [1, 2, 3, 4, 5] and not held.indexed
    ref_tokens, ref_mask = inline.batch_get(rids, views, totals)
    n = 8
    assert np.array_equal(tokens[:n], ref_tokens[:n]) and np.array_equal(mask[:n * n], ref_mask[:n * n])
    root_only, root_mask = batch_tree_arrays([([t[-1]], [-1]) for t in prompts.values()], n)
    assert np.array_equal(tokens[n:], root_only) and np.array_equal(mask[n * n:], root_mask)
    held.release.set()
    background.wait_admissions()
    assert held.indexed == [list(prompts)] and not background._admitting and not background._staged
    views = [running[280:292]] + [t[-4:] + [9, 8] for t in prompts.values()]  # two more tokens each
    totals = [292] + [len(t) + 2 for t in prompts.values()]
    a, b = background.batch_get(rids, views, totals), inline.batch_get(rids, views, totals)
    assert background.undrafted == [] and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_with_tensor_parallel_ranks_admissions_are_indexed_in_line():
    """Every rank of a ``--tp-size`` > 1 server drafts the same batch and feeds its drafts to its shard of the verify:
    whether an admission is still indexing must not depend on a rank's threads. Such a corpus indexes a prefill
    batch's admissions in line (nothing handed to the background) and drafts them at once, as in-line admissions."""
    import numpy as np
    from types import SimpleNamespace

    from lumotree.sglang.suffix import SuffixCorpus, drafts_alone

    assert drafts_alone(SimpleNamespace(tp_size=1)) and not drafts_alone(SimpleNamespace(tp_size=2))
    rng = random.Random(11)
    prompts = {f"p{i}": motif_tokens(rng, 300) for i in range(4)}
    items = [(rid, toks, len(toks)) for rid, toks in prompts.items()]
    inline, ranked = SuffixCorpus(8), SuffixCorpus(8, background=False)
    for rid, toks, n in items:
        inline.admit(rid, toks, n)
    held = HeldIndexing(ranked._drafter)
    ranked.drafter = held
    ranked.admit_batch(items)
    assert not held.entered.is_set() and not ranked._admitting and not ranked._staged
    rids = list(prompts)
    views = [t[-8:] for t in prompts.values()]
    totals = [len(t) for t in prompts.values()]
    a, b = ranked.batch_get(rids, views, totals), inline.batch_get(rids, views, totals)
    assert ranked.undrafted == [] and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_a_background_admission_error_is_raised_at_the_next_drafter_call():
    from lumotree.sglang.suffix import SuffixCorpus

    corpus = SuffixCorpus(8)
    real = corpus._drafter

    class Failing:  # the indexing runs; what it raised comes back from wait_staged, as the C++ drafter rethrows it
        def __getattr__(self, name):
            return getattr(real, name)

        def wait_staged(self, staged):
            real.wait_staged(staged)
            raise RuntimeError("admission failed")

    corpus.drafter = Failing()
    corpus.admit_batch([("a", [1, 2, 3], 3), ("b", [4, 5, 6], 3)])
    real.drain()  # the indexing has run
    with pytest.raises(RuntimeError, match="admission failed"):
        corpus.batch_get(["a"], [[1, 2, 3]], [3])
    assert not corpus._staged and not corpus._admitting  # raised once; the corpus goes on
    with pytest.raises(ValueError, match="non-negative"):  # bad input fails at once, on the caller's thread
        corpus.admit_batch([("c", [1, -2, 3], 3)])


def test_the_python_drafter_admits_in_line(monkeypatch):
    from lumotree.sglang.suffix import SuffixCorpus

    monkeypatch.setenv("LUMOTREE_OPS", "naive")
    corpus = SuffixCorpus(8)
    corpus.admit_batch([("a", [1, 2, 3, 1, 2], 5), ("b", [4, 5, 6], 3)])
    assert not corpus._staged and not corpus._admitting
    assert corpus.drafter.stats["starts"] == 2


def test_a_request_leaving_while_admissions_run_leaves_without_waiting():
    """erase_match_state during background admissions (e.g. on a no-draft step, which does not draft) returns at once:
    a running request's finish reaches the drafter then (the indexing touches only the admitted requests), an admitted
    request's at its commit; the drafts then equal those of a corpus that did everything in line."""
    import numpy as np

    from lumotree.sglang.suffix import SuffixCorpus

    rng = random.Random(11)
    old = motif_tokens(rng, 200)
    new = {f"n{i}": motif_tokens(rng, 150) for i in range(3)}
    items = [(rid, toks, len(toks)) for rid, toks in new.items()]
    corpora = [SuffixCorpus(8), SuffixCorpus(8)]
    for c in corpora:  # a running request, two steps drafted
        c.batch_get(["old"], [old[:120]], [120])
        c.batch_get(["old"], [old[100:140]], [140])
    inline, background = corpora
    for rid, toks, n in items:
        inline.admit(rid, toks, n)
    inline.erase_match_state(["old", "n0"])
    held = HeldIndexing(background._drafter)
    finished = []
    held.finish = lambda rid, out: (finished.append(rid), held.real.finish(rid, out))
    background.drafter = held
    background.admit_batch(items)
    assert held.entered.wait(10)
    background.erase_match_state(["old", "n0"])  # returns although the indexing is held
    assert finished == ["old"] and [f[0] for f in background._finishes] == ["n0"]
    held.release.set()
    rids = ["n1", "n2"]
    args = (rids, [new[r][-8:] for r in rids], [len(new[r]) for r in rids])
    background.wait_admissions()
    a = background.batch_get(*args)
    assert finished == ["old", "n0"] and not background._finishes
    b = inline.batch_get(*args)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])

class HeldBatches(HeldIndexing):
    """The C++ drafter with each admission batch's ``index_staged`` held until the event of its first request is set
    (``gates``; a batch without one runs at once)."""

    def __init__(self, real, gates):
        super().__init__(real)
        self.gates = gates

    def index_async(self, staged):  # in order, as the C++ drafter's one thread: a batch waits for those before it
        import threading

        prev = self._last
        self._last = threading.Thread(target=self._gated, args=(staged, prev), daemon=True)
        self._last.start()

    _last = None

    def _gated(self, staged, prev):
        if prev is not None:
            prev.join(20)
        gate = self.gates.get(list(staged.rids)[0])
        if gate is not None:
            gate.wait(10)
        self._run(staged)


@pytest.mark.parametrize("drop", [1, 3])
def test_a_rewind_of_an_admitted_request_does_not_wait_for_later_admissions(drop):
    """A request admitted with one prefill batch, decoded once while its prompt was indexing (its tokens kept for its
    commit), whose context then moves back (SGLang's overlap scheduler when a prefill ran in between) while a later
    prefill batch indexes: the step returns without waiting for that later batch -- a rewind within the kept tokens
    drops them (1 token of 2), a longer one (3) waits for the request's own commit alone. The context the drafter then
    holds is the server's."""
    import threading

    from lumotree.sglang.suffix import SuffixCorpus

    rng = random.Random(5 + drop)
    running, prompt = motif_tokens(rng, 200), motif_tokens(rng, 120)
    later = {f"m{i}": motif_tokens(rng, 150) for i in range(3)}
    c = SuffixCorpus(8)
    c.batch_get(["run"], [running[:150]], [150])
    gates = {"n0": threading.Event(), "m0": threading.Event()}
    held = HeldBatches(c._drafter, gates)
    c.drafter = held
    c.admit_batch([("n0", prompt, len(prompt))])
    first = prompt + [7, 8]
    c.batch_get(["run", "n0"], [running[:152], first], [152, len(first)])
    assert c.undrafted == [1]  # still indexing: drafted nothing, its two tokens kept
    c.admit_batch([(rid, t, len(t)) for rid, t in later.items()])  # a later prefill batch, held
    gates["n0"].set()
    held.real.wait_staged(c._staged[0][0])  # n0's batch indexed, not yet committed
    moved = (prompt + [7, 9]) if drop == 1 else (prompt[:-1] + [5, 6, 4])
    done = []
    step = threading.Thread(target=lambda: done.append(c.batch_get(["run", "n0"], [running[:154], moved],
                                                                     [154, len(moved)])))
    step.start()
    step.join(5)
    finished = not step.is_alive()
    gates["m0"].set()
    step.join(10)
    assert finished, "the step waited for a later prefill batch's indexing"
    assert held.indexed[0] == ["n0"]  # its own batch first, the later one after the step
    assert done and int(done[0][0][8]) == moved[-1]  # n0's draft starts at the server's last token
    assert c.stats["rewinds"] == 1 and c.stats["rewound_tokens"] == drop
    c.wait_admissions()
    assert c.drafter.context("n0")[-len(moved):] == moved


def test_index_async_indexes_on_the_drafter_s_own_thread_without_the_gil():
    """``index_async`` indexes a staged batch on the C++ drafter's own thread: it becomes ``ready`` while the caller
    holds the GIL in a Python loop that never lets a Python thread in (switch interval 10 s) -- a Python admissions
    thread needed the GIL to start and to report -- and the committed requests draft as after ``start_batch``."""
    import sys
    import time

    rng = random.Random(3)
    prompts = {f"r{i}": motif_tokens(rng, 400) for i in range(4)}
    kw = dict(max_match=8, max_spec=24, global_tokens=1 << 12, min_prob=0.0, retired_tokens=1 << 12)
    a, b = S.NativeSuffixDrafter(threads=2, **kw), S.NativeSuffixDrafter(**kw)
    a.start_batch(list(prompts), list(prompts.values()))
    staged = b.stage_batch(list(prompts), list(prompts.values()))
    assert not staged.ready
    old = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        b.index_async(staged)
        deadline = time.perf_counter() + 5.0
        while not staged.ready and time.perf_counter() < deadline:
            pass  # holds the GIL: no Python thread could run here
        ready = staged.ready
    finally:
        sys.setswitchinterval(old)
    assert ready, "the staged batch was not indexed while the caller held the GIL"
    with pytest.raises(RuntimeError, match="indexed already"):
        b.index_async(staged)
    b.wait_staged(staged)
    b.commit_staged(staged)
    for rid in prompts:
        same(a.draft(rid, 16), b.draft(rid, 16))


def test_index_async_keeps_the_order_and_drain_waits_for_every_batch():
    """Batches handed to ``index_async`` are indexed in order on one thread; ``drain`` returns when all are, and each
    commits as after ``start_batch`` (a next turn's batch adopting the trie a batch before it left)."""
    rng = random.Random(4)
    first = motif_tokens(rng, 300)
    kw = dict(max_match=8, max_spec=24, global_tokens=1 << 12, min_prob=0.0, retired_tokens=1 << 14)
    a, b = S.NativeSuffixDrafter(**kw), S.NativeSuffixDrafter(**kw)
    batches = [{f"t{k}-{i}": motif_tokens(rng, 200) for i in range(3)} for k in range(5)]
    a.start("s", first)
    b.start("s", first)
    a.finish("s", first[-20:])
    b.finish("s", first[-20:])
    batches[0]["s2"] = first + motif_tokens(rng, 50)  # a next turn: adopts "s"'s trie
    staged = [b.stage_batch(list(x), list(x.values())) for x in batches[:1]]
    for x in batches:
        a.start_batch(list(x), list(x.values()))
    b.index_async(staged[0])
    for x in batches[1:]:
        st = b.stage_batch(list(x), list(x.values()))
        b.index_async(st)
        staged.append(st)
    b.drain()
    assert all(st.ready for st in staged)
    for st in staged:
        b.wait_staged(st)
        b.commit_staged(st)
    assert a.stats == b.stats and b.stats["adopted"] == 1
    for x in batches:
        for rid in x:
            same(a.draft(rid, 16), b.draft(rid, 16))


def test_a_staged_batch_records_when_it_became_ready_on_python_s_monotonic_clock():
    """``Staged.ready_ns``: the steady clock (ns) at which its indexing ended -- 0 before, and on the clock of
    ``time.monotonic_ns`` (what the benchmark's admission-left timer compares it with)."""
    import time

    prompts = {f"r{i}": motif_tokens(random.Random(i), 300) for i in range(2)}
    d = S.NativeSuffixDrafter(max_match=8, max_spec=24, global_tokens=1 << 12, min_prob=0.0, retired_tokens=1 << 12)
    staged = d.stage_batch(list(prompts), list(prompts.values()))
    assert staged.ready_ns == 0
    before = time.monotonic_ns()
    d.index_async(staged)
    d.wait_staged(staged)
    after = time.monotonic_ns()
    assert before <= staged.ready_ns <= after
    d.commit_staged(staged)


def test_the_benchmark_times_how_long_a_blocked_admission_kept_indexing(monkeypatch):
    """With draft timing on, a step that finds requests still indexing (``admitting``, or rows drafted empty) marks
    when; at the batch's commit the time from that mark to the indexing's end goes to ``draft_timing.LEFT``, once per
    admission batch. With timing off nothing is kept."""
    import time

    from lumotree.sglang import draft_timing
    from lumotree.sglang.suffix import SuffixCorpus

    rng = random.Random(11)
    prompts = {f"p{i}": motif_tokens(rng, 300) for i in range(3)}
    items = [(rid, toks, len(toks)) for rid, toks in prompts.items()]
    for on in (True, False):
        left = draft_timing.DraftTimer(every=1000)
        monkeypatch.setattr(draft_timing, "LEFT", left)
        monkeypatch.setattr(draft_timing, "_on", on)
        c = SuffixCorpus(8)
        held = HeldIndexing(c._drafter)
        c.drafter = held
        c.admit_batch(items)
        assert held.entered.wait(10)
        assert c.admitting(list(prompts))
        time.sleep(0.05)
        assert c.admitting(list(prompts))  # the first mark stands
        held.release.set()
        c.wait_admissions()
        if on:
            assert list(left.samples) == [4] and len(left.samples[4]) == 1  # one batch of 3 (bucket 4)
            assert 45.0 <= left.samples[4][0] < 10_000.0
        else:
            assert not left.samples
        assert not c._blocked_at
