"""Concurrent coding agents against each server's OpenAI API (GPU machine): the agent workload's speed.

    python3 benchmark/workloads/agents_bench.py --model benchmark/models/tiny-hybrid \\
        --configs none,ngram,lumotree-suffix,lumotree --agents 1,8,32 --out benchmark/results/agents_h200.json

Sessions (:func:`make_sessions`, deterministic for ``--seed``) look like SWE-agent's: a system prompt
with tool documentation, a task, then scripted observations of several kinds over real files of this
machine's Python standard library -- 100-line file views, search hits, directory listings, diffs of
edits, pytest logs, tracebacks. The loop is closed: each turn sends the history so far to
``/v1/chat/completions`` (greedy), and the model's own reply becomes the assistant message before
the next observation. Once a prompt passes ``--collapse-tokens`` tokens, the oldest observations are
replaced by one line (as SWE-agent's history processors do), so prompts grow to ~6-8k tokens and
then edit the middle of a cached prefix. ``--agents K`` runs K agents at once, each working through
its share of the sessions; the radix cache is on (every server with its flags alone). Each server first
serves other sessions at every ``--agents`` level K, K of them at once (at most ``--warmup-sessions``), so
that the just-in-time compiles the batch sizes and prompt lengths of the measured phases meet land there
(timed as ``warmup_s``; ``--jit-log`` counts what still compiles inside each phase); every measured phase starts
from ``/flush_cache`` (the radix cache and the drafters' corpora emptied). A run longer than one sitting:
``--resume`` keeps the configurations an interrupted run of the same command finished, so the one command is
repeated until every server has run (``--replies-out`` keeps the replies the parity needs).

Rows ``{config, agents, tokens_per_s, accept_length, latency_p50, latency_p95, cached_fraction,
turns, prompt_tokens_max}``: completion tokens per second of wall time; per-turn latency (s);
``cached_fraction`` = cached / prompt tokens (SGLang's ``usage.prompt_tokens_details``, with
``--enable-cache-report``); ``accept_length``: the server's average over the run (``/get_server_info`` read after
it; the flush before every run resets SGLang's counters; with ``--repeats``, the median run's). Phases run in the
order of ``--agents``.

Every ``--agents`` level serves sessions of its own (:func:`phase_seed`: the first level ``--seed``, each later one
another; ``session_seeds`` in ``--out``) from a flushed server: ``/flush_cache`` empties the radix cache and also
the drafters' corpora (SGLang's NGRAM worker resets its corpus there, LUMOTREE_SUFFIX's worker inherits that), and
the greedy tiny model answers the same sessions with the same replies, so a level that followed another on the same
sessions without a flush drafted from memory: replayed on the CPU as served (32 agents stepping together, 16-node
trees, ``benchmark/drafters/acceptance_replay.py --concurrent``), a second pass over the same sessions drafted 12.3
tokens per request step against a fresh pass's 5.2 (SGLang's NGRAM corpus 6.6 against 4.0).

``--repeats R``: each measured phase runs R times per server on the same sessions, the server flushed before each;
the row is the run of median speed (``repeats``: every run's tokens/s; ``repeats_latency_p95``: every run's p95 turn
latency; ``latency_p95_all``: the p95 over every run's turns): at 32 agents one 12-19 s phase of SGLang's
NGRAM server took 11.5 s in one run and 19.3 s in another (same flags, two machines, no compile in either).

``--abort-every K``: every K-th turn is first sent and aborted mid-way (a user interrupting it), then
sent again, so that aborted requests' states meet the radix cache (``aborted_turns``; ``aborts_mid_run``:
those whose abort found the request still running).

Losslessness on the same traffic: every reply is kept (``--replies-out``, gzip JSON) and each
configuration's phase is compared with the no-speculation server's same phase (:func:`compare`:
turns whose reply is identical, sessions with a difference, the first differing turn). With
``--extra=--enable-deterministic-inference --extra=--attention-backend=triton --tag=-exact`` every
server runs in the decode-exact mode, where LumoTree's replies must equal no speculation's. ``--margins N`` reads
how close each difference was: the no-speculation server, served last and kept up until the others are done, answers
the first differing turn of up to N differing sessions per server again with its top-2 log-probabilities, and the
margin is its top-1 minus top-2 where the other reply parts from its answer (:func:`margins`).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import gzip
import json
import os
import queue
import random
import statistics
import sys
import sysconfig
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serving"))

SYSTEM = """You are a software engineering agent working in a Python repository.
Call exactly one tool per turn: <tool>NAME</tool><args>ARGUMENTS</args>
Tools:
- view PATH START: print 100 lines of PATH from line START, numbered.
- search PATTERN DIR: list the files and lines under DIR that contain PATTERN.
- ls DIR: list a directory.
- edit PATH START END: replace lines START..END of PATH with the text after the command.
- run_tests PATH: run the tests of PATH and print the report.
- submit: finish.
Keep edits minimal and re-run the tests after every edit."""

KINDS = ("view", "view", "search", "ls", "edit", "run_tests", "traceback")


def _stdlib_files(rng, k):
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.join(root, n) for n in os.listdir(root)
                   if n.endswith(".py") and 2_000 < os.path.getsize(os.path.join(root, n)) < 300_000)
    return [rng.choice(files) for _ in range(k)]


def _numbered(lines, start):
    return "\n".join(f"{start + i:6d}\t{ln}" for i, ln in enumerate(lines))


def observation(rng, kind, lines, rel, func):
    """One tool output of ``kind`` over a file's ``lines`` (edits change ``lines`` in place)."""
    start = rng.randint(1, max(1, len(lines) - 100))
    if kind == "view":
        return _numbered(lines[start - 1:start + 99], start)
    if kind == "search":
        word = func if rng.random() < 0.5 else rng.choice(["return", "self", "raise", "None", "def "])
        hits = [f"{rel}:{i + 1}:{ln}" for i, ln in enumerate(lines) if word in ln][:40]
        return "\n".join(hits) or f"No matches for {word!r}"
    if kind == "ls":
        names = sorted({os.path.basename(p) for p in _stdlib_files(rng, 25)})
        return "\n".join(["README.md", "setup.py", "src/", "tests/"] + [f"src/{n}" for n in names])
    if kind == "edit":
        s2 = rng.randint(start, min(len(lines), start + 60))
        e2 = min(len(lines), s2 + rng.randint(1, 6))
        old = lines[s2 - 1:e2]
        new = [ln + "  # guarded" if ln.strip() else ln for ln in old]
        lines[s2 - 1:e2] = new
        return "\n".join([f"--- a/{rel}", f"+++ b/{rel}", f"@@ -{s2},{len(old)} +{s2},{len(new)} @@"]
                         + [f"-{ln}" for ln in old] + [f"+{ln}" for ln in new])
    if kind == "run_tests":
        n = rng.randint(4, 14)
        failed = rng.randint(0, 3)
        body = [f"tests/test_{os.path.basename(rel)}::test_{func}_{i} {'FAILED' if i < failed else 'PASSED'} "
                f"[{100 * (i + 1) // n:3d}%]" for i in range(n)]
        return "\n".join(["============================= test session starts ==============================",
                          f"collected {n} items", ""] + body +
                         [f"========================= {n - failed} passed, {failed} failed in "
                          f"{rng.uniform(0.1, 3):.2f}s ========================="])
    frames = [f'  File "{rel}", line {rng.randint(1, len(lines))}, in {func}\n    {lines[rng.randrange(len(lines))].strip()}'
              for _ in range(rng.randint(2, 5))]
    return "Traceback (most recent call last):\n" + "\n".join(frames) + f"\nValueError: empty input to {func}()"


def phase_seed(seed: int, level_index: int) -> int:
    """The session seed of the ``level_index``-th ``--agents`` level: ``seed`` for the first, another for every later
    one (warm-up sessions take ``seed + 1000``, profiled ones ``seed + 2000``)."""
    return seed + level_index


