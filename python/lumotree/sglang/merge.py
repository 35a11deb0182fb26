"""MTP + suffix branches in one served draft tree (``LUMOTREE_SUFFIX_MERGE=1`` on a LUMOTREE server).

SGLang's EAGLE V2 worker drafts a tree with the model's MTP layer and lays it out as the verify
input (``build_eagle_verify_input``). With the flag, LumoTree rebuilds that input from a merged
tree: per request, the first ``N - S`` nodes of the MTP tree (SGLang numbers them parents first, so
they form a tree) and up to ``S`` nodes of the request's suffix draft
(:class:`lumotree.drafters.suffix.SuffixDrafter`, over prompt + output) united by token path
(:func:`lumotree.drafters.tree_merge.merge_trees`: a path both propose is one node), filled up to
``N`` nodes; ``S`` = ``LUMOTREE_SUFFIX_MERGE_SLOTS`` (default ``N // 2``); a request whose suffix
draft is empty keeps its whole MTP tree. The rebuilt input keeps SGLang's layout: draft tokens
(root first), positions, ``retrieve_*`` links, and the tree cells of the attention mask rewritten in
place (the mask buffer may be the attention backend's, read by a captured graph).

The suffix drafts are made on the host from the requests' token lists, so the host must know the
tokens the last verify accepted: the flag needs ``--disable-overlap-schedule`` (with the overlap
scheduler the host is one step behind; :func:`lumotree.drafters.tree_merge.align_stale` is the
device half of that case, not wired yet). A suffix draft whose root differs from the device's
root (the bonus token) contributes nothing, so a stale draft can cost nodes but never correctness.
Greedy and sampled requests verify as with MTP alone; rejection sampling with draft probabilities
(``--speculative-use-rejection-sampling``) is refused, suffix nodes have none.
"""
from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional, Sequence

import torch

from lumotree.drafters.suffix import make_suffix_drafter
from lumotree.drafters.tree_merge import merge_trees
from lumotree.sglang.scheduling import MERGE_ENV as ENV_FLAG
from lumotree.sglang.scheduling import merge_enabled as enabled
from lumotree.sglang.scheduling import turns_overlap_off
from lumotree.tree import ancestor_mask, eagle_links, parents_from_eagle

logger = logging.getLogger(__name__)

ENV_SLOTS = "LUMOTREE_SUFFIX_MERGE_SLOTS"
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2  # SGLang's TreeMaskMode values


def validate(server_args) -> None:
    """Clear errors for flag combinations the merged tree cannot serve."""
    if not enabled():
        return

    # the plugin turns overlap off itself with the radix cache on (consistent_prefix_cache, applied after this check)
    if not getattr(server_args, "disable_overlap_schedule", False) and not turns_overlap_off(server_args):
        raise ValueError(f"{ENV_FLAG}=1 needs --disable-overlap-schedule: the suffix drafts are made on the "
                         "host and must see the tokens the last verify accepted")
    if getattr(server_args, "speculative_use_rejection_sampling", False):
        raise ValueError(f"{ENV_FLAG}=1 does not support --speculative-use-rejection-sampling "
                         "(suffix branches carry no draft probabilities)")
    slots = os.environ.get(ENV_SLOTS)
    n = server_args.speculative_num_draft_tokens
    if slots is not None and not (slots.isdigit() and 1 <= int(slots) < n):
        raise ValueError(f"{ENV_SLOTS} must be an integer in [1, {n - 1}] (--speculative-num-draft-tokens {n}), "
                         f"got {slots!r}")


# ---------------------------------------------------------------------------- layout (device)
def write_tree_mask(mask: torch.Tensor, anc: torch.Tensor, seq_lens: torch.Tensor, mode: int) -> None:
    """Overwrite the tree cells of SGLang's flattened verify mask in place: ``FULL_MASK`` rows of
    ``seq_len + N`` per draft token, requests one after another (prefix cells untouched);
    ``QLEN_ONLY`` ``N x N`` per request. ``anc`` `[B, N, N]` bool (ancestor or self)."""
    B, N, _ = anc.shape
    dev = anc.device
    i = torch.arange(N, device=dev)
    if mode == QLEN_ONLY:
        base = torch.arange(B, device=dev) * N * N
        idx = base[:, None, None] + i[None, :, None] * N + i[None, None, :]
    elif mode == FULL_MASK:
        sl = seq_lens.to(dev).long()
        start = N * (torch.cumsum(sl, 0) - sl) + torch.arange(B, device=dev) * N * N  # request b's first row
        idx = start[:, None, None] + i[None, :, None] * (sl[:, None, None] + N) + sl[:, None, None] + i[None, None, :]
    else:
        raise NotImplementedError("LUMOTREE_SUFFIX_MERGE: the bit-packed tree mask (QLEN_ONLY_BITPACKING) is not "
                                  "supported; use an attention backend with the full or qlen mask (e.g. triton)")
    mask.view(-1)[idx.flatten()] = anc.flatten().to(mask.dtype)


