"""A LumoTree server's request capacity: its running cap and state slots as the same server's without speculation
(:mod:`lumotree.sglang.capacity`), through SGLang's own argument parsing and state-pool sizing on the committed tiny
checkpoint (both run on CPU)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from lumotree.sglang import capacity

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPT = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")


def test_the_draft_weights_are_its_own_storages_once():
    """What the draft holds beyond the target: each storage once (a view, a tied weight), the target's not at all."""
    target = torch.nn.ModuleDict({"embed": torch.nn.Embedding(10, 4), "body": torch.nn.Linear(4, 4)})
    draft = torch.nn.Module()
    draft.embed = target["embed"]  # shared with the target (SGLang's set_embed_and_head)
    draft.layer = torch.nn.Linear(4, 6, bias=False)
    draft.tied = torch.nn.Linear(4, 6, bias=False)
    draft.tied.weight = draft.layer.weight  # tied: one storage
    draft.register_buffer("view", draft.layer.weight.detach()[:3])  # a view of that storage
    draft.register_buffer("own", torch.zeros(5, dtype=torch.float64))
    assert capacity.draft_weight_bytes(draft, target) == 4 * 6 * 4 + 5 * 8
    assert capacity.draft_weight_bytes(target, target) == 0


SCRIPT = r"""
import json, sys, types
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
import sglang.srt.runtime_context as rc
import sglang.srt.mem_cache.kv_cache_configurator as kc
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from lumotree.sglang import capacity

REST, DRAFT = 2.0, int(0.25 * (1 << 30))  # GiB left after the weights; the draft's own bytes
original = kc.KVCacheConfigurator._handle_max_mamba_cache
one_rank = rc.get_parallel().override(attn_tp_size=1, tp_size=1, pp_size=1, attn_dp_size=1)  # (kept referenced)
one_rank.__enter__()


def size(extra, hooked, rest=REST, draft=DRAFT):
    sa = prepare_server_args(["--model-path", sys.argv[1], "--device", "cuda"] + extra)
    rc.publish(sa, role="test")  # the scheduler's config bag, fresh for each server
    mc = ModelConfig.from_server_args(sa)
    cfg = types.SimpleNamespace(
        mambaish_config=kc.mambaish_config(mc), hybrid_gdn_config=kc.hybrid_gdn_config(mc), model_config=mc,
        server_args=sa, is_draft_worker=False, ps=types.SimpleNamespace(pp_size=1, attn_dp_size=1),
        spec_algorithm=SpeculativeAlgorithm.from_string(sa.speculative_algorithm) if sa.speculative_algorithm
        else SpeculativeAlgorithm.NONE)
    cfg._calculate_mamba_ratio = types.MethodType(kc.KVCacheConfigurator._calculate_mamba_ratio, cfg)
    capacity.note_draft_bytes(draft)
    kv = capacity.size_state_slots(original, cfg, rest) if hooked else original(cfg, rest)
    # the running cap SGLang then derives (plenty of KV tokens: the state slots decide)
    running = kc.KVCacheConfigurator.resolve_max_num_reqs(cfg, 10 ** 6)
    return {"kv": kv, "slots": rc.get_schedule().max_mamba_cache_size, "running": running}


LT = ["--speculative-algorithm", "LUMOTREE"]
SUFFIX = ["--speculative-algorithm", "LUMOTREE_SUFFIX"]
NEXTN = ["--speculative-algorithm", "NEXTN"]
out = {
    # no speculation: the draft's memory is free for it
    "none": size([], False, rest=REST + DRAFT / (1 << 30)), "none_same_memory": size([], False),
    "lumotree_sglang": size(LT, False), "lumotree": size(LT, True),
    "suffix_sglang": size(SUFFIX, False, draft=0), "suffix": size(SUFFIX, True, draft=0),
    "lumotree_user_slots": size(LT + ["--max-mamba-cache-size", "40"], True),
    "lumotree_big_draft_sglang": size(LT, False, draft=int(1.5 * (1 << 30))),
    "lumotree_big_draft": size(LT, True, draft=int(1.5 * (1 << 30))),  # the KV pool would keep too little
    "nextn_sglang": size(NEXTN, False), "nextn": size(NEXTN, True),  # not LumoTree's: SGLang's sizing
    # memory for ~64 requests' states (the H100 27B run's regime): the running cap follows the slots
    "none_64": size([], False, rest=0.08 + 0.02), "lumotree_64_sglang": size(LT, False, rest=0.08, draft=2 ** 30 // 50),
    "lumotree_64": size(LT, True, rest=0.08, draft=2 ** 30 // 50),
}
print("RESULT " + json.dumps(out))
"""


