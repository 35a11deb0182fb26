"""The LUMOTREE tree worker: SGLang's EAGLE V2 worker (MTP drafting, tree building, KV bookkeeping)
with LumoTree's GDN verify and replay commit underneath (:mod:`lumotree.sglang.backend`) and the
adaptive tree size (:mod:`lumotree.sglang.adaptive`) on top.

Adaptive tree size (default): besides the configured tree, the worker holds a second runtime state
with no draft -- SGLang's one-node verify (``EAGLEWorkerV2._build_trivial_verify_input``, the
root accepted and one token sampled from the target's logits: a decode step), with its own
target-verify CUDA graphs -- and switches between the two before each decode step as
:class:`~lumotree.sglang.adaptive.TreeSizePolicy` says. A switch swaps prebuilt attention backends
and graph runners (SGLang's ``apply_runtime_state``); nothing is captured while serving. A chain whose
``--speculative-adaptive-config`` lists shallower chains too (``[0, 1, 3]``) holds a runtime state for each, its
verify ``steps + 1`` tokens (:func:`candidate_tokens`).

A no-draft step is a decode step: the target model's decode forward through decode CUDA graphs of its
own (:mod:`lumotree.sglang.decode_step`), not SGLang's one-node verify, wherever the batch allows it
(the one-node verify serves the others, its GDN layers running SGLang's decode kernels in place,
:mod:`lumotree.sglang.backend`); the MTP layer's draft-extend is skipped (SGLang's
``_stub_skipped_draft_extend``, with first-level draft scores that keep the next tree whole:
:func:`cold_draft_input`), and so are its draft CUDA graphs at start-up. The price: the MTP layer's
KV cache has no entries for the tokens decoded without a draft, so a request that lives through a no-draft stretch drafts from a
cold start and with those holes when drafting resumes -- which the policy only does when drafting
pays at that batch size. The holes' slots are zeroed before each no-draft step (:mod:`lumotree.sglang.mtp_entries`:
left alone they hold a finished request's entries, which cost the trained tiny model's MTP head more acceptance than
no entries). The acceptance of the first drafted step after such a stretch is not counted (its draft comes from a
stub) -- except after a **warm** no-draft step, the first step of the policy's probes of the tree: SGLang's one-node
verify with the MTP draft-extend (:attr:`lumotree.sglang.adaptive.TreeSizePolicy.warm`), whose draft the next step
drafts from. A prefill skips the draft-extend over its prompts too where the decode steps its requests join will serve no
draft by the policy's estimates (:meth:`LumoTreeWorker._prefill_without_draft`), their slots zeroed alike.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import statistics
import time
import types

import torch

from lumotree.sglang import adaptive, capacity, compile_watch, shared_times, step_timing, warmup
from lumotree.sglang.mtp_entries import MtpEntries
from lumotree.sglang.patches import future_map_cold_rows
from lumotree.sglang.scheduling import publish_prefill_early

logger = logging.getLogger(__name__)


def configured_graph_bs(server_args, exec_bs):
    """The batch sizes SGLang captures decode / verify graphs at: the list in the resolved config bag
    (``get_exec().graph.cuda_graph_bs_decode``) where the user gave one, else the one its graph runners read,
    ``server_args.cuda_graph_config.decode.bs`` (SGLang's default list for the server). Why: the bag's list is
    ``None`` unless ``--cuda-graph-bs`` was given, and LumoTree's choices from it (:func:`decode_step_graph_bs`,
    :func:`one_node_verify_graph_bs`) then kept SGLang's speculative list (a served log, tiny model, max batch 8:
    the no-draft decode graphs at 1-8 against no speculation's 1, 2, 4, 8)."""
    if exec_bs:
        return list(exec_bs)
    config = getattr(server_args, "cuda_graph_config", None)
    bs = getattr(getattr(config, "decode", None), "bs", None)
    return list(bs) if bs else None


def _verify_graph_seconds(worker) -> float:
    """The seconds SGLang's EAGLE V2 worker has spent capturing target-verify graphs so far (it adds each runtime
    state's to ``_additional_graph_time_usage``): where a LUMOTREE server's start-up goes, state by state, in its log."""
    usage = getattr(worker, "_additional_graph_time_usage", None) or {}
    return float(usage.get("target_verify", 0.0))


def one_node_verify_graph_bs(cuda_graph_bs, decodes: bool):
    """Batch sizes of the no-draft state's one-node verify CUDA graphs. Where no-draft steps run as decode
    steps (``decodes``: :mod:`lumotree.sglang.decode_step`, through decode graphs at no speculation's sizes), the
    one-node verify serves only the batches a decode step cannot (logprobs, grammars, penalties, ...): graphs
    of the powers of two and the largest size, the others padded up to them, as SGLang pads any batch to a
    captured size (applied by :func:`lumotree.sglang.decode_step.capture_sizes`). Why: this state took 8.9-12.9 s
    of a LUMOTREE server's start-up while it still captured all 35 sizes up to 128 (27B shapes, H200).
    ``None`` (graphs off) stays ``None``."""
    return sparse_graph_bs(cuda_graph_bs) if decodes else cuda_graph_bs


def sparse_graph_bs(cuda_graph_bs):
    """The powers of two of ``cuda_graph_bs`` below its largest size, and the largest: the sizes a runtime state
    that serves only some steps captures (the one-node verify, :func:`one_node_verify_graph_bs`; a shallower chain
    of a ``--speculative-adaptive-config`` that lists fewer draft steps than the configured chain), the other
    batches padded up to them as SGLang pads any batch to a captured size. Why for the chains: each depth's state
    captures target-verify and draft graphs of its own, ~0.5 s a size at 27B shapes on an H200 (35 verify sizes
    took 16.9 s with first-use compiles), so two extra depths at every size would add ~20-35 s of start-up; the policy
    times each depth's steps as served, padding included, so a depth whose padded step does not pay at a batch size
    is not chosen there. ``None`` (graphs off) stays ``None``."""
    if not cuda_graph_bs:
        return cuda_graph_bs
    sizes = sorted(set(int(b) for b in cuda_graph_bs))
    return [b for b in sizes if b & (b - 1) == 0 and b < sizes[-1]] + [sizes[-1]]


