"""Serving benchmark: no speculation, NEXTN chain, NEXTN tree (topk 2 / 4) and LUMOTREE at the same
tree shapes, batch 1-64, one Qwen3.5-shaped model (GPU machine).

    python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-8l --out benchmark/results/bench_spec_h200.json

The model is a Qwen3.5-27B-shaped hybrid cut to a few layers (GDN Hk=16, Hv=48, K=V=128; gated
attention every 4th layer; one MTP layer) with dummy weights (``--load-format dummy``), or any
checkpoint given with ``--model`` (e.g. benchmark/models/tiny-hybrid, which accepts for real). For
each server configuration and batch size it sends ``batch`` requests of ``--input-len`` random
token ids at once (greedy, ``--output-len`` tokens, ``ignore_eos``) and records tokens/s, the mean
time per verify step (decode step without speculation), the accept length, and the speculative
memory SGLang logs at start-up.

Dummy weights accept almost nothing, so with a dummy model the spec rows measure the cost of a
verify step at acceptance ~1, not end-to-end speedups. ``--oracle-p P`` adds the clearly labelled
controlled-acceptance mode (``lumotree.sglang.oracle``, benchmark only): configurations
``ngram-oracle`` (SGLang's own hybrid path) and ``lumotree-oracle`` (LumoTree's) draft the same
fixed trees whose first branch carries the target's recorded greedy continuation token by token with
probability P, through SGLang's NGRAM loop; on the loop LUMOTREE and NEXTN users run, every MTP
configuration has an ``-oracle`` twin (``lumotree-topk2-oracle``, ``nextn-topk2-oracle``,
``nextn-chain-oracle``, ...; ``lumotree.sglang.draft_oracle``) whose MTP drafts are rewritten before
the verify so that the first-child chain carries the continuation with the same probability. Each
batch is sent twice and the second pass is measured (the first records the continuation). ``--miss``
adds, per batch and oracle configuration, a row of the same server with drafts that miss (prompts it
has never seen, so the MTP layer's own dummy-weight drafts are verified: ``accept_p`` 0). An
adaptive server (``lumotree-topk2-oracle``, ``nextn-chain-adaptive-oracle``; :func:`adapts`) would carry
what the first pass taught it (no acceptance: the continuation is not known yet) into the measured
one, so ``--oracle-warm-passes`` unmeasured passes at the controlled acceptance come between (default
3: its probes, backed off to every 256 steps and more, need them to see the acceptance);
``lumotree-topk2-fixed-oracle`` serves the tree on every step.

Shapes: Qwen3.5-27B's layers cut to 8 or 32 (one GPU), and ``qwen3-next-80b-moe-24l``, Qwen3-Next-80B-A3B's
MoE layers (512 experts, top 10, a shared expert) cut to 24, its own architecture, for ``--tp 2``
(``qwen3-next-80b-moe-12l``: the same layers cut to 12, for one GPU):

    python3 benchmark/serving/bench_spec.py --shape qwen3-next-80b-moe-24l --tp 2 --output-len 128 --oracle-p 0.8 \
        --miss --batches 1,8,32,64,128 --configs none,lumotree-chain-oracle,nextn-chain-replayssm-oracle --out ...

A table longer than one sitting: ``--resume`` keeps what an interrupted run of the same command finished
(configurations whose server wrote every row) and runs the rest, so the one command is repeated until it
prints the whole table (a longer ``--configs`` list grows the table by the new configurations):

    python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --output-len 128 --oracle-p 0.8 --miss \
        --batches 1,8,32,64,128 --configs none,lumotree-chain-oracle,nextn-chain-replayssm-oracle \
        --server-timeout 200 --out serving_speed.json --resume

Scheduler: ``--scheduler default`` runs every server as its flags alone make it (all with SGLang's overlap
scheduler; LumoTree's with the ``no_buffer`` state cache, ``lumotree.sglang.scheduling``); ``sync`` adds
``--disable-overlap-schedule`` to every one.

Prefill graphs: ``--prefill-graphs eager`` (the default here, as the tables in docs/ were made) starts every server
with ``--disable-piecewise-cuda-graph``, so prefills run eagerly; ``sglang`` gives no such flag: SGLang's default
prefill CUDA graphs (breakable graphs on CUDA; for both shapes by SGLang's argument rules), what a user runs. Every
server of a run, no speculation too, prefills the same way; rows and the result say which.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import vcpu_follow  # noqa: E402
from parity import memory_report  # noqa: E402
from sglang_server import (DECODE_LINE, accept_stats, jit_cache_env, jit_compiles, generate, host_speed,  # noqa: E402
                           log_health, machine, machines_note, post, sglang_server, stall_dumps, step_timing,
                           step_totals, stop_profile)

SHAPES = {  # Qwen3.5-27B's per-layer shapes, fewer layers (dummy weights)
    "qwen3.5-27b-8l": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=8, num_attention_heads=24,
                           num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48,
                           linear_key_head_dim=128, linear_value_head_dim=128),
    # 24 GDN + 8 attention layers: the GDN share of a step closer to the real model's (48 of 64)
    "qwen3.5-27b-32l": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=32, num_attention_heads=24,
                            num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48,
                            linear_key_head_dim=128, linear_value_head_dim=128),
    "qwen3-next-80b-shape-8l": dict(hidden_size=2048, intermediate_size=5120, num_hidden_layers=8,
                                    num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                                    linear_value_head_dim=128),
}
# Qwen3-Next-80B-A3B's per-layer config (its MoE: 512 experts, top 10, a shared expert), its own architecture,
# cut to 24 layers (18 GDN + 6 attention; ~82 GB of bf16 weights with the MTP layer: served with --tp 2) or to 12
# (9 GDN + 3 attention; ~44 GB: one GPU, where no two-GPU machine is lent -- the same MoE verify, per layer)
_NEXT_MOE = dict(hidden_size=2048, intermediate_size=5120, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                 linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                 num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                 shared_expert_intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
MOE_SHAPES = {
    "qwen3-next-80b-moe-24l": dict(_NEXT_MOE, num_hidden_layers=24),
    "qwen3-next-80b-moe-12l": dict(_NEXT_MOE, num_hidden_layers=12),
}
SHAPES.update(MOE_SHAPES)


def spec(algo, steps, topk, n):
    return ["--speculative-algorithm", algo, "--speculative-num-steps", str(steps), "--speculative-eagle-topk",
            str(topk), "--speculative-num-draft-tokens", str(n)]


ORACLE_TREE = ["--speculative-num-steps", "3", "--speculative-ngram-max-bfs-breadth", "2",
               "--speculative-num-draft-tokens", "6"]
CONFIGS = {
    "ngram-oracle": ["--speculative-algorithm", "NGRAM_ORACLE", *ORACLE_TREE],
    "lumotree-oracle": ["--speculative-algorithm", "LUMOTREE_ORACLE", *ORACLE_TREE],
    "none": [],
    "nextn-chain": spec("NEXTN", 3, 1, 4),
    "lumotree-chain": spec("LUMOTREE", 3, 1, 4),
    "nextn-topk2": spec("NEXTN", 3, 2, 6),
    "lumotree-topk2": spec("LUMOTREE", 3, 2, 6),
    "nextn-topk4": spec("NEXTN", 3, 4, 8),
    "lumotree-topk4": spec("LUMOTREE", 3, 4, 8),
    # SGLang's other speculative paths for hybrid models: its replay commit for chains, its adaptive chain
    # (steps 0-7 per batch, from its default per-batch config), its model-free n-gram drafter
    "nextn-chain-replayssm": spec("NEXTN", 3, 1, 4) + ["--enable-linear-replayssm-spec"],
    "nextn-chain-adaptive": spec("NEXTN", 3, 1, 4) + ["--speculative-adaptive"],
    # the same with SGLang's default per-batch config less its 7-step candidate at batch 1 (with it, the server did
    # not start at the 27B shapes: an illegal memory access capturing the 7-step draft-extend graph, H200)
    "nextn-chain-adaptive3": spec("NEXTN", 3, 1, 4) + [
        "--speculative-adaptive", "--speculative-adaptive-config", os.path.join(HERE, "sglang_adaptive_3step.json")],
    "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"],
    # LUMOTREE is adaptive by default (the tree or no draft, per step); this serves the tree on every step
    "none-sync": ["--disable-overlap-schedule"],  # no speculation under the synchronous scheduler
    "lumotree-topk2-sync": spec("LUMOTREE", 3, 2, 6) + ["--disable-overlap-schedule"],  # what overlap gains
    "lumotree-topk2-fixed": spec("LUMOTREE", 3, 2, 6) + [
        "--speculative-adaptive-config", os.path.join(HERE, "fixed_tree.json")],
    "lumotree-chain-fixed": spec("LUMOTREE", 3, 1, 4) + [
        "--speculative-adaptive-config", os.path.join(HERE, "fixed_tree.json")],
    # LUMOTREE's chain choosing its depth too (no draft, 1, 2 or 3 draft steps per decode step; opt-in)
    "lumotree-chain-depths": spec("LUMOTREE", 3, 1, 4) + [
        "--speculative-adaptive-config", os.path.join(HERE, "chain_depths.json")],
    # the same with a one-step chain as its only shallower depth (no draft, 1 or 3 draft steps)
    "lumotree-chain-depth1": spec("LUMOTREE", 3, 1, 4) + [
        "--speculative-adaptive-config", os.path.join(HERE, "chain_depth1.json")],
}


# variants of a configuration that differ only in LumoTree's server environment
CONFIG_ENV = {
    # SGLang's own greedy acceptance instead of LumoTree's selection op (what the selection costs a step)
    "lumotree-topk2-sgselect": ("lumotree-topk2", {"LUMOTREE_SGLANG_SELECT": "0"}),
}
for _name, (_base, _env) in CONFIG_ENV.items():
    CONFIGS[_name] = CONFIGS[_base]
# controlled acceptance on the MTP draft loop (lumotree.sglang.draft_oracle): each MTP configuration's twin
NGRAM_ORACLES = ("ngram-oracle", "lumotree-oracle")
for _base in [c for c in CONFIGS if c.startswith(("lumotree-topk", "lumotree-chain", "nextn-"))
              and not c.endswith(("-sgselect", "-sync"))]:
    CONFIGS[_base + "-oracle"] = CONFIGS[_base]


# --diagnose: a server's stall dump (lumotree.sglang.stall_dump) and torch.compile's compile log
DIAGNOSE_ENV = {"LUMOTREE_BENCH_STALL_DUMP_S": "2", "TORCH_LOGS": "dynamo,recompiles"}


def config_env(name: str) -> dict:
    """LumoTree's server environment of a configuration (its ``-oracle`` twin's too)."""
    return dict(CONFIG_ENV.get(name, CONFIG_ENV.get(name.removesuffix("-oracle"), (None, {})))[1])


def adapts(name: str) -> bool:
    """Whether the configuration's server picks its tree size from measured acceptance: LUMOTREE's MTP
    configurations (adaptive by default) but the fixed-tree ones (a config of one candidate), and SGLang's
    ``--speculative-adaptive``."""
    args = CONFIGS[name]
    if "LUMOTREE" in args:
        if "--speculative-adaptive-config" not in args:
            return True
        with open(args[args.index("--speculative-adaptive-config") + 1]) as f:
            return len(json.load(f).get("candidate_steps", [])) > 1
    return "--speculative-adaptive" in args


def write_config(out, shape):
    """A dummy-weight checkpoint directory (config only) of the given shape: a Qwen3.5 text model, or for
    ``MOE_SHAPES`` a Qwen3-Next MoE model."""
    os.makedirs(out, exist_ok=True)
    c = dict(SHAPES[shape])
    L = c["num_hidden_layers"]
    c.update(vocab_size=151936, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
             attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False, full_attention_interval=4,
             linear_conv_kernel_dim=4, mtp_num_hidden_layers=1, torch_dtype="bfloat16", bos_token_id=151643,
             eos_token_id=151645, use_cache=True)
    if shape in MOE_SHAPES:  # Qwen3-Next's own config class: layer pattern from full_attention_interval
        c.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", rope_theta=10000000,
                 partial_rotary_factor=0.25)
    else:
        c.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", attn_output_gate=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                  "mrope_interleaved": True, "mrope_section": [11, 11, 10]},
                 layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
                 num_nextn_predict_layers=1)
    json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump({"bos_token_id": 151643, "eos_token_id": 151645}, open(os.path.join(out, "generation_config.json"), "w"))
    return out



def logged_decode(log, batch, start=0):
    """The server's own decode throughput (SGLang logs it every 40 decode steps) while exactly
    ``batch`` requests ran, from byte ``start`` of its log on: ``(best, median, all)`` of its
    intervals (``None`` when there is none). Free of prefill and of the client. The first interval
    after an idle server also counts the idle time, so the median, not the mean, is robust."""
    try:
        with open(log, errors="replace") as f:
            f.seek(start)
            text = f.read()
    except OSError:
        return None, None, []
    vals = [float(m.group(3)) for m in DECODE_LINE.finditer(text) if int(m.group(1)) == batch]
    if not vals:
        return None, None, []
    srt = sorted(vals)
    return max(vals), srt[len(srt) // 2], vals


def logged_running(log, start=0):
    """``(most requests seen running, best logged decode tokens/s at that count)`` from byte
    ``start`` on: when the server caps the running requests below the batch (SGLang limits them to
    the GDN state slots it could allocate -- the slots per-node snapshots take away), no interval
    has ``batch`` running and :func:`logged_decode` finds none; this says what did run."""
    try:
        with open(log, errors="replace") as f:
            f.seek(start)
            text = f.read()
    except OSError:
        return None, None
    seen = [(int(m.group(1)), float(m.group(3))) for m in DECODE_LINE.finditer(text)]
    if not seen:
        return None, None
    most = max(n for n, _ in seen)
    return most, max(v for n, v in seen if n == most)


def log_size(log):
    try:
        return os.path.getsize(log)
    except OSError:
        return 0


def profile_pass(url, batch, args, key, tag, prefill_s, step_s=None):
    """One more pass of the batch under SGLang's torch profiler (``/start_profile``, stopped by the
    server after ``--profile-steps`` forward steps); the trace lands in ``--profile-dir/tag``. The
    profiler starts ``prefill_s`` plus ``PROFILE_LEAD_STEPS`` of the measured pass's client steps (``step_s``;
    without it 0.3 s) after the requests are sent, so its window holds decode steps only -- a window opening
    with the batch's prefill is dominated by it (32 x 256 tokens: ~0.3 s of GPU time against ~10 ms per decode
    step). Why steps: a fixed 0.3 s outlasted whole passes at batch 1 of the MoE shape (128 steps of ~2 ms), and
    those traces held only the scheduler's idle loop."""
    import threading

    out = os.path.abspath(os.path.join(args.profile_dir, tag))
    os.makedirs(out, exist_ok=True)
    worker = threading.Thread(target=generate, args=(url, batch, args.output_len), kwargs=dict(key=key))
    worker.start()
    time.sleep(prefill_s + (PROFILE_LEAD_STEPS * step_s if step_s else 0.3))
    post(url + "/start_profile", dict(output_dir=out, num_steps=args.profile_steps, activities=["CPU", "GPU"],
                                      with_stack=not args.profile_no_stack, profile_prefix=tag))
    worker.join()
    stop_profile(url, post)  # a pass shorter than --profile-steps would leave no trace
    return out


