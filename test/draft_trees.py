"""SGLang's EAGLE draft-tree selection on CPU (its own ``_select_top_k_tokens_first`` / ``_later`` and
``organize_draft_results``), with the rule of its ``build_tree`` kernel: a selected node whose parent
is not selected is an orphan ("invalid eagle tree")."""
import torch


def _uncompiled(f):
    return getattr(f, "_torchdynamo_orig_callable", f)


def select(topk_p, topk_index, steps, num_draft_tokens, step_probs, organize=None):
    """``(parent_list, selected)`` of one draft: the first level from ``topk_p`` / ``topk_index``
    ``[bs, topk]``, then ``step_probs(i)`` ``[bs * topk, vocab]`` as the draft model's distributions."""
    from sglang.srt.speculative import eagle_utils, spec_utils

    organize = organize or eagle_utils.organize_draft_results
    topk = topk_p.shape[1]
    later = _uncompiled(spec_utils._select_top_k_tokens_later)
    _, _, scores, info = spec_utils._select_top_k_tokens_first(topk_p, topk_index, None, topk)
    score_list, token_list, parents_list = [info[0]], [info[1]], [info[2]]
    for i in range(1, steps):
        p, idx = step_probs(i).topk(topk, -1)
        _, _, scores, info = later(i, p, idx, None, scores, topk)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
    parent_list, selected, _ = organize(score_list, token_list, parents_list, num_draft_tokens)
    return parent_list, selected


def orphans(parent_list, selected, topk):
    """Per request: selected nodes whose parent is neither the root nor selected."""
    out = []
    for b in range(selected.shape[0]):
        sel = set(selected[b].tolist())
        out.append(sum(1 for s in sel if s >= topk and int(parent_list[b, s // topk]) not in sel))
    return out


def softmaxes(bs, topk, vocab=64, seed=0, temperature=3.0):
    """``step_probs`` of random softmaxes (every probability below 1, as a model's are)."""
    g = torch.Generator().manual_seed(seed)
    return lambda i: torch.softmax(temperature * torch.randn(bs * topk, vocab, generator=g), -1)
