"""LumoTree's full-attention verify in the hybrid backend (lumotree.sglang.verify_attention), on CPU with a
stand-in for SGLang's Triton backend and the kernel replaced by its reference: which calls it serves, that it
writes the step's K/V to the pool before attending, that it reads the prefix through the backend's
``kv_indptr`` / ``kv_indices`` and the tree through the GDN backend's ancestor mask, and which servers,
backends and layers keep SGLang's path."""
import logging
from types import SimpleNamespace

import pytest
import torch

from utils import assert_close, make_parents

pytest.importorskip("sglang")

HQ, HKV, D = 4, 2, 16


class TritonAttnBackend:  # stands in for SGLang's class (checked by name)
    dcp_size = 1
    enable_deterministic = False
    use_mla = False
    _translate_kv_loc = None

    def __init__(self, slots=64):
        g = torch.Generator().manual_seed(1)
        self.kb = torch.randn(slots, HKV, D, generator=g)
        self.vb = torch.randn(slots, HKV, D, generator=g)
        self.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: self.kb, get_value_buffer=lambda i: self.vb,
                                                set_kv_buffer=self._set)
        self.calls = []

    def _set(self, layer, loc, k, v):
        self.kb[loc.loc] = k
        self.vb[loc.loc] = v

    def forward_extend(self, *a, **kw):
        self.calls.append("sglang")
        return "sglang-full"


class GDN:  # the GDN backend's side: the flag and the step's ancestor mask
    exact = False
    check = None

    def __init__(self, on=True, mask=(True, None)):
        self.verify_attention_on = on
        self.mask = mask
        self.asked = []

    def tree_mask(self, layer_id, bs, n):
        self.asked.append((layer_id, bs, n))
        return self.mask

    def forward_extend(self, **kw):
        return "linear"


def _hybrid(gdn, fa=None):
    from lumotree.sglang import backend as be

    hy = be.LumoTreeHybridBackend.__new__(be.LumoTreeHybridBackend)
    hy.full_attn_layers, hy.full_attn_backend, hy.linear_attn_backend = [3], fa or TritonAttnBackend(), gdn
    return hy


def _layer(**kw):
    base = dict(layer_id=3, tp_q_head_num=HQ, tp_k_head_num=HKV, qk_head_dim=D, v_head_dim=D, scaling=D ** -0.5,
                sliding_window_size=-1, logit_cap=0.0, k_scale=None, v_scale=None, is_cross_attention=False,
                xai_temperature_len=-1)
    base.update(kw)
    return SimpleNamespace(**base)


def _step(fa, bs, n, prefixes, verify=True):
    """A verify batch: prefixes at scattered slots 1.., the step's tokens at the slots after them."""
    starts = torch.tensor([0] + list(prefixes)).cumsum(0)
    perm = torch.randperm(fa.kb.shape[0] - 1, generator=torch.Generator().manual_seed(2)) + 1
    kv_indices = perm[: int(starts[-1])]
    out_loc = perm[int(starts[-1]): int(starts[-1]) + bs * n]
    fa.forward_metadata = SimpleNamespace(kv_indptr=starts.to(torch.int32), kv_indices=kv_indices)
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: verify),
                         spec_info=SimpleNamespace(draft_token_num=n), out_cache_loc=out_loc)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(bs * n, h * D, generator=g) for h in (HQ, HKV, HKV))
    return fb, q, k, v


@pytest.fixture
def reference_kernel(monkeypatch):
    """The Triton kernel's entry replaced by the fp32 reference (same arguments, writes ``out``)."""
    from lumotree.ops.tree_attention import naive, triton as tri

    seen = []

    def ref(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, anc=None, scale=None, out=None):
        seen.append(anc)
        out.copy_(naive.tree_verify_attention(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, anc, scale))
        return out

    monkeypatch.setattr(tri, "tree_verify_attention", ref)
    return seen