def make_sessions(n: int, turns: int, seed: int = 0):
    """``n`` scripted sessions: ``dict(id, system, task, observations)``; deterministic for ``seed``."""
    rng = random.Random(seed)
    out = []
    for sid, path in enumerate(_stdlib_files(rng, n)):
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
        rel = "src/" + os.path.basename(path)
        funcs = [ln.split("def ", 1)[1].split("(")[0] for ln in lines if ln.lstrip().startswith("def ")] or ["main"]
        func = rng.choice(funcs)
        task = (f"Issue: `{func}` in {rel} fails on empty input (ValueError). The tests in "
                f"tests/test_{os.path.basename(path)} reproduce it. Find the cause and fix it.")
        obs = [observation(rng, "search" if t == 0 else rng.choice(KINDS), lines, rel, func) for t in range(turns)]
        out.append(dict(id=sid, system=SYSTEM, task=task, observations=obs))
    return out


def collapse(messages, count_tokens, limit: int):
    """Replace the oldest observations (user messages after the task) by one line each until the
    prompt has at most ``limit`` tokens (or nothing is left to collapse). Returns a new list."""
    msgs = [dict(m) for m in messages]
    i = 2
    while count_tokens(msgs) > limit and i < len(msgs) - 1:
        if msgs[i]["role"] == "user" and not msgs[i]["content"].startswith("Old environment output"):
            n = msgs[i]["content"].count("\n") + 1
            msgs[i]["content"] = f"Old environment output: ({n} lines omitted)"
        i += 1
    return msgs


def conversation(session, count_tokens, limit: int):
    """A session's turns as the agent sends them: yields each turn's messages (the history collapsed to ``limit``
    tokens) and takes the turn's reply (``send``) to build the next one -- :func:`run_phase`'s loop, and
    :func:`messages_at` replaying it."""
    msgs = [dict(role="system", content=session["system"]), dict(role="user", content=session["task"])]
    for obs in session["observations"]:
        msgs = collapse(msgs, count_tokens, limit)
        reply = yield msgs
        msgs = msgs + [dict(role="assistant", content=reply), dict(role="user", content="OBSERVATION:\n" + obs)]


def _send(talk, reply):
    """The conversation's next turn's messages after ``reply``; ``None`` after its last turn."""
    try:
        return talk.send(reply)
    except StopIteration:
        return None


def messages_at(session, earlier_replies, count_tokens, limit: int):
    """The messages turn ``len(earlier_replies)`` of ``session`` sent, its earlier turns having replied
    ``earlier_replies`` (the loop is closed: the prompt of a turn is built from the replies before it)."""
    talk = conversation(session, count_tokens, limit)
    msgs = next(talk)
    for reply in earlier_replies:
        msgs = _send(talk, reply)
        if msgs is None:
            raise ValueError(f"session {session['id']} has {len(session['observations'])} turns, "
                             f"not {len(earlier_replies) + 1}")
    return msgs


def first_token_margin(url, messages, reply: str, max_tokens: int, send=None) -> dict:
    """Where a speculative server's ``reply`` first parts from the reference server's greedy reply to the same
    ``messages``, and by how much the reference's choice won there: the turn is asked again of the reference server
    (``url``) with its top-2 log-probabilities per token (OpenAI ``logprobs``/``top_logprobs``), and its tokens are
    walked until their text is no longer a prefix of ``reply``. Returns ``token_index`` (``None``: the regenerated
    reply never parts from ``reply``), ``margin`` (top-1 minus top-2 log-probability there, nats), the two tokens,
    ``took_second`` (``reply`` continues with the reference's second choice) and ``regenerated`` (the regenerated
    reply's text: a reference that does not reproduce its own reply shows here)."""
    if send is None:
        from sglang_server import post

        def send(body):
            return post(url + "/v1/chat/completions", body, timeout=600)
    r = send(dict(model="default", messages=messages, max_tokens=max_tokens, temperature=0, logprobs=True,
                  top_logprobs=2))
    choice = r["choices"][0]
    content = ((choice.get("logprobs") or {}).get("content")) or []
    text = ""
    for i, item in enumerate(content):
        tok = item["token"]
        if not reply.startswith(text + tok):
            top = sorted(item.get("top_logprobs") or [], key=lambda t: -t["logprob"])
            alt = next((t for t in top if t["token"] != tok), None)
            rest = reply[len(text):]
            return dict(token_index=i, token=tok, second=alt and alt["token"],
                        margin=(item["logprob"] - alt["logprob"]) if alt else None,
                        took_second=bool(alt and alt["token"] and rest.startswith(alt["token"])),
                        regenerated=choice["message"]["content"])
        text += tok
    return dict(token_index=None, margin=None, regenerated=choice["message"]["content"])


def margins(url, sessions, runs, parity, count_tokens, limit: int, max_tokens: int, per_key: int = 32,
            send=None) -> dict:
    """Per phase of ``parity`` with a difference (``"config/agents"``): at the first differing turn of each session
    that differs (at most ``per_key`` sessions), :func:`first_token_margin` of the reference server (``url``) against
    the configuration's reply, that turn's prompt rebuilt from the reference's earlier replies (equal to the
    configuration's: it is the first difference). Returns ``{key: dict(sessions=[...], summary)}``."""
    by_id = {str(s["id"]): s for s in sessions}
    out = {}
    for key, p in parity.items():
        if not p.get("sessions_with_difference"):
            continue
        rep, ref = runs.get(key, {}), runs.get(p["reference"], {})
        found = []
        for sid in sorted(ref, key=int):
            a, b = rep.get(sid, []), ref[sid]
            turn = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if turn is None or sid not in by_id or len(found) >= per_key:
                continue
            msgs = messages_at(by_id[sid], b[:turn], count_tokens, limit)
            try:
                m = first_token_margin(url, msgs, a[turn], max_tokens, send=send)
            except Exception as e:  # recorded: the other sessions still get theirs
                m = dict(error=repr(e)[:500])
            m.update(session=int(sid), turn=turn, reference_reproduced=m.get("regenerated") == b[turn])
            m.pop("regenerated", None)
            found.append(m)
        got = sorted(m["margin"] for m in found if m.get("margin") is not None)
        out[key] = dict(sessions=found, summary=dict(
            measured=len(got), margin_min=got[0] if got else None,
            margin_median=statistics.median(got) if got else None, margin_max=got[-1] if got else None,
            took_second=sum(bool(m.get("took_second")) for m in found),
            reference_reproduced=sum(bool(m.get("reference_reproduced")) for m in found)))
    return out


LANE_TOKENS = 1_000_000  # a lane server's KV pool, tokens (--max-total-tokens)
LANE_STATES = 4096  # its hybrid state pool, requests and cached prefixes (--max-mamba-cache-size)


def lane_memory(base, tokens: int = LANE_TOKENS, states: int = LANE_STATES):
    """``base`` (the servers' flags) for one of several servers sharing a GPU (``--lanes``): fixed pools instead of a
    share of ``--mem-fraction-static``. SGLang sizes its pools from the memory free when the server measures it, less a slack
    of ``1 - fraction`` times what was free before its model loaded: servers starting at once each see the others'
    pools appear inside that window, and on the H200 one of four lanes with an eighth each failed its start (its
    state pool came out at -46,110 requests). Here each lane's pools are capped (KV ``tokens``, hybrid state
    ``states``: the workload's few thousand requests and cached prefixes) and the fraction only has to leave them
    positive."""
    out = list(base)
    i = out.index("--mem-fraction-static")
    out[i + 1] = "0.85"
    return out + ["--max-total-tokens", str(tokens), "--max-mamba-cache-size", str(states)]


