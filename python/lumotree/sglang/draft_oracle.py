"""Benchmark-only controlled acceptance on the MTP draft path: LUMOTREE and SGLang's NEXTN alike.

Registered only when ``LUMOTREE_BENCH_DRAFT_ORACLE_P`` is set (e.g. ``0.8``); never part of a normal
launch. Dummy-weight models accept nothing, so serving speed at a realistic acceptance needs drafts
whose acceptance is known. :mod:`lumotree.sglang.oracle` gets them through SGLang's NGRAM loop,
which is not the loop a LUMOTREE or NEXTN user runs; this module keeps the served loop -- the MTP
draft, its draft CUDA graphs, tree building, verify, acceptance, draft-extend -- and only rewrites the
drafted tokens before the verify, so the step costs what it costs and accepts what the oracle says:

* **recording** (every step, on the device): the tokens a step produced -- a prefill's sampled token,
  a verify's accepted run, a no-draft step's token -- are written into a table keyed by the request's
  prompt (:meth:`DraftOracle.record`). A prompt served once has its greedy continuation there. Only
  outputs the request asked for (index below its ``max_new_tokens``, kept per request-pool row at
  admission): SGLang's overlap scheduler launches step N+1 before it knows that step N finished a
  request, so a finished request's row takes part in one more step, whose token the host drops (its
  GDN state rows are masked, :mod:`lumotree.sglang.finish`: the token is not the continuation). Recorded,
  it overwrites the continuation: the benchmark's one-token prefill passes (``bench_spec.measure``) finish
  at their prefill, so their extra step would write output 1 of every prompt of the batch, and the
  measured pass after them is forced to emit it. LUMOTREE's forced passes at the 27B shape, batches 8 and
  64, emitted token 0 at output 1 of the first request where no speculation emitted its repeated token
  (one H100); with this check every row's tokens equal no speculation's
  (``benchmark/results/oracle_tokens_27b_h100.json``).
* **injection** (each drafted step, on the device, after SGLang's ``EagleDraftWorker.draft``): in each
  request's draft tree the first-child chain from the root carries the recorded continuation for the
  first ``k`` levels, ``k`` the leading successes of Bernoulli(``p``) draws (deterministic in the
  prompt and the position, so every server draws the same); the chain node after them and every
  other node that would match the continuation at its depth get a wrong token
  (:meth:`DraftOracle.inject`). A request whose continuation is unknown, or whose root token is not
  the recorded one, keeps the MTP layer's own drafts.
* **forcing** (each drafted step's sampling, before SGLang's ``eagle_sample``): the verify's logits get
  :data:`FORCE_BOOST` added at the chain node of depth ``d - 1`` for the recorded output ``d``,
  ``d = 1 .. k + 1`` (:func:`force`), so greedy verification accepts exactly the ``k`` drawn drafts and
  the bonus token is the recorded next output -- whatever the target computed. Why: without it the
  drafts were accepted only where the target repeated the recording's greedy output; on dummy weights
  (near-tied logits) a pass whose numerics differ from the recording pass's (a different mix of decode
  and verify steps, other GEMM shapes) leaves the recorded continuation at the first flipped argmax,
  and every later draft of the request missed. On the H200 a LUMOTREE server, whose adaptive passes mix
  decode and verify steps, accepted 2.1-2.2 at batch 128 where SGLang's chain, verifying every step,
  accepted 2.95 on the same oracle. The emitted tokens are the oracle's, as benchmark output may be.
  Greedy requests only (the benchmarks' own).

The expected accept length is ``1 + p + p^2 + ... + p^D`` for chains of ``D`` draft levels (fewer
where the tree's first-child chain is shorter). No host sync: admission writes the request-pool row's
slot with pinned copies; recording and injection are device ops outside the CUDA graphs, one kernel
launch each on CUDA (:mod:`lumotree.sglang.draft_oracle_kernels`).

Hooks (SGLang's ``HookRegistry``, ``AROUND``): ``EagleDraftWorker.draft`` (injection),
``eagle_utils.eagle_sample`` (forcing) and ``EAGLEWorkerV2.forward_batch_generation`` (admission and recording); LumoTree's no-draft decode step
records through :func:`after_step` itself (it does not run SGLang's method).
"""
from __future__ import annotations

