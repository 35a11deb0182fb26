"""Public LumoTree ops. One dispatch point: CUDA tensors use the fused kernels (Triton, and the
CUDA C++ extension when it is built: selection, and the decode step's small kernels -- the finish rule's mark and
mask, the no-draft step's preparation -- whose launch cost is the host's on every step), everything else the fp32
references.

``LUMOTREE_OPS=naive`` forces the references everywhere (debugging, bisecting a kernel).
"""
from __future__ import annotations

import functools
import os

import torch

from lumotree.ops.commit.naive import CommitPlan, commit_plan
from lumotree.ops.conv_tree import naive as _conv_naive
from lumotree.ops.decode_prep import naive as _prep_naive
from lumotree.ops.finish import naive as _finish_naive
from lumotree.ops.gdn_tree import naive as _gdn_naive
from lumotree.ops.select import naive as _select_naive
from lumotree.ops.state_rows import naive as _rows_naive
from lumotree.ops.select.naive import probs_from_logits
from lumotree.ops.tree_attention import naive as _attn_naive

__all__ = [
    "gdn_tree_verify", "gdn_tree_verify_per_node", "gdn_tree_commit", "conv_tree_verify",
    "conv_tree_commit", "tree_select_greedy", "tree_select_sample", "commit_plan", "CommitPlan",
    "probs_from_logits", "backend_for", "tree_select_and_plan", "mark_finished", "mask_finished", "clamp_run",
    "tree_verify_attention", "decode_prep", "copy_state_rows",
]


def backend_for(device: torch.device) -> str:
    """'triton' for CUDA tensors (unless LUMOTREE_OPS=naive), else 'naive'."""
    forced = os.environ.get("LUMOTREE_OPS", "").strip().lower()
    if forced not in ("", "naive", "triton"):
        raise ValueError(f"LUMOTREE_OPS must be 'naive' or 'triton', got {forced!r}")
    if forced == "naive" or torch.device(device).type != "cuda":
        return "naive"
    return "triton"


@functools.cache
def cuda_op(name: str) -> bool:
    """Whether the CUDA extension is built with op ``name`` registered (``torch.ops.lumotree.<name>``)."""
    try:
        import lumotree._C  # noqa: F401  (registers torch.ops.lumotree.*)
    except ImportError:
        return False
    return hasattr(torch.ops.lumotree, name)


def _fused(module: str):
    import importlib

    return importlib.import_module(f"lumotree.ops.{module}")


def gdn_tree_verify(q, k, v, g, beta, state, tree, scale=None, use_qk_l2norm=False, state_indices=None):
    if backend_for(state.device) == "triton":
        return _fused("gdn_tree.triton").gdn_tree_verify(q, k, v, g, beta, state, tree, scale, use_qk_l2norm,
                                                          state_indices)
    return _gdn_naive.gdn_tree_verify(q, k, v, g, beta, state, tree, scale, use_qk_l2norm, state_indices)


gdn_tree_verify.__doc__ = _gdn_naive.gdn_tree_verify.__doc__
gdn_tree_verify_per_node = _gdn_naive.gdn_tree_verify_per_node


def gdn_tree_commit(k, v, g, beta, state, tree, accept_nodes, accept_len, use_qk_l2norm=False,
                    state_indices=None, track_rows=None, track_len=None):
    if backend_for(state.device) == "triton":
        return _fused("gdn_tree.triton").gdn_tree_commit(k, v, g, beta, state, tree, accept_nodes, accept_len,
                                                          use_qk_l2norm, state_indices, track_rows, track_len)
    return _gdn_naive.gdn_tree_commit(k, v, g, beta, state, tree, accept_nodes, accept_len, use_qk_l2norm,
                                      state_indices, track_rows, track_len)


gdn_tree_commit.__doc__ = _gdn_naive.gdn_tree_commit.__doc__


def conv_tree_verify(x, conv_state, weight, bias, tree, activation="silu", state_indices=None):
    if backend_for(x.device) == "triton":
        return _fused("conv_tree.triton").conv_tree_verify(x, conv_state, weight, bias, tree, activation,
                                                            state_indices)
    return _conv_naive.conv_tree_verify(x, conv_state, weight, bias, tree, activation, state_indices)


def conv_tree_commit(x, conv_state, tree, accept_nodes, accept_len, state_indices=None):
    if backend_for(x.device) == "triton":
        return _fused("conv_tree.triton").conv_tree_commit(x, conv_state, tree, accept_nodes, accept_len,
                                                            state_indices)
    return _conv_naive.conv_tree_commit(x, conv_state, tree, accept_nodes, accept_len, state_indices)


