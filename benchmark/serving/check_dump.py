"""Offline replay of the served steps dumped by ``LUMOTREE_SGLANG_CHECK=1 LUMOTREE_SGLANG_CHECK_DUMP=DIR``.

    python3 benchmark/serving/check_dump.py DIR [--out result.json]

For every dumped step, layer and request: are the verify's scratch k/v/g/beta the verify inputs
(with SGLang's gating), does an fp64 replay of the accepted root path from the pre-commit state
reproduce SGLang's per-node snapshot of the last accepted node, and did the served commit write
that state (``after``)? Runs on CPU.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import torch
import torch.nn.functional as F

from lumotree.ops.gdn_tree.naive import gdn_step


def replay(S, k, v, g, beta, path, rep):
    """fp64 replay of ``path`` (node indices into one request's buffers) from state ``S``: LumoTree's
    reference step (``naive.gdn_step``) with the kernels' L2 norm of k and GQA head sharing."""
    S = S.double()
    for i in path:
        kk = k[i].double()
        kk = (kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 0)
        S = gdn_step(S, kk, v[i].double(), g[i].double(), beta[i].double())
    return S


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-12))


def analyse(path):
    d = torch.load(path)
    c = d["commit"]
    out = []
    layers = sorted(int(k[6:]) for k in d if k.startswith("verify"))
    for li in layers:
        v = d[f"verify{li}"]
        B, N, Hv = c["scratch_g"].shape[1:]  # the commit's requests (the verify may carry padded ones after them)
        Bv = v["k"].shape[0]
        g = (-torch.exp(v["A_log"].float()) * F.softplus(v["a"].float() + v["dt_bias"].float())).view(Bv, N, Hv)
        beta = torch.sigmoid(v["b"].float()).view(Bv, N, Hv)
        rep = v["v"].shape[2] // v["k"].shape[2]
        for b in range(B):
            if int(c["rows"][b]) < 0:
                continue
            last, par = int(c["last"][b]), c["parents"][b].tolist() if c["parents"] is not None else None
            path_ = [last]
            while par is not None and path_[-1] > 0:
                path_.append(par[path_[-1]])
            path_ = path_[::-1] if par is not None else list(range(last + 1))
            S = replay(c["before"][li, b], c["scratch_k"][li, b], c["scratch_v"][li, b], c["scratch_g"][li, b],
                       c["scratch_beta"][li, b], path_, rep)
            snap = v["snaps"][b, last]
            out.append(dict(layer=li, request=b, row=int(c["rows"][b]), accepted_path=path_,
                            scratch_k_is_verify_k=bool(torch.equal(c["scratch_k"][li, b], v["k"][b])),
                            scratch_v_is_verify_v=bool(torch.equal(c["scratch_v"][li, b], v["v"][b])),
                            scratch_gates_max_abs_err=max(float((c["scratch_g"][li, b] - g[b]).abs().max()),
                                                          float((c["scratch_beta"][li, b] - beta[b]).abs().max())),
                            verify_rel_err_vs_sglang=rel(v["o"][b].float(), v["ref"][b].float()),
                            replay_rel_err_vs_sglang_snapshot=rel(S, snap),
                            served_commit_rel_err_vs_replay=rel(c["after"][li, b], S),
                            served_commit_wrote_the_row=not torch.equal(c["after"][li, b], c["before"][li, b])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump_dir")
    ap.add_argument("--out")
    args = ap.parse_args()
    res = {os.path.basename(p): analyse(p) for p in sorted(glob.glob(os.path.join(args.dump_dir, "step*.pt")))}
    for step, rows in res.items():
        for r in rows:
            print(step, json.dumps({k: (round(v, 9) if isinstance(v, float) else v) for k, v in r.items()}))
    if args.out:
        json.dump(dict(command="python3 benchmark/serving/check_dump.py " + args.dump_dir, steps=res),
                  open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
