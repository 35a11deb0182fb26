"""The SGLang plugin on CPU: entry point, registration, argument validation, configuration and the
hook. The backend's verify/commit plumbing: test_backend_emulation.py; serving itself runs on the
GPU machine: benchmark/serving/parity.py."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CKPT = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")


def cfg(**kw):
    base = dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"],
                layer_types=["linear_attention"] * 3 + ["full_attention"], mtp_num_hidden_layers=1)
    base.update(kw)
    return SimpleNamespace(**base)


def test_entry_point_declared():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert eps.get("lumotree") == "lumotree.sglang.plugin:register"


def test_register_is_idempotent_and_eagle_like():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from lumotree.sglang import plugin

    plugin.register()
    plugin.register()
    algo = SpeculativeAlgorithm.from_string("lumotree")
    assert algo.is_eagle() and algo.need_topk() and algo.is_speculative() and not algo.is_ngram()
    assert algo.supports_overlap and algo.validate_server_args is plugin.validate_server_args
    suffix = SpeculativeAlgorithm.from_string("LUMOTREE_SUFFIX")
    assert suffix.is_ngram() and not suffix.is_eagle() and not suffix.has_draft_kv()
    assert suffix.validate_server_args is plugin.validate_suffix_server_args
    # builtin-only queries of SGLang's scheduler are answered as EAGLE / NGRAM answer them
    assert algo.carries_draft_hidden_states() == SpeculativeAlgorithm.EAGLE.carries_draft_hidden_states()
    assert suffix.carries_draft_hidden_states() == SpeculativeAlgorithm.NGRAM.carries_draft_hidden_states()
    with pytest.raises(AttributeError):
        algo.__no_such_dunder__


def test_model_checks():
    from lumotree.sglang.plugin import check_model_config

    check_model_config(cfg())
    check_model_config(cfg(layer_types=None, layers_block_type=["linear_attention", "attention"]))
    with pytest.raises(ValueError, match="no 'linear_attention' layers"):
        check_model_config(cfg(model_type="llama", architectures=["LlamaForCausalLM"], layer_types=None))
    with pytest.raises(ValueError, match=r"layer types \['mamba'\] \(layers \[1\]\)"):
        check_model_config(cfg(layer_types=["linear_attention", "mamba", "full_attention"]))
    with pytest.raises(ValueError, match="has none.*LUMOTREE_SUFFIX drafts without one"):
        check_model_config(cfg(mtp_num_hidden_layers=0))
    check_model_config(cfg(mtp_num_hidden_layers=0), require_mtp=False, algorithm="LUMOTREE_SUFFIX")
    with pytest.raises(ValueError, match="not a Qwen3.5 / Qwen3-Next"):
        check_model_config(cfg(model_type="jet_nemotron"))
    vl = SimpleNamespace(text_config=cfg(), architectures=["Qwen3_5ForConditionalGeneration"])
    check_model_config(vl)


def test_configure_server_args(monkeypatch):
    from lumotree.sglang import plugin

    monkeypatch.delenv(plugin.ENV_ACTIVE, raising=False)
    sa = SimpleNamespace(enable_linear_replayssm_spec=False, mamba_ssm_dtype=None, speculative_num_draft_tokens=6,
                         speculative_eagle_topk=2)
    plugin.configure_server_args(sa)
    assert sa.enable_linear_replayssm_spec and sa.mamba_ssm_dtype == "float32"
    assert os.environ[plugin.ENV_ACTIVE] == "1"


ARGS_SCRIPT = r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
base = ["--model-path", sys.argv[1], "--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6", "--device", "cpu"]
for extra in ([], ["--speculative-num-draft-tokens", "100"], ["--mamba-ssm-dtype", "bfloat16"],
              ["--speculative-draft-model-path", sys.argv[2]], ["--model-path", sys.argv[2]],
              ["--speculative-algorithm", "LUMOTREE_SUFFIX"],
              ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-ngram-max-bfs-breadth", "1"]):
    try:
        prepare_server_args(base + extra)
        print("RESULT ok")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\n", " "))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    import json

    llama = tmp_path_factory.mktemp("llama")
    json.dump(dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
                   num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, vocab_size=256,
                   max_position_embeddings=512, rms_norm_eps=1e-6), open(llama / "config.json", "w"))
    out = subprocess.run([sys.executable, "-c", ARGS_SCRIPT, CKPT, str(llama)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 7, out.stdout[-2000:] + out.stderr[-4000:]
    return lines


def test_cli_flags_parse_and_validate(parsed):
    # a valid LUMOTREE configuration passes every model/flag check and stops at the device check
    assert "runs its GDN kernels on CUDA (got --device cpu)" in parsed[0]
    assert "at most 64 nodes" in parsed[1]
    assert "keeps the GDN state in fp32" in parsed[2]
    assert "--speculative-draft-model-path" in parsed[3] and "not supported" in parsed[3]
    assert "no 'linear_attention' layers" in parsed[4] and "LlamaForCausalLM" in parsed[4]
    assert "LUMOTREE_SUFFIX runs its GDN kernels on CUDA" in parsed[5]
    assert "--speculative-ngram-max-bfs-breadth must be >= 2" in parsed[6]


def test_hook_registers_the_selection(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookType

    from lumotree.sglang import select
    from lumotree.sglang.patches import verify_tree_greedy as hook
    from utils import fresh_hook

    with fresh_hook(hook) as hooks:
        saved = list(hooks.get(hook.TARGET, []))
        monkeypatch.setenv("LUMOTREE_SGLANG_SELECT", "0")
        hook.install()
        assert list(hooks.get(hook.TARGET, [])) == saved  # opted out
        monkeypatch.delenv("LUMOTREE_SGLANG_SELECT")
        hook.install()
        last = hooks[hook.TARGET][-1]
        assert (last[0], last[1]) == (HookType.REPLACE, select.verify_tree_greedy)


def test_hook_registers_backend_classes():
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from lumotree.sglang import backend
    from lumotree.sglang import patches
    from lumotree.sglang.patches import gdn_backend_classes

    assert issubclass(backend.LumoTreeGDNBackend, GDNAttnBackend)
    assert issubclass(backend.LumoTreeHybridBackend, HybridLinearAttnBackend)
    saved = {t: list(HookRegistry._hooks.get(t, [])) for t in gdn_backend_classes.TARGETS}
    try:
        patches.forget(*gdn_backend_classes.TARGETS)
        gdn_backend_classes.install()
        for target, name in gdn_backend_classes.TARGETS.items():
            hooks = HookRegistry._hooks[target]
            assert (hooks[-1][0], hooks[-1][1]) == (HookType.REPLACE, getattr(backend, name))
    finally:
        for t, h in saved.items():
            HookRegistry._hooks[t] = h
        patches.forget(*gdn_backend_classes.TARGETS)


def test_chain_parents():
    from lumotree.sglang.backend import chain_parents

    assert chain_parents(2, 4, "cpu").tolist() == [[-1, 0, 1, 2]] * 2


def test_serve_cli_builds_the_launch_command():
    out = subprocess.run([sys.executable, "-m", "lumotree", "serve", "--model-path", "org/M", "--topk", "4",
                          "--draft-tokens", "8", "--dry-run", "--", "--attention-backend", "triton"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    cmd = out.stdout.split()
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert " ".join(cmd).endswith("--model-path org/M --speculative-algorithm LUMOTREE --speculative-num-steps 3 "
                                  "--speculative-eagle-topk 4 --speculative-num-draft-tokens 8 "
                                  "--attention-backend triton")
    exact = subprocess.run([sys.executable, "-m", "lumotree", "serve", "--model-path", "org/M", "--exact", "--dry-run"],
                           capture_output=True, text=True, timeout=60)
    assert exact.returncode == 0, exact.stderr
    assert exact.stdout.split()[-3:] == ["--enable-deterministic-inference", "--attention-backend", "triton"]
    mine = subprocess.run([sys.executable, "-m", "lumotree", "serve", "--model-path", "org/M", "--exact", "--dry-run", "--",
                           "--attention-backend", "fa3"], capture_output=True, text=True, timeout=60)
    assert mine.stdout.split()[-3:] == ["--enable-deterministic-inference", "--attention-backend", "fa3"]  # (refused
    # at start-up by the plugin's check, with the reason)


ORACLE_SCRIPT = r"""
import os
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
for name in ("LUMOTREE_ORACLE", "NGRAM_ORACLE"):
    try:
        a = SpeculativeAlgorithm.from_string(name)
        print("RESULT", name, a.is_ngram(), a.validate_server_args is not None)
    except ValueError:
        print("RESULT", name, "absent")
