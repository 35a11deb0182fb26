"""The chain verify's full attention by SGLang's split-KV kernel (lumotree/sglang/verify_attention.py):
which servers it applies to, the device check that gates it, the scratch hook (in Triton's interpreter,
against SGLang's prefill kernel), and on the GPU the check itself."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lumotree.sglang import verify_attention


def args(algo="LUMOTREE", topk=1, deterministic=False):
    return SimpleNamespace(speculative_algorithm=algo, speculative_eagle_topk=topk,
                           enable_deterministic_inference=deterministic)


def test_applies_to_lumotree_chains_only(monkeypatch):
    monkeypatch.delenv("LUMOTREE_SUFFIX_MERGE", raising=False)
    assert verify_attention.applies(args())
    assert not verify_attention.applies(args(topk=2))  # a tree is not causal: the kernel computes causal attention
    assert not verify_attention.applies(args(algo="NEXTN"))
    assert not verify_attention.applies(args(algo="LUMOTREE_SUFFIX"))
    assert not verify_attention.applies(args(deterministic=True))  # the decode-exact mode has its own attention
    monkeypatch.setenv("LUMOTREE_SUFFIX_MERGE", "1")
    assert not verify_attention.applies(args())  # suffix branches make the chain a tree


class FakeBuffer(SimpleNamespace):
    pass


def hybrid(cuda=True, name="TritonAttnBackend"):
    kv = FakeBuffer(is_cuda=cuda, shape=(64, 4, 256), dtype=torch.bfloat16, device="cuda:0")
    pool = SimpleNamespace(get_key_buffer=lambda layer: kv, get_value_buffer=lambda layer: kv)
    fa = type(name, (), {})()
    fa.num_head, fa.token_to_kv_pool, fa.use_verify_splitkv = 24, pool, False
    return SimpleNamespace(full_attn_backend=fa, full_attn_layers=[3, 7])


@pytest.mark.parametrize("passed", [True, False])
def test_enable_follows_the_device_check(monkeypatch, passed):
    monkeypatch.delenv("LUMOTREE_SUFFIX_MERGE", raising=False)
    seen = []

    def check(*shape):
        seen.append(shape)
        return passed, "checked"

    monkeypatch.setattr(verify_attention, "check_on_device", check)
    h = hybrid()
    assert verify_attention.enable(h, args()) is passed
    assert h.full_attn_backend.use_verify_splitkv is passed
    assert seen == [(24, 4, 256, 256, torch.bfloat16, "cuda:0")]  # the model's head shapes, from the KV pool


def test_enable_leaves_other_servers_and_backends_alone(monkeypatch):
    monkeypatch.setattr(verify_attention, "check_on_device", lambda *a: pytest.fail("checked"))
    for h, a in ((hybrid(), args(topk=2)), (hybrid(name="FlashInferAttnBackend"), args()), (hybrid(cuda=False), args())):
        assert verify_attention.enable(h, a) is False
        assert h.full_attn_backend.use_verify_splitkv is False


def test_check_is_a_failure_not_an_exception_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    ok, why = verify_attention.check_on_device(24, 4, 256, 256, torch.bfloat16, "cpu")
    assert not ok and "raised" in why


def test_scratch_hook_makes_the_kernel_equal_the_prefill_kernel_in_the_interpreter():
    script = os.path.join(os.path.dirname(__file__), "interpret_verify_splitkv.py")
    out = subprocess.run([sys.executable, script], env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "split-KV verify == prefill kernel" in out.stdout


def test_the_scratch_hook_targets_sglangs_allocation():
    from sglang.kernels.ops.attention.verify_splitkv import VerifySplitKV

    from lumotree.sglang.patches import verify_splitkv_scratch as hook

    module, cls, meth = hook.TARGET.rsplit(".", 2)
    assert (module, cls, meth) == (VerifySplitKV.__module__, "VerifySplitKV", "_alloc")
    vk = VerifySplitKV.__new__(VerifySplitKV)
    vk.h_q, vk.n_splits, vk.l_pad, vk.v_head_dim, vk.device = 2, 4, 4, 8, "cpu"
    hook.alloc_finite(VerifySplitKV._alloc, vk, 3)
    assert vk.att_out.shape[0] == 3 and not vk.att_out.any() and torch.isneginf(vk.att_lse).all()


@pytest.mark.gpu
def test_split_kv_chain_verify_passes_the_device_check_at_qwen35_shapes():
    ok, why = verify_attention.check_on_device(24, 4, 256, 256, torch.bfloat16, "cuda:0")
    assert ok, why


def test_the_scratch_hook_is_registered_around_the_allocation():
    from sglang.srt.plugins.hook_registry import HookType

    from lumotree.sglang.patches import verify_splitkv_scratch as hook
    from utils import fresh_hook

    with fresh_hook(hook) as hooks:
        hook.install()
        assert (hooks[hook.TARGET][-1][0], hooks[hook.TARGET][-1][1]) == (HookType.AROUND, hook.alloc_finite)


@pytest.mark.parametrize("passed", [True, False])
def test_bench_spec_reads_what_the_server_logged(monkeypatch, caplog, tmp_path, passed):
    """bench_spec records a LUMOTREE server's verify-attention line (on, or why not) with its servers."""
    import importlib.util
    import logging

    spec = importlib.util.spec_from_file_location(
        "bench_spec", os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "serving", "bench_spec.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.delenv("LUMOTREE_SUFFIX_MERGE", raising=False)
    monkeypatch.setattr(verify_attention, "check_on_device", lambda *a: (passed, "numbers (1.0 us against 2.0 us)"))
    with caplog.at_level(logging.INFO, logger=verify_attention.__name__):
        verify_attention.enable(hybrid(), args())
    log = tmp_path / "server.log"
    log.write_text("".join(f"[time] {r.getMessage()}\n" for r in caplog.records))
    got = bench.verify_attention(str(log))
    assert got is not None and "numbers (1.0 us against 2.0 us)" in got
    assert got.startswith("chain verify attention by SGLang's split-KV kernel") is passed


def test_kernel_benchmark_table():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_verify_attention",
        os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "kernels", "bench_verify_attention.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [dict(batch=32, context=1024, draft_tokens=4, prefill_kernel_us=250.0, split_kv_us=50.0, speedup=5.0,
                 max_gap=3.9e-3),
            dict(batch=1, context=256, draft_tokens=4, error="the split-KV kernel declined the problem")]
    text = bench.table(rows)
    assert "| 32 | 1024 | 250.0 | 50.0 | 5.0x | 3.9e-03 |" in text and "declined" in text