PROFILE_LEAD_STEPS = 4  # decode steps of a profiled pass before its profiler starts (profile_pass)


def profile_prefill_pass(url, batch, args, key, tag):
    """One-token passes of the batch (its prefill and what a speculative server runs with it: the MTP
    draft-extend over the prompt, the first draft) under SGLang's torch profiler, started before the
    requests and stopped by the server after ``--profile-prefill-steps`` forward steps; two passes are sent
    so that the count is reached whatever a pass holds -- on fresh prompts the first prefills them whole and the
    second resumes them from what the first left in the radix cache. The trace lands in ``--profile-dir/tag``."""
    out = os.path.abspath(os.path.join(args.profile_dir, tag))
    os.makedirs(out, exist_ok=True)
    post(url + "/start_profile", dict(output_dir=out, num_steps=args.profile_prefill_steps, activities=["CPU", "GPU"],
                                      with_stack=not args.profile_no_stack, profile_prefix=tag))
    time.sleep(0.2)
    for _ in range(2):
        generate(url, batch, 1, key=key)
    stop_profile(url, post)
    return out


ADAPTIVE_LINE = re.compile(r"LumoTree adaptive: batch bucket (\d+) -> (no draft|(\d+)-step tree) \(([^;]*); accept ([\d.]+)\)"
                           r"( after a probe)?")


