"""Benchmark-only: where a served decode step's wall time goes on the scheduler's thread, for any server.

Registered only when ``LUMOTREE_BENCH_STEP_TIMING=1``; never part of a normal launch. The torch profiler with
Python stacks slows the host about threefold and hid a host-bound step's difference that plain timing shows (a
no-draft step against no speculation's decode step, ``benchmark/results/profile_no_draft_h200.json``); these are
plain ``perf_counter`` readings through ``AROUND`` hooks on SGLang's scheduler (SGLang's ``HookRegistry``), the same
for a server without speculation, SGLang's speculative ones and LumoTree's.
Per batch bucket, decode batches only (a prefill between two decode steps breaks the interval it falls in;
``verify`` and SGLang's NGRAM loop's parts: the speculative step's requests):

* ``step``: from one decode batch's ``Scheduler.run_batch`` start to the next one's (the served step, wall);
* ``schedule``: ``Scheduler.get_next_batch_to_run`` (its preparation of the decode batch);
* ``launch``: ``Scheduler.run_batch`` (the worker's launch, and any wait inside it);
* ``stash`` / ``extras`` / ``copy_out``: the overlap scheduler's relay -- ``FutureMap.stash`` of a step's results and
  draft input, ``FutureMap._resolve_spec_extras`` (the next speculative step's gather of that draft input) and
  ``GenerationBatchResult.copy_to_cpu`` (the results' copy to the host), keyed by the step's request count, any server;
* ``lengths``: SGLang's ``FutureMap.resolve_seq_lens_cpu`` inside it (a speculative V2 batch waits there for the
  previous step's published lengths);
* ``result``: ``Scheduler.process_batch_result`` (waits for the previous step's results, then the host's share);
* ``worker``: LumoTree's speculative worker's ``forward_batch_generation`` inside ``run_batch`` (:func:`measure`;
  without speculation the worker is the target's, ``forward``);
* ``nodraft`` / ``drafted``: inside it, an adaptive LumoTree worker's no-draft step (its decode forward and what
  follows it) or its drafted step (SGLang's speculative loop with LumoTree's verify), apart;
  ``nodraft_admitting``: those of LUMOTREE_SUFFIX's no-draft steps that the policy did not choose -- the tree was
  chosen but every request's admission was still indexing (in ``nodraft`` too);
* ``forward``: SGLang's ``TpModelWorker.forward_batch_generation``, the target's forward launch (a no-draft step's
  decode forward, no speculation's decode step, with its sampling); ``verify``: the same call for a speculative
  step's TARGET_VERIFY batch;
* ``spec_prep`` / ``sample`` / ``state_commit`` / ``kv_move``: inside SGLang's NGRAM loop (SGLang's NGRAM server and
  LUMOTREE_SUFFIX's drafted step alike), its draft preparation (``NGRAMWorker._prepare_for_speculative_decoding``: the
  drafter and the verify's tree inputs), its tree sampler (``eagle_sample``), its state commit
  (``commit_mamba_states_after_verify``: the step indices it derives and the backend's commit -- LumoTree's ``commit``
  below inside it -- or SGLang's own) and its move of the accepted tokens' KV
  (``move_accept_tokens_to_target_kvcache``), keyed by the step's request count;
* ``post_verify``: a drafted step's work after its verify forward where LumoTree runs it
  (:mod:`lumotree.sglang.post_verify`, replayed as a CUDA graph or run eagerly): LUMOTREE_SUFFIX's tree walk, state
  commit, accepted tokens and their KV move, in place of ``sample`` / ``state_commit`` / ``kv_move``; a LUMOTREE
  chain's sampling, state commit and accepted and bonus tokens, in place of ``sample`` / ``state_commit``. Those then
  time only the eager steps and captures;
* ``commit``: LumoTree's commit after a verify (:meth:`~lumotree.sglang.backend.LumoTreeGDNBackend.commit_after_verify`);
* ``nd_prep`` / ``nd_init`` / ``nd_forward`` / ``nd_sample`` / ``nd_result``: a no-draft step's sections
  (:class:`~lumotree.sglang.decode_step.DecodeStep`: its decode batch, SGLang's ``ForwardBatch.init_new``, the
  forward launch, the sampler, the loop's result) -- :func:`lap`;
* ``dv_pre`` / ``dv_prepare`` / ``dv_mask`` / ``dv_sanitize`` / ``dv_tail`` / ``dv_widen``: a LUMOTREE_SUFFIX drafted
  step's own sections around the parts above (:func:`lumotree.sglang.post_verify.ngram_verify_step`: SGLang's stream
  bookkeeping before the preparation; the whole preparation, ``spec_prep`` and the verify mask's layout inside it; the
  mask's layout alone; SGLang's logits check after the verify; everything after ``post_verify`` -- the lengths'
  publish, the corpus's departures, the result; and the result's layout at the server's stride,
  :func:`lumotree.sglang.suffix_sizes.widen_result`) -- :func:`lap_size`; ``dv_choose`` / ``dv_live``: an adaptive
  LUMOTREE_SUFFIX worker's per-step choice (the policy and the admissions' check) and its note of the step's live
  rows (:class:`~lumotree.sglang.worker.StepLedger`), any decode step;
* ``input``: ``Scheduler.process_input_requests`` (new requests, aborts);
* ``gc``: the scheduler process's garbage collections (a ``gc.callbacks`` entry added at its first ``run_batch``),
  charged to the interval they fall in only (``<kind>_gc``): SGLang unfreezes the collector after its CUDA-graph
  capture, so a full collection walks the whole heap of a serving process wherever it falls.

Per batch bucket (the next power of two) each part logs a line per ``REPORT_EVERY`` samples,
``LumoTree step-<part> timing: batch bucket B: median X ms, p95 Y ms over N steps, total Z ms``, which
``benchmark/serving/sglang_server.py: step_timing`` reads back from the server log.

And where all of the scheduler's time goes: every interval from one ``run_batch`` start to the next is added to the
kind of the batch that started it -- ``decode``, ``prefill`` (an extend batch) or ``other`` -- or to ``idle`` where the
scheduler went idle inside it (SGLang's ``Scheduler.on_idle``: no batch to run); and the parts above that fell inside
an interval go to the same key, ``<kind>_<part>`` (ms and the intervals that had the part; any batch, not only decode),
so that a prefill interval's time is split too. Cumulative totals are logged at most once a second with the wall
clock, ``LumoTree step totals at T: decode X ms N, prefill ..., idle ..., decode_schedule X ms N, ...``, so that a
benchmark takes the difference over its own time windows (``sglang_server.py: step_totals``). The :data:`SECTIONS`
(the target's forward split into its batch's init, the model and the sampler, and a CUDA-graph forward's model into
the graph runner's input copies with its attention metadata and the replay; an EAGLE V2 drafted step's draft, verify
preparation and draft-extend; the scheduler's prefill preparation and
result processing; the radix tree's calls; CUDA event waits; LumoTree's prefill work: its finish rules' admission,
its adaptive worker's choice whether the prefill runs the MTP draft-extend, ``lt_pf_choose``, and the stub draft input
that replaces it, ``lt_pf_stub``, :mod:`lumotree.sglang.worker`; and an adaptive worker's own work on each decode step
outside its forward -- the policy's choice ``lt_choose``, the launch record ``lt_launched``, the ending-step check
``lt_ends``, the finish rule's mask and mark ``lt_mask`` / ``lt_mark``, the no-draft step's publish ``lt_publish``, each
read with its hook's own cost) are charged to those totals only,
so that an interval of any kind is split further, the same way for every server. Beside them, the prompt tokens the
batches that opened each kind's intervals computed (a prefill batch's ``extend_num_tokens``), as
``<kind>_tokens N tokens M`` (tokens, intervals that had some), so that two servers' prefill time compares per token.
And whether the host ran slow or waited: ``cpu_thread X ms N``, the CPU time the scheduler's thread has used (user and
system) and its involuntary context switches (the kernel took the core from it), and ``cpu_process X ms N``, the CPU
time of the whole scheduler process (every thread of it, native ones too) and the scheduler thread's voluntary
switches (it blocked) -- a window's difference of the thread's CPU against its wall time tells a slower host
(CPU time grows with the wall) from waits and preemption (it does not). Where the process's set of threads changes,
a line ``LumoTree scheduler threads: N tasks; name, ...`` (its tasks in ``/proc``, its Python threads by name).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict

from lumotree.sglang.draft_timing import DraftTimer

ENV = "LUMOTREE_BENCH_STEP_TIMING"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
FUTURE_MAP = "sglang.srt.managers.overlap_utils.FutureMap"
TP_WORKER = "sglang.srt.managers.tp_worker.TpModelWorker"
PARTS = ("step", "schedule", "launch", "lengths", "result", "worker", "nodraft", "warm", "drafted", "forward", "verify",
         "commit", "nd_prep", "nd_init", "nd_forward", "nd_sample", "nd_result", "input", "spec_prep", "sample",
         "state_commit", "kv_move", "post_verify", "nodraft_admitting", "dv_pre", "dv_prepare", "dv_mask", "dv_sanitize",
         "dv_tail", "dv_widen", "dv_choose", "dv_live", "stash", "extras", "copy_out")
NGRAM = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
# SGLang's NGRAM loop's steps: (target, part, the position of its ScheduleBatch argument, self counted)
LOOP_PARTS = ((f"{NGRAM}._prepare_for_speculative_decoding", "spec_prep", 1),
              ("sglang.srt.speculative.eagle_utils.eagle_sample", "sample", 1),
              ("sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify", "state_commit", 1),
              ("sglang.srt.speculative.spec_utils.move_accept_tokens_to_target_kvcache", "kv_move", 0))
# the overlap scheduler's relay of a step's results and draft input (any server; keyed by the step's request count):
# (target, part, the request count from its arguments)
RELAY_PARTS = ((f"{FUTURE_MAP}.stash", "stash", lambda args: args[1].shape[0]),
               (f"{FUTURE_MAP}._resolve_spec_extras", "extras", lambda args: len(getattr(args[1], "reqs", None) or ())),
               ("sglang.srt.managers.utils.GenerationBatchResult.copy_to_cpu", "copy_out",
                lambda args: (args[0].accept_lens if args[0].accept_lens is not None else args[0].next_token_ids).shape[0]))
# sections charged to the interval they fall in only (``<kind>_<part>`` totals, any batch): what a prefill or a decode
# interval spends inside the target's forward, the scheduler's preparation and its result processing, for any server
MR = "sglang.srt.model_executor.model_runner.ModelRunner"
SECTIONS = (("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", "fb_init"),
            (f"{MR}._forward_raw", "model"),
            (f"{MR}._maybe_execute_deferred_mamba_cow_and_clear", "mamba_cow"),
            (f"{MR}.sample", "sampling"),
            # inside a CUDA-graph forward: the graph runner's input copies and attention metadata, its replay
            ("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.load_batch",
             "graph_load"),
            ("sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend"
             ".init_forward_metadata_out_graph", "attn_meta"),
            ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend.FullCudaGraphBackend.replay",
             "graph_replay"),
            # SGLang's EAGLE V2 drafted step (LUMOTREE's and SGLang's chains alike): the MTP draft, the verify's
            # preparation (on SGLang's plan stream), the draft-extend after the verify
            ("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft", "draft"),
            ("sglang.srt.speculative.eagle_utils.eagle_prepare_for_verify", "verify_prep"),
            ("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode", "draft_extend"),
            # and a prefill's MTP draft-extend over its prompts (where an adaptive LumoTree worker runs it)
            ("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill", "draft_extend_prefill"),
            ("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend", "prep_extend"),
            (f"{SCHEDULER}.get_new_batch_prefill", "new_prefill"),
            ("sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
             ".process_batch_result_prefill", "result_prefill"),
            ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.match_prefix", "tree_match"),
            ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.cache_unfinished_req", "tree_unfinished"),
            ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.cache_finished_req", "tree_finished"),
            ("torch.cuda.streams.Event.synchronize", "event_sync"),
            # LumoTree's speculative workers' own prefill work (lumotree.sglang.finish, lumotree.sglang.suffix)
            ("lumotree.sglang.finish.admit_batch", "lt_fin_admit"),
            ("lumotree.sglang.finish.FinishedRows.mark_step", "lt_mark"),
            ("lumotree.sglang.suffix.admit_prefilled", "lt_admit"),
            # and an adaptive LumoTree worker's own work on every decode step, outside its forward: the finished rows'
            # mask of the state indices, the policy's choice (with the step clock's reads), the step's launch record,
            # the ending-step check, the no-draft step's early publish of its lengths
            ("lumotree.sglang.finish.FinishedRows.mask_rows", "lt_mask"),
            ("lumotree.sglang.worker.StepLedger.choose", "lt_choose"),
            ("lumotree.sglang.worker.StepLedger.launched", "lt_launched"),
            ("lumotree.sglang.finish.ends_after_step", "lt_ends"),
            ("lumotree.sglang.patches.future_map_host_lengths.publish_known", "lt_publish"))
# samples per logged line (``LUMOTREE_BENCH_STEP_TIMING_EVERY``: fewer to follow a spell of slow steps in time)
REPORT_EVERY = int(os.environ.get("LUMOTREE_BENCH_STEP_TIMING_EVERY", "128"))

KINDS = ("decode", "prefill", "other", "idle")
TOTALS_EVERY_S = 1.0

TIMERS: Dict[str, DraftTimer] = {p: DraftTimer(every=REPORT_EVERY, what=f"step-{p}") for p in PARTS}
_last = {"start": None}  # the last decode run_batch's start (None after any other batch)
# the interval the last run_batch started
_interval = {"start": None, "kind": None, "idle": False, "parts": {}, "tokens": 0}
TOTALS: Dict[str, list] = {k: [0.0, 0] for k in KINDS}  # ms, intervals
PART_TOTALS: Dict[str, list] = {}  # "<kind>_<part>": ms, intervals that had the part
TOKENS: Dict[str, list] = {k: [0, 0] for k in KINDS}  # prompt tokens the intervals' batches computed, intervals
_logged = {"at": 0.0}
_clock, _wall = time.perf_counter, time.time  # (tests set them)
_on = False  # installed (measure times only then)
_gc = {"t0": None, "on": False}  # a collection in progress; the callback added (the scheduler process's first batch)
_threads = {"seen": None}  # the scheduler process's threads as last logged


def cpu_totals() -> Dict[str, list]:
    """The totals line's CPU entries (module docstring): ``cpu_thread`` -- the calling thread's CPU ms and involuntary
    switches -- and ``cpu_process`` -- the process's CPU ms and the thread's voluntary switches. ``{}`` where the
    platform has no per-thread usage."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return {}
    ru = resource.getrusage(who)
    return {"cpu_thread": [(ru.ru_utime + ru.ru_stime) * 1e3, ru.ru_nivcsw],
            "cpu_process": [time.process_time() * 1e3, ru.ru_nvcsw]}