def decode_step_graph_bs(server_args, cuda_graph_bs):
    """Batch sizes of the decode CUDA graphs that serve no-draft steps (:mod:`lumotree.sglang.decode_step`): the
    ones a server without speculation captures (SGLang's own list for no speculation, padding batches as it does),
    where ``cuda_graph_bs`` is SGLang's default list for a speculative server; a list the user chose stays. Why:
    a no-draft step is compared with no speculation's decode step, and SGLang's speculative list has 35 sizes up
    to 128 against 20 (7.4 s of a LUMOTREE server's start-up for these graphs at 27B shapes, H200)."""
    if not cuda_graph_bs:
        return cuda_graph_bs
    generate = getattr(type(server_args), "_generate_decode_cuda_graph_batch_sizes", None)
    if generate is None:
        return cuda_graph_bs
    max_bs = max(int(b) for b in cuda_graph_bs)
    padding = getattr(server_args, "disable_cuda_graph_padding", False)

    def default(algorithm):
        view = types.SimpleNamespace(speculative_algorithm=algorithm, disable_cuda_graph_padding=padding)
        return generate(view, max_bs)

    if sorted(int(b) for b in cuda_graph_bs) != sorted(default(server_args.speculative_algorithm)):
        return cuda_graph_bs  # the user's list
    return default(None)


def take_no_speculation_graph_sizes(server_args) -> None:
    """A LUMOTREE server captures its target-verify and draft CUDA graphs at the batch sizes a server without
    speculation captures its decode graphs at, where the server has SGLang's default speculative list
    (``--cuda-graph-bs`` and ``--disable-cuda-graph-padding`` keep theirs): 20 sizes to 128 instead of 35, each
    batch padded up to the next captured size as no speculation pads its decode step. Why: graph capture was most
    of a LUMOTREE server's start-up beyond SGLang's chain (target-verify graphs 16.9 s at 35 sizes, draft graphs
    6.0 s; 27B shapes, H200), and SGLang's speculative list is finer only below 64 (every size to 8, every second
    to 32), where a step reads the weights once whatever its rows: a verify of 4 tokens per request is
    weight-bound up to ~40 requests on an H100 / H200 (bf16 ridge ~160 tokens). Run after SGLang's own argument
    handling, before any graph runner reads ``cuda_graph_config.decode.bs``."""
    config = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
    if config is None or not config.bs:
        return
    sizes = decode_step_graph_bs(server_args, config.bs)
    if sizes != config.bs:
        logger.info("LumoTree: verify and draft CUDA graphs at no speculation's %d batch sizes (SGLang's speculative "
                    "list: %d; --cuda-graph-bs sets them)", len(sizes), len(config.bs))
        config.bs = sizes


def warm_probes(server_args, candidates) -> bool:
    """Whether the policy's probes of the tree after no-draft steps start with a warm no-draft step (SGLang's one-node
    verify and the MTP draft-extend, :meth:`lumotree.sglang.adaptive.TreeSizePolicy._tree_run`) instead of a cold
    drafted step: where no draft is a candidate, except in the decode-exact mode (``--enable-deterministic-inference``:
    its no-draft step must be a decode step, :func:`lumotree.sglang.adaptive.exact_choice`; the one-node verify is not
    one)."""
    from lumotree.sglang.exact import exact_mode

    return 0 in candidates and len(candidates) > 1 and not exact_mode(server_args)


def candidate_tokens(steps: int, configured_steps: int, configured_tokens: int) -> int:
    """The verify's tokens per request of a candidate of ``steps`` draft steps: the configured tree's, one for no
    draft (the root), ``steps + 1`` for a shallower chain (:func:`lumotree.sglang.adaptive.candidate_steps` allows
    those on chains alone)."""
    if steps == configured_steps:
        return configured_tokens
    return 1 if steps == 0 else steps + 1


@contextlib.contextmanager
def _no_draft_graphs(draft_worker):
    """While a no-draft runtime state is built: the draft worker captures no CUDA graphs."""
    draft_worker._capture_cuda_graphs = lambda: None
    try:
        yield
    finally:
        del draft_worker._capture_cuda_graphs


class StepClock:
    """The time of each decode step as the device saw it: a timing event recorded on the step's stream when
    the step is launched (:meth:`start`); a step's time is the device time from its event to the next decode
    step's -- its forward, drafting and commit, and any wait for the host's next launch (a host-bound step).

    Why not host intervals: under SGLang's overlap scheduler the host launches a step before the previous
    one's results are in and waits for them after, so the interval between two launches times an earlier
    step; a run of steps of one candidate started with samples of the other (:mod:`lumotree.sglang.adaptive`).
    Results of the device's clock are read without waiting (:meth:`samples`: the events already passed).

    A step followed by other device work (a prefill, :meth:`interrupt`) or an idle gap gives no sample; nor does the
    first step after a prefill: SGLang's overlap scheduler processes a prefill's results (its requests' cache
    insertions, their first tokens' output) after launching the next decode step, so where the host is the bottleneck
    that step's interval holds the prefill's result processing too.

    ``steady``: a step followed by a step of another candidate gives no sample either -- for a loop that drafts on
    the host (LUMOTREE_SUFFIX, SGLang's NGRAM loop): its drafted step waits for the previous step's tokens on the
    host and drafts before it launches, so the device idles through that preparation at the end of whatever step
    came before. So a no-draft step followed by a drafted one holds the drafted step's preparation, and a drafted
    step followed by a no-draft one lacks its own (the no-draft step launches without the host's tokens). Served
    estimates that read so (LUMOTREE_SUFFIX, tiny model, one H100, where isolated no-draft steps were most of them):
    no draft 5-6 ms against drafted steps' 3-4 at 1 agent, 15.0 against 8.3-10.7 at 32 agents -- against 2.75 ms
    for a server pinned to no draft at 32 agents (an earlier H200 run). Steps within a run of their candidate carry
    what that candidate costs in a run.

    A step in whose interval the host compiled a Triton kernel gives no sample either (``compiles``,
    :mod:`lumotree.sglang.compile_watch`): whether the compile fell in the step's own launch or in the next step's
    preparation, the device waited for it inside that interval.

    Args:
        event: makes an event with ``record()``, ``query()`` and ``elapsed_time(later)`` (milliseconds),
            as ``torch.cuda.Event(enable_timing=True)``; default that, or :class:`HostEvent` without CUDA.
        steady: samples only of steps followed by a step of their own candidate (above).
        compiles: the process's count of Triton compiles so far (:func:`lumotree.sglang.compile_watch.count`);
            ``None``: not watched.
    """

    LIMIT = 64  # steps whose times are not read yet (a bound: they are read at every launch)

    def __init__(self, event=None, steady: bool = False, compiles=None):
        if event is None:
            event = functools.partial(torch.cuda.Event, enable_timing=True) if torch.cuda.is_available() else HostEvent
        self._event = event
        self.steady = steady
        self._compiles = compiles
        self._compiled = compiles() if compiles is not None else 0  # the count when the last step started
        self.compile_drops = 0  # samples left out for a compile (diagnostics, tests)
        self._open = collections.deque(maxlen=self.LIMIT)  # [event, batch, steps, counts] in launch order
        self._resumed = False  # the next step started follows an interruption (it gives no sample)

    def start(self, batch: int, steps: int) -> None:
        """A decode step of ``batch`` requests with ``steps`` draft steps is launched now (before its device work)."""
        if self._compiles is not None:
            n = self._compiles()
            if n != self._compiled and self._open and self._open[-1][3]:  # the last step's interval held a compile
                self._open[-1][3] = False
                self.compile_drops += 1
            self._compiled = n
        ev = self._event()
        ev.record()
        self._open.append([ev, batch, steps, not self._resumed])
        self._resumed = False

    def interrupt(self, prefill: bool = True) -> None:
        """Device work that is not a decode step (``prefill``: a prefill, whose results the host processes in the
        next step's interval) or an idle gap follows the last step started."""
        if self._open:
            self._open[-1][3] = False
        self._resumed = prefill

    def samples(self) -> list:
        """``[(batch, steps, seconds)]`` of the steps whose next step has started on the device, oldest first."""
        out = []
        while len(self._open) >= 2 and self._open[1][0].query():
            ev, batch, steps, counts = self._open.popleft()
            if counts and (not self.steady or self._open[0][2] == steps):
                out.append((batch, steps, ev.elapsed_time(self._open[0][0]) / 1e3))
        return out