def adaptive_decisions(log):
    """The adaptive tree size's decisions a LUMOTREE server logged, in order: per batch bucket the
    choice (draft steps, 0 = none), its rate estimate per candidate (tokens/s) and the acceptance then --
    the step-cost model the server measured while serving; ``probe``: the decision right after a probe run
    (logged whether or not it changed the choice)."""
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    out = []
    for m in ADAPTIVE_LINE.finditer(text):
        rates = {int(c): float(r) for c, r in re.findall(r"(\d+): ([\d.]+) tok/s", m.group(4))}
        out.append(dict(bucket=int(m.group(1)), steps=0 if m.group(3) is None else int(m.group(3)),
                        tokens_per_s=rates, accept=float(m.group(5)), probe=m.group(6) is not None))
    return out


def state_slots(memory_log):
    """Request-state slots SGLang's memory solver gave the GDN state pool (``max_mamba_cache_size``):
    what the speculative buffers leave for requests at the same ``--mem-fraction-static``."""
    for line in memory_log:
        m = re.search(r"max_mamba_cache_size: (\d+)", line)
        if m:
            return int(m.group(1))
    return None


def merge(files, out):
    """One result from several runs (e.g. one per GPU lane); rows keep their run's command."""
    res = dict(merged=files, commands=[], rows=[], servers={})
    for f in files:
        part = json.load(open(f))
        if "command" in part:
            res["commands"].append(part["command"])
        else:  # an earlier merge: its rows carry their commands
            res["commands"] += part["commands"]
        for key in ("model", "shape", "input_len", "output_len"):
            res.setdefault(key, part.get(key))
        res["rows"] += [dict(r, command=r.get("command", part.get("command")),
                             output_len=r.get("output_len", part.get("output_len"))) for r in part["rows"]]
        res["servers"].update(part["servers"])
    json.dump(res, open(out, "w"), indent=1)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--merge", nargs="+", help="combine result JSONs into --out and print the table")
    ap.add_argument("--shape", default="qwen3.5-27b-8l", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="a real checkpoint instead of the dummy shape")
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="none,nextn-chain,nextn-topk2,lumotree-topk2,nextn-topk4,lumotree-topk4")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--server-timeout", type=int, default=400)
    ap.add_argument("--jit-cache", choices=("fresh", "shared"), default="fresh",
                    help="fresh: each server compiles into its own empty just-in-time caches (Triton, inductor, "
                         "flashinfer, tvm-ffi, torch extensions, the driver's PTX cache), so every ready_s is a "
                         "first start (servers run one after the other would otherwise reuse what earlier ones "
                         "compiled); shared: the machine's caches")
    ap.add_argument("--oracle-p", type=float, default=None, help="controlled acceptance (oracle configs)")
    ap.add_argument("--oracle-warm-passes", type=int, default=3,
                    help="adaptive oracle configurations: unmeasured passes at the controlled acceptance after the "
                         "recording pass, so that the server has seen the acceptance before the measured one (the "
                         "other oracle configurations get one, for what a first pass that accepts compiles)")
    ap.add_argument("--miss-warm-passes", type=int, default=None,
                    help="--miss rows of adaptive servers: unmeasured passes whose drafts miss before the measured "
                         "one (default: --oracle-warm-passes; other servers: one). More of them measure the steady "
                         "state -- the tree probes back off as they keep confirming no draft -- rather than the "
                         "passes right after the acceptance fell")
    ap.add_argument("--tp", type=int, default=1, help="--tp-size of every server (rows record it)")
    ap.add_argument("--miss", action="store_true",
                    help="after each batch's row, a row of the same server on fresh prompts (FreshPrompts: the same for "
                         "every server): oracle configurations' drafts then miss (accept_p 0); no speculation's row is "
                         "what they are compared with")
    ap.add_argument("--prefill-samples", type=int, default=3,
                    help="one-token passes of the batch before each measured pass; the row's prefill_seconds is "
                         "their median (single ones varied by ~30 ms at batch 1)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="measured passes per row (each after its own prefill samples); the row is the pass of median "
                         "client tokens/s, every pass's figures under its 'repeats' (a row without 'median_of' is one "
                         "pass). Why: batch-1 passes of one server moved 0.75-1.05x no speculation from one pass or "
                         "invocation to the next (host-bound steps, MoE shape, H100)")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--running-cap", choices=("flags", "batches"), default="flags",
                    help="flags: no --max-running-requests, each server its own default (no speculation: memory's; "
                         "SGLang's speculative servers: 48; LUMOTREE: 256, memory permitting), what a user "
                         "gets; batches: --max-running-requests the largest of --batches for every server")
    ap.add_argument("--mem-fraction-static", type=float, default=0.7,
                    help="SGLang's static memory share (the suite runs the tiny model at 0.3; at 0.7 its servers "
                         "were once killed with -9, cause not established)")
    ap.add_argument("--profile-dir", default=None,
                    help="after the measured pass, profile --profile-steps steps (torch profiler, CPU+GPU) at the "
                         "batch sizes in --profile-batches; summarise with profile_summary.py")
    ap.add_argument("--prefill-graphs", choices=("eager", "sglang"), default="eager",
                    help="eager: every server prefills eagerly (--disable-piecewise-cuda-graph, as the tables in docs/ "
                         "were made); sglang: SGLang's default prefill CUDA graphs (breakable graphs on CUDA for both "
                         "shapes), what a user who gives no such flag runs")
    ap.add_argument("--scheduler", choices=("default", "sync"), default="default",
                    help="default: each server as its flags alone make it (what a user gets); sync: "
                         "--disable-overlap-schedule for every configuration")
    ap.add_argument("--profile-batches", default="1,8")
    ap.add_argument("--profile-steps", type=int, default=30, help="0: no decode profiles (with --profile-prefill: the prefill's alone)")
    ap.add_argument("--profile-prefill", nargs="?", const="known", choices=("known", "fresh"), default=None,
                    help="also profile one-token passes (the prefill) at --profile-batches, after the decode profiles: "
                         "of the batch's known prompts (the default), or of fresh ones (with --miss)")
    ap.add_argument("--profile-prefill-steps", type=int, default=2)
    ap.add_argument("--profile-no-stack", action="store_true",
                    help="profiles without Python stacks: the host runs at its own speed (with stacks about threefold "
                         "slower), for a timeline of when each launch reaches the device (profile_summary.py --gaps)")
    ap.add_argument("--jit-log", action="store_true",
                    help="every server logs each Triton compile or cache load (LUMOTREE_BENCH_JIT_LOG=1, benchmark "
                         "only); each row records those inside its measured pass (jit: count, ms, kernels) -- what "
                         "a step met for the first time while it was timed")
    ap.add_argument("--step-timing", action="store_true",
                    help="every server times its decode steps by parts on the scheduler's thread "
                         "(LUMOTREE_BENCH_STEP_TIMING=1, lumotree.sglang.step_timing, benchmark only), recorded per "
                         "server and batch bucket (step_timing): where a step's milliseconds go; and per row the "
                         "server's time totals over its phase (step_totals: from its warm passes to its last measured "
                         "pass, all decode intervals, split into the timed sections). Its hooks cost host "
                         "time: such rows are not the flags-alone rows")
    ap.add_argument("--diagnose", default="",
                    help="comma-separated configurations whose servers also dump their threads' stacks when a "
                         "scheduler call runs over 2 s (LUMOTREE_BENCH_STALL_DUMP_S=2, lumotree.sglang.stall_dump) "
                         "and log torch.compile's compiles and recompiles (TORCH_LOGS=dynamo,recompiles): where a "
                         "stall with no Triton compile goes. Their rows say so (diagnosed)")
    ap.add_argument("--time-stats", action="store_true",
                    help="every server with --enable-metrics (SGLang's per-request time stats; a diagnostic, not "
                         "the flags-alone mode): each prefill sample records where its one-token requests' time went "
                         "(prefill_parts, ms: queued, formed into a batch to its result processed, result to the "
                         "tokenizer's reply; medians over the sample's requests)")
    ap.add_argument("--vcpu-probe", action="store_true",
                    help="time the vCPU under the live scheduler beside the passes (vcpu_follow.py, ~0.2 %% of that "
                         "vCPU): each pass records the probe's median (vcpu_probe_ms) and the table counts the passes "
                         "that ran in a slow spell of the machine's vCPUs, with the ratio of the pairs outside them")
    ap.add_argument("--resume", action="store_true",
                    help="--out holds an earlier, interrupted run of the same command (its --configs may differ): "
                         "keep its configurations that finished (a server and every row) and are named again, run the "
                         "others (so that one command can be spread over calls shorter than the whole table); "
                         "those of another machine run again")
    args = ap.parse_args()
    if args.miss and args.model:
        ap.error("--miss draws token-id prompts: it needs --shape, not --model")
    if args.merge:
        res = merge(args.merge, args.out)
        print(table(res["rows"], memory=res["servers"]))
        return
    if args.profile_prefill == "fresh" and (not args.miss or args.model):
        ap.error("--profile-prefill fresh profiles the fresh prompts' phase: it needs --miss (and a dummy shape)")
    batches = [int(b) for b in args.batches.split(",")]
    diagnosed = set(n for n in args.diagnose.split(",") if n)
    unknown = sorted(diagnosed - set(args.configs.split(",")))
    if unknown:
        ap.error(f"--diagnose names configurations that --configs does not: {unknown}")
    if args.model:
        model, extra = args.model, []
    else:
        model = write_config(os.path.join(args.log_dir, "dummy-" + args.shape), args.shape)
        extra = ["--load-format", "dummy", "--skip-tokenizer-init"]
    base = ["--attention-backend", "triton", *prefill_graph_args(args.prefill_graphs),
            "--cuda-graph-max-bs", str(max(batches)), "--mem-fraction-static", str(args.mem_fraction_static),
            "--log-level", "info"]
    base += ["--max-running-requests", str(max(batches))] if args.running_cap == "batches" else []
    base += ["--tp-size", str(args.tp)] if args.tp > 1 else []
    base += ["--enable-metrics"] if args.time_stats else []
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(args.input_len)] for _ in range(max(batches))]
    res = dict(command="python3 " + " ".join(sys.argv), model=model, shape=None if args.model else SHAPES[args.shape],
               input_len=args.input_len, output_len=args.output_len, scheduler=args.scheduler, tp=args.tp,
               prefill_graphs=args.prefill_graphs, rows=[], servers={})
    if args.scheduler == "sync":
        base.append("--disable-overlap-schedule")
    done = resumed(res, args, batches) if args.resume else set()
    probe = None
    if args.vcpu_probe:
        args.vcpu_log = os.path.join(args.log_dir, "vcpu-follow.log")
        probe = vcpu_follow.start(args.vcpu_log, loop=3000)
        res["vcpu_probe"] = dict(loop=3000, period_s=0.1, spell=vcpu_follow.SPELL)
    try:
        run_configs(args, res, done, model, extra, base, batches, prompts, diagnosed)
    finally:
        if probe is not None:
            probe.terminate()
    print(table(res["rows"], memory=res["servers"]))
    for line in prefill_parts_lines(res["rows"]):
        print(line)


