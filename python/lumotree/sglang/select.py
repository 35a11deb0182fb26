"""LumoTree's fused selection as SGLang's greedy tree verification (LUMOTREE servers).

``verify_tree_greedy`` has the signature and the outputs of SGLang 0.5.17's
``sglang.srt.speculative.eagle_utils.verify_tree_greedy_func`` (``predicts`` flat `[B*N]`: the
target's token after every accepted node; ``accept_index`` `[B, W]`: flat indices of the accepted
path, root first, ``-1`` padded; ``accept_token_num`` `[B]`: accepted drafts, root excluded), and
computes them on CUDA with ``torch.ops.lumotree.verify_tree_greedy_sglang`` (one launch: the tree walked
on the device straight from SGLang's first-child / next-sibling links, SGLang's outputs written by the
kernel; it replaced the selection op plus ~13 eager gathers and scatters, a third of a LUMOTREE step's
eager launches at batch 1 on the H200). No host synchronisation. Without the CUDA extension: LumoTree's
torch fallback of the selection.
Installed by :mod:`lumotree.sglang.patches.gdn_backend_classes` together with the backend.
"""
from __future__ import annotations

import torch

from lumotree.tree import TreeDescriptor, parents_from_eagle


def _accept(candidates, target_predict, next_token, next_sibling):
    """The torch fallback's walk: (accept_len [B] incl. the root, accept_nodes [B, N] root first, -1 padded)."""
    B, N = candidates.shape
    from lumotree.ops import tree_select_greedy

    # as the CUDA walk reads the links: forward ones only (a malformed tree from SGLang's builder), and a
    # node no link reaches is never accepted (here: a root child whose token matches nothing)
    idx = torch.arange(N, device=candidates.device)[None]
    nt = torch.where(next_token.long() > idx, next_token.long(), -1)
    ns = torch.where(next_sibling.long() > idx, next_sibling.long(), -1)
    par = parents_from_eagle(nt, ns)
    lost = (par < 0) & (idx > 0)
    cand = torch.where(lost, -1, candidates.long())
    tree = TreeDescriptor.from_parents(torch.where(lost, 0, par), validate=False)
    accept_len, accept_nodes, _ = tree_select_greedy(cand, target_predict.long(), tree)
    return accept_len.to(candidates.device), accept_nodes.to(candidates.device)


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                       retrieve_next_sibling, target_predict, topk: int = -1):
    """Drop-in for SGLang's ``verify_tree_greedy_func`` (outputs written in place and returned). On CUDA with
    the extension built and SGLang's dtypes: ``torch.ops.lumotree.verify_tree_greedy_sglang``, one launch that
    writes SGLang's outputs itself; elsewhere LumoTree's torch selection plus gathers and scatters."""
    from lumotree.ops.select import cuda

    if (candidates.is_cuda and cuda.available() and predicts.dtype == accept_index.dtype == accept_token_num.dtype
            == torch.int32 and all(t.dtype == torch.int64 for t in (candidates, retrieve_index, retrieve_next_token,
                                                                    retrieve_next_sibling, target_predict))):
        torch.ops.lumotree.verify_tree_greedy_sglang(
            predicts, accept_index, accept_token_num, candidates.contiguous(), retrieve_index.contiguous(),
            retrieve_next_token.contiguous(), retrieve_next_sibling.contiguous(), target_predict.contiguous())
        return predicts, accept_index, accept_token_num
    B, N = candidates.shape
    W = accept_index.shape[1]
    accept_len, accept_nodes = _accept(candidates, target_predict, retrieve_next_token, retrieve_next_sibling)
    nodes = accept_nodes[:, :W]
    valid = torch.arange(W, device=nodes.device)[None, :] < accept_len[:, None]
    nodes = torch.where(valid, nodes, torch.zeros_like(nodes))  # padding points at the root: rewrites its value
    flat = retrieve_index.long().gather(1, nodes)
    accept_index.copy_(torch.where(valid, flat, torch.full_like(flat, -1)).to(accept_index.dtype))
    accept_token_num.copy_((accept_len - 1).to(accept_token_num.dtype))
    predicts.scatter_(0, flat.reshape(-1), target_predict.long().gather(1, nodes).reshape(-1).to(predicts.dtype))
    return predicts, accept_index, accept_token_num
