"""Host time of the LUMOTREE_SUFFIX drafter per decode step (CPU): what SGLang's NGRAM loop waits for
on the scheduler's thread before each verify, for a batch of agent requests.

    python3 benchmark/drafters/suffix_host_cost.py --batches 1,8,32,64 --out benchmark/results/suffix_host_cost_cpu.json

Each request is one agent replay session's context (``benchmark/workloads/agent_sessions.json``,
characters as token ids, the turn's prompt up to ``--context`` tokens); per step every request is
handed over with ``--accept`` new tokens (its own continuation from the session text, as if drafts
were accepted), then drafted (``SuffixCorpus.batch_get``: observe + draft + SGLang's layout) with
``--nodes`` nodes. Reports the median and p95 ms per step of ``batch_get`` over ``--steps`` steps,
after the requests' admission (indexing their prompts), which is timed apart. Both drafters: the
Python reference (``SuffixDrafter``) and the C++ one (``NativeSuffixDrafter``), behind the same
``SuffixCorpus`` (context tracking and SGLang's layout stay Python). Beside them, in the same process on
the same contexts, SGLang's NGRAM corpus (``sglang.srt.speculative.cpp_ngram.ngram_corpus.NgramCorpus``,
C++, with SGLang's default NGRAM settings) doing what SGLang's NGRAM worker does on the scheduler's thread
per step: wait for the previous step's asynchronous insert, match the batch's last
``--speculative-ngram-max-trie-depth`` (18) tokens, and hand the same windows to the asynchronous insert.
Its admission row is its first step (NGRAM indexes no prompt). SGLang builds that corpus just in time
with the host compiler; a compiler whose standard headers do not bring ``size_t`` into SGLang's
``result.h`` (seen with g++ here) gets ``-include cstddef`` added, nothing else changed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def contexts(n, context):
    d = json.load(open(os.path.join(HERE, "..", "workloads", "agent_sessions.json")))
    out = []
    for i in range(n):
        s = d["sessions"][i % len(d["sessions"])]
        text = "".join(m["content"] for m in s["messages"])
        off = (i // len(d["sessions"])) * 97  # different contexts for requests beyond the sessions
        out.append([ord(c) % 4096 for c in text[off:off + context + 4096]])
    return out


def run(make, batch, args):
    corpus = make(args.nodes)
    texts = contexts(batch, args.context)
    rids = [f"r{i}" for i in range(batch)]
    lens = [args.context] * batch
    t0 = time.perf_counter()
    corpus.batch_get(rids, [t[:n] for t, n in zip(texts, lens)], lens)  # admission: the prompts are indexed
    admit = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        lens = [n + args.accept for n in lens]
        # SGLang hands over each request's last tokens (its max trie depth) and the total length
        batch_tokens = [t[max(0, n - args.window):n] for t, n in zip(texts, lens)]
        t0 = time.perf_counter()
        corpus.batch_get(rids, batch_tokens, lens)
        times.append(time.perf_counter() - t0)
    times.sort()
    return dict(batch=batch, admission_ms=round(admit * 1e3, 2), step_ms_median=round(statistics.median(times) * 1e3, 3),
                step_ms_p95=round(times[int(0.95 * (len(times) - 1))] * 1e3, 3))


class SGLangNgram:
    """SGLang's NGRAM corpus behind ``batch_get(rids, tokens, lens)`` as its worker drives it per step."""

    DEPTH = 18  # --speculative-ngram-max-trie-depth default

    def __init__(self, nodes):
        import sglang.kernels.ops.speculative.ngram_corpus as nc
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        load_jit = nc.load_jit

        def load_jit_cstddef(*a, **kw):  # see the module docstring
            kw["extra_cflags"] = list(kw.get("extra_cflags") or []) + ["-include", "cstddef"]
            return load_jit(*a, **kw)

        nc.load_jit = load_jit_cstddef
        try:
            self.corpus = NgramCorpus(min_bfs_breadth=1, max_bfs_breadth=10, match_type="BFS", capacity=10_000_000,
                                      max_trie_depth=self.DEPTH, draft_token_num=nodes)
        finally:
            nc.load_jit = load_jit

    def batch_get(self, rids, batch_tokens, lens):
        windows = [list(t[-self.DEPTH:]) for t in batch_tokens]
        self.corpus.synchronize()
        out = self.corpus.batch_get(rids, windows, lens)
        self.corpus.batch_put(windows)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--accept", type=int, default=3)
    ap.add_argument("--window", type=int, default=64, help="tokens SGLang hands over per request per step")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from lumotree.drafters.suffix import NativeSuffixDrafter, SuffixDrafter
    from lumotree.sglang.suffix import SuffixCorpus

    def corpus(kind):
        def make(n):
            c = SuffixCorpus(n)
            c.drafter = (NativeSuffixDrafter if kind == "c++" else SuffixDrafter)(**c.kw)
            return c
        return make

    makers = {"python": corpus("python"), "c++": corpus("c++"), "sglang-ngram": SGLangNgram}
    rows = [dict(drafter=kind, **run(make, int(b), args)) for kind, make in makers.items()
            for b in args.batches.split(",")]
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.out:
        json.dump(dict(command="python3 " + " ".join(sys.argv), rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
