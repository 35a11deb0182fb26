"""LUMOTREE_SUFFIX's default prefill batching (SGLang's prefill delayer, lumotree.sglang.scheduling) and the hook that
skips the delayer's per-pass gather on one rank (lumotree.sglang.patches.prefill_delayer_gather)."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from lumotree.sglang import scheduling
from lumotree.sglang.patches import prefill_delayer_gather

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CKPT = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")

def test_the_hook_decides_as_sglangs_gather_on_one_rank():
    """benchmark/serving/prefill_delayer_cpu.py: SGLang's delayer on a one-rank gloo group with its own gather and
    through the hook, the same verdicts pass by pass on a random stream that meets every outcome the delayer has."""
    script = os.path.join(ROOT, "benchmark", "serving", "prefill_delayer_cpu.py")
    out = subprocess.run([sys.executable, script, "--passes", "3000", "--calls", "50"], capture_output=True, text=True,
                         timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    res = json.loads(lines[-1])
    assert res["same"] is True
    assert set(res["reasons"]) == {"delay", "no_wait", "none prefillable", "token_watermark", "wait_success",
                                   "wait_timeout"}


def test_the_hook_leaves_a_group_of_several_ranks_to_sglang(monkeypatch):
    import torch

    calls = []

    def sglangs(self, *a, **k):
        calls.append((a, k))
        return "gathered"

    two = SimpleNamespace(_global_info_buffer=torch.zeros(2, 1, 5, dtype=torch.int64), _gather_group=None)
    assert prefill_delayer_gather.gather_alone(sglangs, two, True, False, running_batch=3) == "gathered"
    assert calls and not two._lumotree_gather_alone
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    one = SimpleNamespace(_global_info_buffer=torch.zeros(1, 1, 5, dtype=torch.int64), _gather_group=None)
    got = prefill_delayer_gather.gather_alone(sglangs, one, True, False, running_batch=31, max_prefill_bs=4,
                                              waiting_queue_len=2)
    assert len(calls) == 1 and got.tolist() == [[1, 0, 31, 4, 2]]


def test_the_idle_verdict_is_built_only_for_a_one_rank_pass_with_nothing_prefillable():
    """Prefillable passes and delayers of several ranks go to SGLang; a one-rank pass with nothing to prefill gets
    SGLang's verdict for it (the stream equality is the script's, above), carrying the wait of the delay before it."""
    from sglang.srt.managers.prefill_delayer import _State

    from lumotree.sglang.patches import prefill_delayer_idle

    calls = []

    def sglangs(self, *a, **k):
        calls.append((a, k))
        return "sglang"

    alone = SimpleNamespace(_lumotree_gather_alone=True, _curr_state=_State(delayed_count=3))
    several = SimpleNamespace(_lumotree_gather_alone=False, _curr_state=None)
    assert prefill_delayer_idle.idle_alone(sglangs, alone, local_prefillable=True, token_usage=0.5) == "sglang"
    assert prefill_delayer_idle.idle_alone(sglangs, several, local_prefillable=False, token_usage=0.5) == "sglang"
    assert prefill_delayer_idle.idle_alone(sglangs, alone, True, 0.5) == "sglang"  # positional, as the wrapper may pass
    assert len(calls) == 3 and alone._curr_state.delayed_count == 3
    out = prefill_delayer_idle.idle_alone(sglangs, alone, local_prefillable=False, token_usage=0.5)
    assert len(calls) == 3 and alone._curr_state is None
    assert (out.output_allow, out.output_reason, out.input_estimation, out.next_state, out.num_prefillable,
            out.wait_forward_passes) == (True, "", "none", None, 0, 3) and out.wait_seconds > 0
    out = prefill_delayer_idle.idle_alone(sglangs, alone, local_prefillable=False, token_usage=0.5)
    assert (out.wait_forward_passes, out.wait_seconds) == (0, 0.0)


def _args(**kw):
    base = dict(enable_prefill_delayer=False, prefill_delayer_queue_min_ratio=None, prefill_delayer_max_delay_ms=None,
                tp_size=1, dp_size=1, pp_size=1, disable_overlap_schedule=False, disaggregation_mode="null")
    return SimpleNamespace(**{**base, **kw})


def test_default_prefill_delayer_only_where_measured_and_not_asked_otherwise():
    sa = _args()
    assert scheduling.default_prefill_delayer(sa)
    assert (sa.enable_prefill_delayer, sa.prefill_delayer_queue_min_ratio, sa.prefill_delayer_max_delay_ms) == (
        True, scheduling.PREFILL_DELAYER_QUEUE_MIN_RATIO, scheduling.PREFILL_DELAYER_MAX_DELAY_MS)
    for kw in (dict(prefill_delayer_max_delay_ms=0.0), dict(prefill_delayer_queue_min_ratio=0.5),
               dict(enable_prefill_delayer=True), dict(tp_size=2), dict(dp_size=2), dict(pp_size=2),
               dict(disable_overlap_schedule=True), dict(disaggregation_mode="prefill")):
        sa = _args(**kw)
        assert not scheduling.default_prefill_delayer(sa), kw
        assert vars(sa) == vars(_args(**kw)), kw  # left as given


PARSE_SCRIPT = r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
import sglang.srt.runtime_context as rc
base = ["--model-path", sys.argv[1], "--device", "cuda"]  # parsing only: nothing touches a GPU
S = ["--speculative-algorithm", "LUMOTREE_SUFFIX"]
E = ["--enable-prefill-delayer"]
for extra in (S, S + ["--prefill-delayer-max-delay-ms", "0"], S + ["--disable-overlap-schedule"],
              S + E + ["--prefill-delayer-queue-min-ratio", "0.5"],
              ["--speculative-algorithm", "LUMOTREE"], [], ["--speculative-algorithm", "NGRAM"],
              S + E + ["--disable-overlap-schedule"],
              S + E + ["--enable-deterministic-inference", "--attention-backend", "triton"]):
    try:
        sa = prepare_server_args(base + extra)
    except ValueError as e:
        print("RESULT", "ValueError", str(e).split(":")[0])
        continue
    rc.publish(sa, role="test")  # what the scheduler process reads (its config bag, snapshotted from the arguments)
    bag = rc.get_schedule()
    print("RESULT", bag.enable_prefill_delayer, bag.prefill_delayer_queue_min_ratio, bag.prefill_delayer_max_delay_ms)
"""


