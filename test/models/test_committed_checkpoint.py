"""The trained tiny hybrid committed in benchmark/models/tiny-hybrid: within the size
budget, in the layout SGLang's Qwen3_5ForCausalLM + Qwen3_5MTP load, and our reference model
reproduces transformers on it (so `lumotree demo` runs the real model)."""
import json
import os

import pytest
import torch

CKPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "models", "tiny-hybrid")
pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(CKPT, "model.safetensors")),
                                reason="checkpoint not in this checkout")


def test_size_and_layout():
    from safetensors.torch import load_file

    files = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    assert sum(os.path.getsize(os.path.join(CKPT, f)) for f in files) <= 8 * 2 ** 20
    sd = load_file(os.path.join(CKPT, "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    for k in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
              "mtp.layers.0.self_attn.q_proj.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"):
        assert k in sd, k
    cfg = json.load(open(os.path.join(CKPT, "config.json")))
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["num_nextn_predict_layers"] == 1
    assert cfg["tie_word_embeddings"] and "lm_head.weight" not in sd
    log = json.load(open(os.path.join(CKPT, "train_log.json")))
    assert log["device"].startswith("NVIDIA") and log["held_out_ppl"] < 20


def test_reference_model_matches_transformers_on_checkpoint():
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from lumotree.models.tiny_hybrid import TinyHybridLM
    from lumotree.tree import TreeDescriptor

    tok = Tokenizer.from_file(os.path.join(CKPT, "tokenizer.json"))
    ids = torch.tensor([tok.encode("def reverse(xs):\n    return xs[::-1]\n\n\nclass Stack:\n").ids])
    hf = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float64).eval()
    ours = TinyHybridLM.from_hf(CKPT)
    with torch.no_grad():
        ref = hf(ids).logits[0]
    T = ids.shape[1]
    got = ours.verify(ids, TreeDescriptor.from_parents(torch.arange(-1, T - 1)[None]))[0]
    err = float((ref - got).norm() / ref.norm())
    assert err < 1e-6, err


def test_demo_random_weights_flag():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "lumotree", "demo", "--random", "--tokens", "48"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "random weights" in out.stdout and "identical: yes" in out.stdout