class StepLedger:
    """What an adaptive worker keeps of the decode steps it launched, between the policy's choice and the step's
    results on the host: each step's device time (:class:`StepClock`, fed to the policy at the next choice) and,
    in launch order, ``[candidate, cold, live rows]`` until its acceptance arrives (:meth:`accepted`). Shared by
    the LUMOTREE worker (EAGLE V2 loop) and the LUMOTREE_SUFFIX worker (NGRAM loop).

    Args:
        policy: the :class:`~lumotree.sglang.adaptive.TreeSizePolicy`.
        consistent: the overlap scheduler with LumoTree's consistent cache (:meth:`note_live_rows` applies).
        first: the candidate taken as served before the first step (the configured tree).
        event: :class:`StepClock`'s event factory (tests).
        chooser: a :class:`~lumotree.sglang.request_choice.RequestQuantile` that decides each step from the running
            requests' own acceptance once the policy has step times of both candidates (LUMOTREE_SUFFIX);
            ``None``: the policy decides.
        shared: with tensor parallelism, the :class:`~lumotree.sglang.shared_times.SharedStepTimes` through which
            every rank's policy takes rank 0's step times at the same steps; ``None`` on one GPU.
        steady, compiles: :class:`StepClock`'s.
    """

    LOG_EVERY = 512  # decode steps between two summary lines in the server log (the served choice, for diagnosis)
    # drafted steps a probe of the per-request choice serves on a steady clock (StepClock: a drafted step followed by a
    # no-draft one gives no sample): one probe step alone never timed the tree again, and a tree estimate inflated
    # once stayed -- a LUMOTREE_SUFFIX server on a fresh H100, its first drafted steps at 95.7 ms (compiling while
    # serving), read the tree as 42 no-draft steps and served no draft through a whole 1-agent run (0.67x no
    # speculation, accept length 1.05). Two: the first is timed within its run; the second's acceptance is measured too
    STEADY_PROBE_RUN = 2

    def __init__(self, policy, consistent: bool = False, first: int = 0, event=None, chooser=None, shared=None,
                 steady: bool = False, compiles=None):
        self.policy, self.consistent, self.chooser, self.shared = policy, consistent, chooser, shared
        self.first = first
        self.pinned = None  # the configured tree from an exchange that found the ranks' choices differing on
        self.clock = StepClock(event, steady=steady, compiles=compiles)
        # [steps, cold, live rows, undrafted rows, request ids, drafted/no-draft time ratio] of decode steps not
        # yet reported (the last two for the chooser)
        self.pending = collections.deque(maxlen=8)
        self._live_ring, self._live_next = None, 0  # pinned host buffers of the live rows (note_live_rows)
        self.prev = first
        self.last_batch = 0  # requests of the last decode step launched
        self.after_decode = False  # the last forward launched was a decode step (no prefill or idle batch since)
        self._ratio = None  # the chooser's ratio of the step being chosen (None: the policy chose)
        # since the last summary line: decode steps, drafted ones, and the counted acceptance samples (sum, count)
        self._window = [0, 0, 0.0, 0]

    def warm_ms(self) -> dict:
        """The median device time (ms) of the last warm no-draft steps per batch bucket, as the policy keeps them
        (no candidate's samples, :data:`lumotree.sglang.adaptive.WARM`; :meth:`TreeSizePolicy.warm_pays` weighs
        them), for the log: what a warm probe's first step costs beside the bucket's no-draft and drafted steps."""
        return {b: round(1e3 * statistics.median(st.warm_times), 3)
                for b, st in sorted(self.policy.buckets.items()) if getattr(st, "warm_times", None)}

    def choose(self, batch_size: int, rids=None, ending: bool = False):
        """The candidate for a decode step of ``batch_size`` requests (``rids``: their ids, which the chooser
        reads), after the policy has taken the step times the device has finished; ``None`` for an idle batch
        (which ends the last step's time sample). ``ending``: every request is certain to have ended after the step
        (:meth:`ends_after_step`) -- no draft, and no decision of the policy's or the chooser's
        (:meth:`~lumotree.sglang.adaptive.TreeSizePolicy.ending_step`)."""
        samples = self.clock.samples()
        if self.shared is not None and self.pinned is None:
            try:  # every rank takes rank 0's samples at the same steps
                samples = self.shared.take(samples, getattr(self.policy, "accept", None), step=batch_size > 0)
            except shared_times.RanksDiverged as e:
                logger.error("LumoTree adaptive: %s", e)
                self.pinned, samples = self.first, []
        for b, s, seconds in samples:
            self.policy.observe_time(b, s, seconds)
        self._ratio = None
        if batch_size <= 0:
            self.interrupt(prefill=False)
            return None
        if self.pinned is not None:
            return self.pinned
        if ending and 0 in self.policy.candidates:
            return self.policy.ending_step()
        if self.chooser is not None and rids is not None and len(self.policy.candidates) == 2:
            none, tree = self.policy.candidates
            t_tree, t_none = self.policy.step_time(batch_size, tree), self.policy.step_time(batch_size, none)
            if t_tree is not None and t_none:  # until both are measured somewhere the policy explores
                # a stale no-draft time is timed again first (TreeSizePolicy.remeasure), as the policy would
                run = self.policy.run_step(batch_size)
                if run is None:
                    run = self.policy.remeasure(batch_size)
                if run is not None:
                    return run
                self._ratio = t_tree / t_none
                probes = self.chooser.decisions[1]
                if not self.chooser.decide(rids, self._ratio):
                    return none
                if self.clock.steady and self.chooser.decisions[1] > probes:
                    # a probe on a steady clock: two drafted steps, so that the first is timed within its run
                    return self.policy.serve_run(batch_size, tree, self.STEADY_PROBE_RUN)
                return tree
        return self.policy.choose(batch_size)

    def launched(self, batch_size: int, steps: int, cold: bool = False, rids=None, warm: bool = False) -> None:
        """A decode step serving candidate ``steps`` is launched now; ``cold``: its acceptance is not counted;
        ``rids``: its requests' ids in row order (the chooser's); ``warm``: a no-draft step that runs the MTP
        draft-extend (:attr:`lumotree.sglang.adaptive.TreeSizePolicy.warm`) -- its time is no sample of no draft's
        (the clock keeps it as :data:`~lumotree.sglang.adaptive.WARM`), and the drafted step after it is not cold
        (:attr:`prev`)."""
        # a step's time includes no prefill: batches ramp up through smaller buckets as a pass's requests are
        # admitted, and samples that held prefills once made a bucket-4 tree step "take" 55 ms against 13 ms
        # at bucket 8, and the bucket served no draft (27B shapes, batch 8, H200)
        self.clock.start(batch_size, adaptive.WARM if warm else steps)
        if self.shared is not None:
            self.shared.chose(batch_size, steps)
        self.pending.append([steps, cold, None, (), rids, self._ratio])
        self.prev, self.last_batch = (adaptive.WARM if warm else steps), batch_size
        self.after_decode = True
        w = self._window
        w[0] += 1
        w[1] += steps > 0
        if w[0] >= self.LOG_EVERY:
            by_requests = "" if self.chooser is None else (
                "; per-request choice (drafted, probes, no draft) %s, probe interval %d" % (
                    self.chooser.decisions, self.chooser.interval))
            warm = self.warm_ms()
            logger.info("LumoTree adaptive, last %d decode steps: %d drafted; accepted drafts per request %.2f (mean of "
                        "%d drafted steps' samples); step ms per bucket and candidate %s%s%s", w[0], w[1],
                        w[2] / max(1, w[3]), w[3],
                        {b: v["step_ms"] for b, v in self.policy.table()["buckets"].items()},
                        "; warm no-draft step ms per bucket %s" % warm if warm else "", by_requests)
            self._window = [0, 0, 0.0, 0]

    def interrupt(self, prefill: bool = True) -> None:
        """A prefill (or, ``prefill`` false, an idle batch) between two decode steps: the step before it gives no
        time sample (:meth:`StepClock.interrupt`), and the next decode step's requests have no step of theirs in
        flight."""
        self.clock.interrupt(prefill)
        self.after_decode = False

    def ends_after_step(self, reqs, overlap: bool) -> bool:
        """Whether every request of the decode step about to launch (``reqs``) is certain to have ended after it
        (:func:`lumotree.sglang.finish.ends_after_step`); ``overlap``: SGLang's overlap scheduler, whose step
        launched before this one -- where it was a decode step, it held these requests -- is not processed yet (a
        token at least each that the host does not count yet).

        Why: a probe that starts on such a step measures nothing. The benchmark's passes end together, and probes
        that fell on pass ends -- under the overlap scheduler the extra step after a batch's last (it still holds the
        requests the step before finished), the one-token passes -- found no running request and were run again:
        two of four or five probes per bucket (27B shapes, batches 8-64, one H100)."""
        if self.pinned is not None or 0 not in self.policy.candidates:  # no decision to skip (a fixed tree)
            return False
        from lumotree.sglang.finish import ends_after_step

        return ends_after_step(reqs, 1 if overlap and self.after_decode else 0)

    def may_draft(self, new: int) -> bool:
        """Whether the decode steps after the prefills of ``new`` requests since the last decode step may draft:
        the policy's :meth:`~lumotree.sglang.adaptive.TreeSizePolicy.may_draft` at ``new`` to ``new`` plus the last
        decode step's requests; the pinned tree drafts."""
        if self.pinned is not None:
            return self.pinned > 0
        return self.policy.may_draft(new, new + self.last_batch)

    def note_live_rows(self, req_to_token_pool, req_pool_indices) -> None:
        """With the overlap scheduler's consistent cache, right after a drafted step's forward (its finished rows
        marked, :func:`lumotree.sglang.finish.forward_marked`): which of its rows (``req_pool_indices``) are still
        running after it, copied to the host with the step; its acceptance sample leaves the others out.

        Why: rows that finished before the step -- a step launched before the previous step's results were
        processed still holds the requests that step finished (their state rows masked) -- report whatever the
        verify of a finished request gave (zeros with the benchmark's drafts); where a batch of requests ends
        together each such step pulled the acceptance average down by most of its value and the policy dropped a
        tree that paid (27B shapes, batch 32, H200). And rows this step finished: their run was cut at the
        request's end (a stop token, ``max_new_tokens``), so they accept what was left of the request, not what
        the draft was worth -- 32 agents whose turns end together made every turn's end read as acceptance near
        zero (0.76 and 1.26 accepted drafts per request at two bucket-32 decisions of a LUMOTREE_SUFFIX server
        whose tree accepted 4-12 between them, H200), and the policy served no draft into the next turns.

        The rows come from the step's own mark (:attr:`lumotree.sglang.finish.FinishedRows.step_live`, written in
        the mark's launch; read from ``done`` where the step was not marked) into a host buffer of a ring kept
        pinned (:meth:`_live_host`): one copy per drafted step."""
        from lumotree.sglang.finish import FinishedRows

        if not self.consistent or not self.pending:
            return
        entry = self.pending[-1]
        if entry[2] is not None or entry[0] == 0:  # a no-draft step has no acceptance sample to filter
            return
        fin = FinishedRows.of(req_to_token_pool)
        live = fin.step_live
        if live is None or live.shape[0] != req_pool_indices.shape[0]:
            live = ~fin.done[req_pool_indices.long()]
        host = self._live_host(live)
        host.copy_(live, non_blocking=live.is_cuda)  # before SGLang's copy of the results on this stream
        entry[2] = host

    def _live_host(self, live: torch.Tensor) -> torch.Tensor:
        """A host buffer for a drafted step's live rows (``live``'s shape): the next of a ring of pinned buffers,
        one more than :attr:`pending` holds, so that a buffer is written again only after its step's entry has left
        ``pending`` (read or dropped). Why a ring: pinning a new host tensor per step went through the caching host
        allocator on every drafted step."""
        n = live.shape[0]
        ring = self._live_ring
        if ring is None or ring[0].shape[0] < n:
            size = max(n, 2 * ring[0].shape[0] if ring is not None else 64)
            ring = self._live_ring = [torch.empty(size, dtype=torch.bool, pin_memory=live.is_cuda)
                                      for _ in range(self.pending.maxlen + 1)]
            self._live_next = 0
        host = ring[self._live_next][:n]
        self._live_next = (self._live_next + 1) % len(ring)
        return host

    def note_undrafted(self, rows) -> None:
        """Rows of the step just launched that drafted nothing although the step drafted (LUMOTREE_SUFFIX: requests
        whose admission was still indexing, :attr:`lumotree.sglang.suffix.SuffixCorpus.undrafted`): its acceptance
        sample leaves them out -- they accept what a decode step gives, not what the tree is worth."""
        if rows and self.pending:
            self.pending[-1][3] = frozenset(rows)

    def accepted(self, num_correct_drafts_per_req, default_steps: int) -> None:
        """The accepted drafts per request of the oldest reported step (results arrive in launch order, one
        step late under the overlap scheduler), into the policy unless the step was cold or drafted nothing."""
        entry = self.pending.popleft() if self.pending else (default_steps, False, None, (), None, None)
        steps, cold, live, skip, rids, ratio = entry
        if cold:
            return
        drafts = list(num_correct_drafts_per_req)
        live = live.tolist() if live is not None and len(live) == len(drafts) else None  # results in: so is the copy
        if self.chooser is not None and rids is not None and len(rids) == len(drafts):
            self.chooser.observe(rids, steps > 0, [None if i in skip or (live is not None and not live[i]) else d
                                                   for i, d in enumerate(drafts)], ratio)
        if live is not None:
            drafts = [d for i, (d, running) in enumerate(zip(drafts, live)) if running and i not in skip]
        elif skip:
            drafts = [d for i, d in enumerate(drafts) if i not in skip]
        if steps > 0 and drafts:
            self._window[2] += sum(drafts) / len(drafts)
            self._window[3] += 1
        self.policy.observe_accept(steps, drafts)


