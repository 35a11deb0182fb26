"""LUMOTREE_SUFFIX's draft preparation per decode step (``lumotree.sglang.suffix.prepare_draft_tokens``) replayed on
the CPU over the agent benchmark's served token streams, timed whole and for its one call into the C++ drafter: the
Python around that call is what the preparation adds to a drafted step on the scheduler's thread.

The streams: every turn of ``benchmark/workloads/agents_bench.py``'s sessions rebuilt as the server saw it, the
reference server's replies as the continuation (as ``acceptance_replay.py`` does). Served as a server steps them:
``--agents`` closed-loop agents, each turn admitted with its prefill (``admit_prefilled``: its prompt's last 4,096
tokens indexed in the background), then decode steps over the running requests, each request's context handed over
as SGLang's overlap scheduler has it (its ``output_ids`` one step behind, the last round's accepted tokens spliced on)
and the drafts' greedily accepted run appended. ``--form``: ``parts`` (the served form, ``HostCorpus.step_get``) or
``views`` (the form before it: each request's view built by ``window`` + ``last_tokens``, then ``batch_get``); both
forms draft the same trees, which ``--form both`` checks step by step on two corpora while it times each. Rows per
form and batch bucket: the steps and their median preparation, drafter call and difference (the Python) in ms.

    python3 benchmark/drafters/prepare_replay.py \\
        --replies benchmark/results/agents_32_finish_block_replies_h200.json.gz --reference none/32 --agents 32 \\
        --form both --out benchmark/results/prepare_replay_cpu.json

``--background`` replays it as served instead (one form): each prefill batch's admissions left indexing in the
background, the overlap scheduler's doubled tokens after a prefill (a rewind the step after), ``--gpu-ms`` slept after
each step for the rest of a served step; rows add each bucket's 95th percentile, maximum and total:

    python3 benchmark/drafters/prepare_replay.py \
        --replies benchmark/results/agents_32_delayer_replies_h200.json.gz --reference none/32 --agents 32 \
        --nodes 16 --form parts --background --gpu-ms 4 --out OUT.json   # prepare_replay_background_cpu.json's runs

A measurement of this machine's CPU, not of a server: no GPU work, no scheduler around it (served at 32 agents on H200
hosts the same Python took 2.5-3x as long: 1.27 ms in the views form, 0.96 in the parts form, two machines).
"""
import argparse
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

FORMS = ("parts", "views")


def prepare_views(worker, batch):
    """The draft preparation's form before ``HostCorpus.step_get``: each request's view (``window`` +
    ``last_tokens``) and the full view on demand, then ``batch_get``."""
    from lumotree.sglang.suffix import last_tokens

    stride, depth, corpus = worker.draft_token_num, worker.max_trie_depth, worker.ngram_corpus
    ids, lens = batch.spec_info.accept_tokens.tolist(), batch.spec_info.accept_lens.tolist()
    req_ids, views, totals, full = [], [], [], []
    for i, req in enumerate(batch.reqs):
        prev = ids[i * stride:i * stride + lens[i]]
        prompt, out = req.origin_input_ids, req.output_ids
        total = len(prompt) + len(out) + len(prev)
        req_ids.append(req.rid)
        views.append(last_tokens(prompt, out, prev, corpus.window(req.rid, total, depth)))
        totals.append(total)
        full.append(lambda prompt=prompt, out=out, prev=prev: last_tokens(prompt, out, prev, depth))
    return corpus.batch_get(req_ids, views, totals, full)


