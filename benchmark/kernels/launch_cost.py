"""Host time per launch of the small kernels on a LUMOTREE no-draft step -- the finish rule's mark and mask, the step's
preparation -- each as its CUDA C++ op (the extension's, ``torch.ops.lumotree``), its Triton kernel and its torch
reference (several eager ops), on the same inputs in one process: what the host pays per step where the step is
host-bound (the Qwen3-Next MoE shape's batch 1, where
LUMOTREE's host launch work was 1.62 against no speculation's 1.08 ms a step, the finish rule's mark alone 0.076 ms:
``benchmark/results/serving_speed_moe_flags_alone_h100.json``). Host microseconds per call (perf_counter around 2000
calls without a sync, median of 9 rounds; the device is synced between rounds), and the device microseconds per call
(CUDA events).

    python3 benchmark/kernels/launch_cost.py --batch 1 --out benchmark/results/launch_cost_h100.json
"""
import argparse
import json
import statistics
import time

import torch

from report import emit


def host_us(fn, calls=2000, rounds=9):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) * 1e6 / calls)
        b.record()
        b.synchronize()
        dev.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(host), statistics.median(dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from lumotree import ops
    from lumotree.ops.decode_prep import cuda as prep_cuda, naive as prep_naive, triton as prep_tri
    from lumotree.ops.finish import cuda as fin_cuda, naive as fin_naive, triton as fin_tri

    if not (ops.cuda_op("mark_finished") and ops.cuda_op("decode_prep")):
        raise SystemExit("launch_cost: the CUDA extension with the step ops is not built (pip install "
                         "--no-build-isolation -e . with nvcc)")

    dev, bs, slots, S = "cuda", args.batch, 256, 16
    stop = torch.full((slots, S), -1, dtype=torch.int64, device=dev)
    stop[:, 0] = 7
    max_len = torch.full((slots,), 10 ** 6, dtype=torch.int64, device=dev)
    ruled = torch.ones(slots, dtype=torch.bool, device=dev)
    done = torch.zeros(slots, dtype=torch.bool, device=dev)
    rows = torch.arange(bs, dtype=torch.int64, device=dev)
    tokens = torch.randint(100, 200, (bs,), dtype=torch.int32, device=dev)  # a no-draft step: stride 1
    acc = torch.ones(bs, dtype=torch.int32, device=dev)
    seq = torch.full((bs,), 300, dtype=torch.int64, device=dev)
    new_seq = seq + 1
    live = torch.zeros(bs, dtype=torch.bool, device=dev)
    state_idx = torch.arange(bs, dtype=torch.int32, device=dev)
    r2t = torch.arange(slots * 4096, dtype=torch.int32, device=dev).view(slots, 4096)
    kv = [(torch.zeros(slots * 4096, 2, 128, dtype=torch.bfloat16, device=dev),
           torch.zeros(slots * 4096, 2, 128, dtype=torch.bfloat16, device=dev))]
    def mark(impl):
        return lambda: impl.mark_finished(done, stop, max_len, ruled, rows, tokens, acc, new_seq, 1, live)

    cases = {
        "mark_finished": (mark(fin_cuda), mark(fin_tri), mark(fin_naive)),
        "mask_finished": tuple((lambda impl=impl: impl.mask_finished(state_idx, done, rows))
                               for impl in (fin_cuda, fin_tri, fin_naive)),
        "decode_prep": tuple((lambda impl=impl: impl.decode_prep(r2t, rows, seq, kv))
                             for impl in (prep_cuda, prep_tri, prep_naive)),
    }
    rows_out = []
    for name, fns in cases.items():
        (c_h, c_d), (t_h, t_d), (r_h, r_d) = (host_us(fn) for fn in fns)
        row = dict(op=name, batch=bs, cuda_host_us=round(c_h, 2), triton_host_us=round(t_h, 2),
                   torch_host_us=round(r_h, 2), cuda_device_us=round(c_d, 2), triton_device_us=round(t_d, 2),
                   torch_device_us=round(r_d, 2))
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    emit(rows_out, [("op", "op"), ("batch", "batch"), ("CUDA op host us", "cuda_host_us"),
                    ("Triton host us", "triton_host_us"), ("torch ops host us", "torch_host_us"),
                    ("CUDA op device us", "cuda_device_us"), ("Triton device us", "triton_device_us"),
                    ("torch ops device us", "torch_device_us")], args.out)


if __name__ == "__main__":
    main()