def run_configs(args, res, done, model, extra, base, batches, prompts, diagnosed):
    """Each configuration's server in turn: its rows and its server entry into ``res`` (written to ``--out`` as they
    come)."""
    for name in args.configs.split(","):
        if name in done:
            print(f"{name}: kept from {args.out}", flush=True)
            continue
        log = os.path.join(args.log_dir, f"bench-{name}.log")
        srv = dict(args=CONFIGS[name], host=host_speed())  # before the server starts (sglang_server.host_speed)
        t0 = time.time()
        oracle = name.endswith("-oracle")
        if oracle and args.oracle_p is None:
            raise SystemExit(f"{name} needs --oracle-p")
        oracle_env = "LUMOTREE_BENCH_ORACLE_P" if name in NGRAM_ORACLES else "LUMOTREE_BENCH_DRAFT_ORACLE_P"
        env = {oracle_env: str(args.oracle_p)} if oracle else {}
        env.update(config_env(name))
        if args.jit_log:
            env["LUMOTREE_BENCH_JIT_LOG"] = "1"
        if args.step_timing:
            env["LUMOTREE_BENCH_STEP_TIMING"] = "1"
        if name in diagnosed:
            env.update(DIAGNOSE_ENV)
        srv["env"] = env
        srv["jit_cache"] = args.jit_cache
        srv["machine"] = machine()
        try:
            with jit_cache_env(args.jit_cache, env) as env_s, \
                    sglang_server(model, CONFIGS[name] + extra, port=args.port, log=log, timeout=args.server_timeout,
                                  base_args=base, env=env_s) as url:
                srv["ready_s"] = round(time.time() - t0, 1)
                key = "text" if args.model else "input_ids"
                generate(url, [prompts[0]] if not args.model else ["def f(x):"], 16, key=key)  # warm-up
                for bs in batches:
                    batch = prompts[:bs] if not args.model else [f"# request {i}\ndef f{i}(x):" for i in range(bs)]
                    # an unmeasured pass first: it compiles what this batch size needs (Triton JIT of
                    # non-graph kernels; seen costing seconds at a new size) and, for the oracle
                    # configurations, records the greedy continuation the measured pass drafts from
                    generate(url, batch, args.output_len, key=key)
                    # unmeasured passes at the phase's acceptance: an adaptive server's --oracle-warm-passes (it must
                    # see the acceptance), one for the others -- the recording pass accepted nothing, and with fresh
                    # compile caches a first pass that accepts may still compile (SGLang's chain once measured a pass
                    # at batch 8 whose requests finished 0.58-0.99 s in, LUMOTREE's 0.56-0.66 s; 27B shapes, H200)
                    warm = (args.oracle_warm_passes if adapts(name) else 1) if oracle else 0
                    phases = [(args.oracle_p if oracle else None, "known", lambda: batch, lambda: batch)]
                    if args.miss and not args.model:  # prompts never seen (oracles: drafts that miss), every server
                        phases.append((0.0 if oracle else None, "fresh", FreshPrompts(bs, args.input_len, "warm"),
                                       FreshPrompts(bs, args.input_len, "measured")))
                    measured_rows = []
                    miss_warm = warm if args.miss_warm_passes is None or not adapts(name) else args.miss_warm_passes
                    for phase, (accept_p, kind, warm_prompts, prompts_of) in enumerate(phases):
                        t_phase = time.time()
                        for _ in range(warm if phase == 0 else miss_warm):
                            generate(url, warm_prompts(), args.output_len, key=key)
                        row = measure_repeats(url, prompts_of, args, key, log)
                        if args.step_timing:  # (the totals are logged at most once a second)
                            time.sleep(1.2)
                            row["step_totals"] = step_totals(log, {"phase": (t_phase, time.time())}).get("phase")
                        row.update(config=name, shape=None if args.model else args.shape, tp=args.tp, batch=bs,
                                   accept_p=accept_p, prompts=kind, scheduler=args.scheduler,
                                   prefill_graphs=args.prefill_graphs,
                                   step_timing=bool(args.step_timing), diagnosed=name in diagnosed)
                        why = suspect(row)
                        if why:
                            row["suspect"] = why
                            print(f"SUSPECT {name} batch {bs}: {why}", file=sys.stderr, flush=True)
                        res["rows"].append(row)
                        measured_rows.append((row, prompts_of))
                        print(json.dumps(row), flush=True)
                        json.dump(res, open(args.out, "w"), indent=1)
                    # profiles after every measured phase of the batch: a profiled pass's steps are slow (the
                    # profiler's host time), and an adaptive server's step-time samples take them in -- a
                    # phase measured after one was seen serving its slower candidate throughout
                    if args.profile_dir and bs in [int(x) for x in args.profile_batches.split(",")]:
                        for row, prompts_of in (measured_rows if args.profile_steps > 0 else ()):
                            tag = f"{name}-bs{bs}" + ("-miss" if row["prompts"] == "fresh" else "")
                            step_s = row["step_ms"] / 1e3 if row.get("step_ms") else None
                            row["profile"] = profile_pass(url, prompts_of(), args, key, tag, row["prefill_seconds"],
                                                          step_s)
                        if args.profile_prefill:  # the phase's prompts (known: a known prompt for oracles too)
                            row, prompts_of = next((r, p) for r, p in measured_rows
                                                   if r["prompts"] == args.profile_prefill)
                            tag = f"{name}-bs{bs}-prefill" + ("-miss" if args.profile_prefill == "fresh" else "")
                            row["profile_prefill"] = profile_prefill_pass(url, prompts_of(), args, key, tag)
                        json.dump(res, open(args.out, "w"), indent=1)
        except Exception as e:
            srv["error"] = repr(e)[:2000]
        srv.update(memory_report(log), **log_health(log))
        if args.step_timing:
            srv["step_timing"] = step_timing(log)
        if name in diagnosed:
            srv["stalls"] = stall_dumps(log)
        srv["state_slots"] = state_slots(srv.get("memory_log", []))
        srv["adaptive"] = adaptive_decisions(log)
        res["servers"][label(name, args.scheduler)] = srv
        print(json.dumps({name: srv})[:2000], flush=True)
        json.dump(res, open(args.out, "w"), indent=1)