"""


@pytest.mark.parametrize("p", [None, "0.7"])
def test_oracle_algorithms_only_with_the_benchmark_variable(p):
    env = {k: v for k, v in os.environ.items() if k != "LUMOTREE_BENCH_ORACLE_P"}
    if p:
        env["LUMOTREE_BENCH_ORACLE_P"] = p
    out = subprocess.run([sys.executable, "-c", ORACLE_SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 2, out.stderr[-3000:]
    if p:
        assert lines == ["RESULT LUMOTREE_ORACLE True True", "RESULT NGRAM_ORACLE True False"]
    else:
        assert lines == ["RESULT LUMOTREE_ORACLE absent", "RESULT NGRAM_ORACLE absent"]


REMOVED_ENV_SCRIPT = r"""
import os, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
base = ["--model-path", sys.argv[1], "--speculative-num-draft-tokens", "6", "--device", "cpu"]
mtp = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2"]
for env, extra in ((None, mtp), ("LUMOTREE_SUFFIX_MERGE", mtp), ("LUMOTREE_SUFFIX_MERGE_SLOTS", mtp),
                   ("LUMOTREE_SUFFIX_MERGE", ["--speculative-algorithm", "LUMOTREE_SUFFIX"])):
    for name in ("LUMOTREE_SUFFIX_MERGE", "LUMOTREE_SUFFIX_MERGE_SLOTS"):
        os.environ.pop(name, None)
    if env:
        os.environ[env] = "1"
    try:
        prepare_server_args(base + extra)
        print("RESULT ok")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\n", " "))
