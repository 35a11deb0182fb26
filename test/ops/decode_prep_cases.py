"""Cases of a no-draft decode step's preparation shared by the interpreter run (interpret_kernels.py, CPU) and the GPU
test (test_decode_prep_gpu.py): lumotree.ops.decode_prep's Triton kernel and CUDA op against its reference."""
import importlib

import torch


def compare_decode_prep(device, impl="triton"):
    """Slots looked up at each request's length, lengths + 1 in their dtype, the draft KV rows at those slots zeroed
    and no other row touched: rows in any order, int32 and int64 lengths, a request-pool map with padding columns, KV
    rows longer than one block, one and two (k, v) buffer pairs and none, float and byte buffers."""
    from lumotree.ops.decode_prep import naive

    tri = importlib.import_module(f"lumotree.ops.decode_prep.{impl}")  # "triton" or "cuda"

    g = torch.Generator().manual_seed(5)
    for trial in range(6):
        rows_n, ctx, slots, bs = 9, 30, 300, 5
        r2t = torch.randperm(slots, generator=g)[: rows_n * ctx].view(rows_n, ctx).to(torch.int32)
        r2t = torch.cat([r2t, torch.full((rows_n, 8), -7, dtype=torch.int32)], 1)[:, :ctx]  # rows with a padded stride
        rows = torch.randperm(rows_n, generator=g)[:bs]
        seq = torch.randint(0, ctx, (bs,), generator=g).to(torch.int32 if trial % 2 else torch.int64)
        dt = (torch.float32, torch.float16, torch.uint8)[trial % 3]
        pairs = [(torch.randn(slots, 2, 700, generator=g).to(dt), torch.randn(slots, 3, 64, generator=g).to(dt))
                 for _ in range(trial % 3)]
        want_pairs = [(k.clone(), v.clone()) for k, v in pairs]
        loc1, new1 = naive.decode_prep(r2t, rows, seq, want_pairs)
        on = [(k.to(device), v.to(device)) for k, v in pairs]
        loc2, new2 = tri.decode_prep(r2t.to(device), rows.to(device), seq.to(device), on)
        assert loc2.dtype == torch.int64 and torch.equal(loc1, loc2.cpu()), (trial, loc1, loc2)
        assert new2.dtype == seq.dtype and torch.equal(new1, new2.cpu()) and torch.equal(new1, seq + 1), trial
        assert torch.equal(loc1, r2t[rows.long(), seq.long()].long())
        for (k1, v1), (k2, v2), (k0, v0) in zip(want_pairs, on, pairs):
            assert torch.equal(k1, k2.cpu()) and torch.equal(v1, v2.cpu()), trial
            zeroed = torch.zeros(slots, dtype=torch.bool)
            zeroed[loc1] = True
            assert not k1[zeroed].any() and torch.equal(k1[~zeroed], k0[~zeroed])  # only the step's slots
    loc, new = tri.decode_prep(r2t.to(device), rows[:0].to(device), seq[:0].to(device))
    assert loc.shape == new.shape == (0,)
