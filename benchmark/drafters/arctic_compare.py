"""LumoTree's suffix drafter against arctic-inference's ``SuffixDecodingCache`` (the reference SuffixDecoding
implementation, Apache-2.0, C++ behind nanobind; vLLM's suffix decoding runs on it): does it build, what it accepts on
the agent benchmark's served token streams, and what it costs the host per step and per admission (CPU).

    python3 benchmark/drafters/arctic_compare.py --arctic-sdist arctic_inference-0.3.0.tar.gz \\
        --replies benchmark/results/agents_32_replies_h200.json.gz --reference none/32 --seed 0 \\
        --out benchmark/results/arctic_suffix_cpu.json
    # the sdist: pip download --no-deps --no-build-isolation --no-binary :all: arctic-inference==0.3.0

**Build.** arctic-inference ships as an sdist whose build needs CMake, nanobind, protobuf, grpcio-tools, torch and
its CUDA custom ops (vLLM's plugin). Its suffix decoding is two C++ files and a nanobind binding
(``csrc/suffix_decoding``): :func:`build` compiles those alone with the host's g++ and nanobind's own sources
(``nb_combined.cpp``; the ``nanobind`` package, build time only), no CMake, into ``--build-dir``, beside the sdist's
``arctic_inference/suffix_decoding`` Python package, which imports nothing else of arctic-inference.

**Acceptance** (:func:`acceptance_replay.concurrent_replay`: ``--agents`` closed-loop agents stepped together as a
server steps them, the reference server's replies as the continuation): LUMOTREE_SUFFIX's drafter with the server's
settings at ``--nodes`` nodes (``acceptance_replay.SuffixReplay``) and arctic's cache as vLLM drives it at the same
budget (``acceptance_replay.ArcticReplay``: ``nodes - 1`` tokens below the root, its tree speculation, its defaults
``max_tree_depth`` 64, ``max_spec_factor`` 1, ``min_token_prob`` 0.1; and ``min_token_prob`` 0, as LumoTree's).

**Host time** (the agent replay sessions' contexts as in ``suffix_host_cost.py``, characters as token ids, a
``--context``-token prompt per request): per decode step of a batch, each request's ``--accept`` accepted tokens
indexed and a ``--nodes`` draft made -- LumoTree's ``step_batch`` (one C++ call for the batch on the server's host
threads, the GIL released) against arctic's calls per request (``add_active_response`` + ``speculate`` from Python,
as vLLM's proposer makes them); per admission, a prompt's indexing (LumoTree's ``start``; arctic's
``start_request``). Both drafters' tries hold the same prompts; the steps run after 32 earlier outputs reached their
global caches.
"""
import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

SOURCES = ("csrc/suffix_decoding/bindings.cc", "csrc/suffix_decoding/suffix_tree.cc")


def build(sdist: str, build_dir: str) -> dict:
    """Unpack ``sdist`` into ``build_dir`` and compile its suffix decoding extension (``_C``) with g++ and nanobind;
    returns ``dict(version, license, seconds, module_dir)`` (``module_dir``: put on ``sys.path`` to import
    ``arctic_inference.suffix_decoding.cache``). Raises ``RuntimeError`` naming what is missing or what failed."""
    try:
        import nanobind
    except ImportError:
        raise RuntimeError("building arctic-inference's suffix decoding needs the nanobind package "
                           "(pip install nanobind==2.9.2, its build requirement)") from None
    if shutil.which("g++") is None:
        raise RuntimeError("building arctic-inference's suffix decoding needs g++")
    os.makedirs(build_dir, exist_ok=True)
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        tf.extractall(build_dir)
    root = os.path.join(build_dir, top)
    missing = [s for s in SOURCES if not os.path.isfile(os.path.join(root, s))]
    if missing:
        raise RuntimeError(f"{sdist}: no {missing} (not an arctic-inference sdist with suffix decoding?)")
    nb = os.path.dirname(nanobind.__file__)
    out = os.path.join(root, "arctic_inference", "suffix_decoding", "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = ["g++", "-O3", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-DNDEBUG",
           f"-I{nb}/include", f"-I{nb}/ext/robin_map/include", f"-I{sysconfig.get_paths()['include']}",
           *[os.path.join(root, s) for s in SOURCES], os.path.join(nb, "src", "nb_combined.cpp"), "-o", out]
    t0 = time.perf_counter()
    got = subprocess.run(cmd, capture_output=True, text=True)
    if got.returncode != 0:
        raise RuntimeError(f"g++ failed building arctic-inference's suffix decoding:\n{got.stderr[-3000:]}")
    lic = open(os.path.join(root, "LICENSE")).read(400) if os.path.isfile(os.path.join(root, "LICENSE")) else ""
    return dict(version=top.split("-")[-1], license="Apache-2.0" if "Apache License" in lic else "see LICENSE",
                nanobind=getattr(nanobind, "__version__", None), seconds=round(time.perf_counter() - t0, 1),
                module_dir=root)


def arctic_cache_module(module_dir: str):
    sys.path.insert(0, module_dir)
    return importlib.import_module("arctic_inference.suffix_decoding.cache")


