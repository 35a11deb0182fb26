"""The fused merge + layout kernel (Triton interpreter) == the torch path of SuffixMerge, on random
MTP trees and suffix drafts (called by test_tree_merge_kernel.py in a subprocess: TRITON_INTERPRET
must be set before triton is imported)."""
import os
import random
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sglang"))

import torch  # noqa: E402

from lumotree.sglang import merge  # noqa: E402
from test_merge import fake_verify_input  # noqa: E402
from test_tree_merge import random_draft  # noqa: E402


def run(seed, N, slots, mode):
    rng = random.Random(seed)
    B = 4
    par = torch.tensor([[-1] + [rng.randrange(i) for i in range(1, N)] for _ in range(B)])
    tok = torch.tensor([[rng.randrange(4) for _ in range(N)] for _ in range(B)])
    tok[:, 0] = 7
    for b in range(B):  # distinct sibling tokens, as EAGLE's top-k gives
        for i in range(1, N):
            while any(par[b, j] == par[b, i] and tok[b, j] == tok[b, i] for j in range(1, i)):
                tok[b, i] += 4
    seq = torch.tensor([rng.randint(1, 30) for _ in range(B)])
    drafts = [random_draft(rng, rng.randint(1, slots + 1), 4, 7 if b != 2 else 8) for b in range(B)]  # 2: other root
    results = []
    for kernel in (False, True):
        vi = fake_verify_input(par, tok, seq)
        if mode == merge.QLEN_ONLY:
            vi.custom_mask = torch.zeros(B * N * N, dtype=torch.bool)
        m = merge.SuffixMerge(N, slots=slots, max_spec=N, kernel=kernel)
        m.drafter.draft = lambda rid, budget: drafts[int(rid)]
        m.observe = lambda rid, toks: None
        m.forget = lambda rids: None
        m.merge(vi, seq, mode, [str(b) for b in range(B)], [[0]] * B)
        results.append(vi)
    a, k = results
    for name in ("draft_token", "positions", "retrieve_next_token", "retrieve_next_sibling", "custom_mask"):
        assert torch.equal(getattr(a, name), getattr(k, name)), (seed, N, slots, mode, name,
                                                                 getattr(a, name), getattr(k, name))


for seed in range(6):
    for N, slots in ((4, 1), (6, 3), (8, 4), (16, 7)):
        for mode in (merge.FULL_MASK, merge.QLEN_ONLY):
            run(seed, N, slots, mode)
print("tree merge kernel == torch path")
