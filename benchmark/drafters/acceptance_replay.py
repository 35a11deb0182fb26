"""Tokens per verify step that LUMOTREE_SUFFIX's drafter (at several tree sizes) and SGLang's NGRAM corpus would
give on the agent benchmark's served token streams, replayed on the CPU.

``benchmark/workloads/agents_bench.py --replies-out`` keeps every reply a server gave. This rebuilds each turn as the
server saw it -- the session's messages with the history collapse, the tiny model's chat template and tokenizer --
with the reference server's replies (``--reference``, e.g. ``none/8``: no speculation's greedy outputs) as the
target continuation, and replays every turn's decode as a greedy speculative server would: each step the drafter
proposes a tree from the request's context, the longest root path matching the continuation is accepted, plus the
bonus token. So it isolates the drafter (no model, no GPU): the served accept length differs where the served
outputs part from the reference's, and by the server's own accounting (its average includes the warm-up).

* LUMOTREE_SUFFIX: LumoTree's C++ suffix drafter with the server's settings (``SuffixCorpus``), a request admitted
  with its prompt's last 4,096 tokens (a session's next turn adopts its finished trie), the accepted tokens appended
  each step, the output handed to the global cache at the end;
* NGRAM: SGLang's corpus at its defaults (BFS, 18-token windows inserted each step, as its worker does).

Turns run ``--agents`` sessions at a time, turn by turn (finished outputs reach the global caches in that order).
``--concurrent``: as a server steps them instead (:func:`concurrent_replay`: ``--agents`` closed-loop agents, every
running request drafting once per decode step, outputs reaching the global caches as their turns finish); at 32
agents the turn-by-turn order overstates acceptance, since each turn there drafts from the turns before it that a
server runs at the same time (16-node trees on the 32-agent streams of run ``32-agents-first``: 8.0 tokens per step
turn by turn, 5.2 per request step stepped together, the served log's windows as the latter). ``--seed``: the
level's session seed (``session_seeds`` of the agent benchmark's result).

    python3 benchmark/drafters/acceptance_replay.py --replies /tmp/b/replies.json.gz --reference none/8 \\
        --nodes 8,16,32 --out benchmark/results/acceptance_replay_cpu.json
"""
import argparse
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))
sys.path.insert(0, HERE)

MODEL = os.path.join(HERE, "..", "models", "tiny-hybrid")


def accepted(tokens, parents, cont) -> int:
    """Draft tokens accepted greedily: the longest root path (node 0 is the root, already the context's last token)
    whose tokens are ``cont``'s first ones."""
    children = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], []).append(i)
    node, k = 0, 0
    while k < len(cont):
        nxt = next((c for c in children.get(node, ()) if tokens[c] == cont[k]), None)
        if nxt is None:
            break
        node, k = nxt, k + 1
    return k


def parents_from_mask(mask_rows):
    """Parents of an ancestor-or-self mask (rows of bools, SGLang's NGRAM layout): each node's deepest strict
    ancestor (-1 for the root)."""
    depth = [sum(r) - 1 for r in mask_rows]
    out = []
    for i, r in enumerate(mask_rows):
        anc = [j for j, a in enumerate(r) if a and j != i]
        out.append(max(anc, key=lambda j: depth[j]) if anc else -1)
    return out


class SuffixReplay:
    """LUMOTREE_SUFFIX's drafter as its server drives it (``lumotree.sglang.suffix.SuffixCorpus``)."""

    def __init__(self, nodes, window=4096, **kw):
        from lumotree.drafters.suffix import make_suffix_drafter
        from lumotree.sglang.suffix import SuffixCorpus

        self.n, self.window = nodes, window
        self.drafter = make_suffix_drafter(**dict(SuffixCorpus(nodes).kw, **kw))

    def start(self, rid, prompt):
        self.drafter.start(rid, list(prompt[-self.window:]))

    def draft(self, rid, context):
        tokens, parents, _ = self.draft_scored(rid)
        return tokens, parents

    def draft_scored(self, rid):
        """The draft with its nodes' path probabilities under the drafter's counts (``scores[0]``, the root: 1)."""
        d = self.drafter.draft(rid, self.n)
        return list(d.tokens), list(d.parents), list(d.scores)

    def step(self, rid, tokens):
        self.drafter.append(rid, list(tokens))

    def finish(self, rid, output):
        self.drafter.finish(rid, list(output))


