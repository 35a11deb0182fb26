"""Cases of the state-row copy shared by the interpreter run (interpret_kernels.py, CPU) and the GPU test
(test_state_rows_gpu.py): lumotree.ops.state_rows' Triton kernel against its reference."""
import torch


def compare_state_rows(device):
    """Chunk states of the model's dtype (bf16, fp16, fp32) copied into an fp32 pool -- one layer's view of a
    multi-layer pool -- at rows in any order, rows longer than one program's block and shorter; every other pool row
    untouched; the pool copying within itself (SGLang's aligned case); no rows."""
    from lumotree.ops.state_rows import naive, triton as tri

    g = torch.Generator().manual_seed(3)
    for trial, (dt, state) in enumerate([(torch.bfloat16, (3, 40, 36)), (torch.float16, (2, 8, 8)),
                                         (torch.float32, (5, 33, 64)), (torch.bfloat16, (1, 1, 7))]):
        chunks, slots, n = 11, 9, 4
        h = torch.randn(chunks, *state, generator=g).to(dt)
        pool = torch.randn(3, slots, *state, generator=g)  # [layers, slots, ...]: one layer's view is strided by layer
        src_rows = torch.randperm(chunks, generator=g)[:n]
        dst_rows = torch.randperm(slots, generator=g)[:n]
        want = pool.clone()
        naive.copy_state_rows(h, src_rows, want[1], dst_rows)
        got = pool.to(device)
        tri.copy_state_rows(h.to(device), src_rows.to(device), got[1], dst_rows.to(device))
        assert torch.equal(want, got.cpu()), trial
        assert torch.equal(want[1][dst_rows], h[src_rows].float())  # the definition: the rows, cast
        kept = torch.ones(slots, dtype=torch.bool)
        kept[dst_rows] = False
        assert torch.equal(want[1][kept], pool[1][kept]) and torch.equal(want[0], pool[0]), trial
        # within the pool (rows of one tensor: sources and destinations distinct)
        rows = torch.randperm(slots, generator=g)
        want2, got2 = want.clone(), got.clone()
        naive.copy_state_rows(want2[2], rows[:3], want2[2], rows[3:6])
        tri.copy_state_rows(got2[2], rows[:3].to(device), got2[2], rows[3:6].to(device))
        assert torch.equal(want2, got2.cpu()), trial
    tri.copy_state_rows(h.to(device), src_rows[:0].to(device), got[1], dst_rows[:0].to(device))  # no rows
    h, got = torch.randn(6, 2, 3, 4).to(device), torch.zeros(2, 5, 2, 3, 4).to(device)
    src_rows, dst_rows = torch.arange(4).to(device), torch.arange(4).to(device)
    for bad in (lambda: tri.copy_state_rows(h, src_rows, got[1], dst_rows[:2]),  # row counts differ
                lambda: tri.copy_state_rows(h[:, :1], src_rows, got[1], dst_rows),  # row shapes differ
                lambda: tri.copy_state_rows(h.transpose(2, 3), src_rows, got[1].transpose(2, 3), dst_rows)):
        try:
            bad()
        except ValueError:
            continue
        raise AssertionError("a bad argument was accepted")