"""


def test_the_removed_merged_tree_s_variables_fail_at_start_up_naming_themselves():
    """The merged MTP + suffix tree served slower than LUMOTREE_SUFFIX alone and was removed: a server started
    with its environment variables says so (naming the variable and what to serve) instead of ignoring them."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    out = subprocess.run([sys.executable, "-c", REMOVED_ENV_SCRIPT, CKPT], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 4, out.stdout[-2000:] + out.stderr[-4000:]
    assert "runs its GDN kernels on CUDA" in lines[0]  # without them the arguments reach the device check
    assert lines[1].startswith("ValueError LUMOTREE_SUFFIX_MERGE is set: the merged MTP + suffix draft tree was "
                               "removed") and "--speculative-algorithm LUMOTREE_SUFFIX" in lines[1], lines[1]
    assert lines[2].startswith("ValueError LUMOTREE_SUFFIX_MERGE_SLOTS is set"), lines[2]
    assert lines[3].startswith("ValueError LUMOTREE_SUFFIX_MERGE is set"), lines[3]


def test_consistent_prefix_cache_keeps_overlap_with_the_no_buffer_cache(monkeypatch, caplog):
    """With the radix cache on, LumoTree servers take the no_buffer state cache (SGLang 0.5.17's
    extra_buffer path served speculative requests inconsistent cached states,
    benchmark/results/cache_consistency_h200.json) and keep the overlap scheduler, except where the
    finished-row skip does not apply (mixed chunk, deterministic inference): there the synchronous one.
    Page size > 1 keeps SGLang's own, with a warning."""
    from lumotree.sglang.plugin import consistent_prefix_cache

    def args(**kw):
        base = dict(disable_radix_cache=False, disable_overlap_schedule=False, page_size=None,
                    mamba_radix_cache_strategy="auto", speculative_algorithm="LUMOTREE")
        base.update(kw)
        return SimpleNamespace(**base)

    for algo in ("LUMOTREE", "LUMOTREE_SUFFIX", "LUMOTREE_ORACLE", "lumotree"):
        sa = args(speculative_algorithm=algo)
        assert consistent_prefix_cache(sa)
        assert not sa.disable_overlap_schedule and sa.mamba_radix_cache_strategy == "no_buffer"
    for kw in (dict(enable_mixed_chunk=True), dict(enable_deterministic_inference=True)):
        sa = args(**kw)
        assert consistent_prefix_cache(sa)
        assert sa.disable_overlap_schedule and sa.mamba_radix_cache_strategy == "no_buffer"
    for kw in (dict(disable_radix_cache=True), dict(disable_overlap_schedule=True)):
        sa = args(**kw)
        assert not consistent_prefix_cache(sa) and sa.mamba_radix_cache_strategy == "auto"
    caplog.set_level("WARNING")
    sa = args(page_size=16)
    assert not consistent_prefix_cache(sa) and not sa.disable_overlap_schedule
    assert "--page-size 16 needs SGLang's extra_buffer" in caplog.text


