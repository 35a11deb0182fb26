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
Its admission row is its first step (NGRAM indexes no prompt).

``--worker`` measures instead what the NGRAM loop's draft preparation costs per step as a server runs it:
SGLang 0.5.17's ``NGRAMWorker._prepare_draft_tokens`` and ``_update_ngram_corpus`` (compiled from its installed
source: the module imports C++ ops this CPU machine does not build) building each request's view from its
prompt and output (the overlap scheduler's one-round lag spliced from the step's accepted tokens) and calling the
corpus. ``admission_ms`` is the first step (the batch's requests new to the corpus), ``admitted_with_prefill_ms``
what LumoTree's worker spends on the scheduler's thread admitting the prompts right after launching their prefill
(while the GPU computes it; :func:`lumotree.sglang.suffix.admit_prefilled`); for LumoTree's worker the first step
comes at once after that, while the prompts are still being indexed in the background -- it drafts nothing for
the ``first_step_undrafted`` requests still indexing instead of waiting --, and ``admission_background_ms`` is the
indexing left after it, timed as a wait. Rows: ``lumotree-suffix`` (LumoTree's worker: each request hands
over only the tokens the corpus lacks, :func:`lumotree.sglang.suffix.prepare_draft_tokens`; nothing to insert), ``lumotree-suffix-sglang-handover``
(the same corpus under SGLang's preparation at LUMOTREE_SUFFIX's depth of 4,096: the whole prompt copied and
4,096 tokens handed over per request, twice a step) and ``sglang-ngram`` (SGLang's worker and corpus at its
depth of 18); ``--threads 1,2`` runs LumoTree's rows with the C++ drafter on each number of host threads (the
process's torch on one thread, as SGLang's scheduler runs it). SGLang builds that corpus just in time
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


def sglang_ngram_methods(*names):
    """Methods of SGLang's ``NGRAMWorker`` compiled from its installed source (the module imports its C++
    n-gram ops at import time, which are not built on a CPU-only machine)."""
    import ast
    import typing

    import numpy as np
    import sglang
    import torch

    path = os.path.join(os.path.dirname(sglang.__file__), "srt", "speculative", "ngram_worker.py")
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NGRAMWorker")
    defs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
    if sorted(d.name for d in defs) != sorted(names):
        raise RuntimeError(f"SGLang's NGRAMWorker has no {sorted(set(names) - {d.name for d in defs})}")
    ns = dict(np=np, torch=torch, List=typing.List, ScheduleBatch=object)
    exec(compile(ast.Module(body=defs, type_ignores=[]), path, "exec"), ns)
    return [ns[n] for n in names]


class _Req:
    def __init__(self, rid, prompt):
        self.rid, self.origin_input_ids, self.output_ids = rid, prompt, []