class Turns:
    """The GPU's turns among servers that share it (``--lanes N --take-turns``): they start at once, then warm up and
    serve their measured phases one at a time, in :meth:`order`'s order -- each level's repeats round-robin over the
    servers (server A's first run, B's first, A's second, ...), so that a host that runs slower for a while (the same
    H200 host's pure-Python probe read 12 and 21 ms before two servers of one run) slows every server's runs alike
    instead of one server's. A server that fails gives up its turns (:meth:`drop`)."""

    def __init__(self, order):
        self.order, self.i, self.cv = list(order), 0, threading.Condition()

    @staticmethod
    def order(configs, levels, repeats):
        return ([("warm-up", c) for c in configs]
                + [(c, a, r) for a in levels for r in range(repeats) for c in configs])

    def _skip(self):
        while self.i < len(self.order) and self.order[self.i] is None:
            self.i += 1

    def wait(self, key):
        with self.cv:
            self._skip()
            if key not in self.order[self.i:]:
                raise KeyError(f"no turn {key!r} left")
            self.cv.wait_for(lambda: (self._skip(), self.order[self.i] == key)[1])

    def done(self, key):
        with self.cv:
            self._skip()
            if self.i < len(self.order) and self.order[self.i] == key:
                self.i += 1
            self.cv.notify_all()

    def drop(self, config):
        with self.cv:  # its warm-up ("warm-up", config) and its runs (config, level, repeat)
            self.order = [None if k is None or config == (k[1] if k[0] == "warm-up" else k[0]) else k
                          for k in self.order]
            self.cv.notify_all()

    @contextlib.contextmanager
    def turn(self, key):
        self.wait(key)
        try:
            yield
        finally:
            self.done(key)


def no_turn(_key=None):
    return contextlib.nullcontext()


CONTEXT_SLACK = 192  # the chat template's tokens and the client's approximate count against the server's


def context_room(model_dir, collapse_tokens: int, max_tokens: int):
    """Tokens to spare in the checkpoint's context (``max_position_embeddings``) for a prompt collapsed at
    ``collapse_tokens`` (as the client counts it; the server's count runs up to :data:`CONTEXT_SLACK` higher) plus
    ``max_tokens`` new ones; ``None`` without a config to read."""
    path = os.path.join(model_dir or "", "config.json")
    if not os.path.isfile(path):
        return None
    cfg = json.load(open(path))
    ctx = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return None if ctx is None else ctx - collapse_tokens - CONTEXT_SLACK - max_tokens