class HostEvent:
    """:class:`StepClock`'s event without CUDA: the host's clock at ``record()``."""

    def __init__(self):
        self.t = None

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, later: "HostEvent") -> float:
        return (later.t - self.t) * 1e3


def cold_draft_input(draft_input, topk: int) -> None:
    """The first-level draft of a request whose previous step drafted nothing (its MTP draft-extend
    skipped): ``topk`` distinct tokens with distinct, decreasing positive scores, in place of SGLang's
    zero stub (``EAGLEWorkerV2._stub_skipped_draft_extend``).

    Why: EAGLE's tree is the ``num_draft_tokens - 1`` best cumulative scores (parent score x child
    probability). From zero scores every candidate ties at 0, so the selection picks nodes whose parent
    it did not pick -- SGLang's "invalid eagle tree" warning, the node dropped -- and all first-level
    tokens are the same token. With scores ``2^-1 > 2^-2 > ...`` a child (its score its parent's times
    a probability below 1) always ranks below its parent, so the tree is whole; the tokens are still a
    guess (the draft's first level is cold), so this step's acceptance is not counted either."""
    draft_input.topk_p, draft_input.topk_index = cold_first_level(draft_input.topk_p.shape[0], topk,
                                                                  draft_input.topk_p.device)


def cold_first_level(bs: int, topk: int, device):
    """``(topk_p, topk_index)`` `[bs, topk]` of a cold start (:func:`cold_draft_input`), a copy each: later steps
    own (filter, merge) them."""
    p, idx = _cold_rows(topk, device)
    return p.expand(bs, topk).clone(), idx.expand(bs, topk).clone()