SCHED_SCRIPT = r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
base = ["--model-path", sys.argv[1], "--device", "cuda"]  # parsing only: nothing touches a GPU
for extra in (["--speculative-algorithm", "LUMOTREE"], ["--speculative-algorithm", "LUMOTREE_SUFFIX"],
              ["--speculative-algorithm", "LUMOTREE", "--disable-radix-cache"], []):
    sa = prepare_server_args(base + extra)
    print("RESULT", sa.disable_overlap_schedule, sa.mamba_radix_cache_strategy)
"""


def test_lumotree_servers_resolve_to_overlap_with_the_no_buffer_cache():
    """Through SGLang's own argument resolution (its declaration pipeline, materialized after the
    speculative hook): LUMOTREE and LUMOTREE_SUFFIX keep the overlap scheduler with the no_buffer
    strategy; with --disable-radix-cache, and without speculation, SGLang resolves its own cache."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    out = subprocess.run([sys.executable, "-c", SCHED_SCRIPT, CKPT], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 4, out.stdout[-2000:] + out.stderr[-4000:]
    assert lines[0] == lines[1] == "False no_buffer"
    assert not lines[2].endswith("no_buffer") and not lines[3].endswith("no_buffer")


EXACT_SCRIPT = r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
base = ["--model-path", sys.argv[1], "--device", "cuda", "--speculative-algorithm", "LUMOTREE",
        "--enable-deterministic-inference"]  # parsing only: nothing touches a GPU
for extra in ([], ["--attention-backend", "triton"], ["--attention-backend", "flashinfer"],
              ["--attention-backend", "triton", "--page-size", "16"]):
    try:
        sa = prepare_server_args(base + extra)
        print("RESULT ok", sa.attention_backend, sa.enable_deterministic_inference)
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\n", " "))
"""


def test_deterministic_inference_selects_the_decode_exact_verify_and_checks_its_needs():
    """LUMOTREE + --enable-deterministic-inference (the decode-exact verify) resolves with SGLang's
    Triton attention backend and refuses, early and by name, what it cannot serve."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    out = subprocess.run([sys.executable, "-c", EXACT_SCRIPT, CKPT], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 4, out.stdout[-2000:] + out.stderr[-4000:]
    assert "pass --attention-backend triton (none given" in lines[0], lines[0]
    assert lines[1] == "ok triton True", lines[1]
    assert "pass --attention-backend triton" in lines[2] and "flashinfer" in lines[2], lines[2]
    assert "--page-size 1" in lines[3], lines[3]


ADAPTIVE_SCRIPT = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
from lumotree.sglang.adaptive import adaptive_tree_size
base = ["--model-path", sys.argv[1], "--device", "cuda", "--attention-backend", "triton",
        "--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6"]  # parsing only: nothing touches a GPU
