"""``lumotree demo | serve``: command-line entry points."""
from __future__ import annotations

import argparse
import sys
import time


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

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    tok = None
    if args.model is None and not args.random:
        args.model = default_model()
    if args.model:  # a Qwen3.5 checkpoint (e.g. benchmark/models/train_tiny_hybrid.py's) and real code
        import copy
        import inspect
        import os

        from tokenizers import Tokenizer

        model = TinyHybridLM.from_hf(args.model)
        tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
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


def serve(args, rest) -> int:
    """``python -m sglang.launch_server`` with LUMOTREE's flags; everything after ``--`` (or any
    unknown flag) is passed through to SGLang unchanged."""
    import os

    exact = []
    if args.exact:  # the decode-exact verify (lumotree.sglang.exact) runs on SGLang's Triton attention backend
        exact = ["--enable-deterministic-inference"]
        if not any(r == "--attention-backend" or r.startswith("--attention-backend=") for r in rest):
            exact += ["--attention-backend", "triton"]
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.model_path,
           "--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", str(args.steps),
           "--speculative-eagle-topk", str(args.topk), "--speculative-num-draft-tokens", str(args.draft_tokens),
           *exact, *rest]
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    os.execv(sys.executable, cmd)
    return 0  # not reached


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lumotree", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="lossless tree speculation with a tiny hybrid model, on CPU, in seconds")
    d.add_argument("--tokens", type=int, default=160)
    d.add_argument("--budget", type=int, default=16, help="draft tree nodes per step")
    d.add_argument("--depth", type=int, default=6)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--model", default=None, help="a Qwen3.5 text checkpoint directory (default: the trained "
                   "benchmark/models/tiny-hybrid when present)")
    d.add_argument("--random", action="store_true", help="random weights and a synthetic prompt instead")
    s = sub.add_parser("serve", help="python -m sglang.launch_server --speculative-algorithm LUMOTREE ... "
                       "(other flags go to SGLang)")
    s.add_argument("--model-path", required=True, help="a Qwen3.5 / Qwen3-Next hybrid checkpoint with an MTP layer")
    s.add_argument("--steps", type=int, default=3, help="--speculative-num-steps (tree depth)")
    s.add_argument("--topk", type=int, default=2, help="--speculative-eagle-topk (branching)")
    s.add_argument("--draft-tokens", type=int, default=6, help="--speculative-num-draft-tokens (tree nodes)")
    s.add_argument("--exact", action="store_true", help="greedy outputs token-identical to the server without "
                   "speculation (--enable-deterministic-inference: every draft node computed as the one-token decode "
                   "at its position; slower); run the reference with the same SGLang flags")
    s.add_argument("--dry-run", action="store_true", help="print the SGLang command and exit")
    args, rest = ap.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.cmd == "demo":
        if rest:
            ap.error(f"unrecognized arguments: {' '.join(rest)}")
        return demo(args)
    if args.cmd == "serve":
        return serve(args, rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