class NgramReplay:
    """SGLang's NGRAM corpus as its worker drives it (windows of the last 18 tokens, inserted each step)."""

    def __init__(self, nodes):
        from suffix_host_cost import SGLangNgram

        self.n, self.corpus = nodes, SGLangNgram(nodes)

    def start(self, rid, prompt):
        pass

    def draft(self, rid, context):
        import numpy as np

        drafts, mask = self.corpus.batch_get([rid], [context], [len(context)])
        rows = np.asarray(mask, dtype=bool).reshape(self.n, self.n).tolist()
        return [int(t) for t in drafts], parents_from_mask(rows)

    def step(self, rid, tokens):
        pass

    def finish(self, rid, output):
        self.corpus.corpus.erase_match_state([rid])


class ArcticReplay:
    """arctic-inference's ``SuffixDecodingCache`` (the reference SuffixDecoding implementation, C++ behind nanobind) as
    vLLM's suffix decoding drives it: the prompt indexed at the request's start (a tree of its own), each step's
    accepted tokens added to the request's response (its own tree and the global one at once), a tree draft of up
    to ``nodes - 1`` tokens below the root from the context's last ``max_tree_depth`` tokens, the request stopped at
    its end (its response stays in the global tree). ``cache_mod``: its ``arctic_inference.suffix_decoding.cache``
    module (``arctic_compare.py`` builds it); ``spec``: :meth:`SuffixDecodingCache.speculate`'s keywords (defaults:
    its own, with ``use_tree_spec``)."""

    def __init__(self, nodes, cache_mod, max_tree_depth=64, **spec):
        self.n, self.depth = nodes, max_tree_depth
        self.cache = cache_mod.SuffixDecodingCache(max_tree_depth=max_tree_depth)
        self.spec = dict(dict(max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1, use_tree_spec=True), **spec)

    def start(self, rid, prompt):
        self.cache.start_request(rid, list(prompt))

    def draft(self, rid, context):
        d = self.cache.speculate(rid, context[-self.depth:], max_spec_tokens=self.n - 1, **self.spec)
        return [context[-1]] + list(d.token_ids), [-1] + [p + 1 for p in d.parents]

    def step(self, rid, tokens):
        if tokens:
            self.cache.add_active_response(rid, list(tokens))

    def finish(self, rid, output):
        self.cache.stop_request(rid)


def replay(drafter, per_session, agents: int):
    """Verify steps and tokens (accepted drafts + the bonus token per step) over every turn."""
    from admission_replay import turn_order

    steps = tokens = 0
    for rid, prompt, output in turn_order(per_session, agents):
        drafter.start(rid, prompt)
        # the prefill makes the first output token; each verify step then accepts k drafts + 1 bonus
        context, pos = list(prompt) + output[:1], 1
        drafter.step(rid, output[:1])
        while pos < len(output):
            toks, parents = drafter.draft(rid, context)
            if toks[0] != context[-1]:
                raise RuntimeError(f"draft of {rid} starts at {toks[0]}, the context's last token is {context[-1]}")
            k = accepted(toks, parents, output[pos:])
            new = output[pos:pos + k + 1]
            context += new
            pos += len(new)
            drafter.step(rid, new)
            steps += 1
            tokens += len(new)
        drafter.finish(rid, output)
    return steps, tokens