bad = sys.argv[2] + "/bad.json"
json.dump({"candidate_steps": [0, 2]}, open(bad, "w"))
bad_policy = sys.argv[2] + "/bad_policy.json"
json.dump({"candidate_steps": [0, 1], "ema": 2}, open(bad_policy, "w"))
quantile = sys.argv[2] + "/quantile.json"
json.dump({"candidate_steps": [0, 1], "request_quantile": {"quantile": 0.5}}, open(quantile, "w"))
bad_quantile = sys.argv[2] + "/bad_quantile.json"
json.dump({"candidate_steps": [0, 1], "request_quantile": {"quantile": 2}}, open(bad_quantile, "w"))
mtp_quantile = sys.argv[2] + "/mtp_quantile.json"
json.dump({"candidate_steps": [0, 3], "request_quantile": {}}, open(mtp_quantile, "w"))
depths = sys.argv[2] + "/depths.json"
json.dump({"candidate_steps": [0, 1, 3]}, open(depths, "w"))
both = sys.argv[2] + "/both.json"
json.dump({"candidate_steps": [0, 3]}, open(both, "w"))
chain = ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
for extra in ([], ["--speculative-adaptive"], ["--speculative-adaptive-config", bad],
              ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-adaptive"], ["--tp-size", "2"],
              ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-adaptive-config", bad_policy],
              ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-adaptive-config", quantile],
              ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-adaptive-config", bad_quantile],
              ["--speculative-adaptive-config", mtp_quantile],
              chain + ["--speculative-adaptive-config", depths], ["--speculative-adaptive-config", depths],
              ["--tp-size", "2", "--dp-size", "2", "--speculative-adaptive-config", both],
              ["--enable-deterministic-inference", "--speculative-adaptive-config", both],
              ["--enable-deterministic-inference"]):
    try:
        sa = prepare_server_args(base + extra)
        print("RESULT ok", adaptive_tree_size(sa), sa.speculative_adaptive, sa.speculative_num_draft_tokens)
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\n", " "))
"""


def test_lumotree_is_adaptive_by_default_and_checks_the_adaptive_flags(tmp_path):
    """A LUMOTREE server chooses its tree size per step by default; ``--speculative-adaptive`` is
    accepted, on LUMOTREE_SUFFIX too (and SGLang's chain-only controller kept off, so its draft-token sizing does
    not apply to the tree); a config naming a tree it cannot serve, or a policy setting out of range, fails at
    parsing; with tensor parallelism it stays adaptive (the ranks choose alike, lumotree.sglang.shared_times), in the
    decode-exact mode only where its config lists candidates (adaptive.exact_choice). LUMOTREE_SUFFIX's
    per-request choice is checked there too, and a chain's shallower depths (a tree's fail by name)."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    out = subprocess.run([sys.executable, "-c", ADAPTIVE_SCRIPT, CKPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 14, out.stdout[-2000:] + out.stderr[-4000:]
    # the decode-exact mode chooses where its config lists no draft too, else it serves the configured tree
    assert lines[12] == "ok True False 6", lines[12]
    assert lines[13] == "ok False False 6", lines[13]
    # data parallelism serves the configured tree: a config asking it to choose fails, naming the flag and why
    assert "--speculative-adaptive-config" in lines[11] and "data parallelism" in lines[11], lines[11]
    assert lines[0] == "ok True False 6", lines[0]
    assert lines[4] == "ok True False 6", lines[4]  # --tp-size 2: adaptive too, the ranks sharing rank 0's step times
    assert lines[1] == "ok True False 6", lines[1]
    assert "--speculative-adaptive-config" in lines[2] and "candidate_steps [2] cannot be served" in lines[2], lines[2]
    assert lines[3] == "ok True False 6", lines[3]  # LUMOTREE_SUFFIX: adaptive too (its tree or no draft)
    # a policy setting out of range fails at parsing too, naming the flag
    assert "--speculative-adaptive-config" in lines[5] and "ema in (0, 1]" in lines[5], lines[5]
    # LUMOTREE_SUFFIX's per-request choice's settings: accepted; out of range or on a LUMOTREE server it fails, by name
    assert lines[6] == "ok True False 6", lines[6]
    assert "--speculative-adaptive-config" in lines[7] and "quantile in [0, 1)" in lines[7], lines[7]
    assert "--speculative-adaptive-config" in lines[8] and "LUMOTREE_SUFFIX's per-request" in lines[8], lines[8]
    # a chain may choose its depth too; the topk-2 tree may not, and fails at parsing naming the flags
    assert lines[9] == "ok True False 4", lines[9]
    assert "--speculative-adaptive-config" in lines[10] and "--speculative-eagle-topk 1" in lines[10], lines[10]


def test_hooks_on_one_target_all_register_once_each():
    """LumoTree's end-of-request clamp, the benchmark's acceptance oracle and its step timer all wrap SGLang's
    ``eagle_sample``: each registers (the first did not drop the others), and a hook installed twice registers once."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from lumotree.sglang import patches, step_timing
    from lumotree.sglang.patches import eagle_sample_end

    target = eagle_sample_end.TARGET
    timer = next(step_timing.loop_part(part, at) for t, part, at in step_timing.LOOP_PARTS if t == target)
    saved = list(HookRegistry._hooks.get(target, []))
    try:
        patches.forget(target)
        HookRegistry._hooks[target] = []
        patches.register_hook(target, timer, "AROUND")  # the step timer first, as plugin.py installs it
        eagle_sample_end.install()
        eagle_sample_end.install()
        patches.register_hook(target, timer, "AROUND")
        got = [(kind, hook) for kind, hook, _ in HookRegistry._hooks[target]]
        assert got == [(HookType.AROUND, timer), (HookType.AROUND, eagle_sample_end.eagle_sample_end)]
    finally:
        HookRegistry._hooks[target] = saved
        patches.forget(target)
