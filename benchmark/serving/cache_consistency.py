"""Is only committed state ever cached? A radix-cache check on the GPU machine.

    python3 benchmark/serving/cache_consistency.py --model benchmark/models/tiny-hybrid \
        --configs none,lumotree-suffix --out cc.json --log-dir /tmp/logs

For each configuration (``parity.CONFIGS``), one server:

1. turn 1: ``--prompts`` prompts as token ids, greedy, ``max_new_tokens`` alternating between odd
   lengths, so that a speculative step often accepts drafts past a request's end (the overshoot
   SGLang cuts from the output);
2. turn 2 from the radix cache: the prompt + turn 1's output ids + a fixed follow-up, one new token
   with its top-5 logprobs (``cached_tokens`` recorded);
3. the same turn 2 after ``/flush_cache``, computed from scratch;

then the same with turn 1 ended by a stop token (``"\n"``, ``stop_token_ids``) instead of a length,

and compares 2 with 3 per request: the first token and the logprob gap of the fresh run's top
tokens. Both first tokens' top logprobs are kept (``cached_first`` / ``fresh_first``), so that each can also be
compared with the no-speculation server's fresh run (``versus_none``: within one result, or with ``--reference``
a result file holding the ``none`` runs) -- the cached-vs-fresh check alone cannot tell which of the two is off. A cached GDN state that held tokens past its key (the overshoot, or a rejected draft) shows
as a different first token or a large gap; the no-speculation server is the control for how far a
state accumulated in decode steps and one computed by a fresh prefill differ numerically.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "models"))

from sglang_server import generate, log_health, post, sglang_server  # noqa: E402

FOLLOW_UP = "\n# next\n"
LENGTHS = (37, 50, 23, 64)


def first_token(out):
    """``(token id, {token id: logprob})`` of a one-token reply's top logprobs."""
    top = out["meta_info"]["output_top_logprobs"][0]
    lps = {int(t[1]): float(t[0]) for t in top}
    return int(out["output_ids"][0]), lps


def compare(cached, fresh):
    """Per request: same first token, and the largest logprob gap over the fresh run's top tokens
    (a token missing from the cached run's top list counts as a gap of ``inf``)."""
    rows = []
    for (tc, lc), (tf, lf) in zip(cached, fresh):
        gap = max((abs(lc[t] - lp) if t in lc else float("inf")) for t, lp in lf.items())
        rows.append(dict(same_first_token=tc == tf, max_logprob_gap=gap))
    finite = [r["max_logprob_gap"] for r in rows if r["max_logprob_gap"] != float("inf")]
    return dict(same_first_token=sum(r["same_first_token"] for r in rows), of=len(rows),
                max_logprob_gap=max(finite) if finite else None,
                gaps_over_0_1=sum(r["max_logprob_gap"] > 0.1 for r in rows), rows=rows)


def _plain(firsts):
    """``[(token, {token: logprob})]`` as JSON keeps it: ``[[token, [[token, logprob], ...]], ...]``."""
    return [[t, sorted(lps.items())] for t, lps in firsts]


def _firsts(plain):
    return [(int(t), {int(k): float(v) for k, v in lps}) for t, lps in plain]


def versus(reference, run):
    """A run's cached and fresh first tokens, each against the reference run's fresh ones (the
    no-speculation server computing the same turn 2 from scratch)."""
    ref = _firsts(reference["fresh_first"])
    return {side: {k: v for k, v in compare(_firsts(run[f"{side}_first"]), ref).items() if k != "rows"}
            for side in ("cached", "fresh")}


def versus_none(runs, reference_runs=None):
    """``versus`` for every run with kept first tokens, against ``none`` (``none/stop-token`` for the
    stop-token mode) from ``reference_runs`` (default: the same runs)."""
    refs = reference_runs if reference_runs is not None else runs
    out = {}
    for name, r in runs.items():
        ref = refs.get("none/stop-token" if name.endswith("/stop-token") else "none")
        if name.split("/")[0] != "none" and ref and "fresh_first" in ref and "cached_first" in r:
            out[name] = versus(ref, r)
    return out


def turn1_by_stop_token(url, ids, stop_id, max_new_tokens=96):
    """Turn 1 ended by a stop token (``stop_token_ids``, EOS handling on) instead of a length."""
    res = post(url + "/generate", {"input_ids": ids, "sampling_params": dict(
        temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=[stop_id], ignore_eos=False)})
    return res if isinstance(res, list) else [res]