def run_worker(kind, batch, args, threads=None, drafter_kw=None):
    """One worker kind's draft preparation per step (``--worker``): admission (first step) and steps, ms;
    ``threads``: the C++ drafter's host threads for LumoTree's corpus (None: as served, ``drafter_threads()``);
    ``drafter_kw``: LumoTree's corpus built with these settings instead of the served ones."""
    from types import SimpleNamespace

    import torch

    from lumotree.sglang.suffix import DEFAULT_CONTEXT, SuffixCorpus, admit_prefilled, prepare_draft_tokens

    prepare, update, concat = sglang_ngram_methods("_prepare_draft_tokens", "_update_ngram_corpus",
                                                   "_efficient_concat_last_n")
    depth = SGLangNgram.DEPTH if kind == "sglang-ngram" else DEFAULT_CONTEXT
    corpus = SGLangNgram(args.nodes).corpus if kind == "sglang-ngram" else SuffixCorpus(args.nodes, **(drafter_kw or {}))
    if threads is not None and kind != "sglang-ngram":
        corpus.threads = threads
        corpus.reset()
    w = SimpleNamespace(draft_token_num=args.nodes, max_trie_depth=depth, enable_overlap=True, ngram_corpus=corpus)
    w._efficient_concat_last_n = concat.__get__(w)
    if kind == "lumotree-suffix":
        def step(b):
            prepare_draft_tokens(w, b)
    else:
        def step(b):
            prepare(w, b)
            update(w, b)
    texts = contexts(batch, args.context)
    reqs = [_Req(f"r{i}", t[:args.context]) for i, t in enumerate(texts)]
    at_prefill = background = undrafted = None
    if kind == "lumotree-suffix":  # LumoTree's worker indexes the prompts right after launching their prefill
        t0 = time.perf_counter()
        admit_prefilled(w, SimpleNamespace(reqs=reqs))
        at_prefill = round((time.perf_counter() - t0) * 1e3, 2)
    times = []
    for k in range(args.steps + 1):
        if k == 1 and kind == "lumotree-suffix":  # what the first step left indexing in the background, waited for
            t1 = time.perf_counter()
            corpus.wait_admissions()
            background = round((time.perf_counter() - t1) * 1e3, 2)
        # the overlap scheduler's view: output_ids lag one round; that round's tokens come from the step's results
        rounds = [t[args.context + k * args.accept:args.context + (k + 1) * args.accept] for t in texts]
        for r, t in zip(reqs, texts):
            r.output_ids = t[args.context:args.context + k * args.accept]
        acc = torch.tensor([(rd + [0] * args.nodes)[:args.nodes] for rd in rounds]).reshape(-1)
        b = SimpleNamespace(reqs=reqs, grammar_needs_sync=lambda: False,
                            spec_info=SimpleNamespace(accept_tokens=acc, accept_lens=torch.tensor([len(rd) for rd in rounds])))
        t0 = time.perf_counter()
        step(b)
        times.append(time.perf_counter() - t0)
        if k == 0 and kind == "lumotree-suffix":
            undrafted = len(corpus.undrafted)
    admit, times = times[0], sorted(times[1:])
    return dict(batch=batch, admission_ms=round(admit * 1e3, 2), admitted_with_prefill_ms=at_prefill,
                first_step_undrafted=undrafted, admission_background_ms=background,
                step_ms_median=round(statistics.median(times) * 1e3, 3),
                step_ms_p95=round(times[int(0.95 * (len(times) - 1))] * 1e3, 3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--accept", type=int, default=3)
    ap.add_argument("--window", type=int, default=64, help="tokens SGLang hands over per request per step")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--worker", action="store_true", help="the NGRAM loop's draft preparation per step (docstring)")
    ap.add_argument("--threads", default=None,
                    help="--worker: the C++ drafter's host threads to compare for LumoTree's rows, e.g. 1,2 "
                         "(default: as served, up to 4 and at most this machine's CPUs)")
    ap.add_argument("--drafter-kw", action="append", default=None,
                    help="--worker: LumoTree's corpus with these settings (JSON, e.g. '{\"max_spec\": 24}'); repeat to "
                         "compare several, alternated --repeat times (LumoTree's worker rows only)")
    ap.add_argument("--repeat", type=int, default=1, help="--worker with --drafter-kw: alternations of the settings")
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

    if args.worker:
        import torch

        from lumotree.drafters.suffix import drafter_threads

        torch.set_num_threads(1)  # as SGLang's scheduler process runs (ModelRunner.load_model on a GPU)
        threads = [int(t) for t in args.threads.split(",")] if args.threads else [drafter_threads()]
        if args.drafter_kw:
            settings = [json.loads(k) for k in args.drafter_kw]
            rows = [dict(worker="lumotree-suffix", drafter_kw=kw, repetition=rep, threads=t,
                         **run_worker("lumotree-suffix", int(b), args, t, kw))
                    for rep in range(args.repeat) for kw in settings for t in threads for b in args.batches.split(",")]
        else:
            rows = [dict(worker=kind, **({"threads": t} if kind != "sglang-ngram" else {}), **run_worker(kind, int(b), args, t))
                for kind in ("lumotree-suffix", "lumotree-suffix-sglang-handover", "sglang-ngram")
                for t in (threads if kind != "sglang-ngram" else [None])
                for b in args.batches.split(",")]
    else:
        makers = {"python": corpus("python"), "c++": corpus("c++"), "sglang-ngram": SGLangNgram}
        rows = [dict(drafter=kind, **run(make, int(b), args)) for kind, make in makers.items()
                for b in args.batches.split(",")]
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.out:
        json.dump(dict(command="python3 " + " ".join(sys.argv), rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
