"""LumoTree's NGRAM-loop workers lay out the verify's full mask in one pass
(``lumotree.sglang.patches.ngram_full_mask``): the same mask SGLang's per-request loop builds, only for LumoTree's
algorithms, SGLang's constant restored; and SGLang's method still has the branch the patch relies on."""
import logging
import types

import numpy as np
import pytest
import torch

pytest.importorskip("sglang")

N = 4


def _fake_module(full=True, cpu=False):
    return types.SimpleNamespace(USE_FULL_MASK=full, _is_cpu=cpu)


def _fake_prepare(module, masks, lens, log):
    """SGLang's ``_prepare_for_speculative_decoding`` reduced to what decides the mask: the compact ``[B * n * n]``
    tree mask, replaced by the per-request loop's full mask when ``USE_FULL_MASK and not _is_cpu``."""

    def prepare(batch):
        log.append(module.USE_FULL_MASK)
        if not batch.forward_mode.is_decode():
            return
        tree_mask = torch.from_numpy(masks.reshape(-1)).clone()
        if module.USE_FULL_MASK and not module._is_cpu:
            rows = []
            for i in range(len(lens)):
                req = torch.cat((torch.ones((N, lens[i])), torch.from_numpy(masks[i])), dim=1).to(torch.bool)
                rows.append(req.flatten())
            tree_mask = torch.cat(rows, dim=0)
        batch.forward_mode = _Mode("verify")
        batch.spec_info = types.SimpleNamespace(custom_mask=tree_mask)

    return prepare


class _Mode:
    def __init__(self, kind):
        self.kind = kind

    def is_decode(self):
        return self.kind == "decode"

    def is_target_verify(self):
        return self.kind == "verify"


def _batch(lens, kind="decode"):
    return types.SimpleNamespace(forward_mode=_Mode(kind), seq_lens_cpu=torch.tensor(lens), spec_info=None)


def _masks(lens, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.random((len(lens), N, N)) > 0.5
    m[:, np.arange(N), np.arange(N)] = True
    return m


def test_one_pass_mask_equals_sglang_loop_and_restores_the_constant():
    from lumotree.sglang.patches.ngram_full_mask import prepare_with_full_mask

    lens = [0, 7, 130, 1]
    masks = _masks(lens)
    ref_mod, log = _fake_module(), []
    ref = _batch(lens)
    _fake_prepare(ref_mod, masks, lens, log)(ref)  # SGLang alone: the loop
    mod = _fake_module()
    got = _batch(lens)
    prepare_with_full_mask(_fake_prepare(mod, masks, lens, log), got, N, module=mod)
    assert log == [True, False]  # SGLang's method saw the compact setting during the patched call
    assert mod.USE_FULL_MASK is True  # restored
    assert torch.equal(got.spec_info.custom_mask, ref.spec_info.custom_mask)


def test_unchanged_where_sglang_builds_no_full_mask():
    from lumotree.sglang.patches.ngram_full_mask import prepare_with_full_mask

    lens = [3, 5]
    masks = _masks(lens, 1)
    for mod in (_fake_module(cpu=True), _fake_module(full=False)):
        log = []
        b = _batch(lens)
        prepare_with_full_mask(_fake_prepare(mod, masks, lens, log), b, N, module=mod)
        assert b.spec_info.custom_mask.numel() == len(lens) * N * N  # SGLang's compact mask, as it left it
    mod, log = _fake_module(), []
    b = _batch(lens, kind="extend")  # a prefill: SGLang builds no verify input, nothing to lay out
    prepare_with_full_mask(_fake_prepare(mod, masks, lens, log), b, N, module=mod)
    assert b.spec_info is None and mod.USE_FULL_MASK is True


def test_constant_restored_when_sglang_raises():
    from lumotree.sglang.patches.ngram_full_mask import prepare_with_full_mask

    mod = _fake_module()

    def boom(batch):
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        prepare_with_full_mask(boom, _batch([1]), N, module=mod)
    assert mod.USE_FULL_MASK is True


def _ngram_worker_source():
    import importlib.util

    spec = importlib.util.find_spec("sglang.srt.speculative.ngram_worker")  # not imported: needs sgl_kernel's ops
    return open(spec.origin).read()


def test_sglang_method_has_the_branch_the_patch_relies_on():
    """If SGLang changes how it lays out the mask, this fails instead of the patch serving a wrong one."""
    src = _ngram_worker_source()
    body = src[src.index("def _prepare_for_speculative_decoding"):src.index("def _update_ngram_corpus")]
    assert "\nUSE_FULL_MASK = True\n" in src
    assert "if USE_FULL_MASK and not _is_cpu:" in body
    assert "custom_mask=tree_mask" in body
    assert "seq_len = batch.seq_lens_cpu[i]" in body
    assert "torch.ones(\n                    (self.draft_token_num, seq_len)" in body


@pytest.mark.parametrize("unused", [False, True], ids=["full-mask-read", "full-mask-unread"])
@pytest.mark.parametrize("algo,one_pass", [("LUMOTREE_SUFFIX", True), ("LUMOTREE_ORACLE", True),
                                           ("NGRAM_ORACLE", False)])
def test_worker_routes_only_lumotree_algorithms(monkeypatch, caplog, algo, one_pass, unused):
    """The served worker class (SGLang's NGRAM worker subclassed) on a stand-in of SGLang's method and module
    (this CPU machine cannot import SGLang's: its n-gram ops need sgl_kernel's CUDA build)."""
    import sys

    lens = [2, 9, 4]
    masks = _masks(lens, 2)
    log = []
    module = types.SimpleNamespace(USE_FULL_MASK=True, _is_cpu=False)
    module.NGRAMWorker = type("NGRAMWorker", (), {
        "_prepare_for_speculative_decoding": lambda self, batch: _fake_prepare(module, masks, lens, log)(batch)})
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.ngram_worker", module)
    from lumotree.sglang.suffix import ONE_PASS_MASK_ALGORITHMS, ngram_worker as make_worker

    cls = make_worker(lambda sa: None)
    from lumotree.sglang.verify_attention import FullMaskUse

    w = cls.__new__(cls)  # no GPU: only what the method reads
    w.draft_token_num = N
    w._one_pass_mask = algo in ONE_PASS_MASK_ALGORITHMS
    # the target's attention backend: its full-attention layers seen on LumoTree's kernel only, or one on SGLang's
    use = FullMaskUse()
    use.note(3, True)
    if not unused:
        use.note(7, False)
    backend = types.SimpleNamespace(full_mask_use=use, linear_attn_backend=types.SimpleNamespace(check=None))
    w._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=backend))
    b = _batch(lens)
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.suffix"):
        w._prepare_for_speculative_decoding(b)
        w._prepare_for_speculative_decoding(_batch(lens))  # said once
    log = log[:1]
    said = [r for r in caplog.records if "full verify mask is not laid out" in r.getMessage()]
    assert len(said) == (1 if one_pass and unused else 0)
    assert log == [not one_pass]
    assert module.USE_FULL_MASK is True
    ref = _batch(lens)
    _fake_prepare(types.SimpleNamespace(USE_FULL_MASK=True, _is_cpu=False), masks, lens, [])(ref)
    if one_pass and unused:  # no kernel reads the full mask: SGLang's compact tree mask stays, nothing laid out
        assert torch.equal(b.spec_info.custom_mask, torch.from_numpy(masks.reshape(-1)))
    else:
        assert torch.equal(b.spec_info.custom_mask, ref.spec_info.custom_mask)


