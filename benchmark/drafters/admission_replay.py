"""What LUMOTREE_SUFFIX's drafter spends admitting each agent turn, replayed on the CPU.

Each turn of an agent session is a new request whose prompt is the conversation so far; the server hands
the drafter its last ``--window`` tokens (``lumotree.sglang.suffix``: 4,096) and the drafter indexes them on
the scheduler's thread (``SuffixDrafter.start``) -- unless it adopts the trie of the session's previous
turn and indexes only what follows it. This replays ``benchmark/workloads/agents_bench.py``'s sessions (its
defaults: 32 sessions x 13 turns, history collapse past 6.5k tokens) as the server sees them -- prompts
rendered with the model's chat template and tokenized, ``--agents`` sessions at a time turn by turn, each
turn's output (128 tokens) appended and the request finished -- and times every admission.

The replies: deterministic stand-ins (a line of the session's file per turn, repeated to 128 tokens),
not a model's; what matters here is that each next prompt holds the previous turn's output.

    python3 benchmark/drafters/admission_replay.py --agents 8,32 --out benchmark/results/admission_replay_cpu.json

``--extension PATH``: another build of ``lumotree._host`` (e.g. from an earlier commit's
``csrc/host/suffix_drafter.cc``) timed instead, with ``--retired-tokens`` as that version served. ``--stage``: only
the scheduler thread's share of each admission (``stage_batch``: the checks, the prompt's conversion, the choice of a
finished turn's trie to adopt; the indexing runs on the drafter's admission thread), as LumoTree's worker admits a
prefilled prompt. ``--replies``: a run's recorded replies (``agents_bench.py --replies-out``, ``--reference``'s) as the
turns' outputs instead of the stand-ins. ``--threads 1,2``:
also each round's turns admitted in one ``start_batch`` call (as LumoTree admits a prefill batch) on that many of
the drafter's threads.
"""
import argparse
import gzip
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))
sys.path.insert(0, HERE)

MODEL = os.path.join(HERE, "..", "models", "tiny-hybrid")