def prefill_graph_args(mode: str) -> list:
    """Every server's prefill-graph flags: ``eager`` turns SGLang's prefill CUDA graphs off
    (``--disable-piecewise-cuda-graph``), ``sglang`` gives none (SGLang's default)."""
    if mode not in ("eager", "sglang"):
        raise ValueError(f"prefill graphs: 'eager' or 'sglang', not {mode!r}")
    return ["--disable-piecewise-cuda-graph"] if mode == "eager" else []


def phases_of(name, args):
    """The ``(accept_p, prompts)`` of the rows a configuration's server makes per batch."""
    oracle = name.endswith("-oracle")
    return [(args.oracle_p if oracle else None, "known")] + (
        [(0.0 if oracle else None, "fresh")] if args.miss and not args.model else [])


def row_prompts(row) -> str:
    """A row's prompts: ``known`` (the batch's, repeated) or ``fresh`` (:class:`FreshPrompts`); rows written before
    the field: fresh where drafts missed."""
    return row.get("prompts") or ("fresh" if row.get("accept_p") == 0.0 else "known")


def resumed(res, args, batches) -> set:
    """``--resume``: the configurations of ``args.out`` (an earlier run of the same command) that finished --
    their server without an error and a row for every batch and phase, on this machine
    (:func:`sglang_server.kept_on`) -- copied into ``res``; the rows of the others are dropped (they run again).
    Another command's file is refused."""
    from sglang_server import earlier_run, kept_on

    old = earlier_run(args.out, res["command"])
    if old is None:
        return set()
    done, here = set(), machine()
    for name in args.configs.split(","):
        srv = old.get("servers", {}).get(label(name, args.scheduler))
        rows = [r for r in old.get("rows", []) if r.get("config") == name]
        want = {(b, p) for b in batches for p in phases_of(name, args)}
        if (srv is not None and "error" not in srv and {(r["batch"], (r["accept_p"], row_prompts(r))) for r in rows} >= want
                and kept_on(srv, name, here)):
            done.add(name)
            res["rows"] += rows
            res["servers"][label(name, args.scheduler)] = srv
    return done


