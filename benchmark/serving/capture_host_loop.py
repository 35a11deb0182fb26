"""Does capturing a CUDA graph in the middle of a host-bound loop (as ``PostVerifyGraphs._capture`` does while serving,
:mod:`lumotree.sglang.post_verify`) slow the loop's steps after it? A decode-like host loop (Python dict work, small
torch ops, a graph replay, a pinned copy) timed in windows of 100 steps before and after one event: an eager run of
a short sequence (with and without a Triton kernel), a capture of it into a CUDA graph (the first in a new pool, a
second, one with a Triton kernel), then the eager one again. Each window's median wall time and the thread's CPU
time (ms): a slower host would show in both, waits in the wall time alone.

On the GPU machine: ``python3 benchmark/serving/capture_host_loop.py --out capture_host_loop.json``."""
import argparse
import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():
    sys.exit("capture_host_loop.py needs a CUDA device")
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--out", help="write the result JSON here")
ARGS = ap.parse_args()
dev = torch.device("cuda")

@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(x_ptr + o, tl.load(x_ptr + o, mask=m) + 1, mask=m)

x = torch.randn(4096, device=dev)
w = torch.randn(256, 256, device=dev)
g0 = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y0 = w @ w
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g0):
    y0 = w @ w
pin = torch.empty(64, dtype=torch.int64, pin_memory=True)

def step():
    t0, c0 = time.perf_counter(), time.thread_time()
    d = {i: str(i) for i in range(300)}
    parts = [x[: i + 8].sum() for i in range(24)]
    t = torch.stack(parts)
    idx = torch.arange(16, device=dev)
    z = (x[idx] * 2).to(torch.int64)
    g0.replay()
    pin[:16].copy_(z, non_blocking=True)
    CPU.append(time.thread_time() - c0)
    return time.perf_counter() - t0
CPU = []  # the thread CPU time of each step since the last clear


def seq(triton_too):
    a = torch.arange(32, device=dev, dtype=torch.float32)
    if triton_too:
        _add_one[(1,)](a, 32, BLOCK=32)
    b = (a * 3 + 1).cumsum(0)
    return torch.cat([a.to(torch.int32), b.to(torch.int32)])

H = {}
def capture(triton_too):
    if H.get("pool") is None:
        H["pool"], H["stream"] = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    g, cur, st = torch.cuda.CUDAGraph(), torch.cuda.current_stream(), H["stream"]
    st.wait_stream(cur)
    with torch.cuda.stream(st):
        g.capture_begin(pool=H["pool"], capture_error_mode="thread_local")
        try:
            out = seq(triton_too)
        finally:
            g.capture_end()
    cur.wait_stream(st)
    H.setdefault("graphs", []).append((g, out))

def run(event, n_before=600, n_after=3000):
    CPU.clear()
    ts = [step() for _ in range(n_before)]
    cb = list(CPU)
    CPU.clear()
    t0 = time.perf_counter()
    event()
    ev_ms = 1e3 * (time.perf_counter() - t0)
    ta = [step() for _ in range(n_after)]
    win = lambda v: [round(1e3 * statistics.median(v[i:i + 100]), 4) for i in range(0, len(v), 100)]
    return dict(event_ms=round(ev_ms, 2), before=win(ts[-300:]), after=win(ta), cpu_before=win(cb[-300:]),
                cpu_after=win(list(CPU)))

for _ in range(500):  # warm
    step()
res = {}
for name, ev in (("eager", lambda: seq(False)), ("eager_triton", lambda: seq(True)), ("capture_first", lambda: capture(False)),
                 ("capture_second", lambda: capture(False)), ("capture_triton", lambda: capture(True)),
                 ("eager_again", lambda: seq(True))):
    res[name] = run(ev)
out = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "command": "python3 " + " ".join(sys.argv),
       "gpu": torch.cuda.get_device_name(), **res}
print(json.dumps(out))
if ARGS.out:
    json.dump(out, open(ARGS.out, "w"), indent=1)