def replay(per_session, agents: int, nodes: int, forms, background: bool = False, gpu_ms: float = 0.0):
    """Serve every session's turns closed-loop with one corpus per form (each form's preparation timed on its own
    corpus, the same inputs); the drafts of the first form decide what is accepted and must equal the others'.
    ``background``: one form; the turns admitted between two decode steps are one prefill batch, left indexing in the
    background as a server leaves them (a step drafts nothing for a request still indexing and waits where it must),
    and the step after a prefill hands each request that was running before it the last round's tokens twice, as
    SGLang's overlap scheduler does (its ``output_ids`` already hold them; the next step they are gone again: a
    rewind). ``gpu_ms``: the rest of a served step after its preparation (the verify and the scheduler's other work),
    slept after each step, during which background indexing goes on. Returns ``{form: [(batch, prepare s, drafter
    call s), ...]}``, the decode steps, and the first form's drafting: request steps, the drafts they accepted (and per
    request step), those that drafted nothing (``undrafted``: the admission still indexing), the corpus's stats."""
    import numpy as np
    import torch
    from acceptance_replay import accepted, parents_from_mask

    from lumotree.sglang import draft_timing
    from lumotree.sglang.suffix import SuffixCorpus, admit_prefilled, prepare_draft_tokens

    prepare = {"parts": prepare_draft_tokens, "views": prepare_views}
    workers = {f: types.SimpleNamespace(draft_token_num=nodes, max_trie_depth=4096, ngram_corpus=SuffixCorpus(nodes),
                                        enable_overlap=True) for f in forms}
    calls = []
    real_timed = draft_timing.timed

    def timed(timer, batch_size, fn, *args):  # every drafter call, whether or not the server's timing is on
        t0 = time.perf_counter()
        out = fn(*args)
        calls.append(time.perf_counter() - t0)
        return out

    draft_timing.timed = timed
    samples = {f: [] for f in forms}
    queue, running, free, steps = list(range(len(per_session)))[::-1], {}, list(range(agents))[::-1], 0
    fresh = []  # the turns admitted since the last decode step: one prefill batch
    # the first form's request steps, the drafts they accepted, and those that drafted nothing (admission indexing)
    drafting = dict(request_steps=0, accepted_drafts=0, undrafted=0)
    try:
        def admit(agent, s, t):
            prompt, output = per_session[s][t]
            req = types.SimpleNamespace(rid=f"{s}-{t}", origin_input_ids=list(prompt), output_ids=[],
                                        inflight_middle_chunks=0)
            fresh.append(req)
            running[agent] = [req, output, [output[0]]]  # the prefill's token: spliced on, not yet in output_ids

        while queue or running:
            while free and queue:
                admit(free.pop(), queue.pop(), 0)
            prefilled = {id(r) for r in fresh}
            if fresh:
                for w in workers.values():
                    admit_prefilled(w, types.SimpleNamespace(reqs=list(fresh)))
                fresh.clear()
            if not background:
                for w in workers.values():
                    w.ngram_corpus.wait_admissions()  # a server drafts nothing for a request still indexing: not timed
            agents_now = sorted(running)
            reqs = [running[a][0] for a in agents_now]
            # overlap after a prefill: the requests that ran before it hold the last round's tokens in output_ids too
            doubled = [(r, len(r.output_ids), running[a][2]) for a, r in zip(agents_now, reqs)
                       if background and id(r) not in prefilled] if prefilled else []
            for r, _, pending in doubled:
                r.output_ids.extend(pending)
            acc = torch.zeros(len(reqs) * nodes, dtype=torch.int64)
            lens = torch.zeros(len(reqs), dtype=torch.int64)
            for i, a in enumerate(agents_now):
                pending = running[a][2]
                acc[i * nodes:i * nodes + len(pending)] = torch.tensor(pending)
                lens[i] = len(pending)
            batch = types.SimpleNamespace(reqs=reqs, grammar_needs_sync=lambda: False, spec_info=types.SimpleNamespace(
                accept_tokens=acc, accept_lens=lens, draft_token_num=nodes))
            got = {}
            for f in (forms if steps % 2 == 0 else forms[::-1]):  # the order alternates: a machine's swing hits both
                calls.clear()
                t0 = time.perf_counter()
                got[f] = prepare[f](workers[f], batch)
                samples[f].append((len(reqs), time.perf_counter() - t0, sum(calls)))
                if f == forms[0]:
                    drafting["undrafted"] += len(getattr(workers[f].ngram_corpus, "undrafted", ()))
            for r, n, _ in doubled:
                del r.output_ids[n:]
            if gpu_ms:
                time.sleep(gpu_ms / 1e3)
            first = got[forms[0]]
            for f in forms[1:]:
                if not (np.array_equal(first[0], got[f][0]) and np.array_equal(first[1], got[f][1])):
                    raise RuntimeError(f"step {steps}: forms {forms[0]} and {f} drafted differently")
            drafts = np.asarray(first[0]).reshape(len(reqs), nodes)
            masks = np.asarray(first[1]).reshape(len(reqs), nodes, nodes)
            done = []
            for i, a in enumerate(agents_now):
                req, ref, pending = running[a]
                req.output_ids.extend(pending)  # overlap: the last round's tokens reach output_ids a step late
                pos = len(req.output_ids)
                k = accepted(list(drafts[i]), parents_from_mask(masks[i].tolist()), ref[pos:])
                drafting["request_steps"] += 1
                drafting["accepted_drafts"] += k
                running[a][2] = list(ref[pos:pos + k + 1])
                if pos + len(running[a][2]) >= len(ref):
                    done.append(a)
            steps += 1
            for a in done:
                req, ref, pending = running.pop(a)
                req.output_ids.extend(pending)
                for w in workers.values():
                    w.ngram_corpus.erase_match_state([req.rid])
                s, t = map(int, req.rid.split("-"))
                if t + 1 < len(per_session[s]):
                    admit(a, s, t + 1)
                else:
                    free.append(a)
    finally:
        draft_timing.timed = real_timed
    corpus = workers[forms[0]].ngram_corpus
    drafting["accepted_per_request_step"] = round(drafting["accepted_drafts"] / max(1, drafting["request_steps"]), 3)
    drafting["corpus_stats"] = dict(corpus.stats)
    return samples, steps, drafting


