"""The LUMOTREE tree worker: SGLang's EAGLE V2 worker (MTP drafting, tree building, KV bookkeeping)
with LumoTree's GDN verify and replay commit underneath (:mod:`lumotree.sglang.backend`) and the
adaptive tree size (:mod:`lumotree.sglang.adaptive`) on top.

Adaptive tree size (default): besides the configured tree, the worker holds a second runtime state
with no draft -- SGLang's one-node verify (``EAGLEWorkerV2._build_trivial_verify_input``, the
root accepted and one token sampled from the target's logits: a decode step), with its own
target-verify CUDA graphs -- and switches between the two before each decode step as
:class:`~lumotree.sglang.adaptive.TreeSizePolicy` says. The MTP layer's draft-extend still runs on
no-draft steps, so its KV cache stays complete and drafting resumes without a cold step. A switch
swaps prebuilt attention backends and graph runners (SGLang's ``apply_runtime_state``); nothing is
captured while serving.
"""
from __future__ import annotations

import collections
import functools
import logging
import time

from lumotree.sglang import adaptive

logger = logging.getLogger(__name__)


@functools.cache
def worker_class():
    import sglang.srt.speculative.eagle_worker_v2 as ew

    class LumoTreeWorker(ew.EAGLEWorkerV2):
        """``EAGLEWorkerV2`` whose tree size is chosen per decode step (see the module docstring)."""

        def __init__(self, server_args, *args, **kwargs):
            super().__init__(server_args, *args, **kwargs)
            steps = adaptive.candidate_steps(server_args)
            self.tree_policy = adaptive.TreeSizePolicy(steps) if len(steps) > 1 else None
            self._tree_states = {}
            self._last_decode = None  # (batch, steps, host time) of the previous decode step
            self._pending_steps = collections.deque(maxlen=8)  # steps of decode steps not yet reported

        def init_cuda_graphs(self):
            super().init_cuda_graphs()
            if self.tree_policy is None:
                return
            dw = self._draft_worker
            cuda_graph_bs = (None if ew.check_cuda_graph_backend(ew.Phase.DECODE, ew.Backend.DISABLED)
                             else ew.get_exec().graph.cuda_graph_bs_decode)
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
                        tic = time.perf_counter()
                        self._tree_states[steps] = self.build_adaptive_runtime_state(
                            steps, 1 if steps == 0 else self.speculative_num_draft_tokens, cuda_graph_bs=cuda_graph_bs)
                        logger.info("LumoTree adaptive: runtime state for %d draft steps built in %.1f s", steps,
                                    time.perf_counter() - tic)
            logger.info("LumoTree adaptive tree size: candidates %s draft steps (0 = no draft), chosen per decode "
                        "step from measured step times and acceptance", self.tree_policy.candidates)

        def forward_batch_generation(self, batch, *args, **kwargs):
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                self._last_decode = None  # a prefill between two decode steps: no step time to attribute
            return super().forward_batch_generation(batch, *args, **kwargs)

        def activate_step_by_batch(self, batch_size: int) -> None:
            if self.tree_policy is None:
                return
            now = time.perf_counter()
            if self._last_decode is not None:
                b, s, t = self._last_decode
                self.tree_policy.observe_time(b, s, now - t)
            if batch_size <= 0:  # idle batch
                self._last_decode = None
                return
            steps = self.tree_policy.choose(batch_size)
            if steps != self.speculative_num_steps:
                self.apply_runtime_state(self._tree_states[steps])
            self._last_decode = (batch_size, steps, now)
            self._pending_steps.append(steps)

        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
            if self.tree_policy is None:
                return
            # results arrive in launch order (one step late under the overlap scheduler)
            steps = self._pending_steps.popleft() if self._pending_steps else self.speculative_num_steps
            self.tree_policy.observe_accept(steps, num_correct_drafts_per_req)

    return LumoTreeWorker