class FreshPrompts:
    """Each call: ``n`` random prompts of ``length`` token ids that no server has seen (the draft oracle has no
    continuation for them, so the MTP layer's own drafts are verified; dummy weights: they miss), the ``i``-th call's
    drawn from its own seed -- ``(n, length, kind, i)`` --, so every server of a run meets the same ones whatever ran
    before it. Why: the MoE shape's step time depends on the tokens (the experts they route to): no speculation's
    pass on its known prompts against LUMOTREE's on fresh ones differed by 130 us of ``fused_moe_kernel`` per decode
    step at batch 8 (one H100, torch profiles), as much as the rows' whole gap; so with ``--miss`` every server,
    no speculation too, also runs the measured passes' fresh prompts."""

    def __init__(self, n: int, length: int, kind: str):
        self.n, self.length, self.kind, self.i = n, length, kind, 0

    def __call__(self):
        rng = random.Random(f"fresh {self.n} {self.length} {self.kind} {self.i}")
        self.i += 1
        return [[rng.randrange(1000, 100000) for _ in range(self.length)] for _ in range(self.n)]


def measure(url, batch, args, key, log):
    """The batch's prefill (one token) alone, then the measured pass of ``--output-len`` tokens: the
    row's timings, acceptance and the server's own decode throughput over that pass."""
    bs = len(batch)
    samples, parts = [], []
    for _ in range(max(1, args.prefill_samples)):  # prefill (+ one token) alone; the median of a few
        t1 = time.time()
        outs = generate(url, batch, 1, key=key)
        samples.append(time.time() - t1)
        if getattr(args, "time_stats", False):
            parts.append(prefill_parts(outs))
    prefill = statistics.median(samples)
    t1 = time.time()
    at = log_size(log)
    outs = generate(url, batch, args.output_len, key=key)
    wall = time.time() - t1
    time.sleep(0.5)  # the log line of the last interval
    st = accept_stats(outs)
    steps = (st["verify_steps"] / bs) if st["verify_steps"] else args.output_len
    row = dict(started_at=round(t1, 3), seconds=round(wall, 3), prefill_seconds=round(prefill, 3),
               prefill_samples=[round(x, 4) for x in samples], tokens_per_s=st["completion_tokens"] / wall,
               step_ms=1000 * wall / steps, decode_step_ms=1000 * max(wall - prefill, 0.0) / steps,
               decode_tokens_per_s=st["completion_tokens"] / max(wall - prefill, 1e-9),
               accept_length=st["accept_length"])
    row.update(request_spread(outs, wall))
    if parts:
        row["prefill_parts"] = parts
    row["output_digests"] = output_digests(outs)
    row["first_output_ids"] = [int(t) for t in outs[0].get("output_ids", [])] if outs else []  # (first_difference)
    if getattr(args, "jit_log", False):  # the compiles the measured pass met (its window: send to answer)
        row["jit"] = jit_compiles(log, {"pass": (t1, t1 + wall)}).get("pass", dict(count=0, total_ms=0.0, kernels={}))
    if getattr(args, "vcpu_log", None):  # the vCPU under the scheduler during the pass (vcpu_follow)
        ms = vcpu_follow.window_ms(args.vcpu_log, t1, t1 + wall)
        row["vcpu_probe_ms"] = round(statistics.median(ms), 4) if ms else None
    best, med, vals = logged_decode(log, bs, at)  # the measured pass only
    most, at_most = logged_running(log, at)
    row.update(logged_decode_tokens_per_s=best, logged_decode_median_tokens_per_s=med,
               logged_decode_intervals=vals, logged_max_running=most, logged_decode_at_max_running=at_most)
    return row


# SGLang's per-request time stats in ``meta_info`` with --enable-metrics (realtime seconds): the tokenizer's receipt, the
# scheduler's forming of the request's prefill batch (``forward_entry_time``), its processing of the prefill's result
# (``prefill_finished_time``) and the tokenizer's receipt of the finished request
PREFILL_MARKS = ("request_received_ts", "forward_entry_time", "prefill_finished_time", "request_finished_ts")
PREFILL_PARTS = ("queued_ms", "batch_to_result_ms", "result_to_reply_ms")


def prefill_parts(outs) -> dict:
    """Where one-token requests' time went, from their ``meta_info`` time stats (:data:`PREFILL_MARKS`; a server
    with ``--enable-metrics``): ``queued_ms`` (received to formed into a prefill batch), ``batch_to_result_ms``
    (formed to its result processed: the batch's preparation and launch, the forward, and under the overlap
    scheduler whatever the scheduler launched before it processed the result), ``result_to_reply_ms`` (to the
    tokenizer's receipt of the finished request), and SGLang's ``e2e_ms``; medians over the requests that carry
    both marks of a part, ``None`` where none does (a server without the stats)."""
    def med(values):
        return round(1e3 * statistics.median(values), 3) if values else None

    spans = {k: [] for k in PREFILL_PARTS}
    e2e = []
    for o in outs:
        m = o.get("meta_info", {}) or {}
        t = [m.get(k) for k in PREFILL_MARKS]
        for name, a, b in zip(PREFILL_PARTS, t, t[1:]):
            if a and b:
                spans[name].append(float(b) - float(a))
        if m.get("e2e_latency") is not None:
            e2e.append(float(m["e2e_latency"]))
    return {**{k: med(v) for k, v in spans.items()}, "e2e_ms": med(e2e)}