def _sglang_prepare_on_cpu():
    """SGLang's own ``NGRAMWorker._prepare_for_speculative_decoding``, compiled from its installed source into a
    module of its own (its module imports C++ ops this CPU machine does not build), with SGLang's device-only
    helpers stubbed (they fill other buffers, not the mask) and ``_is_cpu`` False: its mask code as on the GPU."""
    import ast
    import importlib.util

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    path = importlib.util.find_spec("sglang.srt.speculative.ngram_worker").origin
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NGRAMWorker")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_prepare_for_speculative_decoding")
    module = types.ModuleType("ngram_worker_on_cpu")
    module.__dict__.update(
        torch=torch, np=np, ScheduleBatch=object, USE_FULL_MASK=True, _is_cpu=False, ForwardMode=ForwardMode,
        reconstruct_indices_from_tree_mask=lambda *a: None, assign_extend_cache_locs_func=lambda **kw: None,
        prepare_mamba_track_for_verify=lambda batch: None, NgramVerifyInput=lambda **kw: types.SimpleNamespace(**kw))
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), module.__dict__)
    return module, module.__dict__["_prepare_for_speculative_decoding"]


@pytest.mark.parametrize("seed", range(4))
def test_one_pass_mask_equals_sglangs_own_method(seed):
    """The wrapper around SGLang's actual method (its source, run on the CPU) gives the mask its loop gives."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from lumotree.sglang.patches.ngram_full_mask import prepare_with_full_mask

    module, method = _sglang_prepare_on_cpu()
    rng = np.random.default_rng(seed)
    bs, n = int(rng.integers(1, 9)), int(rng.choice([1, 4, 8]))
    lens = rng.integers(1, 200, bs)
    masks = _masks(list(lens), seed) if n == N else rng.random((bs, n, n)) > 0.5

    def worker():
        buf = lambda *shape, dtype=torch.int64: [torch.zeros(*(b if i == 0 else s for i, s in enumerate(shape)),  # noqa: E731
                                                             dtype=dtype) for b in range(bs + 1)]
        return types.SimpleNamespace(
            draft_token_num=n, device="cpu", retrieve_indexes_batch=buf(1, n), retrieve_next_token_batch=buf(1, n),
            retrieve_next_sibling_batch=buf(1, n), positions_batch=[torch.zeros(b * n, dtype=torch.int64)
                                                                     for b in range(bs + 1)],
            tree_mask_batch=[torch.zeros(b * n * n, dtype=torch.bool) for b in range(bs + 1)],
            draft_tokens_batch=[torch.zeros(b * n, dtype=torch.int64) for b in range(bs + 1)],
            _prepare_draft_tokens=lambda batch: (np.arange(bs * n, dtype=np.int64), masks.reshape(-1).copy()))

    def batch():
        return types.SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=[None] * bs, has_grammar=False,
                                     seq_lens=torch.tensor(lens), seq_lens_cpu=torch.tensor(lens),
                                     req_pool_indices=torch.arange(bs), req_to_token_pool=types.SimpleNamespace(
                                         req_to_token=None), spec_info=None)

    w, ref = worker(), batch()
    method(w, ref)  # SGLang's loop
    assert ref.forward_mode == ForwardMode.TARGET_VERIFY and ref.spec_info.custom_mask.numel() > bs * n * n
    w, got = worker(), batch()
    prepare_with_full_mask(lambda b: method(w, b), got, n, module=module)
    assert module.USE_FULL_MASK is True
    assert got.forward_mode == ForwardMode.TARGET_VERIFY
    assert torch.equal(got.spec_info.custom_mask, ref.spec_info.custom_mask)
