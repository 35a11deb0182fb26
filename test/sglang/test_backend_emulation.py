import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_backend_verify_and_commit_plumbing_in_interpreter(shape):
    """LumoTree's SGLang backend on fake pools, real Triton kernels interpreted (see the script): the
    served mix verify and replay commit against the fp32 references and SGLang's own tree kernel."""
    pytest.importorskip("sglang")
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "backend_emulation.py")
    out = subprocess.run([sys.executable, script, shape], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert f"backend emulation == references cpu {shape}" in out.stdout


@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_backend_decode_exact_verify_and_commit_plumbing_in_interpreter(shape):
    """The same flow in the decode-exact mode (--enable-deterministic-inference): per-node conv states,
    the path-recurrent verify, its ring, the decode-tile commit, against the same fp32 references."""
    pytest.importorskip("sglang")
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "backend_emulation.py")
    out = subprocess.run([sys.executable, script, shape, "exact"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert f"backend emulation == references cpu {shape} exact" in out.stdout


@pytest.mark.gpu
def test_backend_verify_and_commit_on_gpu_at_qwen35_shapes():
    """The same flow on the GPU: Hk=16, Hv=48, K=V=128, bf16 activations, 16-node EAGLE trees."""
    pytest.importorskip("sglang")
    script = os.path.join(os.path.dirname(__file__), "backend_emulation.py")
    out = subprocess.run([sys.executable, script, "cuda"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "backend emulation == references cuda tree" in out.stdout
    out = subprocess.run([sys.executable, script, "cuda", "exact"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, "exact\n" + out.stdout[-3000:] + out.stderr[-6000:]
    assert "backend emulation == references cuda tree exact" in out.stdout


def test_a_pool_with_sglangs_unfolded_chain_replay_is_refused():
    """A state pool with SGLang's chain-replay cursors (allocated when its fold is off at allocation):
    SGLang's commit would advance them and return before LumoTree's commit; refused, not served wrong."""
    from types import SimpleNamespace

    import pytest
    import torch

    from lumotree.sglang.backend import adopt_pool

    cache = SimpleNamespace(replayssm_rawk=torch.zeros(1), intermediate_ssm=None)
    pool = SimpleNamespace(mamba_cache=cache, replayssm_cache_base=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="chain replay without the fold"):
        adopt_pool(pool)