def _run(script):
    env = {k: v for k, v in os.environ.items() if k != "LUMOTREE_SGLANG_ACTIVE"}  # (another test's server may set it)
    out = subprocess.run([sys.executable, "-c", script, CKPT], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env=env)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-4000:]
    return [json.loads(ln) for ln in lines]


def test_a_lumotree_server_gets_the_state_slots_of_no_speculation():
    """SGLang's sizing gives LUMOTREE fewer slots than no speculation with the draft's memory (its weights counted,
    per-slot rings charged); with LumoTree's sizing it gets exactly no speculation's count, the KV pool paying. The
    user's ``--max-mamba-cache-size`` is kept, and so is SGLang's sizing where the KV pool would keep too little and
    for another algorithm (SGLang's NEXTN)."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    r, = _run(SCRIPT)
    none = r["none"]["slots"]
    assert r["lumotree_sglang"]["slots"] < none  # what the hook is for
    assert r["lumotree"]["slots"] == none
    assert 0 < r["lumotree"]["kv"] < r["lumotree_sglang"]["kv"]
    assert r["lumotree"]["kv"] >= capacity.MIN_KV_KEPT * r["lumotree_sglang"]["kv"]
    # LUMOTREE_SUFFIX has no draft model: only the rings made the difference
    assert r["suffix_sglang"]["slots"] < r["suffix"]["slots"] == r["none_same_memory"]["slots"]
    assert r["lumotree_user_slots"]["slots"] == 40
    assert r["lumotree_big_draft"] == r["lumotree_big_draft_sglang"]
    assert r["nextn"] == r["nextn_sglang"] and r["nextn"]["slots"] < none
    # where the state slots cap the running requests, a LUMOTREE server runs as many as no speculation
    assert r["lumotree_64_sglang"]["running"] < r["none_64"]["running"] == r["lumotree_64"]["running"] < 256


PARSE = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
base = ["--model-path", sys.argv[1], "--device", "cuda"]
fixed = sys.argv[2]
out = {}
for name, extra in (("none", []), ("lumotree", ["--speculative-algorithm", "LUMOTREE"]),
                    ("lumotree_32", ["--speculative-algorithm", "LUMOTREE", "--max-running-requests", "32"]),
                    ("lumotree_graphs_8", ["--speculative-algorithm", "LUMOTREE", "--cuda-graph-max-bs", "8"]),
                    ("lumotree_fixed", ["--speculative-algorithm", "LUMOTREE", "--speculative-adaptive-config", fixed]),
                    ("suffix", ["--speculative-algorithm", "LUMOTREE_SUFFIX"]),
                    ("nextn", ["--speculative-algorithm", "NEXTN"]), ("ngram", ["--speculative-algorithm", "NGRAM"])):
    sa = prepare_server_args(base + extra)
    out[name] = [sa.max_running_requests, sa.cuda_graph_config.decode.max_bs]
print("RESULT " + json.dumps(out))
"""