def host_time(cache_mod, batch: int, args) -> list:
    """Per decode step and per admission, ms (median, p95), of both drafters on the same contexts."""
    from suffix_host_cost import contexts

    from lumotree.drafters.suffix import drafter_threads, make_suffix_drafter
    from lumotree.sglang.suffix import SuffixCorpus

    texts = contexts(batch + 32, args.context)
    rows = []
    threads = args.threads or drafter_threads()

    def stats(ts):
        ts = sorted(ts)
        return round(statistics.median(ts) * 1e3, 3), round(ts[int(0.95 * (len(ts) - 1))] * 1e3, 3)

    def admissions(start):  # each request's prompt indexed, timed
        times = []
        for rid, t in zip(rids, texts):
            t0 = time.perf_counter()
            start(rid, t[:args.context])
            times.append(time.perf_counter() - t0)
        return times

    rids = [f"r{i}" for i in range(batch)]

    # LumoTree: the server's drafter and settings
    d = make_suffix_drafter(threads=threads, **SuffixCorpus(args.nodes).kw)
    for i in range(32):  # earlier outputs in the global cache
        d.start(f"g{i}", texts[batch + i][:args.context])
        d.finish(f"g{i}", texts[batch + i][args.context:args.context + 512])
    adm = admissions(d.start)
    steps = []
    for k in range(args.steps):
        app = [t[args.context + k * args.accept:args.context + (k + 1) * args.accept] for t in texts[:batch]]
        t0 = time.perf_counter()
        d.step_batch(rids, app, args.nodes)
        steps.append(time.perf_counter() - t0)
    rows.append(dict(drafter="lumotree-suffix", threads=threads, batch=batch, nodes=args.nodes,
                     step_ms=stats(steps), admission_ms=stats(adm)))

    # arctic: its cache driven per request, as vLLM's suffix decoding proposer drives it
    for min_prob in (0.1, 0.0):
        c = cache_mod.SuffixDecodingCache(max_tree_depth=64)
        for i in range(32):
            c.start_request(f"g{i}", texts[batch + i][:args.context])
            c.add_active_response(f"g{i}", texts[batch + i][args.context:args.context + 512])
            c.stop_request(f"g{i}")
        adm = admissions(c.start_request)
        steps = []
        for k in range(args.steps):
            end = args.context + (k + 1) * args.accept
            t0 = time.perf_counter()
            for rid, t in zip(rids, texts[:batch]):
                c.add_active_response(rid, t[end - args.accept:end])
                c.speculate(rid, t[max(0, end - 64):end], max_spec_tokens=args.nodes - 1, max_spec_factor=1.0,
                            max_spec_offset=0.0, min_token_prob=min_prob, use_tree_spec=True)
            steps.append(time.perf_counter() - t0)
        rows.append(dict(drafter="arctic-suffix", min_token_prob=min_prob, batch=batch, nodes=args.nodes,
                         step_ms=stats(steps), admission_ms=stats(adm)))
    return rows


def acceptance(cache_mod, args) -> list:
    """Tokens per request step of both drafters on the served streams (concurrent replay)."""
    from acceptance_replay import ArcticReplay, SuffixReplay, concurrent_replay, served_turns

    per_session = served_turns(args)
    rows = []
    for name, make in (("lumotree-suffix", lambda: SuffixReplay(args.nodes)),
                       ("arctic-suffix", lambda: ArcticReplay(args.nodes, cache_mod)),
                       ("arctic-suffix min_token_prob 0", lambda: ArcticReplay(args.nodes, cache_mod,
                                                                                min_token_prob=0.0))):
        t0 = time.perf_counter()
        got = concurrent_replay(make(), per_session, args.agents)
        rows.append(dict(drafter=name, nodes=args.nodes, agents=args.agents, request_steps=got["request_steps"],
                         tokens=got["tokens"], tokens_per_step=round(got["tokens"] / got["request_steps"], 3),
                         seconds=round(time.perf_counter() - t0, 1)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arctic-sdist", required=True, help="arctic_inference-<version>.tar.gz (PyPI's sdist)")
    ap.add_argument("--build-dir", default="/tmp/arctic-build")
    ap.add_argument("--replies", default=None, help="agents_bench.py --replies-out (gzip JSON): the acceptance rows")
    ap.add_argument("--reference", default="none/32")
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=13)
    ap.add_argument("--seed", type=int, default=0, help="the level's session seed (session_seeds of the agents run)")
    ap.add_argument("--collapse-tokens", type=int, default=6500)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=16,
                    help="tree nodes, the root included (LUMOTREE_SUFFIX at 33-64 requests)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--accept", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=None, help="LumoTree's host threads (default: the server's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    built = build(args.arctic_sdist, args.build_dir)
    print(json.dumps(dict(built={k: v for k, v in built.items() if k != "module_dir"})), flush=True)
    mod = arctic_cache_module(built["module_dir"])
    host = []
    for b in (int(x) for x in args.batches.split(",")):
        host += host_time(mod, b, args)
        for r in host[-3:]:
            print(json.dumps(r), flush=True)
    acc = acceptance(mod, args) if args.replies else []
    from acceptance_replay import write_result

    import platform

    return write_result(__file__, argv, args.out, arctic_build={k: v for k, v in built.items() if k != "module_dir"},
                        machine=dict(cpus=os.cpu_count(), processor=platform.processor() or platform.machine()),
                        reference=args.reference if args.replies else None, host_time=host, acceptance=acc)


if __name__ == "__main__":
    main()