def render(messages, generation: bool) -> str:
    """The tiny model's chat template (``chat_template.jinja``)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation else "")


def turns_of(sessions, encode, count, collapse_tokens: int, max_tokens: int, replies=None):
    """Per session, per turn: ``(prompt ids, output ids)`` as the server sees them; ``replies``: the recorded
    replies per session id (``agents_bench.py --replies-out``), else stand-ins."""
    import agents_bench as ab

    out = []
    for s in sessions:
        msgs = [dict(role="system", content=s["system"]), dict(role="user", content=s["task"])]
        turns = []
        for t, obs in enumerate(s["observations"]):
            msgs = ab.collapse(msgs, count, collapse_tokens)
            ids = encode(render(msgs, True))
            if replies is not None:
                reply = replies[str(s["id"])][t]
            else:
                line = next((ln for ln in obs.splitlines()[1:] if ln.strip()), obs[:80])
                reply = f"<tool>view</tool><args>{line.strip()}</args>"
                while len(encode(reply)) < max_tokens:
                    reply += " " + line.strip()
            output = encode(render(msgs + [dict(role="assistant", content=reply)], False))[len(ids):][:max_tokens]
            turns.append((ids, output))
            msgs += [dict(role="assistant", content=reply), dict(role="user", content="OBSERVATION:\n" + obs)]
        out.append(turns)
    return out


def turn_order(per_session, agents: int):
    """``(request id, prompt ids, output ids)`` of every turn, ``agents`` sessions at a time, turn by turn."""
    for g in range(0, len(per_session), agents):
        group = per_session[g:g + agents]
        for t in range(max(len(x) for x in group)):
            for i, turns in enumerate(group):
                if t < len(turns):
                    yield (f"{g + i}-{t}", *turns[t])


def replay(drafter, per_session, agents: int, window: int, batched: bool = False, stage: bool = False):
    """Admission seconds of every turn, ``agents`` sessions at a time, turn by turn; ``batched``: each round's
    turns (one per session of the group) admitted in one ``start_batch`` call, as a prefill batch of them is (each
    turn counted the call's time over the round's turns); ``stage``: each turn admitted as LumoTree's worker admits a
    prefilled prompt, ``stage_batch`` on the scheduler's thread (timed: the checks, the prompt's conversion, the
    choice of a finished turn's trie to adopt), then ``index_staged`` and ``commit_staged`` (not timed: the
    indexing runs on the drafter's admission thread)."""
    times, rounds = [], {}
    for rid, ids, output in turn_order(per_session, agents):
        group, t = rid.rsplit("-", 1)
        rounds.setdefault((int(group) // agents, int(t)), []).append((rid, ids, output))
    for turns in rounds.values():  # in turn_order's order
        if batched:
            t0 = time.perf_counter()
            drafter.start_batch([rid for rid, _, _ in turns], [ids[-window:] for _, ids, _ in turns])
            times += [(time.perf_counter() - t0) / len(turns)] * len(turns)
        for rid, ids, output in turns:
            if stage:
                t0 = time.perf_counter()
                staged = drafter.stage_batch([rid], [ids[-window:]])
                times.append(time.perf_counter() - t0)
                drafter.index_staged(staged)
                drafter.commit_staged(staged)
            elif not batched:
                t0 = time.perf_counter()
                drafter.start(rid, ids[-window:])
                times.append(time.perf_counter() - t0)
            drafter.append(rid, output)
            drafter.finish(rid, output)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="8,32")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=13)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--extension", default=None, help="another build of lumotree._host to time")
    ap.add_argument("--retired-tokens", type=int, default=None,
                    help="the drafter's retired_tokens (default: what LUMOTREE_SUFFIX serves with)")
    ap.add_argument("--threads", default=None,
                    help="e.g. 1,2: also each round's turns admitted in one start_batch call on that many drafter "
                         "threads (rows with threads; without: one start per turn)")
    ap.add_argument("--stage", action="store_true",
                    help="time only what the scheduler's thread spends per admission (stage_batch; see replay)")
    ap.add_argument("--replies", default=None,
                    help="agents_bench.py --replies-out (gzip JSON): the served replies of --reference as the turns' "
                         "outputs instead of stand-ins")
    ap.add_argument("--reference", default="none/32")
    ap.add_argument("--drafter-kw", action="append", default=None,
                    help="the drafter with these settings over the served ones (JSON, e.g. '{\"max_spec\": 24}'); "
                         "repeat to compare several, alternated within each repetition (rows with drafter_kw)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.stage and args.threads:
        ap.error("--stage times single admissions: no --threads")
    import agents_bench as ab
    from tokenizers import Tokenizer

    from lumotree.drafters import suffix as S
    from lumotree.sglang.suffix import SuffixCorpus

    if args.extension:
        spec = importlib.util.spec_from_file_location("_host", args.extension)
        ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ext)
        S._host_extension = lambda: ext
    kw = dict(SuffixCorpus(16).kw)
    if args.retired_tokens is not None:
        kw["retired_tokens"] = args.retired_tokens
    tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    encode = lambda s: tok.encode(s).ids  # noqa: E731
    count = ab.token_counter(MODEL)
    replies = None
    if args.replies:
        with gzip.open(args.replies, "rt") as f:
            replies = json.load(f)[args.reference]
    per_session = turns_of(ab.make_sessions(args.sessions, args.turns, 0), encode, count, 6500, 128, replies=replies)
    rows = []
    modes = [None] + ([int(t) for t in args.threads.split(",")] if args.threads else [])
    settings = [json.loads(k) for k in args.drafter_kw] if args.drafter_kw else [None]
    for agents in (int(a) for a in args.agents.split(",")):
        for r in range(args.repeat):
            for threads, extra in ((t, x) for x in settings for t in modes):  # per turn, then batched rounds
                dkw = dict(kw, **(extra or {}))
                d = S.NativeSuffixDrafter(**dkw) if threads is None else S.NativeSuffixDrafter(threads=threads, **dkw)
                times = replay(d, per_session, agents, args.window, batched=threads is not None, stage=args.stage)
                row = dict(agents=agents, repeat=r, **({} if threads is None else dict(threads=threads)),
                           **({} if extra is None else dict(drafter_kw=extra)),
                           **(dict(part="stage_batch") if args.stage else {}), stats=d.stats,
                           turns=len(times), total_s=round(sum(times), 3),
                           median_ms=round(1e3 * statistics.median(times), 3),
                           p95_ms=round(1e3 * sorted(times)[int(0.95 * (len(times) - 1))], 3))
                rows.append(row)
                print(json.dumps(row), flush=True)
    from acceptance_replay import write_result

    return write_result(__file__, argv, args.out, drafter=kw, extension=args.extension, rows=rows)


if __name__ == "__main__":
    main()
