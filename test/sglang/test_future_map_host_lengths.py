"""The overlap scheduler's host lengths of a speculative batch taken from the host where LumoTree published them from
the host (lumotree.sglang.patches.future_map_host_lengths), on SGLang's own ``FutureMap`` (CPU): the same lengths
as SGLang's device copy gives, SGLang's method wherever a row's lengths exist only on the device, and the periodic
comparison that turns the record off on a difference."""
import logging
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.managers.overlap_utils")

from sglang.srt.managers.overlap_utils import FutureMap  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from lumotree.sglang.patches import future_map_host_lengths as hl  # noqa: E402

ORIGINAL_PUBLISH, ORIGINAL_RESOLVE = FutureMap.publish, FutureMap.resolve_seq_lens_cpu


class Calls:
    """SGLang's resolve, counted."""

    def __init__(self):
        self.n = 0

    def __call__(self, fm, batch):
        self.n += 1
        return ORIGINAL_RESOLVE(fm, batch)


@pytest.fixture(autouse=True)
def no_first_checks(monkeypatch):
    """The tests count SGLang's method's calls: no comparison of the first batches unless a test asks for it."""
    monkeypatch.setattr(hl, "CHECK_FIRST", 0)


def future_map(pool=16):
    return FutureMap(torch.device("cpu"), SpeculativeAlgorithm.from_string("NGRAM"),
                     SimpleNamespace(req_to_token=torch.zeros(pool, 8, dtype=torch.int32)))


def publisher(fm, rows):
    """The scheduler's ``on_publish`` for a batch of request-pool ``rows``, through the hook."""
    idx = torch.tensor(rows)
    return lambda lens: hl.publish(ORIGINAL_PUBLISH, fm, idx, lens)