def test_servers_resolve_the_delayer_through_sglangs_arguments():
    """Through SGLang's argument parsing and the scheduler's published config: LUMOTREE_SUFFIX turns the delayer on;
    ``--prefill-delayer-max-delay-ms 0`` alone, the synchronous scheduler or the user's own delayer flags keep it as
    given; LUMOTREE, NGRAM and no speculation are untouched. ``--enable-prefill-delayer`` on a LumoTree server that
    runs the synchronous scheduler (asked for, or chosen for the decode-exact mode) is refused by name at parsing,
    where SGLang would assert once the scheduler starts."""
    if not os.path.isfile(os.path.join(CKPT, "config.json")):
        pytest.skip("tiny checkpoint not in this checkout")
    out = subprocess.run([sys.executable, "-c", PARSE_SCRIPT, CKPT], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    lines = [ln[len("RESULT "):] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    refused = "ValueError --enable-prefill-delayer needs SGLang's overlap scheduler, and this server runs the " \
              "synchronous one (--disable-overlap-schedule, or LumoTree's choice for --enable-deterministic-inference " \
              "/ --enable-mixed-chunk with the radix cache)"
    assert lines == ["True 0.1 20.0", "False None 0.0", "False None None", "True 0.5 None", "False None None",
                     "False None None", "False None None", refused, refused], out.stdout[-2000:] + out.stderr[-4000:]


# the early ask, on SGLang's delayer (one-rank gloo group) and a stand-in scheduler pass
EARLY_SCRIPT = r"""
from types import SimpleNamespace
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
group = dist.new_group([0], backend="gloo")
from sglang.srt.managers import prefill_delayer as pdm
from lumotree.sglang.patches.prefill_delayer_early import ask_delayer_first
sa = SimpleNamespace(prefill_delayer_queue_min_ratio=0.1, prefill_delayer_max_delay_ms=1e9, enable_dp_attention=False,
                     disable_overlap_schedule=False)
delayer = pdm.PrefillDelayer(dp_size=1, attn_tp_size=1, cpu_group=group, server_args=sa, max_delay_passes=3,
                             token_usage_low_watermark=None)
delayer.skip_first_delayer = False
sched = SimpleNamespace(chunked_req=None, waiting_queue=["r"], grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
                        enable_hierarchical_cache=False, enable_priority_preemption=False, is_hybrid_swa=False,
                        dllm_config=None, prefill_delayer=delayer, max_prefill_bs=4.0, max_running_requests=32)
running = SimpleNamespace(batch_is_full=False, batch_size=lambda: 31)
calls = []
def sglangs(self, prefill_delayer_single_pass=None, running_batch=None):
    # SGLang's method: ranks the queue, then asks the delayer (as the adder does) and prefills when allowed
    calls.append("ranked")
    ok = prefill_delayer_single_pass.negotiate_should_allow_prefill(
        local_prefillable=True, running_batch=31, max_prefill_bs=4, max_running_requests=32, waiting_queue_len=1)
    return ("prefill" if ok else None), running_batch
out = []
for _ in range(4):  # 31 running, 1 waiting: held (queue trigger, 3 needed) until the third pass's timeout
    sp = pdm.PrefillDelayerSinglePassExecutor(delayer, token_usage=0.5)
    got, _rb = ask_delayer_first(sglangs, sched, prefill_delayer_single_pass=sp, running_batch=running)
    sp.finalize(actual_prefill=got is not None)
    out.append(f"{got}:{sp._result.output_reason}")
print("PASSES", " ".join(out))
print("RANKED", len(calls))
"""


def test_the_early_ask_holds_without_ranking_and_lets_sglang_prefill_on_its_verdict():
    out = subprocess.run([sys.executable, "-c", EARLY_SCRIPT], capture_output=True, text=True, timeout=600)
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines() if ln.split()}
    assert "PASSES" in lines, out.stdout[-2000:] + out.stderr[-4000:]
    # two held passes (SGLang's method not entered), then the delayer's pass cap allows and SGLang's method prefills,
    # its own ask reading the pass's verdict; then a new delay starts
    assert lines["PASSES"] == ["None:delay", "None:delay", "prefill:wait_timeout", "None:delay"]
    assert lines["RANKED"] == ["1"]


def test_the_early_ask_leaves_other_passes_to_sglang():
    from lumotree.sglang.patches import prefill_delayer_early

    calls = []

    def sglangs(self, prefill_delayer_single_pass=None, running_batch=None):
        calls.append(prefill_delayer_single_pass)
        return "sglang", running_batch

    class Never:
        def negotiate_should_allow_prefill(self, **kw):
            raise AssertionError("asked early")

    base = dict(chunked_req=None, waiting_queue=["r"],
                grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False), enable_hierarchical_cache=False,
                enable_priority_preemption=False, is_hybrid_swa=False, dllm_config=None, max_prefill_bs=4.0,
                max_running_requests=32, prefill_delayer=SimpleNamespace(_lumotree_gather_alone=True))
    running = SimpleNamespace(batch_is_full=False, batch_size=lambda: 31)
    for kw in (dict(chunked_req="c"), dict(waiting_queue=[]), dict(enable_hierarchical_cache=True),
               dict(enable_priority_preemption=True), dict(is_hybrid_swa=True), dict(dllm_config=object()),
               dict(grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: True)),
               dict(prefill_delayer=SimpleNamespace(_lumotree_gather_alone=False))):
        sched = SimpleNamespace(**{**base, **kw})
        got = prefill_delayer_early.ask_delayer_first(sglangs, sched, prefill_delayer_single_pass=Never(),
                                                      running_batch=running)
        assert got == ("sglang", running), kw
    full = SimpleNamespace(batch_is_full=True, batch_size=lambda: 32)
    assert prefill_delayer_early.ask_delayer_first(sglangs, SimpleNamespace(**base), prefill_delayer_single_pass=Never(),
                                                   running_batch=full) == ("sglang", full)
    assert prefill_delayer_early.ask_delayer_first(sglangs, SimpleNamespace(**base), prefill_delayer_single_pass=None,
                                                   running_batch=running) == ("sglang", running)


APPLIED_SCRIPT = r"""
from sglang.srt.managers import prefill_delayer as pdm
from sglang.srt.managers import scheduler as sm
SGLANGS = [sm.Scheduler._get_new_batch_prefill_raw, pdm.PrefillDelayer._gather_info,
           pdm.PrefillDelayer._negotiate_should_allow_prefill]
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()  # the entry point, as a server process runs it
HookRegistry.apply_hooks()
print("WRAPPED", sm.Scheduler._get_new_batch_prefill_raw is not SGLANGS[0], pdm.PrefillDelayer._gather_info is not SGLANGS[1],
      pdm.PrefillDelayer._negotiate_should_allow_prefill is not SGLANGS[2])
"""


def test_the_plugin_wraps_sglangs_scheduler_and_delayer():
    """The three delayer hooks resolve their targets in SGLang 0.5.17 and are applied for every launch (the entry
    point)."""
    out = subprocess.run([sys.executable, "-c", APPLIED_SCRIPT], capture_output=True, text=True, timeout=600)
    assert "WRAPPED True True True" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
