"""Cases of the device finish rule shared by the interpreter run (interpret_kernels.py, CPU) and the
GPU test (test_finish_gpu.py): the Triton kernels and CUDA ops of lumotree.ops.finish against its reference."""
import importlib

import torch


def compare_finish_rule(device, impl="triton"):
    """The device finish rule's kernels vs its reference: stop hits inside and past the accepted run,
    length limits, rows the rule does not cover, marks that stay, int32 and int64 token ids. ``impl``: the module
    of the mark and mask under test, "triton" or "cuda" (the run's clamp is Triton's either way)."""
    from lumotree.ops.finish import naive as fin_naive, triton as fin_tri

    fin_impl = importlib.import_module(f"lumotree.ops.finish.{impl}")

    g = torch.Generator().manual_seed(11)

    def on(*ts):
        return [t.to(device) for t in ts]

    slots, S = 12, 16
    cuts = marks = 0
    for trial in range(6):
        stop = torch.full((slots, S), -1, dtype=torch.int64)
        for r in range(slots):
            n = int(torch.randint(0, 4, (1,), generator=g))
            stop[r, :n] = torch.randint(0, 8, (n,), generator=g)
        max_len = torch.randint(20, 30, (slots,), generator=g)
        ruled = torch.rand(slots, generator=g) < 0.8
        done = torch.rand(slots, generator=g) < 0.2
        bs, stride = 7, 4
        rows = torch.randperm(slots, generator=g)[:bs]
        dt = torch.int32 if trial % 2 else torch.int64
        tokens = torch.randint(0, 24, (bs * stride,), generator=g).to(dt)
        acc = torch.randint(1, stride + 1, (bs,), generator=g).to(torch.int32)
        seq = torch.randint(16, 30, (bs,), generator=g)
        d1, d2 = done.clone(), done.clone().to(device)
        # with the step's live rows on every other trial (written in the same launch), without on the others
        live1 = torch.zeros(bs + 2, dtype=torch.bool) if trial % 2 == 0 else None
        live2 = torch.ones(bs + 2, dtype=torch.bool, device=device) if live1 is not None else None
        fin_naive.mark_finished(d1, stop, max_len, ruled, rows, tokens, acc, seq + acc, stride, live1)
        fin_impl.mark_finished(d2, *on(stop, max_len, ruled, rows, tokens, acc, seq + acc), stride, live2)
        assert torch.equal(d1, d2.cpu()), (trial, d1, d2)
        if live1 is not None:
            assert torch.equal(live1[:bs], ~d1[rows]), (trial, live1, d1)  # still running after the step
            assert torch.equal(live1[:bs], live2[:bs].cpu()) and live2[bs:].all(), (trial, live1, live2)
        n_nodes = 5
        predict = torch.randint(0, 24, (bs * n_nodes,), generator=g).to(dt)
        index = torch.full((bs, stride), -1, dtype=torch.int32 if trial % 2 else torch.int64)
        for b in range(bs):
            index[b, :int(acc[b])] = b * n_nodes + torch.randperm(n_nodes, generator=g)[:int(acc[b])].to(index.dtype)
        i1, i2 = index.clone(), index.clone().to(device)
        l1 = fin_naive.clamp_run(stop, max_len, ruled, rows, seq, predict, acc, i1)
        l2 = fin_tri.clamp_run(*on(stop, max_len, ruled, rows, seq, predict, acc), i2)
        assert l1.dtype == l2.dtype and torch.equal(l1, l2.cpu()), (trial, l1, l2)
        assert torch.equal(i1, i2.cpu()), (trial, i1, i2)
        cuts += int((l1 < acc).sum())
        marks += int((d1 & ~done).sum())
    assert cuts > 0 and marks > 0, (cuts, marks)  # the draws exercised both rules
    compare_mask_finished(device, impl)


def compare_mask_finished(device, impl="triton"):
    """The finished-row mask of the state indices: kernel vs reference, int32 and int64 indices and rows, a
    strided index view, more rows than one program holds, and rows past the shorter of the two left alone."""
    from lumotree.ops.finish import naive as fin_naive

    fin_impl = importlib.import_module(f"lumotree.ops.finish.{impl}")

    g = torch.Generator().manual_seed(5)
    slots = 700
    done = torch.rand(slots, generator=g) < 0.3
    masked = 0
    for trial, (n_rows, n_idx) in enumerate(((1, 1), (7, 9), (300, 300), (600, 520), (40, 30))):
        idx_dt = torch.int32 if trial % 2 else torch.int64
        row_dt = torch.int64 if trial % 3 else torch.int32
        rows = torch.randperm(slots, generator=g)[:n_rows].to(row_dt)
        base = torch.randint(0, 1000, (n_idx * 2,), generator=g).to(idx_dt)
        b1, b2 = base.clone(), base.clone().to(device)
        i1, i2 = (b1[::2], b2[::2]) if trial == 1 else (b1[:n_idx], b2[:n_idx])  # a strided view on one trial
        fin_naive.mask_finished(i1, done, rows)
        fin_impl.mask_finished(i2, done.to(device), rows.to(device))
        assert torch.equal(b1, b2.cpu()), (trial, b1, b2)  # the whole buffer: nothing written outside the view
        n = min(n_rows, n_idx)
        assert torch.equal(i1[n:], (base[::2] if trial == 1 else base[:n_idx])[n:])  # past the rows: unchanged
        masked += int((i1[:n] == -1).sum())
    assert masked > 100, masked