@pytest.mark.parametrize("tree", [None, "tree"], ids=["chain", "tree"])
def test_verify_attention_writes_kv_then_attends_over_prefix_and_tree(reference_kernel, tree, caplog):
    from lumotree.ops.tree_attention import naive
    from lumotree.tree import ancestor_mask

    bs, n = 3, 5
    anc = None if tree is None else ancestor_mask(torch.tensor([make_parents("tree", n, s) for s in range(bs)])).to(torch.int8)
    fa, gdn = TritonAttnBackend(), GDN(mask=(True, anc))
    hy = _hybrid(gdn, fa)
    fb, q, k, v = _step(fa, bs, n, (7, 1, 20))
    before = fa.kb.clone()
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.verify_attention"):
        o = hy.forward_extend(_layer(), fb, True, q, k, v)
    assert fa.calls == [] and gdn.asked == [(3, bs, n)]
    assert reference_kernel == [anc]
    assert torch.equal(fa.kb[fb.out_cache_loc], k.view(-1, HKV, D))  # the step's keys are in the pool
    untouched = torch.ones(fa.kb.shape[0], dtype=torch.bool)
    untouched[fb.out_cache_loc] = False
    assert torch.equal(fa.kb[untouched], before[untouched])
    md = fa.forward_metadata
    want = naive.tree_verify_attention(q.view(-1, HQ, D), k.view(-1, HKV, D), v.view(-1, HKV, D), before, fa.vb,
                                       md.kv_indptr, md.kv_indices, anc, D ** -0.5)
    assert o.shape == (bs * n, HQ * D)
    assert_close("served verify attention", want.reshape(bs * n, -1), o, 1e-6)
    assert "verify attention by LumoTree's tree kernel" in caplog.text
    # every full-attention layer seen went to LumoTree's kernel: the NGRAM loop's full mask is read by no one
    from lumotree.sglang.verify_attention import full_mask_unused

    assert hy.full_mask_use.served == {3} and full_mask_unused(hy)
    gdn.check = object()  # the in-server cross-check runs SGLang's kernel beside it: the full mask is kept
    assert not full_mask_unused(hy)


def test_verify_attention_keeps_sglang_path_where_it_cannot_serve(reference_kernel, caplog):
    from lumotree.sglang.verify_attention import full_mask_unused

    # prefill (not a verify), a layer before every GDN layer (no tree yet), a server without it
    for gdn, verify in ((GDN(), False), (GDN(mask=(False, None)), True), (GDN(on=False), True)):
        fa = TritonAttnBackend()
        fb, q, k, v = _step(fa, 2, 4, (3, 9), verify=verify)
        hy = _hybrid(gdn, fa)
        assert hy.forward_extend(_layer(), fb, True, q, k, v) == "sglang-full"
        assert not full_mask_unused(hy)  # no verify seen, or SGLang's kernel read the full mask: it is laid out
    # one layer on LumoTree's kernel and one on SGLang's (a sliding window): the full mask stays, for good
    fa, gdn = TritonAttnBackend(), GDN()
    hy = _hybrid(gdn, fa)
    hy.full_attn_layers = [3, 7]
    fb, q, k, v = _step(fa, 2, 4, (3, 9))
    hy.forward_extend(_layer(), fb, True, q, k, v)
    assert full_mask_unused(hy)
    assert hy.forward_extend(_layer(layer_id=7, sliding_window_size=128), fb, True, q, k, v) == "sglang-full"
    hy.forward_extend(_layer(), fb, True, q, k, v)
    assert hy.full_mask_use.sglang == {7} and not full_mask_unused(hy)
    assert not full_mask_unused(fa) and not full_mask_unused(None)  # SGLang's own backends say nothing
    reference_kernel.clear()
    # layers SGLang's kernel must serve, and backends LumoTree's kernel does not read
    with caplog.at_level(logging.INFO, logger="lumotree.sglang.verify_attention"):
        for kw in (dict(sliding_window_size=128), dict(logit_cap=30.0), dict(k_scale=0.5)):
            fa = TritonAttnBackend()
            fb, q, k, v = _step(fa, 2, 4, (3, 9))
            assert _hybrid(GDN(), fa).forward_extend(_layer(**kw), fb, True, q, k, v) == "sglang-full"

        class FlashInferAttnBackend(TritonAttnBackend):
            pass

        fa = FlashInferAttnBackend()
        fb, q, k, v = _step(fa, 2, 4, (3, 9))
        assert _hybrid(GDN(), fa).forward_extend(_layer(), fb, True, q, k, v) == "sglang-full"
        fa = TritonAttnBackend()
        fb, q, k, v = _step(fa, 2, 4, (3, 9))
        assert _hybrid(GDN(), fa).forward_extend(_layer(), fb, True, q, k, v, sinks=torch.zeros(HQ)) == "sglang-full"
    assert reference_kernel == []
    assert "SGLang's prefill kernel (the full-attention backend is FlashInferAttnBackend" in caplog.text
    assert "layer 3 has a sliding window" in caplog.text


