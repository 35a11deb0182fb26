"""The overlap scheduler's relay of no-draft steps' stub draft inputs without copying the stubs
(lumotree.sglang.patches.future_map_cold_rows), on SGLang's own ``FutureMap`` (CPU; SGLang's Triton gather replaced
by the same gather in torch): every resolve hands the next step what SGLang's relay hands it, over random sequences
of stub and real stashes, known and unknown host rows and reused rows; the stubs stay out of the buffers where every
row of a batch is cold."""
import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.managers.overlap_utils")

import sglang.srt.managers.overlap_utils as ou  # noqa: E402
from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from lumotree.sglang.patches import future_map_cold_rows as cr  # noqa: E402
from lumotree.sglang.worker import ColdStubs  # noqa: E402

ORIGINAL_STASH, ORIGINAL_RESOLVE = FutureMap.stash, FutureMap._resolve_spec_extras
HIDDEN = 4


def torch_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    return (topk_p_buf[indices], topk_index_buf[indices], output_tokens_buf[indices],
            None if hidden_states_buf is None else hidden_states_buf[indices])


@pytest.fixture(autouse=True)
def cpu_relay(monkeypatch):
    """SGLang's relay runnable on the CPU: its Triton gather as torch indexing, no stream to record, hidden states
    relayed (a server's args say so), and the hook module's state reset."""
    import sglang.srt.speculative.spec_utils as su

    monkeypatch.setattr(su, "spec_need_hidden_states", lambda: True)
    monkeypatch.setattr(ou, "gather_spec_extras", torch_gather)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    monkeypatch.setattr(cr, "_stubs", None)
    monkeypatch.setattr(cr, "_pending", None)
    monkeypatch.setattr(cr, "_rows", None)


def future_map(pool=12):
    return FutureMap(torch.device("cpu"), SpeculativeAlgorithm.from_string("EAGLE"),
                     SimpleNamespace(req_to_token=torch.zeros(pool, 8, dtype=torch.int32)))


def draft_input(bonus, topk_p=None, topk_index=None, hidden=None):
    return SimpleNamespace(bonus_tokens=bonus, topk_p=topk_p, topk_index=topk_index, hidden_states=hidden,
                           draft_probs=None, dsa_topk_indices=None, future_dsa_topk_indices_available=False)


class Relay:
    """One FutureMap through the hooks and one through SGLang's methods, fed the same steps."""

    def __init__(self, stubs):
        self.stubs = stubs
        self.hooked, self.plain = future_map(), future_map()

    def stash(self, rows, kind, rng, known=True):
        """A step's stash for request-pool ``rows``: ``"stub"`` (a no-draft step's draft input: the stubs' views) or
        ``"real"`` (a drafted step's draft-extend: fresh values); ``known``: the worker named its host rows."""
        bs = len(rows)
        bonus = torch.tensor([rng.randrange(1000) for _ in rows], dtype=torch.int32)
        di = draft_input(bonus)
        if kind == "stub":
            self.stubs.fill(di, bs)
        else:
            di.topk_p, di.topk_index = torch.rand(bs, 1), torch.randint(0, 50, (bs, 1))
            di.hidden_states = torch.rand(bs, HIDDEN)
        host = torch.tensor(rows, dtype=torch.int64)
        cr.note_rows(host if known else None)
        if kind == "stub":
            cr.note_stub(self.stubs, di, host if known else None)
        idx = torch.tensor(rows, dtype=torch.int64)
        cr.stash(ORIGINAL_STASH, self.hooked, idx, RelayPayload.from_draft_input(di))
        ORIGINAL_STASH(self.plain, idx.clone(), RelayPayload.from_draft_input(di))

    def resolve(self, rows):
        """The next step's draft input for ``rows`` from both maps, as ``(hooked, plain)``."""
        out = []
        for fm, hook in ((self.hooked, True), (self.plain, False)):
            di = draft_input(None)
            di.future_indices = torch.tensor(rows, dtype=torch.int64)
            batch = SimpleNamespace(spec_info=di, req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64))
            if hook:
                cr.resolve_spec_extras(ORIGINAL_RESOLVE, fm, batch)
            else:
                ORIGINAL_RESOLVE(fm, batch)
            out.append(di)
        return out