def threads_line():
    """``N tasks; name, ...`` for this process (its tasks in ``/proc``, its Python threads' names), or ``None`` if
    unchanged since the last call."""
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        tasks = -1
    got = f"{tasks} tasks; " + ", ".join(sorted(t.name for t in threading.enumerate()))
    if got == _threads["seen"]:
        return None
    _threads["seen"] = got
    return got


def enabled(env=os.environ) -> bool:
    return env.get(ENV) == "1"


def _decode_size(batch) -> int:
    """The request count of a decode batch; 0 for anything else (None, idle, prefill, mixed)."""
    mode = getattr(batch, "forward_mode", None)
    if batch is None or mode is None or not mode.is_decode():
        return 0
    return len(batch.reqs)


def _charge(part: str, seconds: float) -> None:
    """Add ``seconds`` of ``part`` to the interval now open (closed into :data:`PART_TOTALS` by :func:`_account`)."""
    if _interval["start"] is not None:
        parts = _interval["parts"]
        parts[part] = parts.get(part, 0.0) + seconds


def _add(part: str, bs: int, seconds: float) -> None:
    if bs:
        TIMERS[part].add(bs, seconds)
    _charge(part, seconds)


def _timed(part: str, original, self, batch, *args, **kwargs):
    bs = _decode_size(batch)
    t0 = _clock()
    out = original(self, batch, *args, **kwargs)
    _add(part, bs, _clock() - t0)
    return out


