"""LUMOTREE_SUFFIX's per-step choice (suffix tree or no draft) replayed on the CPU against the agent benchmark's served
token streams, with a step-time model: what the adaptive tree size (``lumotree.sglang.adaptive.TreeSizePolicy``) makes
of acceptance that swings between turn phases, against a fixed tree, no speculation, a per-step oracle and a gate on
the drafter's own expected acceptance (``score``).

Acceptance: every turn of ``benchmark/workloads/agents_bench.py``'s sessions is rebuilt as the server saw it (the
reference server's replies as the continuation, as ``acceptance_replay.py`` does) and LumoTree's C++ suffix drafter
with the server's settings drafts a ``--nodes`` tree at *every* position of every turn (sessions in the benchmark's
order, ``--agents`` at a time, outputs handed to the global cache as they finish): ``k[turn][pos]``, the drafts a
greedy verify would accept there, and the drafter's expectation of it (the sum of its nodes' path probabilities).
Serving: ``--agents`` closed-loop sessions, each turn admitted with a prefill (``--prefill-ms``, and
``--prefill-ms-per-1k`` for each 1,000 of its uncached prompt tokens; its first token), then
decode steps over the running requests; a drafted step advances each request by ``k + 1`` tokens, a no-draft step by 1.
Step time (ms) at batch ``b``: ``none = --none-ms * (F + (1 - F) b / 32)``, ``tree = --tree-ms * (F + (1 - F) b / 32)``
with ``F = --fixed-share``. The policy and the score gate get each step's time and acceptance one step late (the
overlap scheduler), as served. Rows: tokens/s and the turns' p50 / p95 latency (send to last token); the policy rows
again with every draft rejected (``drafts``: what its probes cost where speculation cannot pay). ``--criteria`` and
``--request-variants``: per-step criteria that weigh each request's gain rather than the batch's (:data:`CRITERIA`),
for the tail -- a turn whose drafts miss gains a token per drafted step while the others make drafting pay.

    python3 benchmark/drafters/policy_replay.py --replies benchmark/results/agents_1_32_replies_h200.json.gz \
        --reference none/1 --agents 1 --nodes 32 --none-ms 1.19 --tree-ms 2.91 --fixed-share 1.0 --prefill-ms 25 \
        --variants '[{}, {"EMA": 0.05}]' --out /tmp/r1.json

(the step times: run ``1-32-agents`` of ``agents_h200.json``, batch 1; ``benchmark/results/policy_replay_cpu.json``
has the 1-, 8- and 32-agent runs and their commands). A model, not a measurement of a server: it shows whether the
choice can follow the swings, not what a server gains.
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)


def acceptance_table(per_session, nodes: int, agents: int):
    """``{(session, turn): [k at output position 1, 2, ...]}``: drafts accepted if a tree were drafted there, and the
    same positions' *expected* accepted drafts by the drafter's own counts (the sum of its nodes' path probabilities:
    a node is on the accepted path with its path's probability). The
    sessions run ``agents`` at a time in rounds of one turn each (closed-loop agents started together stay close to
    step), so a turn's drafts see the outputs of earlier rounds in the global cache, not those of its own round's
    other turns -- a sequential replay let each turn draft from its round's earlier outputs, which the tiny model's
    sessions share much of."""
    from acceptance_replay import SuffixReplay, accepted

    d = SuffixReplay(nodes)
    table, expected = {}, {}
    for g in range(0, len(per_session), agents):
        group = list(range(g, min(g + agents, len(per_session))))
        for t in range(max(len(per_session[s]) for s in group)):
            done = []
            for s in group:
                if t >= len(per_session[s]):
                    continue
                prompt, output = per_session[s][t]
                rid = f"{s}-{t}"
                d.start(rid, prompt)
                d.step(rid, output[:1])
                ks, es = [], []
                for pos in range(1, len(output)):
                    toks, parents, scores = d.draft_scored(rid)
                    ks.append(accepted(toks, parents, output[pos:]))
                    es.append(sum(scores[1:]))
                    d.step(rid, output[pos:pos + 1])
                table[(s, t)], expected[(s, t)] = ks, es
                done.append((rid, output))
            for rid, output in done:  # the round's outputs reach the global cache as its turns end
                d.finish(rid, output)
    return table, expected


def serve(table, per_session, agents: int, mode: str, args, finishing: bool = False, expected=None, **policy_kw):
    """Tokens per second and turn latencies of one closed-loop serving of every session (``mode``: none, tree,
    policy, oracle, score). The policy's acceptance sample of a drafted step: each row's accepted drafts as the server
    reports them (a run cut at the request's end accepts what was left of it), the rows that finished in the step left
    out unless ``finishing`` (how LumoTree's workers counted them before). ``score``: each step drafts where the
    drafter's own expectation (``expected``, :func:`acceptance_table`) scaled by its calibration so far (accepted over
    expected drafts of the drafted steps, decayed by :data:`CALIBRATION_DECAY` every step, drafted or not, with
    :data:`CALIBRATION_PRIOR` expected drafts counted as accepted; one step late as served) says
    the tree pays at the model's step times -- what the oracle decides with the true acceptance. :data:`CRITERIA` and
    ``request_harmonic``: criteria that weigh each request's gain (there)."""
    from lumotree.sglang import adaptive

    policy = chooser = None
    if mode == "request_quantile":  # LUMOTREE_SUFFIX's per-request choice, the served class
        from lumotree.sglang.request_choice import RequestQuantile, RequestQuantileSettings

        chooser = RequestQuantile(RequestQuantileSettings(**policy_kw))
    # the batch-wide policy (LUMOTREE_SUFFIX's before its per-request choice); lower-case keys: its settings,
    # upper-case: the module's
    if mode == "policy":
        own = {k: v for k, v in policy_kw.items() if k in adaptive.POLICY_KEYS}
        saved = {k: getattr(adaptive, k) for k in policy_kw if k not in own}
        for k in saved:
            setattr(adaptive, k, policy_kw[k])
        policy = adaptive.TreeSizePolicy([0, 1], settings=dataclasses.replace(adaptive.SUFFIX_SETTINGS, **own))

    def step_ms(b, tree):
        scale = args.fixed_share + (1 - args.fixed_share) * b / 32
        return (args.tree_ms if tree else args.none_ms) * scale

    try:
        sessions = list(range(len(per_session)))
        queue = sessions[agents:]
        running = {}  # session -> [turn, pos, output length, when the turn was sent]
        clock_ms, tokens, steps, drafted, pending, latencies, by_turn = 0.0, 0, 0, 0, [], [], {}
        calib = [0.0, 0.0]  # decayed accepted and expected drafts of drafted steps (score)
        req_est, req_mean, since = {}, [0.0, 0.0], [0]  # request_harmonic: per-turn averages, their mean, no-draft run
        request_kw = policy_kw if mode == "request_harmonic" else {}  # weight, drift, probe_every

        def harmonic_pays(b, accepts):  # at batch b the mean time per token falls with the tree
            return sum(step_ms(b, True) / (a + 1) for a in accepts) < len(accepts) * step_ms(b, False)

        def request_prior():  # request_harmonic: a request's average before its first drafted step
            return req_mean[0] / req_mean[1] if req_mean[1] else 4.0
        spec_prefill_ms = getattr(args, "prefill_ms_speculative", None)
        prefill_ms = args.prefill_ms if mode == "none" or spec_prefill_ms is None else spec_prefill_ms

        def calibrate(got, es):
            calib[0] = CALIBRATION_DECAY * calib[0] + sum(got)
            calib[1] = CALIBRATION_DECAY * calib[1] + sum(es[:len(got)])

        per_1k = getattr(args, "prefill_ms_per_1k", 0.0) or 0.0
        new_tokens = uncached_tokens(per_session) if per_1k else {}

        def admit(s, turn):
            nonlocal clock_ms, tokens
            sent = clock_ms
            clock_ms += prefill_ms + per_1k * new_tokens.get((s, turn), 0) / 1e3
            tokens += 1  # the prefill's token
            running[s] = [turn, 1, len(per_session[s][turn][1]), sent]

        for s in sessions[:agents]:
            admit(s, 0)
        while running:
            b = len(running)
            rows = [(s, st) for s, st in running.items() if st[1] < st[2]]
            ks = [table[(s, st[0])][st[1] - 1] for s, st in rows]
            if mode == "none":
                tree = False
            elif mode == "tree":
                tree = True
            elif mode == "oracle":
                tree = (sum(ks) + len(ks)) / step_ms(b, True) > len(ks) / step_ms(b, False)
            elif mode == "fair":  # the oracle's acceptance, proportional fairness: the product of rates, not the sum
                tree = sum(math.log(k + 1) for k in ks) > len(ks) * math.log(step_ms(b, True) / step_ms(b, False))
            elif mode == "harmonic":  # the oracle's acceptance, the batch's mean time per token (alpha-fairness 2)
                tree = harmonic_pays(b, ks)
            elif mode == "maxmin":  # the oracle's acceptance, no request slower than a decode step would make it
                tree = min(ks, default=0) + 1 >= step_ms(b, True) / step_ms(b, False)
            elif mode == "request_harmonic":  # the harmonic criterion on per-request averages of past steps
                for late in pending:
                    late()
                pending = []
                prior = request_prior()
                tree = harmonic_pays(b, [req_est.setdefault((s, st[0]), prior) for s, st in rows])
                since[0] = 0 if tree else since[0] + 1
                if since[0] > request_kw.get("probe_every", 16):  # a probe: the estimates of the batch refreshed
                    tree, since[0] = True, 0
            elif mode == "request_quantile":  # the served class; the step-time ratio the model's (served: measured)
                for late in pending:
                    late()
                pending = []
                ratio = step_ms(b, True) / step_ms(b, False)
                tree = chooser.decide([(s, st[0]) for s, st in rows], ratio)
            elif mode in ("score", "score_harmonic"):
                for late in pending:
                    late()
                pending = []
                es = [expected[(s, st[0])][st[1] - 1] for s, st in rows]
                c = (calib[0] + CALIBRATION_PRIOR) / (calib[1] + CALIBRATION_PRIOR)
                if mode == "score":
                    tree = (c * sum(es) + len(es)) / step_ms(b, True) > len(es) / step_ms(b, False)
                else:  # the harmonic criterion on the drafter's calibrated expectation
                    tree = harmonic_pays(b, [c * e for e in es])
            else:
                for late in pending:  # the previous step's results arrive now (overlap)
                    late()
                pending = []
                tree = policy.choose(b) > 0
            t = step_ms(b, tree)
            clock_ms += t
            steps += 1
            drafted += tree
            got, per_row = [], []
            for (s, st), k in zip(rows, ks):
                adv = min(k + 1 if tree else 1, st[2] - st[1])
                st[1] += adv
                tokens += adv
                if tree and (finishing or st[1] < st[2]):
                    got.append(adv - 1)
                per_row.append(adv - 1 if st[1] < st[2] else None)  # a row that finished: no sample (as served)
            if chooser is not None:
                pending.append(functools.partial(chooser.observe, [(s, st[0]) for s, st in rows], tree, per_row,
                                                 ratio))
            if policy is not None:
                pending.append(lambda b=b, tree=tree, t=t, got=got: (
                    policy.observe_time(b, int(tree), t / 1e3), policy.observe_accept(int(tree), got)))
            if mode == "request_harmonic":  # one step late, as served: drafted rows averaged, the others drift back
                def learn(keys=[(s, st[0]) for s, st in rows], ks=list(ks), tree=tree):
                    w, r = request_kw.get("weight", 0.5), request_kw.get("drift", 0.1)
                    prior = request_prior()
                    for key, k in zip(keys, ks):
                        old = req_est.get(key, prior)
                        if tree:
                            req_est[key] = (1 - w) * old + w * k
                            req_mean[0], req_mean[1] = 0.99 * req_mean[0] + k, 0.99 * req_mean[1] + 1
                        else:
                            req_est[key] = old + r * (prior - old)
                pending.append(learn)
            if mode in ("score", "score_harmonic"):  # the past fades every step, so a drafter that missed is tried again
                pending.append(functools.partial(calibrate, got if tree else [], es if tree else []))
            for s in [s for s, st in running.items() if st[1] >= st[2]]:
                turn, _, _, sent = running.pop(s)
                latencies.append(clock_ms - sent)
                by_turn.setdefault(turn, []).append(clock_ms - sent)
                if turn + 1 < len(per_session[s]):
                    admit(s, turn + 1)
                elif queue:
                    admit(queue.pop(0), 0)
        return dict(mode=mode, **({"policy": policy_kw} if policy_kw else {}),
                    **({"finishing_rows_counted": finishing} if mode == "policy" else {}), tokens=tokens, steps=steps,
                    drafted_steps=drafted, seconds=round(clock_ms / 1e3, 3),
                    tokens_per_s=round(tokens / (clock_ms / 1e3), 1), **turn_latency(latencies),
                    latency_p50_ms_by_turn=[turn_latency(by_turn[k])["latency_p50_ms"] for k in sorted(by_turn)])
    finally:
        if policy is not None:
            for k, v in saved.items():
                setattr(adaptive, k, v)


# per-step criteria that weigh each request's gain, not the batch's sum (--criteria): with the true acceptance,
# "fair" drafts where the product of the requests' rates rises (proportional fairness), "harmonic" where the batch's
# mean time per token falls, "maxmin" where no request is slower than a decode step would make it; "score_harmonic"
# is "harmonic" on the drafter's calibrated expectation (what a server knows before the step).
# "request_harmonic" (--request-variants) is "harmonic" on each request's own average of its past drafted steps.
CRITERIA = ("fair", "harmonic", "maxmin", "score_harmonic")

CALIBRATION_DECAY = 0.95  # score: the weight of the calibration's past per step
CALIBRATION_PRIOR = 4.0  # score: expected drafts it starts from as if accepted (one step's miss does not zero it)


def uncached_tokens(per_session) -> dict:
    """``{(session, turn): prompt tokens a radix cache would not hold}``: the prompt less its longest common prefix
    with the session's previous context (prompt + reply; a history collapse parts early), or for a first turn with
    the first session's first prompt (the system prompt and tool docs every session shares)."""
    out, first = {}, None
    for s, turns in enumerate(per_session):
        ctx = first if first is not None else []
        for t, (prompt, output) in enumerate(turns):
            out[(s, t)] = len(prompt) - len(os.path.commonprefix([ctx, list(prompt)]))
            if first is None:
                first = list(prompt)
            ctx = list(prompt) + list(output)
    return out


def turn_latency(ms) -> dict:
    """Median and 95th percentile of the turns' latencies (ms, from the send to the last token), as agents_bench
    reports them."""
    if not ms:
        return {}
    ms = sorted(ms)
    mid = len(ms) // 2
    med = ms[mid] if len(ms) % 2 else (ms[mid - 1] + ms[mid]) / 2
    return dict(latency_p50_ms=round(med, 1), latency_p95_ms=round(ms[int(0.95 * (len(ms) - 1))], 1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from acceptance_replay import stream_args

    stream_args(ap, reference="none/8")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--none-ms", type=float, default=2.9, help="a no-draft step at batch 32")
    ap.add_argument("--tree-ms", type=float, default=7.0, help="a drafted step at batch 32")
    ap.add_argument("--fixed-share", type=float, default=0.3, help="share of a step's time independent of the batch")
    ap.add_argument("--prefill-ms", type=float, default=14.0, help="host + device time of a turn's prefill")
    ap.add_argument("--prefill-ms-per-1k", type=float, default=0.0,
                    help="and this much per 1,000 of the turn's prompt tokens a radix cache would not hold "
                         "(uncached_tokens): turns whose history collapsed prefill thousands")
    ap.add_argument("--prefill-ms-speculative", type=float, default=None,
                    help="the speculative server's time per turn's prefill where it differs from --prefill-ms (the "
                         "served 32-agent prefill intervals were 40 %% longer)")
    ap.add_argument("--variants", default='[{}]',
                    help="JSON list of policy settings to replay, one row each: the served LUMOTREE_SUFFIX policy's "
                         "(adaptive.SUFFIX_SETTINGS) with lower-case keys (ema, probe_every, probe_max, probe_budget) "
                         "replaced, module constants (GAP_SAMPLES, ...) with upper-case ones")
    ap.add_argument("--criteria", action="store_true",
                    help="also the per-step criteria that weigh each request's gain (CRITERIA: with the true "
                         "acceptance, and the harmonic one on the drafter's expectation)")
    ap.add_argument("--request-variants", default="[]",
                    help="JSON list of request_harmonic settings, one row each: weight (a drafted step's sample in a "
                         "request's average), drift (towards the mean of all rows per no-draft step), probe_every "
                         "(no-draft steps before a drafted one)")
    ap.add_argument("--request-quantile-variants", default="[]",
                    help="JSON list of settings of LUMOTREE_SUFFIX's per-request choice "
                         "(lumotree.sglang.request_choice.RequestQuantileSettings fields; {} the defaults), one row "
                         "each, and one on the same turns with no draft ever accepted")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from acceptance_replay import served_turns

    per_session = served_turns(args)
    t0 = time.perf_counter()
    table, expected = acceptance_table(per_session, args.nodes, args.agents)
    modes = ("none", "tree", "oracle", "score") + (CRITERIA if args.criteria else ())
    rows = [serve(table, per_session, args.agents, m, args, expected=expected) for m in modes]
    rows += [serve(table, per_session, args.agents, "request_harmonic", args, **kw)
             for kw in json.loads(args.request_variants)]
    rows += [serve(table, per_session, args.agents, "policy", args, finishing=f, **kw)
             for kw in json.loads(args.variants) for f in (True, False)]
    quantiles = json.loads(args.request_quantile_variants)
    rows += [serve(table, per_session, args.agents, "request_quantile", args, **kw) for kw in quantiles]
    # the same turns where no draft is ever accepted: what the policy's probes cost where speculation cannot pay
    missed = {key: [0] * len(ks) for key, ks in table.items()}
    rows += [dict(serve(missed, per_session, args.agents, "policy", args, **kw), drafts="never accepted")
             for kw in json.loads(args.variants)]
    rows += [dict(serve(missed, per_session, args.agents, "request_quantile", args, **kw), drafts="never accepted")
             for kw in quantiles]
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["x_none"] = round(r["tokens_per_s"] / base, 3)
        print(json.dumps(r), flush=True)
    ks = [k for v in table.values() for k in v]
    first = [v[0] for v in table.values() if v]
    acceptance = dict(mean_k_any_position=round(sum(ks) / len(ks), 2), share_k_zero=round(ks.count(0) / len(ks), 3),
                      mean_k_first_decode_step=round(sum(first) / len(first), 2))
    print(json.dumps(acceptance), flush=True)
    from acceptance_replay import write_result

    return write_result(__file__, argv, args.out, reference=args.reference, acceptance=acceptance,
                        model=dict(none_ms=args.none_ms, tree_ms=args.tree_ms, fixed_share=args.fixed_share,
                                   prefill_ms=args.prefill_ms, prefill_ms_per_1k=args.prefill_ms_per_1k,
                                   **({} if args.prefill_ms_speculative is None else
                                      dict(prefill_ms_speculative=args.prefill_ms_speculative))),
                        seconds=round(time.perf_counter() - t0, 1), rows=rows)


if __name__ == "__main__":
    main()
