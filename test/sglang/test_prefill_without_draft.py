"""A LUMOTREE prefill whose decode steps will serve no draft skips the MTP layer's draft-extend
(``LumoTreeWorker._prefill_without_draft``): its draft input is a cold start's, its prompt's MTP entries are zeroed,
and where its requests first draft in a step that is not cold their acceptance is left out of the sample. On CPU,
with SGLang's own draft-input class and a stand-in for its EAGLE V2 loop."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from test_adaptive import bare_worker, measured_policy  # noqa: E402

HIDDEN = 16


def prefill(rows, slots):
    return SimpleNamespace(forward_mode=ForwardMode.EXTEND, is_extend_in_batch=False,
                           reqs=[SimpleNamespace(req_pool_idx=r) for r in rows],
                           seq_lens=torch.tensor([4] * len(rows)), out_cache_loc=torch.tensor(slots))


def decode(rows):
    return SimpleNamespace(forward_mode=ForwardMode.DECODE, is_extend_in_batch=False,
                           reqs=[SimpleNamespace(req_pool_idx=r) for r in rows],
                           seq_lens=torch.tensor([9] * len(rows)), req_pool_indices=torch.tensor(rows))


@pytest.fixture
def worker(monkeypatch):
    import sglang.srt.speculative.eagle_worker_v2 as ew

    from lumotree.sglang.worker import worker_class

    monkeypatch.setattr("lumotree.sglang.finish.admit_batch", lambda batch: None)
    w = bare_worker(worker_class(), measured_policy(), overlap_consistent=False)
    del w.tree_policy.choose  # the policy decides
    w.topk = 2
    w.speculative_num_steps = 0

    def apply_runtime_state(state):
        w.speculative_num_steps = state

    w.apply_runtime_state = apply_runtime_state
    cleared = []
    w._mtp_entries = SimpleNamespace(clear_slots=lambda locs: cleared.append(locs.tolist()),
                                     clear=lambda rows, lens: None)
    w.cleared = cleared
    w._prefill_stub, w._stub_rows, w._admitted, w.prefills, w.prefills_without_draft = False, set(), set(), 0, 0
    runner = SimpleNamespace(spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
                             model_config=SimpleNamespace(spec_hidden_size=HIDDEN, dtype=torch.bfloat16))
    w._draft_worker = SimpleNamespace(draft_runner=runner,
                                      _draft_extend_for_prefill=lambda batch, hidden, ids, mm=None: "draft-extended")
    w._skip_prefill_draft_extend_without_draft()

    def sglang_step(self, batch, *args, **kwargs):  # what EAGLE V2's loop calls of the draft worker
        if batch.forward_mode.is_extend():
            ids = torch.arange(len(batch.reqs)) + 100
            return self._draft_worker._draft_extend_for_prefill(batch, torch.ones(len(batch.reqs), 3), ids)
        self.activate_step_by_batch(batch.seq_lens.shape[0])
        return "verified"

    monkeypatch.setattr(ew.EAGLEWorkerV2, "forward_batch_generation", sglang_step)
    return w


def test_a_prefill_joining_batches_that_serve_no_draft_skips_the_draft_extend(worker):
    """40 requests alone decode at bucket 64, joining the last step's 100 at 140 (bucket 256: past every bucket that
    ran, read as 128): no draft at either."""
    worker._ledger.last_batch = 100
    rows, slots = list(range(40)), list(range(1000, 1120))
    out = worker._forward(prefill(rows, slots))
    assert type(out).__name__ == "EagleDraftInput"
    assert out.bonus_tokens.tolist() == list(range(100, 140))
    # a cold start's first level: distinct tokens, decreasing scores (the tree stays whole); no hidden state
    assert out.topk_index.tolist() == [[0, 1]] * 40 and out.topk_p.tolist() == [[0.5, 0.25]] * 40
    assert out.hidden_states.shape == (40, HIDDEN) and not out.hidden_states.any()
    assert out.hidden_states.dtype == torch.bfloat16
    assert worker.cleared == [slots]  # the prompts' MTP entries zeroed
    assert worker._stub_rows == set(rows) and worker.prefills_without_draft == 1


@pytest.mark.parametrize("last_batch, pinned", [(0, None), (5, None), (100, 3)])
def test_a_prefill_whose_requests_may_draft_runs_the_draft_extend(worker, last_batch, pinned):
    """Alone (2 requests: bucket 2, which borrows bucket 8's times -- the tree pays), joining 5 requests, or on
    ranks whose choices parted (pinned to the tree; with 40 requests after 100 it would skip): SGLang's draft-extend,
    nothing zeroed."""
    worker._ledger.last_batch, worker._ledger.pinned = last_batch, pinned
    worker._stub_rows.add(3)  # a finished request's stub row, now another request's
    rows = [7, 3] if pinned is None else [7, 3] + list(range(100, 138))
    assert worker._forward(prefill(rows, [40, 41])) == "draft-extended"
    assert worker.cleared == [] and worker._stub_rows == set()


def test_stub_rows_drafting_after_a_drafted_step_leave_the_acceptance_sample(worker):
    w, policy = worker, worker.tree_policy
    w._ledger.last_batch = 100
    w._forward(prefill([7, 3] + list(range(100, 138)), list(range(40))))
    policy.choose = lambda batch: 3  # the batch drafts from now on
    w._ledger.prev = 3  # after a drafted step: this one is not cold
    assert w._forward(decode([1, 7, 2, 3])) == "verified"
    assert w._ledger.pending[-1][1] is False and w._ledger.pending[-1][3] == frozenset({1, 3})
    assert w._stub_rows == set(range(100, 138))  # only the step's rows draft from their own draft-extend now
    before = policy.accept
    w.on_verify_complete_cpu([2, 0, 2, 0])  # the stub rows' drafts were a cold guess
    assert policy.accept == pytest.approx((1 - policy.settings.ema) * before + policy.settings.ema * 2)
    # the next drafted step counts every row
    assert w._forward(decode([1, 7, 2, 3])) == "verified" and w._ledger.pending[-1][3] == ()


def test_stub_rows_in_a_cold_step_leave_with_it(worker):
    """A drafted step after no-draft steps is cold (none of its acceptance counts): the stub rows draft there."""
    w = worker
    w._ledger.last_batch = 100
    w._forward(prefill([7] + list(range(100, 139)), list(range(40))))
    w.tree_policy.choose = lambda batch: 3
    w._ledger.prev = 0
    w._forward(decode([7, 2]))
    assert w._ledger.pending[-1][1] is True and w._ledger.pending[-1][3] == ()
    assert w._stub_rows == set(range(100, 139))


def test_prefills_back_to_back_count_together_until_a_decode_step(worker, monkeypatch, caplog):
    """SGLang runs the prefills it can admit one after another, so the decode step after them holds them all: 12
    requests alone would decode at bucket 16 (the tree pays), 12 + 30 at bucket 64 (no draft). A decode step starts
    the count again. The server log counts the prefills that skipped the draft-extend."""
    import logging

    w = worker
    monkeypatch.setattr(type(w), "PREFILL_LOG_EVERY", 2)
    caplog.set_level(logging.INFO, logger="lumotree.sglang.worker")
    assert w._forward(prefill(list(range(12)), [1])) == "draft-extended"
    assert type(w._forward(prefill(list(range(12, 42)), [2]))).__name__ == "EagleDraftInput"
    assert w._stub_rows == set(range(12, 42)) and (w.prefills, w.prefills_without_draft) == (2, 1)
    assert "1 of 2 prefill batches skipped the MTP draft-extend" in caplog.text
    w.tree_policy.choose = lambda batch: 0
    assert w._forward(decode(list(range(42)))) == "verified" and w._admitted == set()
    w._ledger.last_batch = 0  # (as if they had all finished)
    assert w._forward(prefill(list(range(50, 62)), [3])) == "draft-extended"


def test_under_the_overlap_scheduler_the_prefill_hands_over_the_no_draft_steps_stubs(worker, monkeypatch):
    """Overlap scheduler: the skipped prefill's draft input is the no-draft step's stubs (read-only views of kept
    buffers, the same values), named with its host rows for the FutureMap's stash, which may then leave them out of
    its buffers (lumotree.sglang.patches.future_map_cold_rows)."""
    from lumotree.sglang.patches import future_map_cold_rows as cr

    monkeypatch.setattr(cr, "_pending", None)
    monkeypatch.setattr(cr, "_stubs", None)
    worker._cold_stubs, worker.device = None, torch.device("cpu")
    worker._ledger.last_batch = 100
    rows = list(range(40))
    batch = prefill(rows, list(range(1000, 1040)))
    batch.enable_overlap, batch.req_pool_indices_cpu = True, torch.tensor(rows)
    out = worker._forward(batch)
    assert out.topk_index.tolist() == [[0, 1]] * 40 and out.topk_p.tolist() == [[0.5, 0.25]] * 40
    assert out.hidden_states.shape == (40, HIDDEN) and not out.hidden_states.any()
    assert out.topk_p.data_ptr() == worker._cold_stubs.topk_p.data_ptr()  # views, no new tensors
    assert cr._stubs is worker._cold_stubs and cr._pending[0] is out.topk_p and cr._pending[1].tolist() == rows
    assert out.bonus_tokens.tolist() == list(range(100, 140)) and worker.cleared == [list(range(1000, 1040))]