def token_counter(model_dir):
    """Prompt tokens of a message list: the checkpoint's tokenizer when there is one, else ~4 chars/token. Each
    message's count is computed once (cached by its text; the same counts): a turn's history collapse counts the whole
    prompt, once more per collapsed observation, and the tokenizer's ``encode`` does not run in parallel across
    threads (two threads encoding: no faster than one, on this repository's CPU machine) -- with every agent thread
    encoding its prompt of up to 6.6k tokens afresh at every turn (5-50 ms a turn on that machine), a round of 32
    turns spent up to ~0.2 s on the client one turn after another, which the server may wait through."""
    path = os.path.join(model_dir or "", "tokenizer.json")
    if os.path.isfile(path):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        tokens = functools.lru_cache(maxsize=1 << 16)(lambda text: len(tok.encode(text).ids))
        return lambda msgs: sum(tokens(m["content"]) + 4 for m in msgs)
    return lambda msgs: sum(len(m["content"]) // 4 + 4 for m in msgs)


def chat(url, messages, max_tokens, model="default", timeout=600, rid=None):
    from sglang_server import post

    body = dict(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    if rid is not None:
        body["rid"] = rid
    return post(url + "/v1/chat/completions", body, timeout=timeout)


def aborted_turn(url, messages, max_tokens, rid: str, after_s: float, send=chat, abort=None):
    """The turn as a user who interrupts it: the request is sent, aborted after ``after_s`` seconds
    (SGLang's ``/abort_request``), and its (partial or error) answer dropped; the agent then sends the
    turn again. Returns whether the abort found the request still running (an answer with
    ``finish_reason`` abort, or an HTTP error)."""
    if abort is None:
        from sglang_server import post

        def abort(rid):
            post(url + "/abort_request", {"rid": rid})
    box = {}

    def first():
        try:
            box["r"] = send(url, messages, max_tokens, rid=rid)
        except Exception as e:  # an aborted request may end with an HTTP error
            box["e"] = e

    th = threading.Thread(target=first)
    th.start()
    time.sleep(after_s)
    abort(rid)
    th.join()
    if "e" in box:
        return True
    reason = ((box["r"].get("choices") or [{}])[0].get("finish_reason") or "")
    return "abort" in str(reason)


def run_phase(url, sessions, agents: int, max_tokens: int, count_tokens, limit: int, send=chat,
              abort_every: int = 0, abort_after_s: float = 0.05, abort=None):
    """Run every session with ``agents`` concurrent agents; returns per-turn records and the wall time.
    ``abort_every`` K > 0: turn ``t`` of session ``s`` with ``(s + t) % K == K - 1`` is first sent and
    aborted mid-way (:func:`aborted_turn`), then sent again (its record is the second answer's, with
    ``aborted`` set)."""
    todo = list(sessions)
    lock = threading.Lock()
    turns = []

    def agent():
        while True:
            with lock:
                if not todo:
                    return
                s = todo.pop(0)
            talk = conversation(s, count_tokens, limit)
            msgs = next(talk, None)
            replied = None  # when the last reply came: what the agent's own work takes until the next send
            while msgs is not None:
                turn = sum(m["role"] == "assistant" for m in msgs)
                interrupted = None
                if abort_every > 0 and (int(s["id"]) + turn) % abort_every == abort_every - 1:
                    interrupted = aborted_turn(url, msgs, max_tokens, f"agents-{s['id']}-{turn}-abort", abort_after_s,
                                               send=send, abort=abort)
                t0 = time.perf_counter()
                client = None if replied is None or interrupted is not None else t0 - replied
                r = send(url, msgs, max_tokens)
                replied = time.perf_counter()
                dt = replied - t0
                usage = r.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                reply = r["choices"][0]["message"]["content"] or ""
                with lock:
                    turns.append(dict(session=s["id"], turn=turn, latency=dt,
                                      completion_tokens=usage.get("completion_tokens", 0),
                                      prompt_tokens=usage.get("prompt_tokens", 0),
                                      cached_tokens=details.get("cached_tokens", 0) or 0, reply=reply,
                                      aborted=interrupted, client_s=client))
                msgs = _send(talk, reply)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(agents) as pool:
        for f in [pool.submit(agent) for _ in range(agents)]:
            f.result()
    return turns, time.perf_counter() - t0


def resumed(res, runs, args) -> set:
    """``--resume``: the configurations an earlier run of the same command finished -- a server without an error,
    a row for every ``--agents`` level and (with ``--replies-out``) its replies, on this machine unless
    ``--resume-across-machines`` (:func:`sglang_server.kept_on`) -- copied into ``res`` and ``runs``. Another
    command's file is refused."""
    from sglang_server import earlier_run, kept_on, machine

    old = earlier_run(args.out, res["command"])
    if old is None:
        return set()
    if old.get("session_seeds") != res.get("session_seeds"):  # an earlier version served other sessions
        print(f"--resume: {args.out} served other sessions (session_seeds {old.get('session_seeds')}): not kept",
              file=sys.stderr)
        return set()
    here = machine()
    old_replies = {}
    if args.replies_out and os.path.exists(args.replies_out):
        with gzip.open(args.replies_out, "rt") as f:
            old_replies = json.load(f)
    levels = [int(a) for a in args.agents.split(",")]
    done = set()
    for config in args.configs.split(","):
        name = config + args.tag
        srv = old.get("servers", {}).get(name)
        rows = [r for r in old.get("rows", []) if r.get("config") == name and not r.get("partial")]
        keys = [f"{name}/{a}" for a in levels]
        if (srv is not None and "error" not in srv and {r["agents"] for r in rows} >= set(levels)
                and (not args.replies_out or all(k in old_replies for k in keys))
                and kept_on(srv, name, here, args.resume_across_machines)):
            done.add(name)
            res["rows"] += rows
            res["servers"][name] = srv
            runs.update({k: v for k, v in old_replies.items()  # replies, and every repeat's turn details
                         if any(k == key or k.startswith(key + DETAILS) for key in keys)})
    return done


def trace_written(d) -> bool:
    """Whether SGLang's profiler already wrote its trace into ``d`` (it does when it stops after its steps)."""
    return any(".trace.json" in f for f in os.listdir(d)) if os.path.isdir(d) else False


def profile_phases(url, args, name, count):
    """``--profile-dir``: per ``--agents`` level, sessions of another seed (as many as the level; their prompts
    are new to the radix cache) served while SGLang's torch profiler records ``--profile-steps`` forward steps
    from the first turn on -- the level's prefills and decode or verify steps as they interleave. Returns
    the trace directories."""
    from sglang_server import post, stop_profile

    out = {}
    for agents in (int(a) for a in args.agents.split(",")):
        d = os.path.abspath(os.path.join(args.profile_dir, f"{name}-{agents}"))
        os.makedirs(d, exist_ok=True)
        post(url + "/start_profile", dict(output_dir=d, num_steps=args.profile_steps, activities=["CPU", "GPU"],
                                          with_stack=True, profile_prefix=f"{name}-{agents}"))
        run_phase(url, make_sessions(agents, 2, args.seed + 2000), agents, args.max_tokens, count, args.collapse_tokens)
        if not trace_written(d):  # sessions shorter than --profile-steps would leave no trace; a written trace
            stop_profile(url)     # means the profiler stopped itself (a stop then is a traceback in the server log)
        out[str(agents)] = d
    return out


def p95(xs):
    """The 95th percentile of the sorted ``xs`` (the nearest rank below), None for none."""
    return xs[int(0.95 * (len(xs) - 1))] if xs else None


def summarize(config, agents, turns, wall, accept_length=None):
    lat = sorted(t["latency"] for t in turns)
    prompt = sum(t["prompt_tokens"] for t in turns)
    return dict(config=config, agents=agents, turns=len(turns), seconds=round(wall, 3),
                tokens_per_s=sum(t["completion_tokens"] for t in turns) / wall if wall > 0 else 0.0,
                accept_length=accept_length, latency_p50=statistics.median(lat) if lat else None,
                latency_p95=p95(lat),
                cached_fraction=sum(t["cached_tokens"] for t in turns) / prompt if prompt else None,
                prompt_tokens_max=max((t["prompt_tokens"] for t in turns), default=0),
                aborted_turns=sum(t.get("aborted") is not None for t in turns),
                aborts_mid_run=sum(bool(t.get("aborted")) for t in turns),
                **client_gap(turns))


def client_gap(turns) -> dict:
    """The client's own time between a turn's reply and the same session's next send (its history, the collapse's
    token counts, building the request: time the server may wait), median and p95 in ms, where measured."""
    gaps = sorted(t["client_s"] for t in turns if t.get("client_s") is not None)
    if not gaps:
        return {}
    return dict(client_ms_p50=round(1e3 * statistics.median(gaps), 3),
                client_ms_p95=round(1e3 * p95(gaps), 3))


def repeated(config, agents, phases, accept_lengths=None):
    """The row of ``--repeats`` runs of one phase (``phases``: ``[(turns, wall)]``, ``accept_lengths``: each run's):
    the run of median speed (the lower median for an even count), with every run's tokens/s in ``repeats``, every
    run's p95 turn latency in ``repeats_latency_p95`` and the p95 over all runs' turns in ``latency_p95_all`` when
    there is more than one (a tail judged on one run's ~5 % slowest turns moves with the run: at 8 agents a row's p95
    sat 0.3 ms above no speculation's where the first run's was 10 ms below)."""
    accept_lengths = accept_lengths or [None] * len(phases)
    rows = [summarize(config, agents, turns, wall, acc) for (turns, wall), acc in zip(phases, accept_lengths)]
    if len(rows) == 1:
        return rows[0]
    row = sorted(rows, key=lambda r: r["tokens_per_s"])[(len(rows) - 1) // 2]
    lat = sorted(t["latency"] for turns, _ in phases for t in turns)
    return dict(row, repeats=[round(r["tokens_per_s"], 1) for r in rows],
                repeats_latency_p95=[None if r["latency_p95"] is None else round(r["latency_p95"], 4) for r in rows],
                latency_p95_all=p95(lat))


def replies(turns):
    """``{session: [reply of turn 0, 1, ...]}`` of one phase."""
    out = {}
    for t in sorted(turns, key=lambda t: (t["session"], t["turn"])):
        out.setdefault(str(t["session"]), []).append(t["reply"])
    return out


def details(turns):
    """``{session: [[prompt_tokens, cached_tokens, completion_tokens, latency_ms] of turn 0, 1, ...]}`` of one phase
    (kept in ``runs`` beside the replies, under the phase's key + :data:`DETAILS`, and a later repeat's under that
    + ``@2``, ``@3``, ...): which turns make a tail latency. Why every repeat's: a 32-agent run's p95 rose above no
    speculation's in its second and third repeats, and only the first one's turns were kept."""
    out = {}
    for t in sorted(turns, key=lambda t: (t["session"], t["turn"])):
        lat = t.get("latency")
        out.setdefault(str(t["session"]), []).append([t.get("prompt_tokens", 0), t.get("cached_tokens", 0),
                                                       t.get("completion_tokens", 0),
                                                       None if lat is None else round(lat * 1e3, 1)])
    return out


DETAILS = "#turns"


def compare(runs, reference="none"):
    """Per ``"config/agents"`` key of ``runs`` (``{key: replies(...)}``) other than the reference's:
    turns whose reply equals the reference's same phase (``reference/agents``), sessions with a
    difference, and the first differing ``(session, turn)``. The loop is closed, so a session's turns
    after its first difference are different conversations (they are counted as they come). Where the
    phases' :func:`details` are in ``runs`` too, ``first_difference_detail`` gives both servers' prompt and
    cached tokens at that turn (this one's first) and the characters the two replies share from the start."""
    out = {}
    for key, rep in runs.items():
        if DETAILS in key:
            continue
        config, agents = key.rsplit("/", 1)
        ref = runs.get(f"{reference}/{agents}")
        if config == reference or ref is None:
            continue
        same = total = 0
        differing, first = [], None
        for sid in sorted(ref, key=int):
            a, b = rep.get(sid, []), ref[sid]
            eq = [x == y for x, y in zip(a, b)] + [False] * abs(len(a) - len(b))
            same += sum(eq)
            total += len(eq)
            if not all(eq):
                differing.append(int(sid))
                turn = eq.index(False)
                if first is None or (turn, int(sid)) < (first[1], first[0]):
                    first = (int(sid), turn)
        out[key] = dict(reference=f"{reference}/{agents}", identical_turns=same, turns=total,
                        sessions_with_difference=len(differing), first_difference=first)
        mine, theirs = runs.get(key + DETAILS), runs.get(f"{reference}/{agents}" + DETAILS)
        if first is not None and mine is not None and theirs is not None:
            sid, turn = str(first[0]), first[1]
            a = mine.get(sid, [])[turn] if turn < len(mine.get(sid, [])) else None
            b = theirs.get(sid, [])[turn] if turn < len(theirs.get(sid, [])) else None
            ra, rb = rep.get(sid, []), ref.get(sid, [])
            out[key]["first_difference_detail"] = dict(
                prompt_tokens=[a and a[0], b and b[0]], cached_tokens=[a and a[1], b and b[1]],
                reply_common_prefix_chars=(len(os.path.commonprefix([ra[turn], rb[turn]]))
                                           if turn < min(len(ra), len(rb)) else 0))
    return out


CONFIGS = {
    "none": [],
    "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"],
    # SGLang's NGRAM at LUMOTREE_SUFFIX's tree sizes (32 nodes up to 32 running requests, 16 at 33-64):
    # its best configuration for a workload is a peer, not only its 8-token one
    "ngram16": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "16"],
    "ngram32": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "32"],
    # SGLang's MTP chain (the model's own NEXTN head, 3 steps): the peer of the fast mode's parity report
    "nextn": ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4"],
    "lumotree-suffix": ["--speculative-algorithm", "LUMOTREE_SUFFIX"],
    "lumotree": ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "6"],
}
# SGLang's queue-based prefill delayer ("for workloads where decode requests finish one-at-a-time") with the settings
# LUMOTREE_SUFFIX serves by default (lumotree.sglang.scheduling.default_prefill_delayer): the peers with it
PREFILL_DELAYER = ["--enable-prefill-delayer", "--prefill-delayer-queue-min-ratio", "0.1",
                   "--prefill-delayer-max-delay-ms", "20"]