def tree_select_and_plan(draft_tokens, target, tree, *, greedy, coins=None, coins_final=None, cache_slots=None,
                         conv_width=1, generator=None):
    """Acceptance + commit plan, no host sync: the CUDA extension on CUDA tensors when built, else
    the static-shaped torch fallback (CPU too). Returns ``(bonus, CommitPlan)``."""
    if backend_for(draft_tokens.device) == "triton":
        return _fused("select.cuda").tree_select_and_plan(draft_tokens, target, tree, greedy=greedy, coins=coins,
                                                          coins_final=coins_final, cache_slots=cache_slots,
                                                          conv_width=conv_width, generator=generator)
    from lumotree.ops.select import fallback

    if not greedy:
        coins = coins if coins is not None else torch.rand(*draft_tokens.shape, generator=generator)
        coins_final = coins_final if coins_final is not None else torch.rand(draft_tokens.shape[0], generator=generator)
    return fallback.tree_select_and_plan(draft_tokens, target, tree, greedy=greedy, coins=coins,
                                         coins_final=coins_final, cache_slots=cache_slots, conv_width=conv_width)


def tree_select_greedy(draft_tokens, target_tokens, tree):
    if backend_for(draft_tokens.device) == "triton":
        return _fused("select.cuda").tree_select_greedy(draft_tokens, target_tokens, tree)
    return _select_naive.tree_select_greedy(draft_tokens, target_tokens, tree)


def tree_select_sample(draft_tokens, target_probs, tree, coins=None, coins_final=None, generator=None):
    if backend_for(draft_tokens.device) == "triton":
        return _fused("select.cuda").tree_select_sample(draft_tokens, target_probs, tree, coins, coins_final,
                                                         generator)
    return _select_naive.tree_select_sample(draft_tokens, target_probs, tree, coins, coins_final, generator)


def mark_finished(done, stop, max_len, ruled, req_pool_indices, next_token_ids, accept_lens, new_seq_lens, stride,
                  live=None):
    if backend_for(done.device) == "triton":
        impl = _fused("finish.cuda" if cuda_op("mark_finished") else "finish.triton")
        return impl.mark_finished(done, stop, max_len, ruled, req_pool_indices, next_token_ids, accept_lens,
                                  new_seq_lens, stride, live)
    return _finish_naive.mark_finished(done, stop, max_len, ruled, req_pool_indices, next_token_ids, accept_lens,
                                       new_seq_lens, stride, live)


def decode_prep(req_to_token, req_pool_indices, seq_lens, zero_kv=()):
    if backend_for(seq_lens.device) == "triton":
        impl = _fused("decode_prep.cuda" if cuda_op("decode_prep") else "decode_prep.triton")
        return impl.decode_prep(req_to_token, req_pool_indices, seq_lens, zero_kv)
    return _prep_naive.decode_prep(req_to_token, req_pool_indices, seq_lens, zero_kv)


decode_prep.__doc__ = _prep_naive.decode_prep.__doc__


def copy_state_rows(src, src_rows, dst, dst_rows):
    if backend_for(dst.device) == "triton":
        return _fused("state_rows.triton").copy_state_rows(src, src_rows, dst, dst_rows)
    return _rows_naive.copy_state_rows(src, src_rows, dst, dst_rows)


copy_state_rows.__doc__ = _rows_naive.copy_state_rows.__doc__


def clamp_run(stop, max_len, ruled, req_pool_indices, seq_lens, predict, accept_lens, accept_index):
    if backend_for(stop.device) == "triton":
        return _fused("finish.triton").clamp_run(stop, max_len, ruled, req_pool_indices, seq_lens, predict,
                                                 accept_lens, accept_index)
    return _finish_naive.clamp_run(stop, max_len, ruled, req_pool_indices, seq_lens, predict, accept_lens,
                                   accept_index)


def mask_finished(state_indices, done, req_pool_indices):
    if backend_for(done.device) == "triton":
        impl = _fused("finish.cuda" if cuda_op("mask_finished") else "finish.triton")
        return impl.mask_finished(state_indices, done, req_pool_indices)
    return _finish_naive.mask_finished(state_indices, done, req_pool_indices)


mark_finished.__doc__ = _finish_naive.mark_finished.__doc__
mask_finished.__doc__ = _finish_naive.mask_finished.__doc__
clamp_run.__doc__ = _finish_naive.clamp_run.__doc__


def tree_verify_attention(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, anc=None, scale=None):
    if backend_for(q.device) == "triton":
        return _fused("tree_attention.triton").tree_verify_attention(q, k, v, k_buffer, v_buffer, kv_indptr,
                                                                      kv_indices, anc, scale)
    return _attn_naive.tree_verify_attention(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, anc, scale)


tree_verify_attention.__doc__ = _attn_naive.tree_verify_attention.__doc__