def prefill_parts_lines(rows) -> list:
    """One line per row with ``--time-stats`` parts (:func:`prefill_parts`): each part's median over the median
    pass's prefill samples, ms."""
    out = []
    for r in rows:
        parts = r.get("prefill_parts")
        if not parts:
            continue
        cells = []
        for k in PREFILL_PARTS + ("e2e_ms",):
            v = [p[k] for p in parts if p.get(k) is not None]
            cells.append(f"{k[:-3].replace('_', ' ')} {statistics.median(v):.1f}" if v else f"{k[:-3].replace('_', ' ')} –")
        out.append(f"prefill parts, {r['config']} batch {r['batch']} ({r.get('prompts', 'known')}), ms: " + ", ".join(cells))
    return out


def measure_repeats(url, prompts_of, args, key, log):
    """``--repeats`` measured passes (:func:`measure`, each on ``prompts_of()``: the same prompts for a phase whose
    drafts are known, fresh ones where they should miss) and their row: :func:`median_pass`."""
    return median_pass([measure(url, prompts_of(), args, key, log) for _ in range(max(1, args.repeats))])


def median_pass(rows):
    """One row for passes ``rows`` (in run order): the pass of median client tokens/s (the lower of the two middle
    ones for an even count), whole -- its timings, acceptance and server log belong together -- with every pass's
    figures under ``repeats``, ``median_of`` (how many), ``picked`` (which) and ``tokens_per_s_range``."""
    if len(rows) == 1:
        return rows[0]
    order = sorted(range(len(rows)), key=lambda i: rows[i]["tokens_per_s"])
    pick = order[(len(rows) - 1) // 2]
    row = dict(rows[pick])
    row["repeats"] = [dict(tokens_per_s=round(r["tokens_per_s"], 1), step_ms=round(r["step_ms"], 3),
                           accept_length=r["accept_length"], logged_decode_tokens_per_s=r.get("logged_decode_tokens_per_s"),
                           seconds=r["seconds"], started_at=r.get("started_at"),
                           prefill_seconds=r.get("prefill_seconds"),
                           decode_tokens_per_s=r.get("decode_tokens_per_s"),
                           **{k: r[k] for k in ("output_digests", "first_output_ids", "jit", "vcpu_probe_ms")
                              if k in r}) for r in rows]
    row.update(median_of=len(rows), picked=pick,
               tokens_per_s_range=[round(rows[order[0]]["tokens_per_s"], 1), round(rows[order[-1]]["tokens_per_s"], 1)])
    return row


def output_digests(outs) -> list:
    """Each request's generated token ids as a short digest (in request order): two servers' passes on the same
    prompts generated the same tokens where their digests agree. Why: the MoE step's time follows the experts the
    tokens route to, so servers whose greedy tokens part (numerics of a cached prompt state, say) time other work."""
    import hashlib

    return [hashlib.sha1(json.dumps(o.get("output_ids", [])).encode()).hexdigest()[:10] for o in outs]


def paired_ratio(row, base):
    """``row``'s client tokens/s over ``base``'s, pass by pass: the median of the per-pass ratios where both rows
    kept their passes (``repeats``, equally many -- the i-th pass of every server runs the same prompts: the known
    ones, or :class:`FreshPrompts`'s i-th draw), else the two rows' own ratio. Why: the fresh prompts' passes differ
    by up to 4 % on one server (the MoE step follows the tokens' experts), and two servers' median passes need not be
    the same prompts; paired, the prompts drop out. Returns ``(ratio, the per-pass ratios or None)``."""
    a, b = row.get("repeats"), base.get("repeats")
    if a and b and len(a) == len(b):
        per = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(a, b)]
        return statistics.median(per), per
    return row["tokens_per_s"] / base["tokens_per_s"], None


def decode_ratio(row, base) -> Optional[float]:
    """``row``'s decode tokens/s over ``base``'s -- each pass's tokens over its wall time less its prefill samples'
    median (``decode_tokens_per_s``) --, pass by pass where both rows kept them (as :func:`paired_ratio`), else the
    two rows' own; ``None`` where either lacks them. Why: a pass re-sends prompts its server has just seen, and
    servers whose radix caches resume them at different tokens (LumoTree's prompt-interior states; SGLang's
    ``extra_buffer`` cache, every 256 tokens) spend different prefill times on them: the client ratio counts that,
    this one leaves it out."""
    a, b = row.get("repeats"), base.get("repeats")
    if a and b and len(a) == len(b) and all(r.get("decode_tokens_per_s") for r in a + b):
        return statistics.median(x["decode_tokens_per_s"] / y["decode_tokens_per_s"] for x, y in zip(a, b))
    if row.get("decode_tokens_per_s") and base.get("decode_tokens_per_s"):
        return row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return None


def same_tokens(row, base) -> Optional[float]:
    """The share of ``row``'s requests, over its passes, whose generated tokens equal ``base``'s on the same pass
    (:func:`output_digests`); ``None`` where either row has no digests."""
    a = [r.get("output_digests") for r in row.get("repeats", [row])]
    b = [r.get("output_digests") for r in base.get("repeats", [base])]
    if len(a) != len(b) or not all(a) or not all(b):
        return None
    pairs = [(x, y) for da, db in zip(a, b) for x, y in zip(da, db)]
    return sum(x == y for x, y in pairs) / len(pairs) if pairs else None


def first_difference(row, base) -> Optional[list]:
    """Per pass, the first token index at which ``row``'s first request generated another token than ``base``'s on the
    same pass (``first_output_ids``; ``None`` for a pass where the two agree, or where one is a prefix of the other
    at the shorter length), or ``None`` where either row lacks them. Why: two servers whose digests part on every
    request part somewhere -- at the first drafted step after a stretch of no-draft steps, at the prefill's token,
    or from the start -- and where tells which of them."""
    a = [r.get("first_output_ids") for r in row.get("repeats", [row])]
    b = [r.get("first_output_ids") for r in base.get("repeats", [base])]
    if len(a) != len(b) or any(x is None for x in a + b):
        return None
    return [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in zip(a, b)]


def request_spread(outs, wall):
    """How the measured pass's requests spread out: each request's verify steps and end-to-end latency
    (SGLang's ``meta_info``): the batch runs ``max_verify_steps`` steps, the last ones with fewer requests;
    ``wall / max_verify_steps`` is the mean step time of the whole pass, tail included."""
    steps = sorted(int(o["meta_info"].get("spec_verify_ct", 0) or 0) for o in outs)
    e2e = sorted(float(o["meta_info"]["e2e_latency"]) for o in outs if o["meta_info"].get("e2e_latency") is not None)
    out = dict(max_verify_steps=steps[-1] if steps else 0, min_verify_steps=steps[0] if steps else 0)
    if steps and steps[-1]:
        out["ms_per_batch_step"] = 1000 * wall / steps[-1]
    if e2e:
        out.update(e2e_min_s=round(e2e[0], 3), e2e_max_s=round(e2e[-1], 3))
    return out


MISS_ACCEPT_MAX = 1.3  # accept length above which a row whose drafts should miss is not believed


