"""The tiny-model recipe runs end to end on CPU (a few steps) and exports a checkpoint that
transformers reloads with identical logits, with the mtp.* tensors SGLang's Qwen3_5MTP loads."""
import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("train_tiny_hybrid",
                                                  os.path.join(ROOT, "benchmark/models/train_tiny_hybrid.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = str(tmp_path_factory.mktemp("tiny"))
    model, mtp, log = mod.main(["--out", out, "--smoke", "--steps", "2"])
    return model, out, log


def test_export_reloads_with_same_logits(recipe):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, out, log = recipe
    assert log["train_steps"] == 2 and log["held_out_ppl"] > 1 and log["checkpoint_bytes"] <= 8 * 2 ** 20
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "print(1)"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([tok("def f(x):\n    return x + 1\n")["input_ids"]])
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():  # the export is bf16: compare against the same rounding
            p.copy_(p.to(torch.bfloat16).float())
        assert torch.allclose(model(ids).logits, reloaded(ids).logits, atol=1e-4, rtol=1e-4)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["mtp_num_hidden_layers"] == 1
    assert cfg["layer_types"][-1] == "full_attention" and cfg["layer_types"][0] == "linear_attention"


def test_mtp_tensors_in_sglang_layout(recipe):
    from safetensors.torch import load_file

    _, out, _ = recipe
    names = set(load_file(os.path.join(out, "model.safetensors")))
    for n in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
              "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.gate_proj.weight"):
        assert n in names, n
    assert any(n.startswith("model.layers.0.linear_attn.") for n in names)


def test_demo_runs_on_the_exported_checkpoint(recipe, capsys):
    from lumotree.cli import main

    _, out, _ = recipe
    assert main(["demo", "--model", out, "--tokens", "24"]) == 0
    assert "identical: yes" in capsys.readouterr().out