def test_applies_to_lumotree_and_suffix_servers_but_not_exact():
    from lumotree.sglang.verify_attention import applies

    def sa(algo, det=False):
        return SimpleNamespace(speculative_algorithm=algo, enable_deterministic_inference=det)

    assert applies(sa("LUMOTREE"))
    assert not applies(sa("NEXTN")) and not applies(sa(None)) and not applies(sa("LUMOTREE", det=True))
    assert applies(sa("LUMOTREE_SUFFIX")) and not applies(sa("LUMOTREE_SUFFIX", det=True))


def test_gdn_backend_tree_mask_is_this_forwards_tree():
    from lumotree.sglang.backend import LumoTreeGDNBackend
    from lumotree.tree import ancestor_mask

    be = LumoTreeGDNBackend.__new__(LumoTreeGDNBackend)
    be._first_gdn_layer, be._cur_tree, be._cur_chain = 1 << 30, None, True
    assert be.tree_mask(3, 2, 4) == (False, None)  # no GDN layer ran
    assert be.tree_mask(3, 2, 1) == (True, None)  # a one-token verify needs no mask
    par = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]])
    md = SimpleNamespace(retrieve_parent_token=par)
    anc, _ = be._tree_for(0, md, 2, 4, "cpu")
    assert be.tree_mask(3, 2, 4)[0] and torch.equal(be.tree_mask(3, 2, 4)[1], ancestor_mask(par).to(torch.int8))
    assert be.tree_mask(3, 3, 4) == (False, None)  # another shape: not this forward's tree
    be._tree_for(0, SimpleNamespace(retrieve_parent_token=None), 2, 4, "cpu")  # a chain: causal
    assert be.tree_mask(3, 2, 4) == (True, None)
    be._first_gdn_layer = 5
    assert be.tree_mask(3, 2, 4) == (False, None)  # the attention layer comes first


def test_cross_check_compares_live_rows_only_and_feeds_sglang_valid_parents(monkeypatch):
    """A finished or padded row (state slot -1) is skipped by SGLang's conv kernel, so its
    ``retrieve_parent_token`` is whatever the buffer held: the attention check leaves such rows out, and the
    GDN check hands SGLang's kernel a chain for them (it indexes its snapshot buffer with the parents; on the
    H200 unwritten parents sent it out of bounds)."""
    from lumotree.sglang import crosscheck
    from lumotree.sglang.crosscheck import CrossCheck

    bs, n = 3, 4
    o = torch.arange(bs * n * 2, dtype=torch.float32).reshape(bs * n, 2)
    ref = o.clone()
    ref[n:2 * n] += 100.0  # row 1 differs: a finished row
    fa = SimpleNamespace(forward_extend=lambda *a, **k: ref.clone())
    chk = CrossCheck()
    chk.attention(fa, o, None, None, SimpleNamespace(layer_id=3), None, o, n, torch.tensor([True, False, True]))
    assert chk.worst["attention"] == 0.0 and chk.attention_checks == 1
    chk.attention(fa, o, None, None, SimpleNamespace(layer_id=3), None, o, n, None)
    assert chk.worst["attention"] > 0.5

    seen = {}

    def fake_update(**kw):
        seen["parents"] = kw["retrieve_parent_token"].clone()
        return torch.zeros(1, bs * n, 1, 2)

    import sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent as fsg
    monkeypatch.setattr(fsg, "fused_sigmoid_gating_delta_rule_update", fake_update)
    garbage = torch.tensor([[0, 0, 0, 1], [0, 977, -5, 2 ** 30], [0, 0, 1, 1]], dtype=torch.int32)
    md = SimpleNamespace(retrieve_parent_token=garbage)
    layer = SimpleNamespace(A_log=None, dt_bias=None)
    q = torch.zeros(bs, n, 1, 2)
    v = torch.zeros(bs, n, 1, 2)
    chk.verify(0, layer, q, q, v, None, None, torch.zeros(8, 1, 2, 2), torch.tensor([5, -1, 7]), md,
               torch.zeros(bs * n, 1, 2))
    assert seen["parents"].tolist() == [[0, 0, 0, 1], [0, 0, 1, 2], [0, 0, 1, 1]]
    assert crosscheck  # the module under test
