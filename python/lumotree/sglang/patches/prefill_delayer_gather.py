"""Hook: the all-gather SGLang's prefill delayer makes on every scheduler pass, when its group is this rank alone.

Why: with ``--enable-prefill-delayer`` (SGLang 0.5.17) the scheduler asks ``PrefillDelayer`` on every pass whether a
prefill may run, and ``PrefillDelayer._gather_info`` all-gathers five integers across the attention ranks -- also on
a one-GPU server, where the group is the rank itself: a gloo collective per pass, 207 us on this project's CPU
against the hook's 28 (``benchmark/serving/prefill_delayer_cpu.py``, ``benchmark/results/prefill_delayer_cpu.json``). Served at 32 concurrent agents (tiny model, H200,
``docs/performance.md``) the delayer's check cost no speculation ~0.5 ms per decode step (run
``32-agents-prefill-delayer``: scheduling 4.97 s over 5,578 decode intervals against 2.27 s over 5,483 without the
delayer); with the gather skipped 0.58 against 0.34 ms per step (run ``32-agents-delayer-default``, another machine),
the rest the held passes' ranking of the waiting queue (:mod:`lumotree.sglang.patches.prefill_delayer_early`).
LUMOTREE_SUFFIX turns the delayer on by default (:func:`lumotree.sglang.scheduling.default_prefill_delayer`).

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on the method): where the gather group has one rank and the
buffer is on the host, the local row is written into the delayer's buffer and returned as the gather would have
returned it (the same tensor, the same values: the delayer's decisions are unchanged, ``test_prefill_delayer.py``);
otherwise SGLang's gather runs. Registered in every process: it changes no decision of any server, only the time a
one-rank delayer takes.

Remove when: SGLang skips the collective for a group of one (``world_size == 1``).
"""
from __future__ import annotations

TARGET = "sglang.srt.managers.prefill_delayer.PrefillDelayer._gather_info"
_ALONE = "_lumotree_gather_alone"  # cached on the delayer: its group has one rank and its buffer is on the host


def _alone(delayer) -> bool:
    alone = getattr(delayer, _ALONE, None)
    if alone is None:
        import torch.distributed as dist

        buf = delayer._global_info_buffer
        alone = buf.device.type == "cpu" and buf.numel() == 5 and dist.get_world_size(delayer._gather_group) == 1
        setattr(delayer, _ALONE, alone)
    return alone


def gather_alone(original, self, local_prefillable: bool, local_token_watermark_force_allow: bool,
                 running_batch: int = 0, max_prefill_bs: int = 0, waiting_queue_len: int = 0):
    if not _alone(self):
        return original(self, local_prefillable, local_token_watermark_force_allow, running_batch=running_batch,
                        max_prefill_bs=max_prefill_bs, waiting_queue_len=waiting_queue_len)
    import torch

    self._global_info_buffer.view(5).copy_(torch.tensor(
        [int(local_prefillable), int(local_token_watermark_force_allow), running_batch, max_prefill_bs,
         waiting_queue_len], dtype=torch.int64))
    return self._global_info_buffer[:, 0, :]


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, gather_alone, "AROUND")
