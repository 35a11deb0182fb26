"""``lumotree demo | serve``: command-line entry points.

Input errors end with one line on stderr that names the problem and the fix, and exit status 2
(:class:`UsageError`); nothing is loaded or launched before the inputs are checked.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

MAX_DEMO_TOKENS = 100_000


class UsageError(Exception):
    """A bad command-line input: reported as ``lumotree <cmd>: error: <message>``, exit status 2."""


def _positive(name: str, value: int, upper: int = None) -> None:
    if value < 1:
        raise UsageError(f"{name} must be a positive integer (got {value})")
    if upper is not None and value > upper:
        raise UsageError(f"{name} must be at most {upper} (got {value})")


def check_demo_model(path: str) -> None:
    """A directory holding a Qwen3.5 text checkpoint: config.json, model.safetensors, tokenizer.json."""
    if not os.path.exists(path):
        raise UsageError(f"--model {path}: no such directory (give a Qwen3.5 text checkpoint directory, or leave "
                         f"--model out for the bundled tiny model)")
    if not os.path.isdir(path):
        raise UsageError(f"--model {path}: is a file; give the checkpoint's directory (config.json, "
                         f"model.safetensors, tokenizer.json)")
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise UsageError(f"--model {path}: missing {', '.join(missing)}; the demo reads a Qwen3.5 text checkpoint "
                         f"with its tokenizer (config.json, model.safetensors, tokenizer.json)")


def default_model():
    """The trained tiny checkpoint when present: ``$LUMOTREE_DEMO_MODEL``, else the repository's
    ``benchmark/models/tiny-hybrid`` (an editable/source install), else None (random weights)."""
    import os

    env = os.environ.get("LUMOTREE_DEMO_MODEL")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    cand = os.path.normpath(os.path.join(here, "..", "..", "benchmark", "models", "tiny-hybrid"))
    return cand if os.path.isfile(os.path.join(cand, "model.safetensors")) else None


def demo(args) -> int:
    import torch

    from lumotree.drafters.ngram import NgramDrafter
    from lumotree.models.generate import generate_plain, generate_tree
    from lumotree.models.tiny_hybrid import TinyHybridConfig, TinyHybridLM

    _positive("--tokens", args.tokens, MAX_DEMO_TOKENS)
    _positive("--budget", args.budget)
    _positive("--depth", args.depth)
    if args.model is not None and args.random:
        raise UsageError("--model and --random exclude each other (a checkpoint, or random weights)")
    if args.model is not None:
        check_demo_model(args.model)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    tok = None
    if args.model is None and not args.random:
        args.model = default_model()
    if args.model:  # a Qwen3.5 checkpoint (e.g. benchmark/models/train_tiny_hybrid.py's) and real code
        import copy
        import inspect

        from tokenizers import Tokenizer

        try:
            model = TinyHybridLM.from_hf(args.model)
            tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
        except Exception as e:  # the checkpoint's own errors (tokenizers raises plain Exception)
            raise UsageError(f"--model {args.model}: cannot load it as a Qwen3.5 text checkpoint "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'})") from None
        # copy.py is in the training recipe's held-out split (CRC32 of its path % 20 == 0)
        prompt = tok.encode(inspect.getsource(copy)[:2000]).ids
        what = f"checkpoint {args.model}, prompt: the first 2000 characters of copy.py ({len(prompt)} tokens)"
    else:
        model = TinyHybridLM(TinyHybridConfig(seed=args.seed))
        g = torch.Generator().manual_seed(args.seed)
        motif = torch.randint(0, model.config.vocab_size, (24,), generator=g).tolist()
        prompt = motif * 2
        what = f"seed {args.seed}, random weights"
    t0 = time.perf_counter()
    plain = generate_plain(model, prompt, args.tokens)
    t1 = time.perf_counter()
    drafter = NgramDrafter(max_match=4, depth=args.depth, budget=args.budget)
    spec, st = generate_tree(model, prompt, args.tokens, drafter)
    t2 = time.perf_counter()
    same = plain == spec
    c = model.config
    print(f"model: tiny hybrid (Qwen3.5 shape), {c.num_layers} layers {c.layer_types()}, vocab {c.vocab_size}, "
          f"{what}")
    print(f"generated: {args.tokens} greedy tokens, plain decode {t1 - t0:.2f} s, tree speculation {t2 - t1:.2f} s")
    print(f"identical: {'yes' if same else 'no'}")
    print(f"verify steps: {st.steps} (plain: {args.tokens})")
    print(f"mean accepted length: {st.mean_accept_len:.2f} draft tokens/step")
    print(f"tokens per verify step: {st.tokens_per_step:.2f}")
    print(f"tree: {st.nodes / st.steps:.1f} nodes, {st.paths / st.steps:.2f} paths, "
          f"{st.boundaries / st.steps:.2f} boundary states per tree (mean); budget {args.budget} nodes")
    print(f"speculative GDN state memory (largest tree): LumoTree boundary states {st.boundary_bytes / 1024:.0f} KiB "
          f"vs per-node snapshots {st.snapshot_bytes / 1024:.0f} KiB")
    if tok is not None:
        print("continuation: " + repr(tok.decode(spec[:60]))[:240])
    if not same:
        for i, (a, b) in enumerate(zip(plain, spec)):
            if a != b:
                print(f"first difference at token {i}: plain {a}, speculative {b}", file=sys.stderr)
                break
        return 1
    return 0


def check_serve(args, rest, cuda_available=None) -> None:
    """What ``serve`` checks before launching SGLang: the flags it sets itself are not given twice, the
    tree flags are in range, the model is a directory with config.json (or a Hugging Face repo id), and
    a CUDA GPU is present (``cuda_available``: for tests)."""
    for flag in ("--speculative-algorithm", "--model-path", "--speculative-num-steps", "--speculative-eagle-topk",
                 "--speculative-num-draft-tokens"):
        if any(r == flag or r.startswith(flag + "=") for r in rest):
            own = {"--speculative-algorithm": "--suffix", "--model-path": "--model-path",
                   "--speculative-num-steps": "--steps", "--speculative-eagle-topk": "--topk",
                   "--speculative-num-draft-tokens": "--draft-tokens"}[flag]
            raise UsageError(f"{flag} is set by lumotree serve; use its {own} option (or run "
                             f"python -m sglang.launch_server yourself)")
    if not args.suffix:
        _positive("--steps", args.steps, 16)
        _positive("--topk", args.topk, 8)
        if args.draft_tokens is None:  # a chain's every node; a tree's two per level (3 steps, topk 2: 6)
            args.draft_tokens = min(64, args.steps * args.topk + 1, args.steps + 1 if args.topk == 1 else 2 * args.steps)
        if not 2 <= args.draft_tokens <= min(64, args.steps * args.topk + 1):
            raise UsageError(f"--draft-tokens must be in [2, {min(64, args.steps * args.topk + 1)}] for --steps "
                             f"{args.steps} --topk {args.topk} (a tree of at most steps x topk + 1 nodes, at most 64; "
                             f"got {args.draft_tokens})")
    path = args.model_path
    if os.path.exists(path):
        if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
            raise UsageError(f"--model-path {path}: not a checkpoint directory with a config.json")
    elif path.startswith((".", "/", "~")) or path.count("/") != 1:
        raise UsageError(f"--model-path {path}: no such directory, and not a Hugging Face repo id (org/name)")
    if cuda_available is None:
        try:
            import torch

            cuda_available = torch.cuda.is_available()
        except ImportError:
            cuda_available = False
    if not cuda_available:
        raise UsageError("no CUDA GPU visible: a LumoTree server runs on an NVIDIA GPU (SGLang's CPU path is not "
                         "supported); on this machine run `lumotree demo` instead, or add --dry-run to print the command")


def _names_attention_backend(rest) -> bool:
    return any(r == "--attention-backend" or r.startswith("--attention-backend=") for r in rest)


def fa3_installed() -> bool:
    """Whether the installed sgl-kernel carries its FlashAttention-3 extension (``sgl_kernel.flash_ops``),
    which SGLang's default attention backend on Hopper imports; looked up as a file, without importing
    sgl-kernel (its import loads CUDA libraries)."""
    import glob
    import importlib.util

    try:
        spec = importlib.util.find_spec("sgl_kernel")
    except (ImportError, ValueError):
        return False
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(glob.glob(os.path.join(d, "flash_ops*.so")) for d in dirs)


def serve(args, rest) -> int:
    """``python -m sglang.launch_server`` with LUMOTREE's flags; everything after ``--`` (or any
    unknown flag) is passed through to SGLang unchanged."""
    check_serve(args, rest, cuda_available=True if args.dry_run else None)
    exact = []
    if args.exact:  # the decode-exact verify (lumotree.sglang.exact) runs on SGLang's Triton attention backend
        exact = ["--enable-deterministic-inference"]
        if not _names_attention_backend(rest):
            exact += ["--attention-backend", "triton"]
    if args.suffix:  # model-free suffix drafting; its tree size follows the running batch (sglang/suffix_sizes.py)
        tree = ["--speculative-algorithm", "LUMOTREE_SUFFIX"]
    else:
        tree = ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", str(args.steps),
                "--speculative-eagle-topk", str(args.topk), "--speculative-num-draft-tokens", str(args.draft_tokens)]
    backend = []
    if not exact and not _names_attention_backend(rest) and not fa3_installed():
        # SGLang picks FlashAttention-3 on Hopper and stops at start-up ("Can not import FA3 in sgl_kernel")
        # when its sgl-kernel build lacks it; its Triton backend serves every LumoTree path
        print("lumotree serve: sgl-kernel has no FlashAttention-3 kernels (sgl_kernel.flash_ops); serving with "
              "--attention-backend triton", file=sys.stderr, flush=True)
        backend = ["--attention-backend", "triton"]
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.model_path, *tree, *exact, *backend,
           *rest]
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    os.execv(sys.executable, cmd)
    return 0  # not reached


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lumotree", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="lossless tree speculation with a tiny hybrid model, on CPU, in seconds")
    d.add_argument("--tokens", type=int, default=160, help="greedy tokens to generate, plainly and speculatively")
    d.add_argument("--budget", type=int, default=16, help="draft tree nodes per step")
    d.add_argument("--depth", type=int, default=6, help="longest draft path (n-gram continuation length)")
    d.add_argument("--seed", type=int, default=1, help="random weights' and synthetic prompt's seed (with --random)")
    d.add_argument("--model", default=None, help="a Qwen3.5 text checkpoint directory (default: the trained "
                   "benchmark/models/tiny-hybrid when present)")
    d.add_argument("--random", action="store_true", help="random weights and a synthetic prompt instead")
    s = sub.add_parser("serve", help="python -m sglang.launch_server --speculative-algorithm LUMOTREE ... "
                       "(other flags go to SGLang)")
    s.add_argument("--model-path", required=True, help="a Qwen3.5 / Qwen3-Next hybrid checkpoint (directory or "
                   "Hugging Face repo id) with an MTP layer (any, with --suffix)")
    # the default is a 3-step chain: at controlled acceptance on the 27B shapes (H200, docs/performance.md) a
    # LUMOTREE step with the topk-2 tree cost 1.2-1.9x the chain's step (batch 1-32), more than a tree can
    # win back in acceptance; --topk 2 --draft-tokens 6 serves the tree
    s.add_argument("--steps", type=int, default=3, help="--speculative-num-steps (draft depth)")
    s.add_argument("--topk", type=int, default=1, help="--speculative-eagle-topk (branching; 1: a chain)")
    s.add_argument("--draft-tokens", type=int, default=None,
                   help="--speculative-num-draft-tokens (tree nodes; default: steps + 1 for a chain, 2 x steps for a tree)")
    s.add_argument("--suffix", action="store_true", help="model-free suffix drafting (LUMOTREE_SUFFIX; for agents "
                   "and models without an MTP layer); --steps/--topk/--draft-tokens do not apply")
    s.add_argument("--exact", action="store_true", help="greedy outputs token-identical to the server without "
                   "speculation (--enable-deterministic-inference: every draft node computed as the one-token decode "
                   "at its position; slower); run the reference with the same SGLang flags")
    s.add_argument("--dry-run", action="store_true", help="print the SGLang command and exit")
    args, rest = ap.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    try:
        if args.cmd == "demo":
            if rest:
                raise UsageError(f"unrecognized arguments: {' '.join(rest)} (see lumotree demo --help)")
            return demo(args)
        if args.cmd == "serve":
            return serve(args, rest)
    except UsageError as e:
        print(f"lumotree {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
