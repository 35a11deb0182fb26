"""Serve the tiny trained hybrid with SGLang and measure what #6 asks for (GPU machine).

    python3 benchmark/models/eval_tiny_hybrid_sglang.py --model DIR --out eval.json

Code-completion prompts are the first lines of held-out files (same split as the training
recipe, on the same machine). For each speculative configuration it launches
``python -m sglang.launch_server`` with the model's own MTP head (``--speculative-algorithm NEXTN``),
sends the prompts greedily, and records accept length = completion tokens / verify steps; it also
asks ``/v1/chat/completions`` (the tokenizer's chat template) and checks that greedy outputs equal
those of the same server without speculation.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serving"))

from sglang_server import accept_stats, generate, post, sglang_server  # noqa: E402
from train_tiny_hybrid import corpus  # noqa: E402

CONFIGS = {
    "none": [],
    "nextn-chain": ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
    "nextn-tree": ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"],
}


def prompts(n, chars=600, max_chars=40_000_000):
    _, held = corpus(max_chars=max_chars)
    out = []
    for t in held:
        if len(t) < chars + 200:
            continue
        cut = t.rfind("\n", 0, chars)
        out.append(t[: cut + 1 if cut > 0 else chars])
        if len(out) == n:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="nextn-chain,none")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--log-dir", default=".")
    args = ap.parse_args()
    P = prompts(args.prompts)
    res = dict(model=args.model, prompts=len(P), max_new_tokens=args.max_new_tokens, runs={})
    texts = {}
    for name in args.configs.split(","):
        t0 = time.time()
        try:
            with sglang_server(args.model, CONFIGS[name], log=os.path.join(args.log_dir, f"server-{name}.log")) as url:
                r = dict(ready_s=round(time.time() - t0, 1))
                t1 = time.time()
                outs = generate(url, P, args.max_new_tokens)
                r.update(seconds=round(time.time() - t1, 2), **accept_stats(outs))
                r["tokens_per_s"] = r["completion_tokens"] / r["seconds"]
                texts[name] = [o["text"] for o in outs]
                chat = post(url + "/v1/chat/completions", dict(
                    model="default", temperature=0, max_tokens=64,
                    messages=[{"role": "user", "content": "Write a Python function that reverses a list."}]))
                r["chat"] = dict(content=chat["choices"][0]["message"]["content"],
                                 finish_reason=chat["choices"][0]["finish_reason"], usage=chat.get("usage"))
                r["sample_completion"] = P[0][-200:] + " ⟶ " + texts[name][0][:300]
        except Exception as e:  # record and go on with the next configuration
            r = dict(error=repr(e))
        res["runs"][name] = r
        print(json.dumps({name: {k: v for k, v in r.items() if k != "sample_completion"}}), flush=True)
        json.dump(res, open(args.out, "w"), indent=1)
    if "none" in texts:
        res["greedy_identical_to_no_spec"] = {
            n: sum(a == b for a, b in zip(t, texts["none"])) / len(P) for n, t in texts.items() if n != "none"}
    json.dump(res, open(args.out, "w"), indent=1)
    print(json.dumps(res.get("greedy_identical_to_no_spec")))


if __name__ == "__main__":
    main()