def concurrent_replay(drafter, per_session, agents: int, admission_steps: int = 0, window: int = 40, observe=None):
    """The turns as a server steps them: ``agents`` closed-loop agents, each working through its sessions one turn
    after another (a session's next turn is prefilled the step after its last finished; a free agent takes the next
    session), every running request drafting once per decode step. A finished turn's output reaches the drafter's
    global cache at the end of its step, so concurrent turns do not see each other's outputs -- unlike
    :func:`replay`, where each turn runs to its end before the next drafts. A request drafts nothing (its bonus token
    alone) in its first ``admission_steps`` decode steps: its prompt still indexing, as LUMOTREE_SUFFIX's
    background admissions leave it. Within a decode step every request drafts before any appends the step's tokens
    (a drafter whose global cache holds running requests' outputs sees the others' up to the step before). Returns
    ``dict(steps, request_steps, tokens, windows)``: decode steps, request
    steps (tokens per request step is the servers' accept length) and, per ``window`` decode steps, the accept length
    of the requests stepped in them (SGLang's decode log line every 40 steps). ``observe(context, tokens, parents,
    continuation, accepted)``, where given, sees every draft (:class:`Headroom`); a turn's end is
    ``observe.finished(output)``."""
    queue = list(range(len(per_session)))[::-1]
    running = {}  # agent -> [rid, session, turn, context, output, pos, undrafted steps left]
    free = list(range(agents))[::-1]
    steps = request_steps = tokens = 0
    win, windows = [0, 0], []

    def admit(agent, sess, turn):
        prompt, output = per_session[sess][turn]
        rid = f"{sess}-{turn}"
        drafter.start(rid, prompt)
        drafter.step(rid, output[:1])  # the prefill's token
        running[agent] = [rid, sess, turn, list(prompt) + output[:1], output, 1, admission_steps]

    while queue or running:
        while free and queue:
            admit(free.pop(), queue.pop(), 0)
        done, accepts = [], {}
        for agent in sorted(running):  # every request drafts before any appends its step's tokens, as a server's
            r = running[agent]         # step does: no draft sees another request's tokens of the same step
            rid, _, _, context, output, pos, wait = r
            if pos >= len(output):  # a one-token reply: done at its prefill
                continue
            if wait > 0:
                accepts[agent], r[6] = 0, wait - 1
            else:
                toks, parents = drafter.draft(rid, context)
                accepts[agent] = accepted(toks, parents, output[pos:])
                if observe is not None:
                    observe(context, toks, parents, output[pos:], accepts[agent])
        for agent in sorted(running):
            r = running[agent]
            rid, _, _, context, output, pos, wait = r
            if pos >= len(output):
                done.append(agent)
                continue
            k = accepts[agent]
            new = output[pos:pos + k + 1]
            context += new
            r[5] = pos + len(new)
            drafter.step(rid, new)
            request_steps += 1
            tokens += len(new)
            win[0] += 1
            win[1] += len(new)
            if r[5] >= len(output):
                done.append(agent)
        steps += 1
        if steps % window == 0:
            windows.append(round(win[1] / max(1, win[0]), 2))
            win = [0, 0]
        for agent in done:
            rid, sess, turn, _, output, _, _ = running.pop(agent)
            drafter.finish(rid, output)
            if observe is not None:
                observe.finished(output)
            if turn + 1 < len(per_session[sess]):
                admit(agent, sess, turn + 1)
            else:
                free.append(agent)
    return dict(steps=steps, request_steps=request_steps, tokens=tokens, windows=windows)


class Headroom:
    """What a suffix drafter could have drafted, per request step of :func:`concurrent_replay` (``--headroom``): the
    continuation's *copy length* -- its longest prefix (up to ``cap`` tokens) that follows the step's root token
    somewhere in the request's context or in a finished output (what any suffix drafter may propose; 0: the next
    token never follows the root there) -- beside the tokens the draft had accepted and its size. ``summary()``: the
    shares of request steps with nothing to copy and with no draft, and by copy length the share and the mean
    accepted."""

    END = chr(0x10FFFF)  # after each finished output: no token, so no copy spans two outputs

    def __init__(self, cap: int):
        import numpy as np

        self.np, self.cap, self.rows, self.outputs = np, cap, [], ""

    @staticmethod
    def _text(tokens) -> str:
        """Token ids as one character each: a substring search matches whole tokens only."""
        if any(t >= 0x10FFFF or t < 0 for t in tokens):
            raise ValueError("Headroom: token ids must lie in [0, 0x10FFFF)")
        return "".join(map(chr, tokens))

    def finished(self, output) -> None:
        self.outputs += self._text(output) + self.END

    def __call__(self, context, tokens, parents, continuation, accepted) -> None:
        hay, copy = self._text(context), 0
        while copy < min(len(continuation), self.cap):
            needle = self._text([context[-1]] + list(continuation[:copy + 1]))
            if needle not in hay and needle not in self.outputs:
                break
            copy += 1
        self.rows.append((accepted, copy, len(tokens)))

    def summary(self, nodes: int) -> dict:
        np = self.np
        k, copy, size = (np.asarray(c) for c in zip(*self.rows))
        deepest = nodes - 1  # the deepest a tree of this many nodes reaches

        def band(lo, hi):
            m = (copy >= lo) & (copy < hi)
            mean = round(float(k[m].mean()), 2) if m.any() else None
            return dict(share=round(float(m.mean()), 3), accepted_mean=mean)

        return dict(request_steps=len(self.rows), nothing_to_copy=round(float((copy == 0).mean()), 3),
                    no_draft=round(float((size == 1).mean()), 3),
                    copy_1_5=band(1, 6), copy_6_to_deepest=band(6, deepest),
                    copy_deepest_or_more=band(deepest, 10 ** 9),
                    accepted_mean=round(float(k.mean()), 3),
                    copy_mean_capped=round(float(np.minimum(copy, deepest).mean()), 3))