def _pad_to(tokens, parents, num, n):
    """Fill each request's tree to ``n`` real nodes with extra children of the root repeating its
    first child's token (ordinary candidates to the verification: outputs stay exact)."""
    B = tokens.shape[0]
    idx = torch.arange(n, device=tokens.device)[None, :]
    pad = idx >= num[:, None]
    first_child = torch.where(num > 1, tokens[:, 1], tokens[:, 0])
    tokens = torch.where(pad, first_child[:, None].expand(B, n), tokens)
    parents = torch.where(pad, torch.zeros_like(parents), parents)
    parents[:, 0] = -1
    return tokens, parents


# ---------------------------------------------------------------------------- host state
class SuffixMerge:
    """The suffix tries of the running requests, and the merge into SGLang's verify input."""

    def __init__(self, num_draft_tokens: int, slots: Optional[int] = None, max_match: int = 16,
                 max_spec: int = 16, context: int = 4096, kernel: Optional[bool] = None):
        self.n = num_draft_tokens
        self.slots = slots if slots is not None else int(os.environ.get(ENV_SLOTS, max(1, num_draft_tokens // 2)))
        if not 1 <= self.slots < num_draft_tokens:
            raise ValueError(f"suffix slots must be in [1, {num_draft_tokens - 1}], got {self.slots}")
        self.drafter = make_suffix_drafter(max_match=max_match, max_spec=max_spec)
        self.max_depth = max_spec
        self.kernel = kernel  # the fused Triton merge + layout (default: on CUDA tensors)
        self.context = context
        self._seen: Dict[object, int] = {}  # tokens of the request's context already indexed
        self._prompt: Dict[object, int] = {}  # where its output starts (for the global cache)
        self.steps = 0
        self.suffix_draft_nodes = 0

    def observe(self, rid, tokens: Sequence[int]) -> None:
        """Feed a request's full token list (prompt + output so far); only the new tail is indexed."""
        seen = self._seen.get(rid)
        if seen is None or seen > len(tokens):
            self.drafter.start(rid, list(tokens[-self.context:]))
            self._prompt[rid] = min(len(tokens), self.context)
        elif len(tokens) > seen:
            self.drafter.append(rid, list(tokens[seen:]))
        self._seen[rid] = len(tokens)

    def forget(self, active: Sequence[object]) -> None:
        """Retire requests no longer running; their outputs join the drafter's global cache."""
        keep = set(active)
        for rid in [r for r in self._seen if r not in keep]:
            self._seen.pop(rid)
            ctx = self.drafter.context(rid)
            self.drafter.finish(rid, ctx[self._prompt.pop(rid, len(ctx)):])

    def suffix_tensors(self, rids: Sequence[object], device):
        """The requests' suffix drafts as a padded batch (host-built, copied without blocking)."""
        drafts = [_cap_depth(self.drafter.draft(r, self.slots + 1), self.max_depth) for r in rids]
        M = max(2, 1 << self.slots.bit_length())  # >= slots + 1, a power of two (the kernel's)
        # padded host lists, one tensor each (not three small tensors per request)
        tok = torch.tensor([d.tokens + [0] * (M - len(d)) for d in drafts], dtype=torch.long)
        par = torch.tensor([d.parents + [-1] * (M - len(d)) for d in drafts], dtype=torch.long)
        sc = torch.tensor([d.scores + [0.0] * (M - len(d)) for d in drafts], dtype=torch.float32)
        num = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        pin = torch.cuda.is_available() and torch.device(device).type == "cuda"
        out = [t.pin_memory() if pin else t for t in (tok, par, sc, num)]
        return [t.to(device, non_blocking=True) for t in out], num

    def merge(self, verify_input, seq_lens: torch.Tensor, mask_mode: int, rids: Sequence[object],
              contexts: Sequence[Sequence[int]], fill_mask: bool = True) -> None:
        """Rebuild ``verify_input`` (SGLang's EagleVerifyInput, fields modified in place) from the MTP
        tree it holds merged with the requests' suffix drafts."""
        for rid, toks in zip(rids, contexts):
            self.observe(rid, toks)
        self.forget(rids)
        B, N = len(rids), self.n
        dev = verify_input.draft_token.device
        (s_tok, s_par, s_sc, s_num), s_num_host = self.suffix_tensors(rids, dev)
        keep_mtp = torch.where(s_num > 1, N - self.slots, N)
        self.steps += 1
        self.suffix_draft_nodes += int((s_num_host - 1).clamp(min=0).sum())  # host-side count, no device sync
        if self.kernel if self.kernel is not None else dev.type == "cuda":
            from lumotree.drafters.tree_merge_triton import tree_merge_layout_fwd

            tree_merge_layout_fwd(verify_input.draft_token, verify_input.retrieve_next_token,
                                  verify_input.retrieve_next_sibling, keep_mtp, (s_tok, s_par, s_sc * 0.999, s_num),
                                  seq_lens.to(dev), verify_input.positions, verify_input.custom_mask, mask_mode,
                                  write_mask=fill_mask)
            return
        m_tok = verify_input.draft_token.view(B, N).long()
        m_par = parents_from_eagle(verify_input.retrieve_next_token.view(B, N),
                                   verify_input.retrieve_next_sibling.view(B, N))
        # MTP's first N - S nodes (all N without a suffix draft) rank first, then the suffix nodes
        # (their path probability, < 1), then the rest of the MTP tree fills what is left
        first = torch.arange(N, device=dev)[None, :] < keep_mtp[:, None]
        m_sc = torch.where(first, 1.0, 1e-3).to(torch.float32)
        full = torch.full((B,), N, dtype=torch.long, device=dev)
        tok, par, _, num = merge_trees([(m_tok, m_par, m_sc, full), (s_tok, s_par, s_sc * 0.999, s_num)], N,
                                       max_depth=self.max_depth)
        tok, par = _pad_to(tok, par, num, N)
        first, nxt = eagle_links(par)
        anc = ancestor_mask(par)
        depth = anc.sum(2) - 1
        verify_input.draft_token.copy_(tok.flatten().to(verify_input.draft_token.dtype))
        verify_input.positions.copy_((seq_lens.to(dev).long()[:, None] + depth).flatten()
                                     .to(verify_input.positions.dtype))
        verify_input.retrieve_next_token.copy_(first.view_as(verify_input.retrieve_next_token)
                                               .to(verify_input.retrieve_next_token.dtype))
        verify_input.retrieve_next_sibling.copy_(nxt.view_as(verify_input.retrieve_next_sibling)
                                                 .to(verify_input.retrieve_next_sibling.dtype))
        if fill_mask and verify_input.custom_mask is not None:
            write_tree_mask(verify_input.custom_mask, anc, seq_lens, mask_mode)


def _cap_depth(draft, max_depth: int):
    """The draft without nodes deeper than ``max_depth`` below the root (parents precede children)."""
    from lumotree.drafters.suffix import Draft

    depth, keep, new = [], [], {}
    for i, p in enumerate(draft.parents):
        depth.append(0 if p < 0 else depth[p] + 1)
        if depth[i] <= max_depth and (p < 0 or p in new):
            new[i] = len(keep)
            keep.append(i)
    return Draft([draft.tokens[i] for i in keep], [new[draft.parents[i]] if draft.parents[i] >= 0 else -1 for i in keep],
                 [draft.scores[i] for i in keep])


_STATE: Optional[SuffixMerge] = None


def state(num_draft_tokens: int, num_steps: int) -> SuffixMerge:
    """The server's merge state; suffix branches no deeper than the MTP steps (SGLang sizes the
    accepted path to ``num_steps + 1`` tokens, deeper nodes could never be accepted)."""
    global _STATE
    if _STATE is None or _STATE.n != num_draft_tokens:
        _STATE = SuffixMerge(num_draft_tokens, max_spec=num_steps)
        logger.info("LumoTree: MTP + suffix branches in one tree (%s=1): %d of %d draft nodes for suffix "
                    "branches", ENV_FLAG, _STATE.slots, num_draft_tokens)
    return _STATE


class _Context:
    """A request's prompt + output as one sequence without copying them: ``SuffixMerge.observe``
    reads its length and a tail slice every step, and a context is thousands of tokens."""

    __slots__ = ("prompt", "output")

    def __init__(self, prompt, output):
        self.prompt, self.output = prompt, output

    def __len__(self):
        return len(self.prompt) + len(self.output)

    def __getitem__(self, sl: slice) -> List[int]:
        start = range(len(self))[sl].start if len(self) else 0
        p = len(self.prompt)
        head = list(self.prompt[start:]) if start < p else []
        return head + list(self.output[max(0, start - p):])


def request_tokens(req) -> _Context:
    """A running request's context as the host knows it: prompt + output so far (not copied)."""
    return _Context(req.origin_input_ids, req.output_ids)