def lap(part: str, batch, t0: float) -> float:
    """The time since ``t0`` (a :func:`lap`'s return, first ``lap(None, None, 0.0)``) added to ``part`` for
    ``batch``; returns now. ``0.0`` and nothing timed unless step timing is on: a section of a step is then
    ``t = lap("a", batch, t)`` with no cost worth naming."""
    return lap_size(part, _decode_size(batch) if _on and part is not None else 0, t0)


def lap_size(part: str, bs: int, t0: float) -> float:
    """:func:`lap` where the caller knows the request count (a speculative step's batch changes mode inside it)."""
    if not _on:
        return 0.0
    now = _clock()
    if part is not None:
        _add(part, bs, now - t0)
    return now


def get_next_batch_to_run(original, self, *args, **kwargs):
    t0 = _clock()
    plan = original(self, *args, **kwargs)  # SGLang 0.5.17: a NextBatchPlan (its batch_to_run)
    _add("schedule", _decode_size(getattr(plan, "batch_to_run", None)), _clock() - t0)
    return plan


def _kind(batch) -> str:
    mode = getattr(batch, "forward_mode", None)
    if mode is not None and mode.is_decode():
        return "decode"
    return "prefill" if mode is not None and mode.is_extend() else "other"


def _account(t0: float, batch, log=None) -> None:
    """Close the interval the last ``run_batch`` started (at ``t0``, this one's start) and open this one's; log the
    cumulative totals at most every :data:`TOTALS_EVERY_S` seconds."""
    if _interval["start"] is not None:
        key = "idle" if _interval["idle"] else _interval["kind"]
        got = TOTALS[key]
        got[0] += (t0 - _interval["start"]) * 1e3
        got[1] += 1
        for part, seconds in _interval["parts"].items():
            got = PART_TOTALS.setdefault(f"{key}_{part}", [0.0, 0])
            got[0] += seconds * 1e3
            got[1] += 1
        if _interval["tokens"]:
            TOKENS[key][0] += _interval["tokens"]
            TOKENS[key][1] += 1
    kind = _kind(batch)
    tokens = int(getattr(batch, "extend_num_tokens", None) or 0) if kind == "prefill" else 0
    _interval.update(start=t0, kind=kind, idle=False, parts={}, tokens=tokens)
    now = _wall()
    if now - _logged["at"] >= TOTALS_EVERY_S:
        _logged["at"] = now
        parts = "".join(f", {k} {ms:.1f} ms {n}" for k, (ms, n) in sorted(PART_TOTALS.items()))
        parts += "".join(f", {k}_tokens {t} tokens {n}" for k, (t, n) in TOKENS.items() if n)
        parts += "".join(f", {k} {ms:.1f} ms {n}" for k, (ms, n) in cpu_totals().items())
        log = log or TIMERS["step"].log
        log("LumoTree step totals at %.3f: %s", now,
            ", ".join(f"{k} {TOTALS[k][0]:.1f} ms {TOTALS[k][1]}" for k in KINDS) + parts)
        changed = threads_line()
        if changed is not None:
            log("LumoTree scheduler threads: %s", changed)