def batch(rows):
    """A decode batch of the speculative loop at its launch: lengths unknown until resolved."""
    idx = torch.tensor(rows)
    return SimpleNamespace(spec_info=SimpleNamespace(future_indices=idx), req_pool_indices_cpu=idx.clone(),
                           seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


def resolve(fm, rows, calls):
    b = batch(rows)
    hl.resolve_seq_lens_cpu(calls, fm, b)
    return b


def test_host_published_lengths_resolve_as_the_device_copy_does_without_sglang_s_method(caplog):
    fm, calls = future_map(), Calls()
    # a prefill of rows 3, 5 (host lengths known), then a no-draft step of rows 1, 2 (old + 1)
    hl.publish_known(publisher(fm, [3, 5]), torch.tensor([40, 7]), torch.tensor([3, 5]), torch.tensor([40, 7]))
    hl.publish_known(publisher(fm, [1, 2]), torch.tensor([11, 12]), torch.tensor([1, 2]), torch.tensor([11, 12]))
    with caplog.at_level(logging.INFO, logger=hl.__name__):
        got = resolve(fm, [2, 3, 1, 5], calls)
    assert calls.n == 0 and hl.SERVED_LINE in caplog.text  # no device copy waited for; said once in the log
    want = batch([2, 3, 1, 5])
    ORIGINAL_RESOLVE(fm, want)
    assert got.seq_lens_cpu.tolist() == want.seq_lens_cpu.tolist() == [12, 40, 11, 7]
    assert torch.equal(got.seq_lens, want.seq_lens) and got.seq_lens_sum == want.seq_lens_sum == 70
    assert fm.lumotree_host_lengths.served == 1


def test_a_publish_of_device_only_lengths_forgets_every_row():
    fm, calls = future_map(), Calls()
    hl.publish_known(publisher(fm, [1, 2]), torch.tensor([11, 12]), torch.tensor([1, 2]), torch.tensor([11, 12]))
    publisher(fm, [4])(torch.tensor([30]))  # a drafted step of another row: its lengths on the device alone
    b = resolve(fm, [1, 2], calls)
    assert calls.n == 1 and b.seq_lens_cpu.tolist() == [11, 12]  # SGLang's copy, same values
    # a row never published from the host: SGLang's method
    hl.publish_known(publisher(fm, [1, 2]), torch.tensor([12, 13]), torch.tensor([1, 2]), torch.tensor([12, 13]))
    assert resolve(fm, [1, 2, 4], calls).seq_lens_cpu.tolist() == [12, 13, 30] and calls.n == 2
    assert resolve(fm, [2, 1], calls).seq_lens_cpu.tolist() == [13, 12] and calls.n == 2


def test_a_host_copy_counts_only_for_the_publish_it_was_made_for():
    fm, calls = future_map(), Calls()
    seen = []
    hl.publish_known(seen.append, torch.tensor([11]), torch.tensor([1]), torch.tensor([11]))  # not the map's publish
    assert seen and hl._pending is None
    publisher(fm, [1])(torch.tensor([99]))  # the next publish, of other lengths: not taken as the host's
    assert resolve(fm, [1], calls).seq_lens_cpu.tolist() == [99] and calls.n == 1
    # no host copy, or one of another shape: a plain publish
    hl.publish_known(publisher(fm, [1]), torch.tensor([5]), None, None)
    hl.publish_known(publisher(fm, [1, 2]), torch.tensor([5, 6]), torch.tensor([1]), torch.tensor([5]))
    assert resolve(fm, [1], calls).seq_lens_cpu.tolist() == [5] and calls.n == 2


def test_the_periodic_comparison_turns_a_wrong_record_off(monkeypatch, caplog):
    monkeypatch.setattr(hl, "CHECK_EVERY", 3)
    fm, calls = future_map(), Calls()
    hl.publish_known(publisher(fm, [1, 2]), torch.tensor([11, 12]), torch.tensor([1, 2]), torch.tensor([11, 12]))
    for _ in range(2):
        assert resolve(fm, [1, 2], calls).seq_lens_cpu.tolist() == [11, 12]
    assert calls.n == 0
    assert resolve(fm, [1, 2], calls).seq_lens_cpu.tolist() == [11, 12] and calls.n == 1  # compared: equal
    assert fm.lumotree_host_lengths.on and fm.lumotree_host_lengths.checked == 1
    fm.lumotree_host_lengths.lens[2] = 13  # a record that parted from the device
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            b = resolve(fm, [1, 2], calls)
    assert b.seq_lens_cpu.tolist() == [11, 12] and calls.n == 2  # the compared batch got SGLang's lengths
    assert not fm.lumotree_host_lengths.on and hl.MISMATCH_LINE in caplog.text
    hl.publish_known(publisher(fm, [1, 2]), torch.tensor([12, 13]), torch.tensor([1, 2]), torch.tensor([12, 13]))
    assert resolve(fm, [1, 2], calls).seq_lens_cpu.tolist() == [12, 13] and calls.n == 3  # off for good


def test_sglang_s_method_where_its_copy_is_not_a_host_sync_or_its_debug_checks_run(monkeypatch):
    fm, calls = future_map(), Calls()
    hl.publish_known(publisher(fm, [1]), torch.tensor([11]), torch.tensor([1]), torch.tensor([11]))
    fm.needs_cpu_seq_lens = False  # a backend that takes no host lengths
    assert resolve(fm, [1], calls).seq_lens_cpu is None and calls.n == 1
    fm.needs_cpu_seq_lens = True
    import sglang.srt.managers.overlap_utils as ou

    monkeypatch.setattr(ou, "_DEBUG_ASSERT", True, raising=False)
    hl.publish_known(publisher(fm, [1]), torch.tensor([11]), torch.tensor([1]), torch.tensor([11]))
    monkeypatch.setattr(fm, "_publish_fresh", True, raising=False)
    resolve(fm, [1], calls)
    assert calls.n == 2
    monkeypatch.setattr(ou, "_DEBUG_ASSERT", False, raising=False)
    prefill = SimpleNamespace(spec_info=None, req_pool_indices_cpu=torch.tensor([1]))
    hl.resolve_seq_lens_cpu(calls, fm, prefill)  # a batch without a speculative input: SGLang's (a no-op)
    assert calls.n == 3


def test_a_prefill_publishes_its_host_lengths_with_the_device_s():
    from lumotree.sglang.scheduling import publish_prefill_early

    fm, calls = future_map(), Calls()
    mode = SimpleNamespace(is_extend=lambda: True, is_target_verify=lambda: False)
    pre = SimpleNamespace(forward_mode=mode, seq_lens=torch.tensor([300, 7]), seq_lens_cpu=torch.tensor([300, 7]),
                          req_pool_indices_cpu=torch.tensor([6, 9]))
    args, kwargs = publish_prefill_early(pre, (), {"on_publish": publisher(fm, [6, 9])})
    assert kwargs["on_publish"] is None
    b = resolve(fm, [9, 6], calls)
    assert calls.n == 0 and b.seq_lens_cpu.tolist() == [7, 300] and b.seq_lens.tolist() == [7, 300]


def test_installed_on_both_methods():
    from sglang.srt.plugins.hook_registry import HookRegistry

    from lumotree.sglang import patches

    targets = [f"{hl.FUTURE_MAP}.publish", f"{hl.FUTURE_MAP}.resolve_seq_lens_cpu"]
    saved = {t: list(HookRegistry._hooks.get(t, [])) for t in targets}
    try:
        patches.forget(*targets)
        hl.install()
        for t, fn in zip(targets, (hl.publish, hl.resolve_seq_lens_cpu)):
            assert any(h is fn for _, h, *_ in HookRegistry._hooks[t])
    finally:
        for t in targets:
            HookRegistry._hooks[t] = saved[t]
        patches.forget(*targets)


def test_a_server_s_first_batches_served_from_the_host_are_each_compared(monkeypatch):
    monkeypatch.setattr(hl, "CHECK_FIRST", 2)
    fm, calls = future_map(), Calls()
    hl.publish_known(publisher(fm, [1]), torch.tensor([11]), torch.tensor([1]), torch.tensor([11]))
    for n in (1, 2, 2, 2):  # the first two compared (SGLang's method ran), then served from the host alone
        assert resolve(fm, [1], calls).seq_lens_cpu.tolist() == [11] and calls.n == n
    assert fm.lumotree_host_lengths.checked == 2 and fm.lumotree_host_lengths.on


def test_sglang_copies_host_lengths_for_lumotree_suffix_and_not_for_lumotree_on_triton():
    """Which servers the hook can serve at all: SGLang's own decision for the served backends (Triton full attention,
    LumoTree's GDN backend, SGLang's Triton draft backends). LUMOTREE_SUFFIX runs NGRAM's loop, which always copies;
    a LUMOTREE server on these backends copies nothing, so there is no wait to skip."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, TritonMultiStepDraftBackend
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    from lumotree.sglang import plugin
    from lumotree.sglang.backend import LumoTreeGDNBackend

    plugin.register()
    # LumoTree's hybrid backend keeps SGLang's rule: its full or its linear backend's need
    target = SimpleNamespace(needs_cpu_seq_lens=TritonAttnBackend.needs_cpu_seq_lens
                             or LumoTreeGDNBackend.needs_cpu_seq_lens)
    backends = [target, TritonMultiStepDraftBackend, TritonAttnBackend]

    def needs(algorithm):
        return decide_needs_cpu_seq_lens(SimpleNamespace(enable_two_batch_overlap=False,
                                                         speculative_algorithm=algorithm), backends)

    assert needs(plugin.SUFFIX_ALGORITHM) is True and needs(plugin.ALGORITHM) is False


def test_a_map_that_copies_no_host_lengths_says_so_once(caplog):
    fm, calls = future_map(), Calls()
    fm.needs_cpu_seq_lens = False
    hl.publish_known(publisher(fm, [1]), torch.tensor([11]), torch.tensor([1]), torch.tensor([11]))
    with caplog.at_level(logging.INFO, logger=hl.__name__):
        for _ in range(3):
            assert resolve(fm, [1], calls).seq_lens_cpu is None
    assert calls.n == 3 and caplog.text.count(hl.UNNEEDED_LINE) == 1 and hl.SERVED_LINE not in caplog.text
    assert "lumotree_host_lengths" not in fm.__dict__  # nor does it keep a record
    fm2 = future_map()  # one that copies: never says it
    hl.publish_known(publisher(fm2, [1]), torch.tensor([11]), torch.tensor([1]), torch.tensor([11]))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=hl.__name__):
        resolve(fm2, [1], calls)
    assert hl.UNNEEDED_LINE not in caplog.text and hl.SERVED_LINE in caplog.text