def stream_args(ap, reference: str) -> None:
    """The flags :func:`served_turns` reads (the replies, the reference whose replies are the targets, the sessions as
    the agent benchmark made them), added to ``ap`` for each replay script that rebuilds the served streams."""
    ap.add_argument("--replies", required=True, help="agents_bench.py --replies-out (gzip JSON)")
    ap.add_argument("--reference", default=reference, help="the configuration/level whose replies are the targets")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=13)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--collapse-tokens", type=int, default=6500)
    ap.add_argument("--max-tokens", type=int, default=128)


def served_turns(args):
    """Per session, per turn ``(prompt ids, output ids)`` with the reference server's replies (``args``: replies,
    reference, sessions, turns, seed, collapse_tokens, max_tokens as this script's flags)."""
    import agents_bench as ab
    from admission_replay import turns_of
    from tokenizers import Tokenizer

    with gzip.open(args.replies, "rt") as f:
        replies = json.load(f)[args.reference]
    tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    sessions = ab.make_sessions(args.sessions, args.turns, args.seed)
    return turns_of(sessions, lambda s: tok.encode(s).ids, ab.token_counter(MODEL), args.collapse_tokens,
                    args.max_tokens, replies=replies)


def write_result(script: str, argv, out, **fields) -> dict:
    """A replay script's result: the command that ran it (``argv``: its arguments, else the process's) and
    ``fields``, written to ``out`` as JSON when given; shared by the scripts in this folder."""
    res = dict(command="python3 " + " ".join([os.path.relpath(script)] + (argv if argv is not None else sys.argv[1:])),
               **fields)
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stream_args(ap, reference="none/8")
    ap.add_argument("--nodes", default="8,16,32", help="LUMOTREE_SUFFIX tree sizes")
    ap.add_argument("--ngram-nodes", default="8", help="SGLang NGRAM draft tokens ('' for none)")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--drafter-kw", action="append", default=None,
                    help="JSON: LumoTree drafter settings other than the server's (repeatable: rows for each; "
                         "default: the server's)")
    ap.add_argument("--session-range", default=None, help="LO:HI, replay only these sessions (e.g. a held-out half)")
    ap.add_argument("--concurrent", action="store_true", help="step the agents' requests together (concurrent_replay)")
    ap.add_argument("--passes", type=int, default=1,
                    help="replay the streams this many times through the same drafter (a row per pass: what a drafter "
                         "that kept its corpus drafts on sessions it has seen)")
    ap.add_argument("--admission-steps", type=int, default=0,
                    help="--concurrent: decode steps a new request drafts nothing (its admission indexing)")
    ap.add_argument("--headroom", action="store_true",
                    help="--concurrent: beside each LumoTree row, what its drafts could have copied (Headroom)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.headroom and not args.concurrent:
        ap.error("--headroom needs --concurrent")
    per_session = served_turns(args)
    if args.session_range:
        lo, hi = (int(x) for x in args.session_range.split(":"))
        per_session = per_session[lo:hi]
    settings = [json.loads(k) for k in (args.drafter_kw or ["{}"])]
    rows = []
    runs = [("lumotree-suffix", int(n), kw) for kw in settings for n in args.nodes.split(",") if n] + \
        [("ngram", int(n), None) for n in args.ngram_nodes.split(",") if n]
    if args.passes < 1:
        ap.error(f"--passes must be at least 1 (got {args.passes})")
    for name, n, kw in runs:
        make = NgramReplay if kw is None else (lambda n, kw=kw: SuffixReplay(n, **kw))
        drafter = make(n)
        for p in range(args.passes):
            t0 = time.perf_counter()
            if args.concurrent:
                probe = Headroom(cap=n) if args.headroom and kw is not None else None
                got = concurrent_replay(drafter, per_session, args.agents, args.admission_steps, observe=probe)
                steps, tokens = got["request_steps"], got["tokens"]
                extra = dict(decode_steps=got["steps"], windows=got["windows"],
                             **(dict(headroom=probe.summary(n)) if probe is not None else {}))
            else:
                (steps, tokens), extra = replay(drafter, per_session, args.agents), {}
            row = dict(drafter=name, nodes=n, **(dict(drafter_kw=kw) if kw else {}),
                       **(dict(replay_pass=p + 1) if args.passes > 1 else {}), steps=steps, tokens=tokens,
                       tokens_per_step=round(tokens / steps, 3), **extra, seconds=round(time.perf_counter() - t0, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return write_result(__file__, argv, args.out, reference=args.reference, turns=sum(len(t) for t in per_session),
                        order="concurrent" if args.concurrent else "turn by turn", rows=rows)


if __name__ == "__main__":
    main()