def rows(samples) -> list:
    """Per form and batch bucket (the next power of two): steps, median preparation / drafter call / difference."""
    from lumotree.sglang.adaptive import bucket

    out = []
    for form, got in samples.items():
        for b in sorted({bucket(n) for n, _, _ in got}):
            xs = [(p, c) for n, p, c in got if bucket(n) == b]
            ps = sorted(p for p, _ in xs)
            out.append(dict(form=form, batch_bucket=b, steps=len(xs),
                            prepare_ms=round(statistics.median(ps) * 1e3, 3),
                            drafter_call_ms=round(statistics.median(c for _, c in xs) * 1e3, 3),
                            python_ms=round(statistics.median(p - c for p, c in xs) * 1e3, 3),
                            prepare_p95_ms=round(ps[min(len(ps) - 1, int(0.95 * len(ps)))] * 1e3, 3),
                            prepare_max_ms=round(ps[-1] * 1e3, 3), prepare_total_ms=round(sum(ps) * 1e3, 1)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from acceptance_replay import stream_args

    stream_args(ap, reference="none/32")
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--form", choices=(*FORMS, "both"), default="both")
    ap.add_argument("--background", action="store_true",
                    help="admissions indexed in the background as served, the overlap scheduler's doubled tokens "
                         "after a prefill (one --form)")
    ap.add_argument("--gpu-ms", type=float, default=0.0,
                    help="with --background: ms slept after each step for the rest of a served step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.background and args.form == "both":
        ap.error("--background replays one --form: a step drafts nothing for a request still indexing, whose timing "
                 "differs between two corpora")
    from acceptance_replay import served_turns, write_result

    forms = FORMS if args.form == "both" else (args.form,)
    t0 = time.perf_counter()
    samples, steps, drafting = replay(served_turns(args), args.agents, args.nodes, forms, background=args.background,
                            gpu_ms=args.gpu_ms)
    got = rows(samples)
    for r in got:
        print(r, flush=True)
    return write_result(__file__, argv, args.out, reference=args.reference, nodes=args.nodes, decode_steps=steps, drafting=drafting,
                        background=args.background, gpu_ms=args.gpu_ms, seconds=round(time.perf_counter() - t0, 1),
                        rows=got)


if __name__ == "__main__":
    main()
