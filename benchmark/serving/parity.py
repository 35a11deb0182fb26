"""Greedy parity of LUMOTREE against the same server without speculation (GPU machine).

    python3 benchmark/serving/parity.py --model benchmark/models/tiny-hybrid --out parity.json

For each configuration (default: LUMOTREE tree, no speculation, NEXTN tree with the same tree
shape) it launches ``python -m sglang.launch_server``, then

1. sends the code-completion prompts greedily in batches of 1, 7 and the rest (mixed batch sizes),
   ``--max-new-tokens`` each, ``ignore_eos``;
2. sends a second turn for the first 8 prompts (the same prompt + a fixed follow-up), which must hit
   the radix cache (``cached_tokens > 0``);
3. aborts a long request mid-way while 4 other greedy requests run (those must be unaffected);
4. sends 8 sampled requests (temperature 0.8, top-p 0.95), which must all complete;
5. sends inputs at the edges (:func:`edge_cases`: an empty prompt, ``max_new_tokens`` 0 and 1, stop
   strings hit inside a draft), whose answers must equal the no-speculation server's;
6. records accept length, tokens/s, and the speculative memory SGLang logs at start-up
   (``intermediate_ssm`` snapshots vs the replay buffers);

and finally compares every configuration's greedy texts with the no-speculation server's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "models"))

from sglang_server import accept_stats, generate, log_health, post, sglang_server  # noqa: E402

TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]
CONFIGS = {
    "lumotree": ["--speculative-algorithm", "LUMOTREE", *TREE],
    "none": [],
    "nextn-tree": ["--speculative-algorithm", "NEXTN", *TREE],
    "nextn-chain": ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
    "lumotree-chain": ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
    "lumotree-suffix": ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--speculative-num-draft-tokens", "8"],
}
MEM_PATTERNS = [r"intermediate_ssm_state_cache size: [^\s]+", r"intermediate_conv_window_cache size: [^\s]+",
                r"LumoTree speculative scratch: .*", r"Mamba Cache is allocated.*", r"ReplaySSM.*ring.*",
                r"Capture target verify CUDA graph end.*"]  # the verify graphs' memory pool (transient buffers)


def speculative_bytes(lines):
    """What the server keeps for speculation beyond its state pool, from its start-up log lines:
    SGLang's per-node snapshots + conv windows (NEXTN), or LumoTree's scratch + the same conv windows."""
    # one figure per quantity (the same number can appear in several logged lines)
    gb = lambda pat: max([float(m.group(1)) * 2**30 for ln in lines for m in [re.search(pat, ln)] if m], default=0.0)  # noqa: E731,E501
    mib = lambda pat: max([float(m.group(1)) * 2**20 for ln in lines for m in [re.search(pat, ln)] if m], default=0.0)  # noqa: E731,E501
    out = dict(intermediate_ssm=gb(r"intermediate_ssm_state_cache size: ([0-9.]+)GB"),
               conv_windows=gb(r"intermediate_conv_window_cache size: ([0-9.]+)GB"),
               lumotree_scratch=mib(r"LumoTree speculative scratch: ([0-9.]+) MiB"),
               released_rings=mib(r"released SGLang's per-pool-slot ring buffers: ([0-9.]+) MiB"))
    out["total"] = out["intermediate_ssm"] + out["conv_windows"] + out["lumotree_scratch"]
    return out


def memory_report(log):
    """``memory_log`` (the start-up lines about speculative buffers) and ``speculative_bytes`` of a server log."""
    lines = memory_lines(log)
    return dict(memory_log=lines, speculative_bytes=speculative_bytes(lines))


def memory_lines(log):
    try:
        text = open(log, errors="replace").read()
    except OSError:
        return []
    out = []
    for p in MEM_PATTERNS:
        out += [m.group(0)[:300] for m in re.finditer(p, text)]
    return out


def abort_and_sample(url, P, texts, name):
    """A long request aborted mid-way beside 4 greedy ones, then 8 sampled requests."""
    out = {}
    long_res = {}

    def long_request():
        try:
            long_res["r"] = post(url + "/generate", {"text": P[-1], "rid": "lumotree-abort-me", "sampling_params": dict(
                temperature=0.0, max_new_tokens=4096, ignore_eos=True)})
        except Exception as e:  # an aborted request may end with an HTTP error
            long_res["error"] = repr(e)[:300]

    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(1.0)
    side = []
    th2 = threading.Thread(target=lambda: side.extend(generate(url, P[8:12], 256)))
    th2.start()
    time.sleep(0.5)
    post(url + "/abort_request", {"rid": "lumotree-abort-me"})
    th.join(120)
    th2.join(300)
    lr = long_res.get("r")
    out["aborted"] = dict(finish_reason=(lr or {}).get("meta_info", {}).get("finish_reason") if lr else None,
                          completion_tokens=(lr or {}).get("meta_info", {}).get("completion_tokens") if lr else None,
                          error=long_res.get("error"))
    texts[name + "/beside_abort"] = [o["text"] for o in side]
    sampled = post(url + "/generate", {"text": P[:8], "sampling_params": dict(
        temperature=0.8, top_p=0.95, max_new_tokens=128, ignore_eos=True)}, timeout=120)
    out["sampled"] = dict(completed=sum(o["meta_info"]["completion_tokens"] == 128 for o in sampled), of=len(sampled),
                          **accept_stats(sampled))
    return out


EDGE_STOPS = ("\n", "):", " = ", "return")  # stop strings that code continuations hit, often inside a draft


def edge_cases(url, P):
    """Inputs at the edges, each answered as the no-speculation server answers it (compared as text):
    an empty prompt, ``max_new_tokens`` 0 and 1, greedy requests ending on a stop string (which a
    speculative step may accept in the middle of its run), and a stop string with ``no_stop_trim``.
    An answer is ``text|finish type|completion tokens``, or ``error <HTTP status>``."""
    import urllib.error

    def ask(text, **sp):
        try:
            o = post(url + "/generate", {"text": text, "sampling_params": dict(temperature=0.0, **sp)}, timeout=120)
        except urllib.error.HTTPError as e:
            return [f"error {e.code}"] * (len(text) if isinstance(text, list) else 1)
        outs = o if isinstance(o, list) else [o]
        return ["%s|%s|%s" % (x["text"], (x["meta_info"].get("finish_reason") or {}).get("type"),
                              x["meta_info"].get("completion_tokens")) for x in outs]

    out = []
    out += ask("", max_new_tokens=16)
    out += ask(P[0], max_new_tokens=0)
    out += ask(P[:4], max_new_tokens=1)
    for stop in EDGE_STOPS:
        out += ask(P[4:8], max_new_tokens=128, stop=[stop])
    out += ask(P[8:10], max_new_tokens=128, stop=["\n"], no_stop_trim=True)
    return out


def workload(url, P, max_new_tokens, texts, name, abort=True):
    """The parity workload on a running server: greedy batches of 1, 7 and the rest; a second turn
    extending 8 prompts (radix hits); an aborted request beside greedy ones; sampled requests.
    Greedy texts go to ``texts[name...]``; returns the measurements."""
    r = {}
    outs, t1 = [], time.time()
    for lo, hi in ((0, 1), (1, 8), (8, len(P))):  # batch sizes 1, 7, rest
        outs += generate(url, P[lo:hi], max_new_tokens)
    r.update(seconds=round(time.time() - t1, 2), **accept_stats(outs))
    r["tokens_per_s"] = r["completion_tokens"] / r["seconds"]
    texts[name] = [o["text"] for o in outs]
    turn2 = [P[i] + "\n# next\n" + P[(i + 1) % len(P)][:200] for i in range(min(8, len(P)))]
    outs2 = generate(url, turn2, 128)
    r["turn2_cached_tokens"] = [o["meta_info"].get("cached_tokens", 0) for o in outs2]
    texts[name + "/turn2"] = [o["text"] for o in outs2]
    if name.startswith("none"):  # the reference's top-2 margins, to tell near-ties from errors where a text differs
        texts[name + "/margins"] = token_margins(url, P, max_new_tokens)
    texts[name + "/edge"] = edge_cases(url, P)
    if abort:
        r.update(abort_and_sample(url, P, texts, name))
    return r


def token_margins(url, P, max_new_tokens):
    """Per prompt, per generated token of the greedy reference: ``[token text, top-1 minus top-2
    logprob]`` (after the timed runs: logprobs cost time)."""
    outs = []
    for lo, hi in ((0, 1), (1, 8), (8, len(P))):  # the same batches as the timed greedy runs
        outs += generate(url, P[lo:hi], max_new_tokens, extra=dict(
            return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True))
    res = []
    for o in outs:
        toks = o["meta_info"]["output_token_logprobs"]
        tops = o["meta_info"]["output_top_logprobs"]
        res.append([[t[2], (top[0][0] - top[1][0]) if top and len(top) > 1 else None] for t, top in zip(toks, tops)])
    return res


def margin_at(margins, char):
    """The reference's margin where its text and another part at character ``char``: at the token
    covering it, or -- when ``char`` is that token's first character -- the smaller of that and the
    previous token's (a different token there that extends the reference's, ``atures`` for
    ``ature``, shows up as a difference at the next token's first character)."""
    pos, prev = 0, None
    for text, m in margins:
        start, pos = pos, pos + len(text or "")
        if pos > char:
            if start == char and prev is not None and m is not None:
                return min(m, prev)
            return m
        prev = m
    return None