def on_idle(original, self, *args, **kwargs):
    _interval["idle"] = True
    _last["start"] = None
    return original(self, *args, **kwargs)


def gc_callback(phase: str, info: dict) -> None:
    """``gc.callbacks`` entry: each collection's wall time charged to the interval it falls in (``gc``)."""
    if phase == "start":
        _gc["t0"] = _clock()
    elif _gc["t0"] is not None:
        _charge("gc", _clock() - _gc["t0"])
        _gc["t0"] = None


def run_batch(original, self, batch, *args, **kwargs):
    if not _gc["on"]:  # the scheduler's process (the hooks are registered in every process of the server)
        import gc

        gc.callbacks.append(gc_callback)
        _gc["on"] = True
    bs = _decode_size(batch)
    t0 = _clock()
    _account(t0, batch)
    if bs and _last["start"] is not None:
        TIMERS["step"].add(bs, t0 - _last["start"])
    _last["start"] = t0 if bs else None
    out = original(self, batch, *args, **kwargs)
    _add("launch", bs, _clock() - t0)
    return out


def forward_batch_generation(original, self, batch=None, *args, **kwargs):
    """The target's forward launch: keyed by the decode batch, or (a speculative worker's call) its forward batch;
    a TARGET_VERIFY forward batch's is ``verify``."""
    fb = kwargs.get("forward_batch", args[0] if args else None)
    bs, part = _decode_size(batch), "forward"
    mode = getattr(fb if batch is None else batch, "forward_mode", None)
    if batch is None and mode is not None and mode.is_decode():
        bs = int(fb.batch_size)
    elif mode is not None and mode.is_target_verify():  # SGLang's NGRAM loop passes its ScheduleBatch
        bs, part = (int(fb.batch_size) if batch is None else len(batch.reqs)), "verify"
    t0 = _clock()
    out = original(self, batch, *args, **kwargs)
    _add(part, bs, _clock() - t0)
    return out


