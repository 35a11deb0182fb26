"""The one-token verify (the adaptive worker's no-draft step) is served as a decode step: SGLang's
decode path updates the pool rows in place and the commit does nothing, in the decode-exact mode too (the decode
kernels are what its exact verify computes for one node); a tree verify (the exact mode's too) and SGLang's
extra_buffer state cache keep LumoTree's verify and replay commit. Dispatch only
(CPU): the numerics are SGLang's decode kernels, compared end to end on the GPU
(test_served_no_draft_gpu.py)."""
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")


def backend(monkeypatch, *, one_token_decode=True, exact=False):
    from lumotree.sglang import backend as be_mod
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    calls = []
    monkeypatch.setattr(GDNAttnBackend, "forward_decode", lambda self, layer, fb, x, a, b, **kw: calls.append("decode"))
    be = be_mod.LumoTreeGDNBackend.__new__(be_mod.LumoTreeGDNBackend)
    be.lumotree, be.exact, be.one_token_decode, be._verify_tokens = True, exact, one_token_decode, None
    be._first_verify_done = True
    be._verify = lambda *a: calls.append("verify")
    return be, calls


def fb(n):
    return SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                           spec_info=SimpleNamespace(draft_token_num=n))


@pytest.mark.parametrize("exact", [False, True], ids=["default", "exact"])
def test_one_token_verify_is_a_decode_and_commits_nothing(monkeypatch, exact):
    be, calls = backend(monkeypatch, exact=exact)
    be.forward_extend(SimpleNamespace(layer_id=0), fb(1), None, None, None)
    assert calls == ["decode"] and be._verify_tokens == 1
    be.forward_metadata = None  # the commit must not touch anything: it would fail on this
    be.commit_after_verify(SimpleNamespace(shape=(4,)), None, None)


@pytest.mark.parametrize("n,kw", [(6, {}), (1, {"one_token_decode": False}), (4, {"exact": True})],
                         ids=["tree", "extra-buffer", "exact-tree"])
def test_other_verifies_keep_the_tree_verify_and_commit(monkeypatch, n, kw):
    be, calls = backend(monkeypatch, **kw)
    be.forward_extend(SimpleNamespace(layer_id=0), fb(n), None, None, None)
    assert calls == ["verify"]
    be.forward_metadata = None
    with pytest.raises(AttributeError):  # it went on to the replay commit (which reads the metadata)
        be.commit_after_verify(SimpleNamespace(shape=(4,)), None, None)


def test_extra_buffer_servers_keep_the_replay_commit():
    from lumotree.sglang import backend as be_mod

    sa = SimpleNamespace(enable_mamba_extra_buffer=lambda: True)
    assert not be_mod.one_token_decode(sa)
    assert be_mod.one_token_decode(SimpleNamespace(enable_mamba_extra_buffer=lambda: False))
