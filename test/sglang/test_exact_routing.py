"""The decode-exact mode's routing in LumoTree's hybrid backend (CPU, fakes): only a target verify's
full-attention layers go to the per-node decode attention; everything else keeps SGLang's path."""
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")


class TritonAttnBackend:  # stands in for SGLang's class (ExactAttention checks the name and mode)
    enable_deterministic = True
    dcp_size = 1
    use_mla = False
    sliding_window_size = None

    def __init__(self):
        self.calls = []

    def forward_extend(self, *a, **kw):
        self.calls.append("full")
        return "sglang-full"


def _backend(exact: bool):
    from lumotree.sglang import backend as be

    lin = SimpleNamespace(exact=exact, forward_metadata=SimpleNamespace(retrieve_parent_token="parents"), calls=[])
    lin.forward_extend = lambda **kw: lin.calls.append("linear") or "linear"
    hy = be.LumoTreeHybridBackend.__new__(be.LumoTreeHybridBackend)
    hy.full_attn_layers, hy.full_attn_backend, hy.linear_attn_backend = [3], TritonAttnBackend(), lin
    return hy


def _batch(verify: bool):
    return SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: verify),
                           spec_info=SimpleNamespace(draft_token_num=6))


def test_exact_mode_routes_only_verify_full_attention_to_per_node_decode(monkeypatch):
    from lumotree.sglang import exact

    seen = []
    monkeypatch.setattr(exact.ExactAttention, "forward",
                        lambda self, q, k, v, layer, fb, parents, n, save: seen.append((layer.layer_id, parents, n))
                        or "exact")
    hy = _backend(exact=True)
    full, gdn = SimpleNamespace(layer_id=3), SimpleNamespace(layer_id=0)
    assert hy.forward_extend(full, _batch(True), True, "q", "k", "v") == "exact"
    assert seen == [(3, "parents", 6)]
    assert hy.forward_extend(full, _batch(False), True, "q", "k", "v") == "sglang-full"  # prefill: SGLang's
    assert hy.forward_extend(gdn, _batch(True), True, mixed_qkv="x", a="a", b="b") == "linear"
    hy2 = _backend(exact=False)  # default mode: SGLang's tree attention for the verify
    assert hy2.forward_extend(full, _batch(True), True, "q", "k", "v") == "sglang-full"
    assert len(seen) == 1


def test_exact_attention_refuses_what_it_cannot_mirror():
    from lumotree.sglang.exact import ExactAttention

    class FlashInferAttnBackend(TritonAttnBackend):
        pass

    with pytest.raises(RuntimeError, match="Triton attention backend in deterministic mode"):
        ExactAttention(FlashInferAttnBackend())
    fa = TritonAttnBackend()
    fa.enable_deterministic = False
    with pytest.raises(RuntimeError, match="deterministic mode"):
        ExactAttention(fa)
    fa = TritonAttnBackend()
    fa.sliding_window_size = 128
    with pytest.raises(RuntimeError, match="no decode context parallelism, MLA or sliding window"):
        ExactAttention(fa)
    ExactAttention(TritonAttnBackend())


def test_exact_attention_names_the_flags_when_the_kv_lists_would_not_fit():
    import torch

    from lumotree.sglang.exact import ExactAttention

    fa = TritonAttnBackend()
    fa.max_context_len = 262144
    fb = SimpleNamespace(seq_lens=torch.zeros(256, dtype=torch.int32))  # 256 x 16 x 262k x 8 B = 8 GiB
    with pytest.raises(RuntimeError, match="lower --context-length, --cuda-graph-max-bs"):
        ExactAttention(fa)._layout(3, fb, None, 16)
