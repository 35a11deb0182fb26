"""The reference hybrid model (our tree GDN / conv / attention references inside) reproduces
transformers' Qwen3_5ForCausalLM on the same weights: an independent check of the references."""
import pytest
import torch

from lumotree.models.tiny_hybrid import TinyHybridLM
from lumotree.tree import TreeDescriptor


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "train_tiny_hybrid", os.path.join(os.path.dirname(__file__), "..", "..", "benchmark/models/train_tiny_hybrid.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(0)
    cfg = mod.make_config(vocab=97, hidden=64, layers=4, inter=96, heads=2, kv_heads=1, head_dim=32,
                          lin_k_heads=1, lin_v_heads=2, lin_dim=16)
    cfg.rope_parameters["mrope_section"] = [2, 1, 1]  # 4 frequency pairs: head_dim 32 x 0.25 / 2
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms and gates (fresh init has zeros / ones there)
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.add_(torch.randn_like(p) * 0.2)
    out = str(tmp_path_factory.mktemp("hf"))
    model.save_pretrained(out, safe_serialization=True)
    return out, model


def test_reference_model_matches_transformers(hf_dir):
    path, hf = hf_dir
    ours = TinyHybridLM.from_hf(path)
    ids = torch.randint(0, 97, (1, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.double()(ids).logits[0]
    tree = TreeDescriptor.from_parents(torch.arange(-1, 22)[None])
    got = ours.verify(ids, tree)[0]
    err = float((ref - got).norm() / ref.norm())
    assert err < 1e-6, err


def test_rejects_non_hybrid_checkpoints(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="not a Qwen3.5 text checkpoint"):
        TinyHybridLM.from_hf(str(tmp_path))
