"""Which verify / commit variant was fastest per cell, from ``bench_verify_forms.py`` results.

Reads one or more result JSONs (a core run and a variants run of ``bench_verify_forms.py``) and
prints, per (tree, batch): the served mix verify and every timed mix variant, the commit forms and
their tilings, each with its time relative to the served default -- only variants whose outputs
matched SGLang's (``*_rel_err`` <= ``--max-rel-err``) are ranked. A variant becomes a default
only after its GPU tests passed; this script does not decide that.

    python3 benchmark/kernels/pick_defaults.py verify_forms.json verify_forms_variants.json
"""
from __future__ import annotations

import argparse
import json


def rank(rows, max_rel_err=1e-3):
    """``[(tree, batch, kind, [(name, us, ratio to the served default), ...] fastest first)]``."""
    out = []
    for r in rows:
        key = (r["tree"], r["batch"])
        err = r.get("rel_err", {})
        verify = [("mix (served)", r["mix_verify_us"])]
        verify += [(f"mix {n}", us) for n, us in r.get("mix_variants_us", {}).items()
                   if r.get("mix_variants_rel_err", {}).get(n, 0.0) <= max_rel_err]
        if "mix_fused_step_us" in r and "commit_us" in r and err.get("fused_step_state_vs_commit", 0.0) <= max_rel_err:
            verify.append(("mix fused step - replay commit", r["mix_fused_step_us"] - r["commit_us"]))
            if "mix_fused_step_replay_us" in r:
                verify.append(("mix fused step, per-step loads - replay commit",
                               r["mix_fused_step_replay_us"] - r["commit_us"]))
        commit = [("replay (served)", r["commit_us"])]
        for name, col, e in (("gather", "gather_commit_us", "gather_commit_state"),
                             ("dot", "dot_commit_us", "dot_commit_state"),
                             ("knorm (kept key norms)", "commit_knorm_us", "knorm_commit_state")):
            if col in r and err.get(e, 0.0) <= max_rel_err:
                commit.append((name, r[col]))
        commit += list(r.get("commit_variants_us", {}).items())
        for kind, items in (("verify", verify), ("commit", commit)):
            base = items[0][1]
            out.append((*key, kind, sorted(((n, us, us / base) for n, us in items), key=lambda t: t[1])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--max-rel-err", type=float, default=1e-3)
    args = ap.parse_args()
    rows = [r for f in args.files for r in json.load(open(f))["rows"]]
    for tree, batch, kind, items in rank(rows, args.max_rel_err):
        best = ", ".join(f"{n} {us:.1f} µs ({ratio:.2f})" for n, us, ratio in items[:4])
        print(f"{tree} bs {batch} {kind}: {best}")


if __name__ == "__main__":
    main()