def same(a, b):
    for f in ("bonus_tokens", "topk_p", "topk_index", "hidden_states"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and torch.equal(x, y), f


def stubs():
    return ColdStubs(1, (HIDDEN, torch.float32), torch.device("cpu"))


def test_no_draft_steps_relay_their_tokens_alone_and_resolve_as_sglang_does(caplog):
    import logging

    caplog.set_level(logging.INFO, logger=cr.__name__)
    rng, relay = random.Random(0), Relay(stubs())
    relay.stash([3, 5], "real", rng)  # a prefill with its draft-extend: SGLang's stash (allocates the buffers)
    for _ in range(4):  # no-draft steps of rows 3, 5
        a, b = relay.resolve([3, 5])
        same(a, b)
        relay.stash([3, 5], "stub", rng)
    sentinel = relay.hooked.topk_p_buf[[3, 5]].clone()
    relay.hooked.topk_p_buf[[3, 5]] = float("nan")  # nothing reads or writes the stale rows from here
    relay.stash([3, 5], "stub", rng)
    a, b = relay.resolve([3, 5])
    same(a, b)
    cold = relay.hooked.lumotree_cold_rows
    assert cold.rows == {3, 5} and cold.kept == 5 and cold.served == 4 and cold.written == 0
    assert torch.isnan(relay.hooked.topk_p_buf[[3, 5]]).all() and not torch.isnan(sentinel).any()
    assert a.topk_p.data_ptr() == relay.stubs.topk_p.data_ptr()  # the stubs' views, not copies
    assert caplog.text.count(cr.SERVED_LINE) == 1  # said once
    relay.stash([3, 5], "real", rng)  # drafting resumes: SGLang's stash, the rows not cold any more
    assert cold.rows == set()
    same(*relay.resolve([3, 5]))


@pytest.mark.parametrize("seed", range(12))
def test_random_sequences_resolve_as_sglang_does(seed):
    """Batches of random rows from a pool of 11, stub and real stashes, a worker that names its host rows or not,
    rows a finished request freed reused by a new one, batches larger than the stubs' rows: every resolve equal."""
    rng, relay = random.Random(seed), Relay(stubs())
    written = set()
    relay.stash([1], "real", rng)
    written.add(1)
    for _ in range(60):
        rows = rng.sample(range(1, 12), rng.randrange(1, 11))
        relay.stash(rows, rng.choice(["stub", "stub", "real"]), rng, known=rng.random() > 0.15)
        written.update(rows)
        ask = rng.sample(sorted(written), rng.randrange(1, len(written) + 1))
        same(*relay.resolve(ask))
    cold = relay.hooked.lumotree_cold_rows
    assert cold.kept > 0 and cold.served > 0


def test_off_where_the_relay_is_not_the_one_it_knows(monkeypatch):
    rng = random.Random(1)
    relay = Relay(stubs())
    relay.stash([2], "stub", rng)  # the first stash allocates the buffers: SGLang's, whatever the payload
    assert "lumotree_cold_rows" not in relay.hooked.__dict__
    relay.stash([2], "stub", rng)
    assert relay.hooked.lumotree_cold_rows.rows == {2}
    monkeypatch.setattr(ou, "_DEBUG_ASSERT", True, raising=False)  # SGLang's poisoning asserts: its own methods
    relay.stash([4], "stub", rng)
    assert relay.hooked.lumotree_cold_rows.rows == set()  # the stale row written back before SGLang's stash
    monkeypatch.setattr(ou, "_DEBUG_ASSERT", False, raising=False)
    same(*relay.resolve([2, 4]))