for _name in ("none", "ngram16"):
    CONFIGS[_name + "-delayer"] = CONFIGS[_name] + PREFILL_DELAYER
# LUMOTREE_SUFFIX without its default prefill delayer (the user's opt-out)
CONFIGS["lumotree-suffix-no-delayer"] = CONFIGS["lumotree-suffix"] + ["--prefill-delayer-max-delay-ms", "0"]
# LUMOTREE_SUFFIX with its delayer's holds capped at 4 scheduler passes (SGLang's default 30): where the running cap is
# about the concurrency, SGLang's slot trigger holds each prefill up to the cap
CONFIGS["lumotree-suffix-passes4"] = CONFIGS["lumotree-suffix"] + ["--prefill-delayer-max-delay-passes", "4"]
# LUMOTREE_SUFFIX with the running-request cap SGLang's NGRAM handling sets when none is given (48), past the
# benchmark's own (the --agents level): SGLang's delayer also holds a prefill while fewer slots are free than its
# largest prefill batch of late, which the benchmark's cap keeps true at 32 agents
CONFIGS["lumotree-suffix-r48"] = CONFIGS["lumotree-suffix"] + ["--max-running-requests", "48"]
# LUMOTREE_SUFFIX with 64-node trees at every batch size (its default caps a tree at 32 nodes): on the flags-alone token
# streams (CPU replay, benchmark/drafters/acceptance_replay.py --nodes 32,64) 64 nodes draft 11.86 / 10.69 tokens per
# step at 1 / 8 agents against 10.07 / 9.19 -- whether the dearer verify pays is what serving it at those levels shows
CONFIGS["lumotree-suffix-64"] = CONFIGS["lumotree-suffix"] + ["--speculative-num-draft-tokens", "64"]
# the same servers on the synchronous scheduler (what the overlap default gains)
CONFIGS["lumotree-suffix-sync"] = CONFIGS["lumotree-suffix"] + ["--disable-overlap-schedule"]
CONFIGS["lumotree-sync"] = CONFIGS["lumotree"] + ["--disable-overlap-schedule"]
# diagnosis, not a peer: LUMOTREE_SUFFIX pinned to its no-draft step (every decode step the target's decode forward),
# to set its per-step cost beside no speculation's on the same sessions (profiles)
CONFIGS["lumotree-suffix-nodraft"] = CONFIGS["lumotree-suffix"] + [
    "--speculative-adaptive-config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_draft.json")]
# the same for LUMOTREE (the EAGLE V2 loop with the MTP head): its no-draft step's host cost on the tiny model
# (docs/performance.md, serving speed), timed in parts with --step-timing
CONFIGS["lumotree-nodraft"] = CONFIGS["lumotree"] + [
    "--speculative-adaptive-config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_draft.json")]