def test_a_lumotree_server_without_the_flag_is_not_capped_at_sglangs_speculative_48(tmp_path):
    """Without ``--max-running-requests`` SGLang caps its speculative servers at 48 running requests; a LumoTree
    server that can serve no draft takes 256 (or its decode graphs' largest batch, if larger) instead, and memory
    caps it as it caps no speculation; a smaller ``--cuda-graph-max-bs`` does not lower it. The flag, a fixed tree (no no-draft step) and LUMOTREE_SUFFIX keep what SGLang does."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"candidate_steps": [3]}))
    script = PARSE.replace("fixed = sys.argv[2]", f"fixed = {str(fixed)!r}")
    r, = _run(script)
    graphs = r["none"][1]
    assert r["none"][0] is None and graphs > 48
    assert r["lumotree"][0] == max(capacity.RUNNING, graphs) and r["lumotree_graphs_8"][0] == capacity.RUNNING
    assert r["lumotree_32"][0] == 32
    assert r["lumotree_fixed"][0] == 48 and r["nextn"][0] == 48 and r["ngram"][0] == 48
    assert r["suffix"][0] == 48  # its 32-node verify graphs' buffers grow with the cap


def test_the_sizing_hook_is_registered_on_sglangs_method():
    """The patch wraps the method SGLang 0.5.17 sizes the state pool in (a renamed method fails here, not silently on
    a GPU)."""
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from lumotree.sglang import patches
    from lumotree.sglang.patches import state_slots_as_no_spec as patch

    module, cls, method = patch.TARGET.rsplit(".", 2)
    assert callable(getattr(getattr(importlib.import_module(module), cls), method))
    saved = list(HookRegistry._hooks.get(patch.TARGET, []))
    try:
        patches.forget(patch.TARGET)
        patch.install()
        hooks = HookRegistry._hooks[patch.TARGET]
        assert (hooks[-1][0], hooks[-1][1]) == (HookType.AROUND, patch.handle_max_mamba_cache)
    finally:
        HookRegistry._hooks[patch.TARGET] = saved
        patches.forget(patch.TARGET)


def test_sharing_the_draft_head_early_leaves_the_target_whole_when_sglang_shares_it_again(monkeypatch):
    """The worker runs SGLang's ``EagleDraftWorker.init_lm_head`` before the pools are sized, and SGLang runs it again
    after: with Qwen3.5's MTP model (its own ``set_embed_and_head`` / ``set_lm_head_from_target``) the second call
    deletes and re-sets the weight of what is by then the target's LM head module. The target must keep its tensors,
    the draft must hold the target's, and the draft's own copies must be gone after the first call."""
    from types import SimpleNamespace

    import sglang.srt.speculative.eagle_worker_v2 as ew
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def model(vocab=32, hidden=8):
        m = torch.nn.Module()
        m.model = torch.nn.Module()
        m.model.embed_tokens = torch.nn.Embedding(vocab, hidden)
        m.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        return m

    target = model()
    target.get_embed_and_head = lambda: (target.model.embed_tokens.weight, target.lm_head.weight)
    draft = model()
    draft.config = SimpleNamespace(tie_word_embeddings=False)
    draft.set_embed_and_head = Qwen3_5ForCausalLMMTP.set_embed_and_head.__get__(draft)
    draft.set_lm_head_from_target = Qwen3_5ForCausalLMMTP.set_lm_head_from_target.__get__(draft)
    worker = SimpleNamespace(target_worker=SimpleNamespace(model_runner=SimpleNamespace(model=target)),
                             draft_runner=SimpleNamespace(model=draft), speculative_algorithm=SimpleNamespace(
                                 is_eagle3=lambda: False), hot_token_id=None)
    embed, head = target.model.embed_tokens.weight, target.lm_head.weight
    own = draft.model.embed_tokens.weight, draft.lm_head.weight
    worker.init_token_map = lambda: None
    worker.init_lm_head = lambda: ew.EagleDraftWorker.init_lm_head(worker)
    capacity.share_draft_head(worker)  # LumoTree's, before the pools
    assert draft.model.embed_tokens.weight is embed and draft.lm_head is target.lm_head
    assert capacity.draft_weight_bytes(draft, target) == 0 and all(o is not embed and o is not head for o in own)
    ew.EagleDraftWorker.init_lm_head(worker)  # SGLang's, after the pools
    assert target.model.embed_tokens.weight is embed and target.lm_head.weight is head
    assert draft.model.embed_tokens.weight is embed and draft.lm_head.weight is head