class ColdStubs:
    """The draft input a no-draft step leaves under SGLang's overlap scheduler -- :func:`cold_draft_input`'s first
    level and zero hidden states -- as read-only views of buffers kept across steps (``[:bs]``), not new tensors each
    step. Why: the overlap scheduler copies a step's draft input into its FutureMap's buffers
    (``FutureMap.stash``) and the next step gathers fresh tensors from them (``_resolve_spec_extras``); the batch's
    filter and merge index or concatenate (new tensors): nothing writes these. Made anew each step, SGLang's stub
    and the cold first level were five allocations and kernel launches on a host-bound no-draft step (0.18 ms of
    4.3 on the tiny model, one H100). The synchronous scheduler hands the draft input itself to the next step's
    draft, so it keeps :func:`cold_draft_input`'s own copies.

    Args:
        topk: the draft's first-level width.
        hidden: ``(size, dtype)`` of the draft's recurrent hidden state, or ``(None, None)`` (none relayed).
    """

    def __init__(self, topk: int, hidden, device):
        self.topk, (self.hidden_size, self.hidden_dtype), self.device = topk, hidden, device
        self.rows = 0
        self.topk_p = self.topk_index = self.hidden_states = None

    def _grow(self, bs: int) -> None:
        rows = max(bs, 2 * self.rows, 64)
        p, idx = cold_first_level(rows, self.topk, self.device)
        self.topk_p, self.topk_index, self.rows = p, idx, rows
        self.hidden_states = (None if self.hidden_size is None else
                              torch.zeros((rows, self.hidden_size), dtype=self.hidden_dtype, device=self.device))

    def fill(self, draft_input, bs: int) -> None:
        """Set ``draft_input``'s ``topk_p``, ``topk_index`` and ``hidden_states`` for ``bs`` requests."""
        if bs > self.rows:
            self._grow(bs)
        draft_input.topk_p, draft_input.topk_index = self.topk_p[:bs], self.topk_index[:bs]
        draft_input.hidden_states = None if self.hidden_states is None else self.hidden_states[:bs]


@functools.lru_cache(maxsize=None)
def _cold_rows(topk: int, device):
    ranks = torch.arange(topk, device=device)
    return torch.pow(2.0, -(ranks + 1).to(torch.float32))[None], ranks.to(torch.int64)[None]