def suspect(row):
    """Why a row's acceptance cannot be right, or ``None``: a row whose drafts should miss (``accept_p``
    0, dummy-weight drafts) that accepted them anyway means the verify's outputs are degenerate (a constant
    token the dummy drafts also propose). Seen once: a verify attention kernel that passed its start-up
    check broke the outputs from batch 8 on, and its miss rows accepted 3.5-3.9 tokens per step."""
    acc = row.get("accept_length")
    if row.get("accept_p") == 0.0 and acc is not None and acc > MISS_ACCEPT_MAX:
        return (f"accept length {acc:.2f} with drafts that should miss (above {MISS_ACCEPT_MAX}): "
                "degenerate outputs?")
    return None


def label(config, scheduler):
    """A configuration's name in tables and the servers map: the scheduler is named unless the server ran
    with its flags alone (``default``)."""
    return config if scheduler in (None, "default") else f"{config} [{scheduler}]"


def spell_passes(row, base):
    """Which passes of ``row`` and of ``base`` ran in a slow spell of the machine's vCPUs (``--vcpu-probe``): their
    probe median above :data:`vcpu_follow.SPELL` times the median over both rows' passes; ``None`` where either row
    lacks the probe. Why: one vCPU ran 2x slow for seconds under a host-bound batch-1 server, whichever was serving
    (``benchmark/results/cpu_speed_h100.json``), and the pass-by-pass ratio follows it."""
    a, b = row.get("repeats"), base.get("repeats")
    if not a or not b or len(a) != len(b) or any(r.get("vcpu_probe_ms") is None for r in a + b):
        return None
    normal = statistics.median(r["vcpu_probe_ms"] for r in a + b)
    slow = lambda reps: [r["vcpu_probe_ms"] > vcpu_follow.SPELL * normal for r in reps]  # noqa: E731
    return slow(a), slow(b)


def jit_passes(row) -> int:
    """How many of ``row``'s measured passes met Triton compiles or cache loads (``--jit-log``): such a pass's time
    holds them (no speculation's batch-8 pass on fresh prompts once met a 464 ms compile, and a speculative row's
    ratio against it read 1.34x). Its passes' own records where kept, else the row's (its median pass)."""
    reps = row.get("repeats")
    if not reps or not any("jit" in r for r in reps):
        reps = [row]
    return sum(1 for r in reps if (r.get("jit") or {}).get("count"))


def versus(row, base) -> str:
    """A table cell: ``row`` against no speculation's row ``base`` on the same prompts, pass by pass
    (:func:`paired_ratio`: the median and the range of the per-pass ratios), without the passes' prefill
    (:func:`decode_ratio`), and the share of requests that generated
    the same tokens (:func:`same_tokens`, where both recorded them) with, where the first requests part, the token
    at which (:func:`first_difference`), and where either row's passes met JIT compiles (:func:`jit_passes`), how
    many; "–" without ``base`` or for ``base`` itself."""
    if base is None or base is row:
        return "–"
    ratio, per = paired_ratio(row, base)
    cell = f"{ratio:.3f}" + (f" ({min(per):.3f}-{max(per):.3f})" if per and len(per) > 1 else "")
    dec = decode_ratio(row, base)
    cell += f"; decode {dec:.3f}" if dec is not None else ""
    same = same_tokens(row, base)
    cell += f"; same tokens {100 * same:.0f} %" if same is not None else ""
    parts = [i for i in (first_difference(row, base) or []) if i is not None]
    cell += f" (first request parts at token {min(parts)}-{max(parts)})" if parts else ""
    jit = [f"{who} {n}" for who, r in (("no speculation", base), ("this row", row)) if (n := jit_passes(r))]
    cell += "; passes with JIT compiles: " + ", ".join(jit) if jit else ""
    spells = spell_passes(row, base)
    if spells and (any(spells[0]) or any(spells[1])):
        _, per = paired_ratio(row, base)
        calm = [x for x, s, t in zip(per, *spells) if not (s or t)]
        cell += (f"; passes in a slow vCPU spell: no speculation {sum(spells[1])}, this row {sum(spells[0])}"
                 + (f" (pass by pass without them {statistics.median(calm):.3f})" if calm else ""))
    return cell


def table(rows, memory=None):
    """Markdown table; ``memory``: the servers' entries, for the speculative-memory column and, where they ran on more
    than one machine (a ``--resume`` on another), a line saying which ran where."""
    out = machines_note(memory, "so rows of different machines are not a comparison") + [
        "| config | batch | accept_p | new tokens | tokens/s (client; median pass, range) | ms per step (client) | "
        "decode tokens/s (server log, best) | median | accept length | spec. memory | "
        "x no speculation (pass by pass: median, range; decode alone; same tokens) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    def key(r):  # rows are compared with no speculation's of the same batch, prompts, scheduler and prefill mode
        return r["batch"], row_prompts(r), r.get("scheduler"), r.get("prefill_graphs", "eager")

    none = {key(r): r for r in rows if r["config"] == "none"}
    for r in rows:
        acc = f"{r['accept_length']:.2f}" if r["accept_length"] else "–"
        dec = f"{r['logged_decode_tokens_per_s']:.0f}" if r.get("logged_decode_tokens_per_s") else "–"
        if not r.get("logged_decode_tokens_per_s") and r.get("logged_max_running"):  # capped below the batch
            dec = f"{r['logged_decode_at_max_running']:.0f} ({r['logged_max_running']} running)"
        med = r.get("logged_decode_median_tokens_per_s")
        dec += f" | {med:.0f}" if med else " | –"
        cfg = label(r["config"], r.get("scheduler"))
        mem = (memory or {}).get(cfg, {}).get("speculative_bytes", {}).get("total")
        mem = f"{mem / 2**20:.0f} MiB" if mem is not None else "–"
        ap = r.get("accept_p", r.get("oracle_p"))
        cfg += " **suspect**" if r.get("suspect") else ""
        cfg += " (timing hooks)" if r.get("step_timing") else ""  # host work on the step: not a flags-alone row
        cfg += " (diagnosed)" if r.get("diagnosed") else ""  # its server watched for stalls (--diagnose)
        cfg += " (prefill graphs)" if r.get("prefill_graphs") == "sglang" else ""  # SGLang's default prefill graphs
        if (r.get("jit") or {}).get("count"):  # the measured pass met kernels it had to compile or load
            cfg += f" (JIT {r['jit']['count']}, {r['jit']['total_ms']:.0f} ms)"
        tps = f"{r['tokens_per_s']:.0f}"
        if r.get("tokens_per_s_range"):  # the median of several passes: their range beside it
            lo, hi = r["tokens_per_s_range"]
            tps += f" ({lo:.0f}-{hi:.0f})"
        ap = ("–" if ap is None else str(ap)) + (" (fresh)" if ap is None and row_prompts(r) == "fresh" else "")
        vs = versus(r, none.get(key(r)))
        out.append(f"| {cfg} | {r['batch']} | {ap} | {r.get('output_len') or '–'} | {tps} | {r['step_ms']:.2f} | {dec} "
                   f"| {acc} | {mem} | {vs} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
