"""``lumotree demo | serve`` input errors: one line naming the problem and the fix, exit status 2, no
traceback, nothing loaded or launched."""
import os

import pytest

from lumotree.cli import main

ROOT = os.path.join(os.path.dirname(__file__), "..")
CKPT = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")


def run(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err
    return rc, err


def one_line_error(rc, err, *needles):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("argv,needles", [
    pytest.param(["--tokens", "0"], ["--tokens must be a positive integer (got 0)"], id="tokens-0"),
    pytest.param(["--tokens", "-5"], ["--tokens"], id="tokens-negative"),
    pytest.param(["--budget", "0"], ["--budget must be a positive integer"], id="budget-0"),
    pytest.param(["--depth", "0"], ["--depth must be a positive integer"], id="depth-0"),
    pytest.param(["--model", "/nonexistent"], ["--model /nonexistent: no such directory"], id="no-model"),
    pytest.param(["--model", __file__], ["is a file", "directory"], id="model-is-a-file"),
    pytest.param(["--random", "--model", CKPT], ["--model and --random"], id="model-and-random"),
    pytest.param(["--bogus"], ["unrecognized arguments: --bogus"], id="unknown-flag"),
])
def test_demo_input_errors(capsys, argv, needles):
    one_line_error(*run(capsys, "demo", *argv), *needles)


def test_demo_checkpoint_without_tokenizer_or_with_a_broken_config(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    one_line_error(*run(capsys, "demo", "--model", str(tmp_path)), "missing tokenizer.json")
    (tmp_path / "tokenizer.json").write_text("{}")
    one_line_error(*run(capsys, "demo", "--model", str(tmp_path)), "cannot load it as a Qwen3.5 text checkpoint")


@pytest.mark.parametrize("argv,needles", [
    pytest.param(["--model-path", "./nowhere"], ["--model-path ./nowhere: no such directory"], id="no-model"),
    pytest.param(["--model-path", __file__], ["not a checkpoint directory"], id="model-is-a-file"),
    pytest.param(["--model-path", "org/m", "--steps", "0"], ["--steps must be a positive integer"], id="steps-0"),
    pytest.param(["--model-path", "org/m", "--draft-tokens", "40"], ["--draft-tokens must be in [2, 4]"], id="chain-too-big"),
    pytest.param(["--model-path", "org/m", "--topk", "2", "--draft-tokens", "40"], ["--draft-tokens must be in [2, 7]"],
                 id="tree-too-big"),
    pytest.param(["--model-path", "org/m", "--", "--speculative-algorithm", "NEXTN"],
                 ["--speculative-algorithm is set by lumotree serve", "--suffix"], id="algorithm-twice"),
    pytest.param(["--model-path", "org/m", "--speculative-num-draft-tokens=8"], ["use its --draft-tokens option"],
                 id="tree-flag-twice"),
])
def test_serve_input_errors(capsys, argv, needles):
    one_line_error(*run(capsys, "serve", "--dry-run", *argv), *needles)


def test_serve_without_a_gpu_says_so(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_line_error(*run(capsys, "serve", "--model-path", CKPT), "no CUDA GPU visible", "lumotree demo")


def test_serve_suffix_builds_the_model_free_command(capsys):
    assert main(["serve", "--model-path", CKPT, "--suffix", "--dry-run"]) == 0
    out = capsys.readouterr().out.split()
    assert out[out.index("--speculative-algorithm") + 1] == "LUMOTREE_SUFFIX"
    assert "--speculative-num-steps" not in out and "--speculative-num-draft-tokens" not in out


@pytest.mark.parametrize("argv,want", [
    pytest.param([], ("3", "1", "4"), id="default-chain"),
    pytest.param(["--topk", "2"], ("3", "2", "6"), id="topk2-tree"),
    pytest.param(["--steps", "5", "--topk", "4"], ("5", "4", "10"), id="wide-tree"),
    pytest.param(["--topk", "2", "--draft-tokens", "5"], ("3", "2", "5"), id="given"),
])
def test_serve_defaults_to_a_chain_and_sizes_trees(capsys, argv, want):
    assert main(["serve", "--model-path", CKPT, "--dry-run", *argv]) == 0
    out = capsys.readouterr().out.split()
    got = tuple(out[out.index(f) + 1] for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                                  "--speculative-num-draft-tokens"))
    assert out[out.index("--speculative-algorithm") + 1] == "LUMOTREE" and got == want


@pytest.mark.parametrize("fa3,argv,backend", [
    pytest.param(True, [], None, id="fa3-sglang-picks"),
    pytest.param(False, [], "triton", id="no-fa3-triton"),
    pytest.param(False, ["--", "--attention-backend", "flashinfer"], "flashinfer", id="no-fa3-user-choice"),
    pytest.param(False, ["--exact"], "triton", id="no-fa3-exact-once"),
])
def test_serve_falls_back_to_triton_attention_without_fa3(capsys, monkeypatch, fa3, argv, backend):
    from lumotree import cli

    monkeypatch.setattr(cli, "fa3_installed", lambda: fa3)
    assert main(["serve", "--model-path", CKPT, "--dry-run", *argv]) == 0
    cap = capsys.readouterr()
    out = cap.out.split()
    assert out.count("--attention-backend") == (0 if backend is None else 1)
    if backend is not None:
        assert out[out.index("--attention-backend") + 1] == backend
    assert ("no FlashAttention-3" in cap.err) == (not fa3 and not argv)


def test_fa3_probe_finds_sgl_kernels_extension_file():
    import glob
    import importlib.util

    from lumotree.cli import fa3_installed

    spec = importlib.util.find_spec("sgl_kernel")
    has = spec is not None and bool(glob.glob(os.path.join(os.path.dirname(spec.origin), "flash_ops*.so")))
    assert fa3_installed() is has
    assert has  # sglang==0.5.17's sgl-kernel wheel (this project's pin) carries FA3


def test_fa3_probe_without_the_extension(monkeypatch, tmp_path):
    import importlib.machinery
    import importlib.util

    from lumotree import cli

    (tmp_path / "__init__.py").write_text("")
    spec = importlib.machinery.ModuleSpec("sgl_kernel", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert cli.fa3_installed() is False
    (tmp_path / "flash_ops.abi3.so").write_bytes(b"")
    assert cli.fa3_installed() is True