def run(url, tok, texts, stop=None):
    """One check; ``stop``: end turn 1 at this token (text) instead of at the LENGTHS."""
    post(url + "/flush_cache", {})
    time.sleep(1.0)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    follow = tok(FOLLOW_UP, add_special_tokens=False)["input_ids"]
    turn1 = []
    if stop is not None:
        stop_id = tok(stop, add_special_tokens=False)["input_ids"][-1]
        outs = turn1_by_stop_token(url, ids, stop_id)
        turn1 = [(p, o["output_ids"], o["meta_info"]) for p, o in zip(ids, outs)]
    for i, m in enumerate(LENGTHS if stop is None else ()):  # one batch per length
        group = ids[i::len(LENGTHS)]
        outs = generate(url, group, m, key="input_ids")
        turn1 += [(p, o["output_ids"], o["meta_info"]) for p, o in zip(group, outs)]
    turn2 = [p + list(o) + follow for p, o, _ in turn1]
    top = dict(return_logprob=True, top_logprobs_num=5)
    cached_outs = generate(url, turn2, 1, key="input_ids", extra=top)
    post(url + "/flush_cache", {})
    time.sleep(1.0)
    fresh_outs = generate(url, turn2, 1, key="input_ids", extra=top)
    cached_first, fresh_first = [first_token(o) for o in cached_outs], [first_token(o) for o in fresh_outs]
    res = compare(cached_first, fresh_first)
    res["cached_first"], res["fresh_first"] = _plain(cached_first), _plain(fresh_first)
    res["cached_tokens"] = [o["meta_info"].get("cached_tokens", 0) for o in cached_outs]
    res["fresh_cached_tokens"] = [o["meta_info"].get("cached_tokens", 0) for o in fresh_outs]
    res["turn2_tokens"] = [len(t) for t in turn2]
    res["turn1_verify_steps"] = [m.get("spec_verify_ct", 0) for _, _, m in turn1]
    res["turn1_tokens"] = [m["completion_tokens"] for _, _, m in turn1]
    res["turn1_finish"] = [str((m.get("finish_reason") or {}).get("type")) for _, _, m in turn1]
    return res


def main():
    from eval_tiny_hybrid_sglang import prompts
    from parity import CONFIGS
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="none,lumotree")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--extra", action="append", default=[],
                    help="more server flags for every configuration (repeatable), e.g. --extra=--disable-overlap-schedule")
    ap.add_argument("--tag", default="", help="suffix of the run names (runs with --extra)")
    ap.add_argument("--reference", default=None,
                    help="a result file holding the no-speculation runs (none, none/stop-token) for versus_none")
    ap.add_argument("--request-timeout", type=int, default=120,
                    help="seconds a request may take before the run is recorded as failed (a hung server)")
    args = ap.parse_args()
    import sglang_server as server_module

    server_module.REQUEST_TIMEOUT_S = args.request_timeout
    tok = AutoTokenizer.from_pretrained(args.model)
    texts = prompts(args.prompts)
    res = dict(model=args.model, command=" ".join(sys.argv), lengths=LENGTHS, runs={})
    for config in args.configs.split(","):
        name = config + args.tag
        log = os.path.join(args.log_dir, f"cache-{name}.log")
        try:
            with sglang_server(args.model, CONFIGS[config] + args.extra + ["--log-level", "info"], port=args.port,
                               log=log, timeout=240) as url:
                res["runs"][name] = run(url, tok, texts)  # turn 1 ended by its length
                res["runs"][name + "/stop-token"] = run(url, tok, texts, stop="\n")  # ended by a stop token
        except Exception as e:  # keep what was measured; the log says the rest
            res["runs"][name] = dict(error=repr(e)[:2000])
        res["runs"][name]["extra_args"] = args.extra
        res["runs"][name].update(log_health(log))
        for key in (name, name + "/stop-token"):
            r = res["runs"].get(key, {})
            print(json.dumps({key: {k: v for k, v in r.items() if k != "rows"}}), flush=True)
        refs = json.load(open(args.reference))["runs"] if args.reference else None
        res["versus_none"] = versus_none(res["runs"], refs)
        json.dump(res, open(args.out, "w"), indent=1)
    print(json.dumps({"versus_none": res.get("versus_none")}), flush=True)


if __name__ == "__main__":
    main()