import array
import os
import zlib
from typing import Dict, Optional, Sequence, Tuple

import torch

ENV_P = "LUMOTREE_BENCH_DRAFT_ORACLE_P"
SLOTS = 1024  # prompts the table remembers (then the oldest slot is reused)
MAX_LEN = 2048  # output tokens remembered per prompt

DRAFT_TARGET = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft"
SAMPLE_TARGET = "sglang.srt.speculative.eagle_utils.eagle_sample"
STEP_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"


def probability(env=os.environ) -> Optional[float]:
    """The oracle's per-level acceptance probability, or ``None`` when it is off."""
    raw = env.get(ENV_P)
    if raw is None:
        return None
    try:
        p = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_P} must be a probability in [0, 1], got {raw!r}") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{ENV_P} must be a probability in [0, 1], got {raw!r}")
    return p


def prompt_key(tokens: Sequence[int]) -> Tuple[int, int]:
    """``(length, crc32)`` of a prompt's token ids: the table key, the same in every server process."""
    return len(tokens), zlib.crc32(array.array("q", [int(t) for t in tokens]).tobytes())


def uniform(key: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Deterministic uniforms in [0, 1) from int64 ``key`` and position ``idx`` (broadcast): 32-bit
    mixing whose products stay below 2**63, so every device computes the same values."""
    m = 0x5BD1E995  # < 2**31: (value < 2**32) * m < 2**63
    h = ((key.long() & 0xFFFFFFFF) * m) & 0xFFFFFFFF
    h = h ^ (idx.long() & 0xFFFFFFFF)
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 15)) * m) & 0xFFFFFFFF
    h = h ^ (h >> 13)
    return (h & 0xFFFFFF).double() / float(1 << 24)


def wrong(truth: torch.Tensor) -> torch.Tensor:
    """A token id that is not ``truth`` and stays within any vocabulary ``truth`` is in."""
    return torch.where(truth > 0, truth - 1, torch.ones_like(truth))


class DraftOracle:
    """The continuation table (slots x positions, plus a trash slot and column that masked writes go to)
    and each request-pool row's slot and prompt length; see the module docstring."""

    def __init__(self, p: float, rows: int, device, slots: int = SLOTS, max_len: int = MAX_LEN):
        self.p, self.slots, self.max_len = float(p), slots, max_len
        dev = torch.device(device)
        self.cont = torch.zeros(slots + 1, max_len + 1, dtype=torch.int64, device=dev)
        self.filled = torch.zeros(slots + 1, dtype=torch.int64, device=dev)  # output indices < filled are known
        self.slot_key = torch.zeros(slots + 1, dtype=torch.int64, device=dev)
        self.row_slot = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        self.row_plen = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.row_end = torch.zeros(rows, dtype=torch.int64, device=dev)  # outputs the row's request asked for
        self._keys: Dict[Tuple[int, int], int] = {}
        self._next = 0
        self.plan: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # the last injection's, until sampled

    @classmethod
    def of(cls, req_to_token_pool, p: float) -> "DraftOracle":
        """The pool's oracle (one per request pool, made on first use)."""
        oracle = getattr(req_to_token_pool, "lumotree_draft_oracle", None)
        if oracle is None:
            rt = req_to_token_pool.req_to_token
            oracle = cls(p, rt.shape[0], rt.device)
            req_to_token_pool.lumotree_draft_oracle = oracle
        return oracle

    # ------------------------------------------------------------------ host: admission
    def _slot(self, key: Tuple[int, int]) -> Tuple[int, bool]:
        slot = self._keys.get(key)
        if slot is not None:
            return slot, False
        slot = self._next % self.slots
        self._next += 1
        for k in [k for k, s in self._keys.items() if s == slot]:  # reused: the oldest prompt leaves
            del self._keys[k]
        self._keys[key] = slot
        return slot, True

    def admit(self, reqs: Sequence) -> None:
        """Rows of requests entering by prefill: their prompt's slot (a new prompt: an empty slot)."""
        if not reqs:
            return
        rows, slots, plens, ends, keys, fresh = [], [], [], [], [], []
        for req in reqs:
            key = prompt_key(req.origin_input_ids)
            slot, new = self._slot(key)
            rows.append(int(req.req_pool_idx))
            slots.append(slot)
            plens.append(len(req.origin_input_ids))
            limit = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
            ends.append(self.max_len if limit is None else min(int(limit), self.max_len))
            keys.append(key[1])
            fresh.append(new)
        dev = self.cont.device

        def put(values, dtype=torch.int64):
            t = torch.tensor(values, dtype=dtype)
            return (t.pin_memory() if dev.type == "cuda" else t).to(dev, non_blocking=True)

        rows_t, slots_t = put(rows), put(slots)
        self.row_slot[rows_t] = slots_t
        self.row_plen[rows_t] = put(plens)
        self.row_end[rows_t] = put(ends)
        self.slot_key[slots_t] = put(keys)
        # a new prompt in a reused slot starts empty; a known prompt keeps what was recorded
        self.filled[slots_t] = torch.where(put(fresh, torch.bool), torch.zeros_like(slots_t), self.filled[slots_t])

    # ------------------------------------------------------------------ device: recording
    def record(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor,
               accept_lens: Optional[torch.Tensor], stride: int, prefill: bool) -> None:
        """Write what a step produced. Prefill: ``tokens[b]`` is output 0 of row ``b``. Otherwise
        ``tokens`` ``[bs * stride]`` holds each row's accepted run first (``accept_lens[b]`` tokens),
        following the root at output index ``seq_lens[b] - prompt length``. Outputs at or past the row's
        ``max_new_tokens`` are not written (the module docstring: a finished request's extra step). On CUDA
        one kernel launch (:mod:`lumotree.sglang.draft_oracle_kernels`), these torch ops elsewhere."""
        bs = seq_lens.shape[0]
        if bs == 0:
            return
        if self.cont.is_cuda:
            return _kernels().record(self, req_pool_indices, seq_lens, tokens, accept_lens, stride, prefill)
        rows = req_pool_indices[:bs].long()
        slot = self.row_slot[rows]
        if prefill:
            idx = torch.zeros(bs, 1, dtype=torch.long, device=slot.device)
            toks = tokens[:bs].long()[:, None]
            keep = torch.ones(bs, 1, dtype=torch.bool, device=slot.device)
        else:
            toks = tokens[: bs * stride].long().view(bs, stride)
            j = torch.arange(stride, device=slot.device)[None]
            idx = (seq_lens[:bs].long() - self.row_plen[rows])[:, None] + 1 + j
            keep = j < accept_lens[:bs].long()[:, None]
        keep = keep & (slot[:, None] >= 0) & (idx >= 0) & (idx < self.max_len) & (idx < self.row_end[rows][:, None])
        s = torch.where(keep, slot[:, None].expand_as(idx), torch.full_like(idx, self.slots))
        c = torch.where(keep, idx, torch.full_like(idx, self.max_len))
        self.cont.index_put_((s.reshape(-1), c.reshape(-1)), toks.reshape(-1))
        end = torch.where(keep, idx + 1, torch.zeros_like(idx)).amax(1)
        self.filled.scatter_reduce_(0, s[:, 0], end, reduce="amax")  # the trash slot's is never read

    # ------------------------------------------------------------------ device: injection
    def inject(self, draft_token: torch.Tensor, positions: torch.Tensor, next_token: torch.Tensor,
               req_pool_indices: torch.Tensor, levels: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """Rewrite ``draft_token`` ``[bs * N]`` in place (node 0 of each row: the root, kept); the
        tree's depths from ``positions`` ``[bs * N]``, its first children from ``next_token`` ``[bs, N]``
        (SGLang's ``retrieve_next_token``, -1 for none); ``levels``: the draft steps. Returns the
        **forcing plan** ``(node, token)``, each ``[bs, levels + 1]``: at level ``d`` (column ``d - 1``)
        the first-child chain's node of depth ``d - 1`` and the recorded output its greedy choice is
        forced to (:func:`force`) -- for ``d <= k + 1`` where the continuation is known, ``-1`` elsewhere
        and in rows without injection. On CUDA one kernel launch
        (:mod:`lumotree.sglang.draft_oracle_kernels`), these torch ops elsewhere."""
        bs, n = next_token.shape[0], next_token.shape[1]
        if bs == 0 or levels <= 0:
            return None
        if self.cont.is_cuda:
            return _kernels().inject(self, draft_token, positions, next_token, req_pool_indices, levels)
        dev = draft_token.device
        tok = draft_token.view(bs, n)
        pos = positions.view(bs, n).long()
        rows = req_pool_indices[:bs].long()
        slot = self.row_slot[rows]
        sc = slot.clamp(min=0)
        filled = self.filled[sc]
        o = pos[:, 0] - self.row_plen[rows]  # the root's output index
        root_ok = (slot >= 0) & (o >= 0) & (o < filled) & (o < self.max_len)
        root_ok &= self.cont[sc, o.clamp(0, self.max_len - 1)] == tok[:, 0].long()
        d = torch.arange(1, levels + 1, device=dev)[None]
        idx = o[:, None] + d  # [bs, levels]: the output index a level-d draft should hold
        valid = root_ok[:, None] & (idx < filled[:, None]) & (idx < self.max_len)
        truth = self.cont[sc[:, None], idx.clamp(0, self.max_len - 1)]
        succ = valid & (uniform(self.slot_key[sc][:, None], idx) < self.p)
        k = succ.long().cumprod(1).sum(1)  # leading successes
        # the first-child chain: its node at each level (-1 past its end)
        chain, prev = [], torch.zeros(bs, dtype=torch.long, device=dev)
        nt = next_token.long()
        for _ in range(levels):
            nxt = nt.gather(1, prev.clamp(min=0)[:, None]).squeeze(1)
            prev = torch.where(prev >= 0, nxt, torch.full_like(nxt, -1))
            chain.append(prev)
        chain = torch.stack(chain, 1)  # [bs, levels]
        # the forcing plan: level d's parent (the chain node of depth d - 1) and the recorded output d
        parent = torch.cat([torch.zeros(bs, 1, dtype=torch.long, device=dev), chain], 1)  # [bs, levels + 1]
        fidx = o[:, None] + torch.arange(1, levels + 2, device=dev)[None]
        force_ok = (root_ok[:, None] & (parent >= 0) & (fidx < filled[:, None]) & (fidx < self.max_len)
                    & (torch.arange(1, levels + 2, device=dev)[None] <= k[:, None] + 1))
        ftok = self.cont[sc[:, None], fidx.clamp(0, self.max_len - 1)]
        plan = (torch.where(force_ok, parent, -1), torch.where(force_ok, ftok, -1))
        on_chain = torch.zeros(bs, n + 1, dtype=torch.bool, device=dev)
        on_chain.scatter_(1, torch.where(chain >= 0, chain, torch.full_like(chain, n)),
                          torch.ones_like(chain, dtype=torch.bool))
        on_chain = on_chain[:, :n]
        depth = pos - pos[:, :1]
        lvl = (depth - 1).clamp(0, levels - 1)
        truth_at = truth.gather(1, lvl)
        valid_at = valid.gather(1, lvl) & (depth >= 1) & (depth <= levels)
        cur = tok.long()
        new = torch.where(on_chain & valid_at & (depth <= k[:, None]), truth_at, cur)
        clash = valid_at & (new == truth_at) & ~(on_chain & (depth <= k[:, None]))
        new = torch.where(clash, wrong(truth_at), new)
        tok.copy_(new.to(tok.dtype))
        return plan


def _kernels():
    from lumotree.sglang import draft_oracle_kernels

    return draft_oracle_kernels


# ---------------------------------------------------------------------------- hooks
def _oracle_for(batch) -> Optional[DraftOracle]:
    p = probability()
    if p is None or getattr(batch, "req_to_token_pool", None) is None:
        return None
    return DraftOracle.of(batch.req_to_token_pool, p)


def draft(original, self, batch, *args, **kwargs):
    """``EagleDraftWorker.draft`` with the oracle's tokens written into the verify input it returns; the
    forcing plan waits on the oracle for this step's sampling (:func:`sample`)."""
    vi = original(self, batch, *args, **kwargs)
    oracle = _oracle_for(batch)
    if oracle is not None and not batch.forward_mode.is_idle() and getattr(vi, "retrieve_next_token", None) is not None:
        oracle.plan = oracle.inject(vi.draft_token, vi.positions,
                                    vi.retrieve_next_token.view(batch.seq_lens.shape[0], -1),
                                    batch.req_pool_indices, int(vi.spec_steps or 0))
    return vi


def sample(original, verify_input, batch, logits_output, *args, **kwargs):
    """SGLang's ``eagle_sample`` after the verify's logits are forced along the drawn runs (the plan of
    this step's injection: drafting and sampling alternate within a step)."""
    force_planned(verify_input, batch, logits_output)
    return original(verify_input, batch, logits_output, *args, **kwargs)


def force_planned(verify_input, batch, logits_output) -> None:
    """Force the verify's logits along this step's plan (:func:`force`) and forget the plan, so that the
    ``eagle_sample`` after it forces nothing more: LumoTree's post-verify CUDA graphs
    (:mod:`lumotree.sglang.post_verify`) force before their replay, since a plan is a new tensor each step. A no-op
    without the oracle or a plan."""
    oracle = _oracle_for(batch)
    if oracle is None:
        return
    plan, n = oracle.plan, getattr(verify_input, "draft_token_num", None)
    oracle.plan = None
    if plan is not None and n and not batch.forward_mode.is_idle():
        force(logits_output.next_token_logits, plan, int(n))


FORCE_BOOST = 1.0e4  # added to a forced logit: far above the logits of any model here, under softmax too


def force(logits: torch.Tensor, plan: Tuple[torch.Tensor, torch.Tensor], n: int) -> bool:
    """Make the target's greedy choice at each planned node its planned token: ``logits`` ``[bs * n, V]``,
    the verify's, before SGLang samples them; ``plan`` from :meth:`DraftOracle.inject`. One accumulating
    ``index_put_`` (entries without a plan add 0 to their row's root), no host sync. ``False`` (nothing
    forced) when the logits are not the plan's batch."""
    node, tok = plan
    bs = node.shape[0]
    if logits.shape[0] != bs * n:
        return False
    rows = torch.arange(bs, device=node.device)[:, None] * n + node.clamp(min=0)
    cols = tok.clamp(0, logits.shape[-1] - 1)
    vals = torch.where(node >= 0, FORCE_BOOST, 0.0).to(logits.dtype)
    logits.index_put_((rows.reshape(-1), cols.reshape(-1)), vals.reshape(-1), accumulate=True)
    return True


def after_step(batch, out, seq_lens, rows, prefill: bool) -> None:
    """Record what a step produced (``seq_lens`` / ``rows``: the batch's before the step)."""
    oracle = _oracle_for(batch)
    if oracle is None or batch.forward_mode.is_idle() or getattr(out, "next_token_ids", None) is None:
        return
    if prefill:
        oracle.record(rows, seq_lens, out.next_token_ids, None, 1, prefill=True)
    elif getattr(out, "accept_lens", None) is not None:
        oracle.record(rows, seq_lens, out.next_token_ids, out.accept_lens, int(out.speculative_num_draft_tokens),
                      prefill=False)


def forward_batch_generation(original, self, batch, *args, **kwargs):
    """``EAGLEWorkerV2.forward_batch_generation`` with admission before a prefill and recording after
    every step."""
    oracle = _oracle_for(batch)
    prefill = batch.forward_mode.is_extend()
    if oracle is not None and prefill:
        oracle.admit(batch.reqs)
    seq_lens, rows = batch.seq_lens, batch.req_pool_indices
    out = original(self, batch, *args, **kwargs)
    after_step(batch, out, seq_lens, rows, prefill)
    return out


def install() -> None:
    """Register the hooks (when :data:`ENV_P` is set; a bad value fails here, at start-up)."""
    if probability() is None:
        return
    from lumotree.sglang.patches import register_hook

    register_hook(DRAFT_TARGET, draft, "AROUND")
    register_hook(SAMPLE_TARGET, sample, "AROUND")
    register_hook(STEP_TARGET, forward_batch_generation, "AROUND")