@functools.cache
def worker_class():
    import sglang.srt.speculative.eagle_worker_v2 as ew

    from lumotree.sglang import draft_oracle, post_verify
    from lumotree.sglang.backend import one_token_decode
    from lumotree.sglang.decode_step import DecodeStep, capture_sizes
    from lumotree.sglang.finish import forward_marked, keep_out_of_cache
    from lumotree.sglang.scheduling import overlap_consistent

    class LumoTreeWorker(ew.EAGLEWorkerV2):
        """``EAGLEWorkerV2`` whose tree size is chosen per decode step (see the module docstring)."""

        PREFILL_LOG_EVERY = 256  # prefill batches between two lines on how many skipped the MTP draft-extend

        def __init__(self, server_args, *args, **kwargs):
            super().__init__(server_args, *args, **kwargs)
            # the scheduler sizes the pools after this: the draft's copies of the target's tensors freed first, then its
            # state slots come as without the draft (lumotree.sglang.capacity)
            capacity.share_draft_head(self._draft_worker)
            capacity.note_draft_bytes(capacity.draft_weight_bytes(self._draft_worker.draft_runner.model,
                                                                  self._target_worker.model_runner.model))
            steps = (adaptive.candidate_steps(server_args) if adaptive.adaptive_tree_size(server_args)
                     else [self.speculative_num_steps])
            # one candidate that is the configured tree: a fixed tree, no policy ([0] pins the no-draft step)
            self.tree_policy = (adaptive.TreeSizePolicy(steps, settings=adaptive.policy_settings(server_args),
                                                        warm_probes=warm_probes(server_args, steps))
                                if steps != [self.speculative_num_steps] else None)
            self._warm = False  # this decode step serves no draft warm (the MTP draft-extend runs: TreeSizePolicy.warm)
            self._tree_states = {}
            self._ledger = StepLedger(self.tree_policy, overlap_consistent(server_args), self.speculative_num_steps,
                                      shared=shared_times.for_server(server_args) if self.tree_policy else None,
                                      compiles=compile_watch.install() if self.tree_policy else None)
            self._decode_step = None  # the no-draft step as a decode forward (built with the CUDA graphs)
            self._decodes = one_token_decode(server_args)
            self._step_chosen = False  # this decode step's tree size is chosen already
            self._overlap_consistent = self._ledger.consistent
            self._draft_oracle = draft_oracle.probability() is not None  # benchmark only
            self._mtp_entries = None  # the MTP layer's entries of tokens decoded without a draft, zeroed
            self._cold_stubs = None  # the overlap scheduler's no-draft draft inputs (ColdStubs)
            self._prefill_stub = False  # this prefill skips the MTP draft-extend (the steps after it serve no draft)
            self._stub_rows = set()  # request rows whose draft input is a prefill's stub until they draft
            self._admitted = set()  # request rows prefilled since the last decode step
            self.prefills = self.prefills_without_draft = 0  # prefill batches, those that skipped the draft-extend
            if self.tree_policy is not None and 0 in self.tree_policy.candidates:
                self._skip_draft_extend_without_draft()

        def alloc_memory_pool(self, *args, **kwargs):
            """SGLang's pools, then (an adaptive server that can serve no draft) the MTP layer's entries that no-draft
            steps and prefills without the draft-extend zero: the draft runner has no pools before this call (the
            scheduler allocates them after building the workers)."""
            super().alloc_memory_pool(*args, **kwargs)
            if self.tree_policy is not None and 0 in self.tree_policy.candidates and self._mtp_entries is None:
                self._mtp_entries = MtpEntries.of_runner(self._draft_worker.draft_runner)
                if self._mtp_entries is not None:  # (unified memory: its stale entries would stay; always extend)
                    self._skip_prefill_draft_extend_without_draft()
                    self._warm_decode_prep()

        def _warm_decode_prep(self):
            """The no-draft step's preparation kernel compiled for the MTP entries it zeroes, once both exist
            (whichever of the pools and the decode step comes last)."""
            raw = getattr(getattr(self, "_mtp_entries", None), "raw_pairs", None)
            if raw is not None and getattr(self, "_decode_step", None) is not None:
                self._decode_step.warm_prep(raw)

        def _skip_draft_extend_without_draft(self):
            dw = self._draft_worker
            draft_extend = dw._draft_extend_for_decode

            def draft_extend_for_decode(batch, batch_output):
                if self.speculative_num_steps == 0 and not getattr(self, "_warm", False):
                    return self._stub_skipped_draft_extend(batch, batch_output)
                return draft_extend(batch, batch_output)

            dw._draft_extend_for_decode = draft_extend_for_decode

        def _skip_prefill_draft_extend_without_draft(self):
            dw = self._draft_worker
            draft_extend = dw._draft_extend_for_prefill

            def draft_extend_for_prefill(batch, target_hidden_states, next_token_ids, mm_input_embeds=None):
                if self._prefill_stub and not batch.forward_mode.is_idle():
                    return step_timing.measure_size("lt_pf_stub", 0, self._prefill_without_draft, batch, next_token_ids)
                return draft_extend(batch, target_hidden_states, next_token_ids, mm_input_embeds)

            dw._draft_extend_for_prefill = draft_extend_for_prefill

        def _choose_prefill_draft_extend(self, batch) -> None:
            """Before a prefill: skip the MTP layer's draft-extend over its prompts where the decode steps its
            requests join will serve no draft by the policy's estimates (:meth:`StepLedger.may_draft`); see
            :meth:`_prefill_without_draft`."""
            reqs = getattr(batch, "reqs", None) or ()
            rows = [r.req_pool_idx for r in reqs]
            # SGLang runs the prefills it can admit back to back: the next decode step holds them all
            self._admitted.update(rows)
            self._prefill_stub = (bool(reqs) and self._mtp_entries is not None
                                  and getattr(batch, "out_cache_loc", None) is not None  # (the slots to zero)
                                  and not self._ledger.may_draft(len(self._admitted)))
            if self._prefill_stub:
                self._stub_rows.update(rows)
            elif self._stub_rows:
                self._stub_rows.difference_update(rows)
            self.prefills += 1
            if self.prefills % self.PREFILL_LOG_EVERY == 0:
                logger.info("LumoTree adaptive: %d of %d prefill batches skipped the MTP draft-extend",
                            self.prefills_without_draft + self._prefill_stub, self.prefills)

        def _prefill_without_draft(self, batch, next_token_ids):
            """The prefill's draft input without the MTP draft-extend: the first-level draft of a cold start
            (:func:`cold_draft_input`, zero hidden states), as a no-draft decode step leaves it; the prompt's MTP
            entries zeroed (:meth:`MtpEntries.clear_slots`: their slots may hold a finished request's). Why: that
            draft-extend is what a prefill of a LUMOTREE server costs beyond no speculation's (+4-5 % from batch 32 on
            at 27B shapes, H200), paid for drafts that the steps after it do not make. Its price where drafting
            resumes for these requests: the first draft of each is cold, and the prompt's entries read as absent --
            6.6 % less accept length over the first 64 positions after the prompt, 1.7 % over 380, on the trained
            tiny model's MTP head (``benchmark/drafters/mtp_holes.py``, ``mtp_holes_text_cpu.json``)."""
            from sglang.srt.speculative.eagle_info import EagleDraftInput
            from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

            self._mtp_entries.clear_slots(batch.out_cache_loc)
            bs = next_token_ids.shape[0]
            self.prefills_without_draft += 1
            if self.prefills_without_draft == 1:
                logger.info("LumoTree adaptive: prefills whose decode steps serve no draft skip the MTP draft-extend "
                            "(their prompts' MTP entries zeroed)")
            if getattr(batch, "enable_overlap", False):  # the no-draft step's stubs (see _stub_skipped_draft_extend)
                out = EagleDraftInput(bonus_tokens=next_token_ids, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)
                self._fill_overlap_stubs(out, bs, batch)
                return out
            topk_p, topk_index = cold_first_level(bs, self.topk, next_token_ids.device)
            hidden_size, dtype = get_draft_recurrent_hidden_state_spec(self._draft_worker.draft_runner)
            hidden = (None if hidden_size is None else
                      torch.zeros((bs, hidden_size), dtype=dtype, device=next_token_ids.device))
            return EagleDraftInput(topk_p=topk_p, topk_index=topk_index, hidden_states=hidden,
                                   bonus_tokens=next_token_ids, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)

        def init_cuda_graphs(self):
            super().init_cuda_graphs()
            warmup.warm_spec_decode_slots(getattr(self, "req_to_token_pool", None))  # every bucket, before serving
            warmup.warm_slot_copies(getattr(getattr(self, "req_to_token_pool", None), "mamba_pool", None))
            served = self.tree_policy.candidates if self.tree_policy is not None else [self.speculative_num_steps]
            warmup.warm_verify_kernels(  # every verify width served (a no-draft candidate: the one-node verify's)
                getattr(self, "req_to_token_pool", None),
                [candidate_tokens(s, self.speculative_num_steps, self.speculative_num_draft_tokens) for s in served],
                [s + 1 for s in served])
            if (getattr(self, "topk", None) == 1 and torch.cuda.is_available()
                    and not ew.check_cuda_graph_backend(ew.Phase.DECODE, ew.Backend.DISABLED)):
                # a chain's work after each verify forward as CUDA graphs (lumotree.sglang.post_verify)
                self._post_verify = post_verify.EagleVerifyGraphs(self.device)
            if self.tree_policy is None:
                return
            dw = self._draft_worker
            cuda_graph_bs = (None if ew.check_cuda_graph_backend(ew.Phase.DECODE, ew.Backend.DISABLED)
                             else configured_graph_bs(self._target_worker.model_runner.server_args,
                                                      ew.get_exec().graph.cuda_graph_bs_decode))
            with (dw.draft_tp_context(dw.draft_runner.tp_group), ew.speculative_moe_backend_context(),
                  ew.speculative_moe_a2a_backend_context()):
                self._tree_states[self.speculative_num_steps] = ew.SpecRuntimeState(
                    speculative_num_steps=self.speculative_num_steps,
                    speculative_num_draft_tokens=self.speculative_num_draft_tokens,
                    draft_attn_backend=dw.draft_attn_backend,
                    cuda_graph_runner=dw.cuda_graph_runner,
                    target_attn_backend=self._target_worker.model_runner.attn_backend,
                    target_graph_runner=self._target_worker.model_runner.decode_cuda_graph_runner,
                    draft_extend_attn_backend=dw.draft_extend_attn_backend,
                    cuda_graph_runner_for_draft_extend=dw.cuda_graph_runner_for_draft_extend)
                for steps in self.tree_policy.candidates:
                    if steps not in self._tree_states:
                        tic, verify0 = time.perf_counter(), _verify_graph_seconds(self)
                        # no draft: the draft model never runs (no draft, draft-extend skipped), so no draft graphs
                        skip = _no_draft_graphs(dw) if steps == 0 else contextlib.nullcontext()
                        graph_bs = (one_node_verify_graph_bs(cuda_graph_bs, self._decodes) if steps == 0
                                    else sparse_graph_bs(cuda_graph_bs))  # a shallower chain
                        with skip, capture_sizes(self._target_worker.model_runner.server_args, graph_bs):
                            self._tree_states[steps] = self.build_adaptive_runtime_state(
                                steps, candidate_tokens(steps, self.speculative_num_steps,
                                                        self.speculative_num_draft_tokens),
                                cuda_graph_bs=graph_bs)
                        took, verify = time.perf_counter() - tic, _verify_graph_seconds(self) - verify0
                        logger.info("LumoTree adaptive: runtime state for %d draft steps built in %.1f s (target-verify "
                                    "graphs %.1f s at batch sizes %s; the rest -- draft graphs, attention backends, "
                                    "buffers -- %.1f s)", steps, took, verify, graph_bs, took - verify)
                if 0 in self.tree_policy.candidates and self._decodes:
                    decode_bs = decode_step_graph_bs(self.server_args, cuda_graph_bs)
                    self._decode_step = DecodeStep.build(self, decode_bs)
                    self._warm_decode_prep()
            logger.info("LumoTree adaptive tree size: candidates %s draft steps (0 = no draft), chosen per decode "
                        "step from measured step times and acceptance", self.tree_policy.candidates)

        def forward_batch_generation(self, batch, *args, **kwargs):
            return step_timing.measure("worker", batch, self._forward_marked, batch, *args, **kwargs)

        def _forward_marked(self, batch, *args, **kwargs):
            decode = getattr(self, "tree_policy", None) is not None and batch.forward_mode.is_decode()
            future_map_cold_rows.note_rows(getattr(batch, "req_pool_indices_cpu", None))  # (for its stash)
            rows = batch.req_pool_indices[:batch.seq_lens.shape[0]] if decode else None
            # where each request ends: the run clamp; the overlap scheduler's finished rows (lumotree.sglang.finish)
            out = forward_marked(getattr(self, "_overlap_consistent", False), batch,
                                 lambda: self._forward(batch, *args, **kwargs))
            if decode:
                self._ledger.note_live_rows(batch.req_to_token_pool, rows)
            return out

        def verify(self, batch, grammar_barrier=None):
            """SGLang's verify step; a plain greedy chain's work after the verify forward through CUDA graphs
            (:func:`lumotree.sglang.post_verify.eagle_verify_step`)."""
            graphs = getattr(self, "_post_verify", None)
            if (graphs is not None and grammar_barrier is None and not batch.forward_mode.is_idle()
                    and getattr(batch.spec_info, "draft_token_num", None) == self.speculative_num_draft_tokens
                    and post_verify.EagleVerifyGraphs.serves_eagle(self, batch)):
                return post_verify.eagle_verify_step(self, graphs, batch)
            return super().verify(batch, grammar_barrier=grammar_barrier)

        def prepare_for_kv_cache_release(self, req) -> None:
            keep_out_of_cache(getattr(self, "_overlap_consistent", False), req)

        def _forward(self, batch, *args, **kwargs):
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                # a prefill between two decode steps: the one before it has no step time of its own
                self._ledger.interrupt()
                args, kwargs = publish_prefill_early(batch, args, kwargs)  # its lengths are known: publish, launch
                if getattr(self, "_mtp_entries", None) is not None:  # (only adaptive servers that can serve none)
                    step_timing.measure_size("lt_pf_choose", 0, self._choose_prefill_draft_extend, batch)
            elif self.tree_policy is not None and not batch.forward_mode.is_idle():
                bs = batch.seq_lens.shape[0]
                if getattr(self, "_admitted", None):
                    self._admitted.clear()
                self._ending = self._ledger.ends_after_step(getattr(batch, "reqs", None),
                                                             getattr(batch, "enable_overlap", False))
                self.activate_step_by_batch(bs)
                self._step_chosen = True  # SGLang's loop asks again: the choice stands
                warm = getattr(self, "_warm", False)
                decode = (self._decode_step is not None and self.speculative_num_steps == 0 and not warm
                          and self._decode_step.serves(batch))
                if warm:  # SGLang's one-node verify and its draft-extend: every row's draft input is its own after it
                    if self._stub_rows:
                        self._stub_rows.difference_update(r.req_pool_idx for r in batch.reqs)
                    return step_timing.measure("warm", batch, super().forward_batch_generation, batch, *args,
                                               **kwargs)
                if self.speculative_num_steps == 0 and getattr(self, "_mtp_entries", None) is not None and not decode:
                    # no draft-extend writes this token's MTP entry: zero the stale one in its slot (the decode
                    # step zeroes it at the slot it looks up for its forward: _no_draft_decode)
                    self._mtp_entries.clear(batch.req_pool_indices[:bs], batch.seq_lens)
                elif self.speculative_num_steps > 0 and getattr(self, "_stub_rows", None):
                    self._note_stub_rows(batch)
                if decode:
                    self._step_chosen = False
                    return step_timing.measure("nodraft", batch, self._no_draft_decode, batch,
                                               kwargs.get("on_publish", args[0] if args else None))
                return step_timing.measure("drafted", batch, super().forward_batch_generation, batch, *args, **kwargs)
            return super().forward_batch_generation(batch, *args, **kwargs)

        def _note_stub_rows(self, batch) -> None:
            """A drafted step: rows whose draft input is still a skipped prefill's stub draft cold; where the step
            itself is not cold (it follows a drafted step) their acceptance is left out of its sample. After it
            every row's draft input is its own draft-extend's."""
            rows = self._stub_rows
            stub = [i for i, r in enumerate(batch.reqs) if r.req_pool_idx in rows]
            if stub and self._ledger.pending and not self._ledger.pending[-1][1]:
                self._ledger.note_undrafted(stub)
            rows.difference_update(r.req_pool_idx for r in batch.reqs)

        def _fill_overlap_stubs(self, draft_input, bs: int, batch) -> None:
            """``draft_input``'s draft fields as the kept stubs' views (:class:`ColdStubs`), named with ``batch``'s
            host rows for the FutureMap's stash, which may then leave them out of its buffers
            (:mod:`lumotree.sglang.patches.future_map_cold_rows`)."""
            if self._cold_stubs is None:
                from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

                self._cold_stubs = ColdStubs(self.topk, get_draft_recurrent_hidden_state_spec(
                    self._draft_worker.draft_runner), self.device)
            self._cold_stubs.fill(draft_input, bs)
            future_map_cold_rows.note_stub(self._cold_stubs, draft_input, getattr(batch, "req_pool_indices_cpu", None))

        def _stub_skipped_draft_extend(self, batch, batch_output):
            if getattr(batch, "enable_overlap", False):  # copied into the FutureMap: shared read-only stubs
                self._fill_overlap_stubs(batch_output.next_draft_input, batch.seq_lens.shape[0], batch)
                return
            super()._stub_skipped_draft_extend(batch, batch_output)
            cold_draft_input(batch_output.next_draft_input, self.topk)

        def _no_draft_decode(self, batch, on_publish):
            """The no-draft step as a decode forward; what follows a one-node verify in SGLang's loop
            (publish the lengths -- before the forward here, :meth:`DecodeStep._decode` --, stub the skipped
            draft-extend) follows it too."""
            seq_lens, rows = batch.seq_lens, batch.req_pool_indices
            mtp = getattr(self, "_mtp_entries", None)
            raw = getattr(mtp, "raw_pairs", None)  # zeroed in the step's preparation launch, or
            out = self._decode_step.run(batch, on_publish, on_slots=mtp.clear_slots if mtp is not None and raw is None
                                        else None, zero_kv=raw)  # through the pool's set_kv_buffer
            if getattr(self, "_draft_oracle", False):  # SGLang's step (hooked there) does not run
                draft_oracle.after_step(batch, out, seq_lens, rows, prefill=False)
            self._stub_skipped_draft_extend(batch, out)
            return out

        def activate_step_by_batch(self, batch_size: int) -> None:
            if self.tree_policy is None:
                return
            if self._step_chosen:
                self._step_chosen = False
                return
            steps = self._ledger.choose(batch_size, ending=getattr(self, "_ending", False))
            self._ending = False
            if steps is None:  # idle batch (no draft-extend of its own: not warm)
                self._warm = False
                return
            if steps != self.speculative_num_steps:
                self.apply_runtime_state(self._tree_states[steps])
            # the first drafted step after no-draft steps drafts from zeros (draft-extend skipped): not an acceptance;
            # after a warm no-draft step it drafts from the draft-extend's output (counted)
            self._warm = steps == 0 and getattr(self.tree_policy, "warm", False)
            if self._warm:
                self.warm_steps = getattr(self, "warm_steps", 0) + 1
                if self.warm_steps in (1, 64) or self.warm_steps % 1024 == 0:
                    logger.info("LumoTree adaptive: %d warm no-draft steps (a tree probe's first step: one-node verify "
                                "and the MTP draft-extend)", self.warm_steps)
            self._ledger.launched(batch_size, steps, cold=steps > 0 and self._ledger.prev == 0, warm=self._warm)

        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
            if self.tree_policy is None:
                return
            self._ledger.accepted(num_correct_drafts_per_req, self.speculative_num_steps)

    return LumoTreeWorker