def reference_for(name, texts):
    """The no-speculation run a run is compared with: ``none`` + the run's tag when that exists
    (``lumotree-det`` -> ``none-det``: same server flags), else ``none``; never the run itself."""
    refs = [r for r in texts if r != name and r.startswith("none") and "/" not in r and len(r) > 4
            and name.endswith(r[4:])]
    return max(refs, key=len) if refs else "none"


def is_compared(name, runs) -> bool:
    """Whether a run is compared with a reference: every speculative run, and a no-speculation variant
    whose tag extends a reference's (``none-nocache-fp32head`` vs ``none-fp32head``: how reproducible
    the reference itself is under a change that should not matter)."""
    if "/" in name:
        return False
    return not name.startswith("none") or reference_for(name, runs) != "none"


def compare(texts):
    """Per speculative configuration: how many greedy texts equal the no-speculation server's."""
    cmp = {}
    for name in texts:
        if not is_compared(name, texts):
            continue
        ref = reference_for(name, texts)
        if ref not in texts:
            continue
        a, b = texts[name], texts[ref][: len(texts[name])]
        first_diff = [next((j for j, (x, y) in enumerate(zip(s, t)) if x != y), None) for s, t in zip(a, b)]
        cmp[name] = dict(reference=ref, identical=sum(s == t for s, t in zip(a, b)), of=len(b),
                         first_diff_char=[d for d in first_diff if d is not None][:32])
        margins = texts.get(ref + "/margins")
        if margins:  # how close the reference's own top-2 was where the texts part
            ms = [margin_at(margins[i], d) for i, d in enumerate(first_diff) if d is not None]
            cmp[name]["reference_margin_at_first_diff"] = [round(m, 4) if m is not None else None for m in ms][:32]
            all_m = [m for row in margins for _, m in row if m is not None]
            if all_m:
                cmp[name]["reference_margin_quantiles"] = {q: round(sorted(all_m)[int(q * (len(all_m) - 1))], 4)
                                                           for q in (0.01, 0.05, 0.5)}
        for part in ("turn2", "beside_abort", "edge"):
            if f"{name}/{part}" in texts and f"{ref}/{part}" in texts:
                cmp[name][f"{part}_identical"] = sum(s == t for s, t in zip(texts[f"{name}/{part}"],
                                                                            texts[f"{ref}/{part}"]))
    return cmp


def main():
    from eval_tiny_hybrid_sglang import prompts

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="lumotree,none,nextn-tree")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--log-dir", default=".")
    args = ap.parse_args()
    P = prompts(args.prompts)
    res = dict(model=args.model, prompts=len(P), max_new_tokens=args.max_new_tokens, tree=TREE, runs={})
    texts = {}
    for name in args.configs.split(","):
        log = os.path.join(args.log_dir, f"server-{name}.log")
        r = {}
        t0 = time.time()
        try:
            with sglang_server(args.model, CONFIGS[name] + ["--log-level", "info"], log=log, timeout=240) as url:
                r["ready_s"] = round(time.time() - t0, 1)
                r.update(workload(url, P, args.max_new_tokens, texts, name))
        except Exception as e:  # keep what was measured; the log says the rest
            r["error"] = repr(e)[:2000]
        r.update(memory_report(log), **log_health(log))
        res["runs"][name] = r
        print(json.dumps({name: r})[:3000], flush=True)
        json.dump(res, open(args.out, "w"), indent=1)
    if "none" in texts:
        res["greedy_vs_no_spec"] = compare(texts)
        print(json.dumps(res["greedy_vs_no_spec"]), flush=True)
    res["texts"] = texts
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