def measure(part: str, batch, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its wall time added to ``part`` for a decode ``batch`` when step timing is on (a
    LumoTree worker's whole step: ``worker``)."""
    if not _on:
        return fn(*args, **kwargs)
    return measure_size(part, _decode_size(batch), fn, *args, **kwargs)


def measure_size(part: str, bs: int, fn, *args, **kwargs):
    """:func:`measure` where the caller knows the batch size (``bs``; 0: the interval's totals only)."""
    if not _on:
        return fn(*args, **kwargs)
    t0 = _clock()
    out = fn(*args, **kwargs)
    _add(part, bs, _clock() - t0)
    return out


def process_batch_result(original, self, batch, *args, **kwargs):
    return _timed("result", original, self, batch, *args, **kwargs)


def resolve_seq_lens_cpu(original, self, batch, *args, **kwargs):
    return _timed("lengths", original, self, batch, *args, **kwargs)


def loop_part(part: str, batch_at: int):
    """An ``AROUND`` hook timing ``part`` of a speculative step whose ScheduleBatch is positional argument ``batch_at``
    (in TARGET_VERIFY mode there, or about to be: keyed by its request count)."""
    def hook(original, *args, **kwargs):
        batch = args[batch_at] if len(args) > batch_at else None
        t0 = _clock()
        out = original(*args, **kwargs)
        _add(part, len(getattr(batch, "reqs", None) or ()), _clock() - t0)
        return out

    return hook


def sized_part(part: str, size_of):
    """An ``AROUND`` hook timing ``part`` keyed by the request count ``size_of(args)`` (:data:`RELAY_PARTS`)."""
    def hook(original, *args, **kwargs):
        t0 = _clock()
        out = original(*args, **kwargs)
        try:
            bs = int(size_of(args))
        except (AttributeError, IndexError, TypeError):
            bs = 0
        _add(part, bs, _clock() - t0)
        return out

    return hook


def section(part: str):
    """An ``AROUND`` hook charging its target's wall time to ``part`` of the interval now open (:data:`SECTIONS`)."""
    def hook(original, *args, **kwargs):
        t0 = _clock()
        try:
            return original(*args, **kwargs)
        finally:
            _charge(part, _clock() - t0)

    return hook


def process_input_requests(original, self, *args, **kwargs):
    t0 = _clock()
    out = original(self, *args, **kwargs)
    _charge("input", _clock() - t0)
    return out


def install() -> None:
    """Register the hooks (when :data:`ENV` is ``1``)."""
    global _on
    _on = enabled()
    if not _on:
        return
    from lumotree.sglang.patches import register_hook

    register_hook(f"{SCHEDULER}.get_next_batch_to_run", get_next_batch_to_run, "AROUND")
    register_hook(f"{SCHEDULER}.run_batch", run_batch, "AROUND")
    register_hook(f"{SCHEDULER}.process_batch_result", process_batch_result, "AROUND")
    register_hook(f"{FUTURE_MAP}.resolve_seq_lens_cpu", resolve_seq_lens_cpu, "AROUND")
    register_hook(f"{SCHEDULER}.on_idle", on_idle, "AROUND")
    register_hook(f"{SCHEDULER}.process_input_requests", process_input_requests, "AROUND")
    register_hook(f"{TP_WORKER}.forward_batch_generation", forward_batch_generation, "AROUND")
    for target, part, batch_at in LOOP_PARTS:
        register_hook(target, loop_part(part, batch_at), "AROUND")
    for target, part in SECTIONS:
        register_hook(target, section(part), "AROUND")
    for target, part, size_of in RELAY_PARTS:
        register_hook(target, sized_part(part, size_of), "AROUND")