# LUMOTREE_SUFFIX's per-request draft choice with its default settings written out (lumotree.sglang.request_choice):
# since that choice is the default, the same server as lumotree-suffix; runs *-request-choice served it under this
# name beside the batch-wide choice it replaced
CONFIGS["lumotree-suffix-request-quantile"] = CONFIGS["lumotree-suffix"] + [
    "--speculative-adaptive-config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "request_quantile.json")]
# LUMOTREE_SUFFIX with the averaging and probing of LUMOTREE's policy (its own before adaptive.SUFFIX_SETTINGS): the
# comparison that chose SUFFIX_SETTINGS on a CPU model, served when the policy alone chose each step (now the
# per-request choice decides once the policy has timed both candidates)
CONFIGS["lumotree-suffix-mtp-policy"] = CONFIGS["lumotree-suffix"] + [
    "--speculative-adaptive-config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "mtp_policy.json")]


STEP_BUCKETS = ("1", "2", "4", "8", "16", "32", "64")
STEP_PARTS = ("schedule", "lengths", "worker", "nodraft", "nodraft_admitting", "nd_prep", "nd_init", "nd_forward",
              "nd_sample", "nd_result", "drafted", "dv_choose", "dv_live", "dv_pre", "dv_prepare", "spec_prep",
              "dv_mask", "verify", "dv_sanitize", "post_verify", "dv_tail", "dv_widen", "sample", "state_commit",
              "kv_move", "commit", "forward", "result")
# the scheduler's loop per interval: these follow one another (lengths, worker, forward, verify and commit are
# inside launch); what is left is the loop's own time
INTERVAL_PARTS = ("schedule", "input", "launch", "lengths", "worker", "forward", "spec_prep", "verify", "post_verify",
                  "sample", "commit", "result")


def markdown(res) -> str:
    """The tables of a result (this script's ``--out``, or one run of ``benchmark/results/agents_h200.json``): per
    --agents level every row's tokens/s (x the server without speculation of the same --tag at that level), p50 / p95
    turn latency and accept length; then, where servers logged ``--step-timing``, their median ms per decode step and
    per ``run_batch`` by batch bucket, the step's parts, and the scheduler's time by kind in each measured phase."""
    rows = res.get("rows", [])
    out = []
    if res.get("lanes", 1) > 1 and res.get("take_turns"):
        out += [f"(--lanes {res['lanes']} --take-turns: the servers were up at once on one GPU and served one at a "
                "time, the repeats round-robin; the others idle meanwhile)", ""]
    elif res.get("lanes", 1) > 1:
        out += [f"(--lanes {res['lanes']}: the servers shared one GPU, so the speeds below are not a server's "
                "alone)", ""]
    from sglang_server import machines_note

    out += machines_note(res.get("servers"), "so no ratio is given between servers of different machines")
    host = {n: s["host"] for n, s in res.get("servers", {}).items() if s.get("host")}
    if host:  # sglang_server.host_speed: how fast the machine's host ran before each server started
        out += ["Host probe before each server started, ms (a Python loop / 2,000 small torch CPU ops): " + "; ".join(
            f"{n} {h['python_ms']:.1f} / {h['torch_ms']:.1f}" for n, h in host.items()), ""]
    where = {n: s.get("machine") for n, s in res.get("servers", {}).items()}
    partial = [f"{r['config']} at {r['agents']} ({r['partial']})" for r in rows if r.get("partial")]
    if partial:
        out += ["Partial rows (the run stopped before their last repeat): " + "; ".join(partial), ""]
    for level in sorted({r["agents"] for r in rows}):
        at = [r for r in rows if r["agents"] == level]
        out += [f"{level} agent{'s' if level != 1 else ''}:", "",
                "| server | tokens/s (x none) | p50 / p95 turn (s) | accept |", "|---|---|---|---|"]
        for r in at:
            ref = next((x for x in at if x["config"] == "none" + _tag(r["config"])), None)
            tps, ref_tps = r.get("tokens_per_s"), (ref or {}).get("tokens_per_s")
            mine, theirs = where.get(r["config"]), where.get((ref or {}).get("config"))
            apart = mine is not None and theirs is not None and mine != theirs
            rel = ""
            if tps and ref_tps and ref is not r:
                rel = " (other machine)" if apart else f" ({tps / ref_tps:.2f}x)"
            out.append(f"| {r['config']} | {_num(tps, '.0f')}{rel} | {_num(r.get('latency_p50'))} / "
                       f"{_num(r.get('latency_p95'))} | {_num(r.get('accept_length'))} |")
        out.append("")
        tails = [r for r in at if r.get("repeats_latency_p95")]
        if tails:  # every repeat's tail, and the tail of all repeats' turns together
            out += ["p95 turn latency (s) by repeat; over all repeats' turns: " + "; ".join(
                f"{r['config']} " + " / ".join(_num(x, ".3f") for x in r["repeats_latency_p95"])
                + f"; {_num(r.get('latency_p95_all'), '.3f')}" for r in tails), ""]
        gaps = [r for r in at if r.get("client_ms_p50") is not None]
        if gaps:  # the agents' own time between a reply and their next send (the server may wait through it)
            out += ["Client time between a reply and the next send, p50 / p95 ms: " + "; ".join(
                f"{r['config']} {r['client_ms_p50']:.1f} / {r['client_ms_p95']:.1f}" for r in gaps), ""]
    parity = res.get("parity") or {}
    if parity:  # each phase's replies against the no-speculation server's same phase
        got = res.get("margins") or {}
        out += ["Replies against the no-speculation server's (turns identical; sessions with a difference; the first "
                "differing session/turn; where --margins ran: the reference's top-1 minus top-2 log-probability "
                "where each differing session's reply first parts from its own, min / median, and how many took its "
                "second choice there):", "",
                "| phase | identical turns | sessions differing | first difference | margin min / median (nats) | "
                "took 2nd |", "|---|---|---|---|---|---|"]
        for key, p in parity.items():
            m = (got.get(key) or {}).get("summary") or {}
            first = p.get("first_difference")
            where = "-" if first is None else f"{first[0]}/{first[1]}"
            second = f"{m['took_second']} of {m['measured']}" if m else "-"
            out.append(f"| {key} | {p['identical_turns']} / {p['turns']} | {p['sessions_with_difference']} | {where} | "
                       f"{_num(m.get('margin_min'), '.3f')} / {_num(m.get('margin_median'), '.3f')} | {second} |")
        out.append("")
    timed = {n: s["step_timing"] for n, s in res.get("servers", {}).items() if s.get("step_timing")}
    if timed:
        buckets = [b for b in STEP_BUCKETS if any(b in t.get("step", {}) for t in timed.values())]
        out += ["Median ms per decode step / its run_batch, by batch bucket (--step-timing):", "",
                "| server | " + " | ".join(buckets) + " |", "|---|" + "---|" * len(buckets)]
        for n, t in timed.items():
            cells = [f"{t['step'][b]['median_ms']:.2f} / {t['launch'][b]['median_ms']:.2f}"
                     if b in t.get("step", {}) and b in t.get("launch", {}) else "-" for b in buckets]
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
        parts = [(n, p) for n, t in timed.items() for p in STEP_PARTS if t.get(p)]
        if parts:
            out += ["Their parts, median ms (schedule: get_next_batch_to_run; lengths: resolve_seq_lens_cpu; worker: "
                    "LumoTree's speculative worker, its nodraft and drafted steps apart, nd_*: the no-draft step's "
                    "sections; spec_prep / sample / state_commit / kv_move: SGLang's NGRAM loop's draft "
                    "preparation, tree sampler, state commit (LumoTree's commit inside it) and KV move; post_verify: "
                    "LUMOTREE_SUFFIX's work after the verify forward (graph replays or eager); dv_*: its drafted "
                    "step's own sections (lumotree.sglang.step_timing); forward: the "
                    "target's forward launch, verify: a TARGET_VERIFY one; commit: LumoTree's commit; result: "
                    "process_batch_result):",
                    "", "| server: part | " + " | ".join(buckets) + " |", "|---|" + "---|" * len(buckets)]
            for n, p in parts:
                out.append(f"| {n}: {p} | " + " | ".join(f"{timed[n][p][b]['median_ms']:.2f}" if b in timed[n][p]
                                                         else "-" for b in buckets) + " |")
            out.append("")
    totals = {n: s["step_totals"] for n, s in res.get("servers", {}).items() if s.get("step_totals")}
    phases = sorted({w for t in totals.values() for w in t if w not in ("start-up", "warm-up")})
    for w in phases:
        out += [f"Scheduler time in the measured phase ({w}; --step-timing): seconds (intervals)", "",
                "| server | decode | prefill | idle | other |", "|---|---|---|---|---|"]
        for n, t in totals.items():
            got = t.get(w, {})
            cells = [f"{got[k]['seconds']:.2f} ({got[k]['intervals']})" if k in got else "-"
                     for k in ("decode", "prefill", "idle", "other")]
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
        tokens = {n: t[w] for n, t in totals.items() if t.get(w, {}).get("prefill_tokens")}
        if tokens:  # lumotree.sglang.step_timing: the prompt tokens the prefill batches computed
            out += ["Prompt tokens the prefill intervals computed, and the target's forward (the model section) per "
                    "1,000 of them: " + "; ".join(
                        f"{n} {got['prefill_tokens']['tokens']:,}, " + (
                            f"{got['prefill_model']['seconds'] * 1e6 / got['prefill_tokens']['tokens']:.2f} ms"
                            if got.get("prefill_model") and got["prefill_tokens"]["tokens"] else "-")
                        for n, got in tokens.items()), ""]
        inside = [(n, k) for n, t in totals.items() for k in ("decode", "prefill")
                  if any(f"{k}_{p}" in t.get(w, {}) for p in INTERVAL_PARTS)]
        if inside:
            out += [f"Inside those intervals ({w}), seconds (rest: the loop's own time, the interval less schedule, "
                    "input, launch and result; the other parts are inside launch):", "",
                    "| server: kind | " + " | ".join(INTERVAL_PARTS) + " | rest |",
                    "|---|" + "---|" * (len(INTERVAL_PARTS) + 1)]
            for n, k in inside:
                got = totals[n].get(w, {})
                sec = {p: got.get(f"{k}_{p}", {}).get("seconds") for p in INTERVAL_PARTS}
                whole = got.get(k, {}).get("seconds")
                rest = (whole - sum(sec[p] or 0.0 for p in ("schedule", "input", "launch", "result"))
                        if whole is not None else None)
                out.append(f"| {n}: {k} | " + " | ".join(_num(sec[p]) for p in INTERVAL_PARTS) + f" | {_num(rest)} |")
            out.append("")
        from lumotree.sglang.step_timing import SECTIONS  # the sections inside those intervals, in its order

        cols = [p for p in [p for _, p in SECTIONS] + ["gc"] if any(f"{k}_{p}" in t.get(w, {}) for t in totals.values()
                                                                  for k in ("decode", "prefill"))]
        if cols:
            out += [f"Sections inside those intervals ({w}), seconds (nested: model and sampling inside forward, "
                    "mamba_cow inside model, prep_extend and tree_match inside schedule, the tree's and event_sync "
                    "inside result; lt_*: LumoTree's worker's prefill admissions and finish marks; gc: the scheduler "
                    "process's garbage collections, wherever they fell):", "",
                    "| server: kind | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
            for n, t in totals.items():
                got = t.get(w, {})
                for k in ("decode", "prefill"):
                    if any(f"{k}_{p}" in got for p in cols):
                        out.append(f"| {n}: {k} | " + " | ".join(_num(got.get(f"{k}_{p}", {}).get("seconds"))
                                                                 for p in cols) + " |")
            out.append("")
    return "\n".join(out)


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _tag(config: str) -> str:
    """The --tag of a configuration name: what follows its CONFIGS key."""
    key = max((k for k in CONFIGS if config.startswith(k)), key=len, default=config)
    return config[len(key):]


def main():
    ap = argparse.ArgumentParser()
    if "--render" in sys.argv[1:]:  # tables of an existing result, no servers
        ap.add_argument("--render", required=True, metavar="FILE[:RUN]",
                        help="print the tables of this script's --out FILE, or of the run RUN of a file of runs "
                             "(benchmark/results/agents_h200.json)")
        a = ap.parse_args()
        path, _, run = a.render.partition(":")
        res = json.load(open(path))
        if "runs" in res:
            res = next((r for r in res["runs"] if r["name"] == run), None)
            if res is None:
                ap.error(f"no run {run!r} in {path}")
        print(markdown(res))
        return
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", default="none,ngram,lumotree-suffix,lumotree")
    ap.add_argument("--agents", default="1,8,32")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=13)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--collapse-tokens", type=int, default=6500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--server-timeout", type=int, default=400)
    ap.add_argument("--step-timing", action="store_true",
                    help="every server logs where its decode steps' wall time goes on the scheduler's thread "
                         "(LUMOTREE_BENCH_STEP_TIMING=1, lumotree.sglang.step_timing), recorded per server")
    ap.add_argument("--draft-timing", action="store_true",
                    help="every server times its model-free draft preparation per step (LUMOTREE_BENCH_DRAFT_TIMING=1, "
                         "benchmark only; NGRAM and LUMOTREE_SUFFIX): per batch bucket in the result's servers; "
                         "LUMOTREE_SUFFIX's prefill admissions likewise (admission_timing); the wait for the last "
                         "step's GPU work each preparation begins with apart (draft_wait); LUMOTREE_SUFFIX's call into "
                         "its C++ drafter inside the preparation (draft_native) and its waits for admissions still indexing "
                         "(draft_held); where a step drafted nothing for requests still indexing, how much longer their "
                         "indexing ran (admission_left)")
    ap.add_argument("--jit-log", action="store_true",
                    help="every server logs each Triton compile (LUMOTREE_BENCH_JIT_LOG=1, benchmark only): per "
                         "window (start-up, warm-up, each measured phase) the count, time and kernels in the "
                         "result's servers")
    ap.add_argument("--jit-cache", choices=("fresh", "shared"), default="fresh",
                    help="fresh: each server compiles into its own empty just-in-time caches (Triton, inductor, "
                         "flashinfer, tvm-ffi, torch extensions, the driver's PTX cache; every ready_s and warmup_s a "
                         "first start's); shared: the machine's caches")
    ap.add_argument("--extra", action="append", default=[], help="one more SGLang flag for every server (repeatable)")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE in every server's environment (repeatable)")
    ap.add_argument("--tag", default="", help="appended to the configuration names in the results")
    ap.add_argument("--replies-out", default=None, help="every reply, per configuration and phase (gzip JSON)")
    ap.add_argument("--warmup-sessions", type=int, default=32,
                    help="per server, before the measured phases: at each --agents level K, min(K, this) other "
                         "sessions (another seed) all at once, then /flush_cache -- what just-in-time compiles at new "
                         "shapes costs is recorded as the server's warmup_s, not in the rows (0: none)")
    ap.add_argument("--abort-every", type=int, default=0,
                    help="K > 0: every K-th turn (by session + turn) is first sent and aborted mid-way, then sent again")
    ap.add_argument("--abort-after", type=float, default=0.05, help="seconds before such a turn's first send is aborted")
    ap.add_argument("--profile-dir", default=None,
                    help="after a server's measured phases: one more session at each --agents level under SGLang's "
                         "torch profiler (its /start_profile, --profile-steps forward steps, Python stacks), one "
                         "trace directory per configuration and level (benchmark/serving/profile_summary.py reads them)")
    ap.add_argument("--profile-steps", type=int, default=40)
    ap.add_argument("--prefill-graphs", action="store_true",
                    help="serve with SGLang's default prefill CUDA graphs (breakable, on CUDA) instead of turning them "
                         "off with --disable-piecewise-cuda-graph as the recorded runs did (their capture adds minutes "
                         "to every server's start)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each measured phase this many times per server (the radix cache flushed between "
                         "them): the row is the run of median speed, every run's tokens/s in its 'repeats' "
                         "(one 12-19 s phase at 32 agents is not a stable measure); the parity compares the "
                         "first runs")
    ap.add_argument("--lanes", type=int, default=1,
                    help="serve this many configurations at once on the one GPU (each with fixed KV and state pools, "
                         "lane_memory, and its own port): for runs whose replies, not speeds, are the "
                         "measure -- the decode-exact mode's parity is independent of timing; the rows' speeds of "
                         "such a run (its 'lanes' field) are not a server's alone")
    ap.add_argument("--take-turns", action="store_true",
                    help="with --lanes N: the servers start at once (their start-ups overlap) but warm up and serve "
                         "their measured phases one at a time, each level's --repeats round-robin over the servers "
                         "(Turns): speeds of a server alone on the GPU, the others idle, and host noise shared")
    ap.add_argument("--margins", type=int, default=0, metavar="N",
                    help="N > 0: after every other server has run, the no-speculation server (kept up for it) answers "
                         "the first differing turn of up to N sessions per differing phase again with its top-2 "
                         "log-probabilities: the margin its choice won by where each reply first parts from its own "
                         "('margins' in --out)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the configurations an interrupted run of the same command finished (rows and server in "
                         "--out, replies in --replies-out) and run the rest: one command repeated across sittings; "
                         "those of another machine run again")
    ap.add_argument("--resume-across-machines", action="store_true",
                    help="--resume keeps finished configurations of another machine too (for runs whose replies, not "
                         "speeds, are compared, as the decode-exact ones)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1 (got {args.repeats})")
    if args.lanes < 1:
        ap.error(f"--lanes must be at least 1 (got {args.lanes})")
    if args.take_turns and args.lanes < 2:
        ap.error("--take-turns needs --lanes N with N >= 2 (servers that start at once)")
    if args.take_turns and args.margins > 0:
        ap.error("--take-turns and --margins: the margin queries run outside the turns; use one or the other")
    room = context_room(args.model, args.collapse_tokens, args.max_tokens)
    if room is not None and room < 0:
        ap.error(f"--collapse-tokens {args.collapse_tokens} + --max-tokens {args.max_tokens} (+{CONTEXT_SLACK} for the "
                 f"chat template) exceed the model's context by {-room} tokens: lower --collapse-tokens")
    from sglang_server import (ADMISSION_LEFT_TIMING_LINE, ADMISSION_TIMING_LINE, DRAFT_HELD_TIMING_LINE,
                               DRAFT_NATIVE_TIMING_LINE,
                               DRAFT_WAIT_TIMING_LINE, draft_timing,
                               get, host_speed, jit_cache_env, jit_compiles, log_health, machine, post, sglang_server,
                               step_timing, step_totals)

    count = token_counter(args.model)
    base = ([] if args.prefill_graphs else ["--disable-piecewise-cuda-graph"]) + [
        "--enable-cache-report", "--mem-fraction-static", "0.5",
        "--max-running-requests", str(max(int(a) for a in args.agents.split(",")))]
    if not any(e.startswith("--attention-backend") for e in args.extra):
        base = ["--attention-backend", "triton", *base]
    base += [p for e in args.extra for p in e.split("=", 1)]
    env = dict(e.split("=", 1) for e in args.env)
    if args.draft_timing:
        env["LUMOTREE_BENCH_DRAFT_TIMING"] = "1"
    if args.jit_log:
        env["LUMOTREE_BENCH_JIT_LOG"] = "1"
    if args.step_timing:
        env["LUMOTREE_BENCH_STEP_TIMING"] = "1"
    levels = [int(a) for a in args.agents.split(",")]
    seeds = {a: phase_seed(args.seed, i) for i, a in enumerate(levels)}
    level_sessions = {a: make_sessions(args.sessions, args.turns, sd) for a, sd in seeds.items()}  # (phase_seed)
    res = dict(command="python3 " + " ".join(sys.argv), rows=[], servers={},
               session_seeds={str(a): sd for a, sd in seeds.items()})
    runs = {}
    done = resumed(res, runs, args) if args.resume else set()
    res["parity"] = compare(runs, reference="none" + args.tag)
    configs = args.configs.split(",")
    lock = threading.RLock()  # res, runs and the files they are written to (--lanes: servers at once)
    reference = "none" + args.tag
    if args.margins > 0:
        if "none" not in configs:
            ap.error("--margins needs the no-speculation server among --configs (it answers the margin queries)")
        if reference in done:
            ap.error(f"--margins: {reference} was kept from an earlier run (--resume); its server must run now")
        configs = [c for c in configs if c != "none"] + ["none"]  # it serves last and waits for the others
    finished = {c + args.tag: threading.Event() for c in configs}
    for name in done:
        finished[name].set()

    names = [c + args.tag for c in args.configs.split(",")]  # the rows' order: the command's
    for d in {os.path.dirname(os.path.abspath(args.out)), args.log_dir}:  # a fresh machine has neither folder
        os.makedirs(d, exist_ok=True)

    def save():
        with lock:  # rows in the command's order of configurations and levels, whichever server finished first
            res["rows"].sort(key=lambda r: (names.index(r["config"]) if r["config"] in names else len(names),
                                            levels.index(r["agents"]) if r["agents"] in levels else len(levels)))
            with open(args.out + ".tmp", "w") as f:  # replaced whole: a run killed while saving keeps the last save
                json.dump(res, f, indent=1)
            os.replace(args.out + ".tmp", args.out)
            if args.replies_out:
                with gzip.open(args.replies_out + ".tmp", "wt") as f:
                    json.dump(runs, f)
                os.replace(args.replies_out + ".tmp", args.replies_out)

    here = machine()  # recorded per server: a --resume on another machine shows (markdown)

    def put_row(row):  # a (config, level)'s row, in place of any partial one
        res["rows"] = [r for r in res["rows"] if (r["config"], r["agents"]) != (row["config"], row["agents"])]
        res["rows"].append(row)
    gpu_turns = None  # --take-turns: set below, before the servers start
    gpu_turn = no_turn

    def serve(config, port, base):
        name = config + args.tag
        log = os.path.join(args.log_dir, f"agents-{name}.log")
        host = host_speed()  # before the server starts (sglang_server.host_speed; with --lanes others may be up)
        t0 = time.time()
        windows = {"start-up": (t0, None)}
        env_c = dict(env)
        server = {}
        try:
            with jit_cache_env(args.jit_cache, env_c) as env_s, \
                    sglang_server(args.model, CONFIGS[config], port=port, log=log, timeout=args.server_timeout,
                                  base_args=base, env=env_s) as url:
                server.update(ready_s=round(time.time() - t0, 1), args=CONFIGS[config] + base, env=env_c,
                              jit_cache=args.jit_cache, machine=here, host=host)
                with lock:
                    res["servers"][name] = server
                windows["start-up"] = (t0, time.time())
                if args.warmup_sessions > 0:
                    warm = make_sessions(args.warmup_sessions, args.turns, args.seed + 1000)
                    with gpu_turn(("warm-up", config)):
                        t1 = time.time()
                        for agents in levels:
                            k = min(agents, len(warm))  # the level's batch sizes, every turn's prompt lengths
                            run_phase(url, warm[:k], k, args.max_tokens, count, args.collapse_tokens)
                        server["warmup_s"] = round(time.time() - t1, 1)
                        windows["warm-up"] = (t1, time.time())
                        post(url + "/flush_cache", {})  # the measured phases start from an empty radix cache
                for li, agents in enumerate(levels):
                    t2, phases, accepts = None, [], []
                    for rep in range(args.repeats):
                        with gpu_turn((config, agents, rep)):
                            t2 = t2 or time.time()
                            if rep or li:  # every phase from an empty radix cache and empty drafter corpora
                                post(url + "/flush_cache", {})
                            phases.append(run_phase(url, level_sessions[agents], agents, args.max_tokens,
                                                    count, args.collapse_tokens,
                                                    abort_every=args.abort_every, abort_after_s=args.abort_after))
                            # the run's own (the flush reset SGLang's counters)
                            info = json.loads(get(url + "/get_server_info"))
                            accepts.append(next((s.get("avg_spec_accept_length")
                                                 for s in info.get("internal_states", [])
                                                 if s.get("avg_spec_accept_length")), None))
                        if rep + 1 < args.repeats:  # saved as it stands: a run stopped later keeps its repeats so far
                            with lock:
                                put_row(dict(repeated(name, agents, phases, accepts),
                                             partial=f"{len(phases)} of {args.repeats} repeats"))
                                save()
                    # (taking turns: the window spans the other servers' runs too; this server's decode and prefill
                    # totals do not move while it waits, its idle time does)
                    windows[f"{agents} agents"] = (t2, time.time())
                    row = repeated(name, agents, phases, accepts)
                    turns = phases[0][0]  # the parity compares every server's first phase
                    with lock:
                        put_row(row)
                        runs[f"{name}/{agents}"] = replies(turns)
                        runs[f"{name}/{agents}" + DETAILS] = details(turns)
                        for rep, phase in enumerate(phases[1:], start=2):  # a tail in a later repeat, by turn too
                            runs[f"{name}/{agents}{DETAILS}@{rep}"] = details(phase[0])
                        res["parity"] = compare(runs, reference="none" + args.tag)
                        print(json.dumps(row), flush=True)
                        save()
                if args.profile_dir:
                    server["profiles"] = profile_phases(url, args, name, count)
                if args.margins > 0 and name == reference:
                    for other, ev in finished.items():  # every other server's replies are in
                        if other != name:
                            ev.wait()
                    with lock:
                        parity, snapshot = dict(res["parity"]), dict(runs)
                    got = {}
                    for a in levels:  # each level's parity against the sessions its first phase served
                        got.update(margins(url, level_sessions[a], snapshot,
                                           {k: p for k, p in parity.items() if k.endswith(f"/{a}")}, count,
                                           args.collapse_tokens, args.max_tokens, per_key=args.margins))
                    with lock:
                        res["margins"] = got
        except Exception as e:  # a server that fails is recorded, the others still run
            server = dict(error=repr(e)[:2000])
        finally:
            finished[name].set()
            if gpu_turns is not None:
                gpu_turns.drop(config)
        server.update(log_health(log))
        if args.draft_timing:
            server["draft_timing"] = draft_timing(log)
            server["admission_timing"] = draft_timing(log, ADMISSION_TIMING_LINE)
            server["draft_wait"] = draft_timing(log, DRAFT_WAIT_TIMING_LINE)
            server["draft_native"] = draft_timing(log, DRAFT_NATIVE_TIMING_LINE)
            server["draft_held"] = draft_timing(log, DRAFT_HELD_TIMING_LINE)
            server["admission_left"] = draft_timing(log, ADMISSION_LEFT_TIMING_LINE)
        closed = {k: (a, b if b is not None else time.time()) for k, (a, b) in windows.items()}
        if args.step_timing:
            server["step_timing"] = step_timing(log)
            server["step_totals"] = step_totals(log, closed)
        if args.jit_log:
            server["jit_compiles"] = jit_compiles(log, closed)
        with lock:
            res["servers"][name] = server
            save()

    todo = []
    for config in configs:
        if config + args.tag in done:
            print(f"{config + args.tag}: kept from {args.out}", flush=True)
        else:
            todo.append(config)
    if args.lanes <= 1:
        for config in todo:
            serve(config, args.port, base)
    else:
        # the servers of a run share the GPU: each takes its share of the memory SGLang may use, and a port of its own
        res["lanes"] = args.lanes
        if args.take_turns:
            res["take_turns"] = True
            gpu_turns = Turns(Turns.order(todo, levels, args.repeats))
            gpu_turn = gpu_turns.turn
        mem = [p for e in args.extra for p in e.split("=", 1)]
        share = base if "--mem-fraction-static" in mem else lane_memory(base)
        ports = queue.Queue()
        for i in range(args.lanes):
            ports.put(args.port + 10 * i)

        def lane(config):
            port = ports.get()
            try:
                serve(config, port, share)
            finally:
                ports.put(port)

        with concurrent.futures.ThreadPoolExecutor(args.lanes) as pool:
            for f in [pool.submit(lane, c) for c in todo]:
                f.result()
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()
