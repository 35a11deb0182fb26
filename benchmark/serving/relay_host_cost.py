"""Host time of the overlap scheduler's relay of a no-draft step, SGLang's ``FutureMap`` with and without LumoTree's
cold-rows hook (``lumotree.sglang.patches.future_map_cold_rows``), same process, same inputs.

One relay round = the ``stash`` of a no-draft step's draft input (bonus tokens + the ColdStubs' views) and the next
step's ``_resolve_spec_extras`` of the same rows -- what SGLang's scheduler runs around every no-draft step of a
LUMOTREE server under the overlap scheduler. Timed on the host (``perf_counter`` over ``--rounds`` rounds, no sync
inside; the device synchronized before and after), per batch size; also the round with the bonus tokens in int32
(a cast inside ``stash``) against int64 (the FutureMap's dtype). Not a served step: what these calls cost the host.

    python3 benchmark/serving/relay_host_cost.py --batches 1,8,32 --out relay_host_cost.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from types import SimpleNamespace

import torch


@contextlib.contextmanager
def relay_env(device):
    """SGLang's relay runnable here: hidden states relayed (a server's args say so); on the CPU its Triton gather as
    torch indexing and no stream to record. Restored on exit."""
    import sglang.srt.managers.overlap_utils as ou
    import sglang.srt.speculative.spec_utils as su

    saved = [(su, "spec_need_hidden_states", su.spec_need_hidden_states)]
    su.spec_need_hidden_states = lambda: True
    if device.type != "cuda":
        saved += [(ou, "gather_spec_extras", ou.gather_spec_extras), (torch.Tensor, "record_stream", torch.Tensor.record_stream)]
        ou.gather_spec_extras = lambda i, p, x, o, h: (p[i], x[i], o[i], None if h is None else h[i])
        torch.Tensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def rounds(fm, hooked, stubs, rows, n, bonus_dtype, device):
    """Host seconds per relay round over ``n`` rounds (the median of 5 repeats)."""
    from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload

    from lumotree.sglang.patches import future_map_cold_rows as cr

    bs = len(rows)
    idx = torch.tensor(rows, dtype=torch.int64, device=device)
    host = torch.tensor(rows, dtype=torch.int64)
    bonus = torch.arange(bs, device=device).to(bonus_dtype)
    batch = SimpleNamespace(req_pool_indices_cpu=host, reqs=rows)

    def one():
        di = SimpleNamespace(bonus_tokens=bonus, draft_probs=None, dsa_topk_indices=None,
                             future_dsa_topk_indices_available=False)
        stubs.fill(di, bs)
        if hooked:
            cr.note_rows(host)
            cr.note_stub(stubs, di, host)
            cr.stash(FutureMap.stash, fm, idx, RelayPayload.from_draft_input(di))
        else:
            FutureMap.stash(fm, idx, RelayPayload.from_draft_input(di))
        nxt = SimpleNamespace(future_indices=idx, bonus_tokens=None, topk_p=None, topk_index=None, hidden_states=None,
                              draft_probs=None, future_dsa_topk_indices_available=False)
        batch.spec_info = nxt
        if hooked:
            cr.resolve_spec_extras(FutureMap._resolve_spec_extras, fm, batch)
        else:
            FutureMap._resolve_spec_extras(fm, batch)
        return nxt

    for _ in range(20):
        one()
    times = []
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            one()
        times.append((time.perf_counter() - t0) / n)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--hidden", type=int, default=2048, help="the draft's relayed hidden state size (Qwen3-Next: 2048)")
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    with relay_env(device):
        return _run(args, device, argv)


def _run(args, device, argv):
    from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from lumotree.sglang.patches import future_map_cold_rows as cr
    from lumotree.sglang.worker import ColdStubs

    batches = [int(b) for b in args.batches.split(",")]
    pool = max(batches) + 2
    rows_out = []
    for bs in batches:
        rows = list(range(1, bs + 1))
        for hooked in (False, True):
            for bonus_dtype in (torch.int32, torch.int64):
                fm = FutureMap(device, SpeculativeAlgorithm.from_string("EAGLE"),
                               SimpleNamespace(req_to_token=torch.zeros(pool, 8, dtype=torch.int32, device=device)))
                stubs = ColdStubs(args.topk, (args.hidden, torch.bfloat16), device)
                cr._stubs = cr._pending = cr._rows = None
                first = SimpleNamespace(bonus_tokens=torch.zeros(bs, dtype=torch.int64, device=device), dsa_topk_indices=None)
                stubs.fill(first, bs)
                FutureMap.stash(fm, torch.tensor(rows, device=device), RelayPayload.from_draft_input(first))
                sec = rounds(fm, hooked, stubs, rows, args.rounds, bonus_dtype, device)
                cold = fm.__dict__.get("lumotree_cold_rows")
                rows_out.append(dict(batch=bs, hook=hooked, bonus_dtype=str(bonus_dtype).replace("torch.", ""),
                                     host_us_per_round=round(sec * 1e6, 2),
                                     kept=getattr(cold, "kept", 0), served=getattr(cold, "served", 0)))
                print(json.dumps(rows_out[-1]), flush=True)
    res = dict(command="python3 benchmark/serving/relay_host_cost.py " + " ".join(argv or []), device=str(device),
               gpu=torch.cuda.get_device_name() if device.type == "cuda" else None, rows=rows_out)
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    print("| batch | SGLang's relay, int32 / int64 bonus (us) | with the hook, int32 / int64 bonus (us) |")
    print("|---|---|---|")
    for bs in batches:
        got = {(r["hook"], r["bonus_dtype"]): r["host_us_per_round"] for r in rows_out if r["batch"] == bs}
        print(f"| {bs} | {got[(False, 'int32')]:.1f} / {got[(False, 'int64')]:.1f} | "
              f"{got[(True, 'int32')]:.1f} / {got[(True, 'int64')]:.1f} |")
    return res


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
