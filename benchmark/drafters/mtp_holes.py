"""What the MTP layer's missing KV entries cost in acceptance, on the committed tiny model's trained MTP head (CPU).

A LUMOTREE no-draft step is a plain decode step: it skips the MTP layer's draft-extend
(:mod:`lumotree.sglang.worker`), so the MTP layer's KV cache gets no entry for the token it decodes, and the first
drafted step after a no-draft stretch drafts its first level cold (:func:`lumotree.sglang.worker.cold_draft_input`).
Later drafts attend over the context with those holes. The served benchmarks cannot show what that costs: their
drafts come from the controlled-acceptance oracle or from dummy weights. This replays SGLang's MTP chain drafter
(``EAGLEWorkerV2``: the first level from the draft-extend's last position, then ``--speculative-num-steps - 1``
chained steps, each fed the previous step's token and its MTP hidden state) on the tiny model's greedy outputs, in
fp32 on the CPU, and counts the drafts a greedy verify accepts.

An MTP entry ``i`` is the layer's key and value at position ``i`` from ``(x[i + 1], h[i])`` (the target's final
hidden state at ``i``); with one MTP layer an entry depends on nothing else, so a drafted step at any position can be
evaluated alone: the step whose last token is ``x[t]`` queries entry ``t - 1`` (its first level) over the entries
``0 .. t - 1``, then its chained steps at ``t, t + 1, ...`` over those and their own. Every position of a region is
evaluated so (as if a drafted step started there), for every scenario on the same positions:

* ``full``: every entry written (a server that drafts every step, or fills the MTP cache on no-draft steps);
* ``stretch-S``: entries ``P .. P + S - 1`` missing (``S`` no-draft steps right after a ``P``-token prompt's
  prefill, then drafting resumes; the region starts after the resumed run's cold step);
* ``prompt``: entries ``0 .. P - 1`` missing (a prefill without the MTP draft-extend);

each hole served three ways: ``masked`` (left out of the attention: what a server that knew its holes would do),
``zero`` (key and value 0: a slot the draft model never wrote) and ``stale`` (another sequence's entry at the same
slot: SGLang's request-to-token map gives a decoded token a slot whose draft-pool KV a finished request wrote).

Sequences stay within the windows the checkpoint was trained on (``train_log.json``'s ``seq``, 512 tokens): beyond
them its positions are extrapolation, and there leaving out the prompt's entries *raised* the acceptance (+7 % at
positions 449-765 with 256-token prompts) -- a shorter context back inside the trained length, not a property of
the cache.

    python3 benchmark/drafters/mtp_holes.py --texts 24 --prompt 128 --gen 380 --continuation text \
        --out benchmark/results/mtp_holes_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import sysconfig
import time
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "models", "tiny-hybrid")
FILLS = ("masked", "zero", "stale")


class MtpLayer:
    """The checkpoint's MTP layer (SGLang's ``Qwen3_5MTP``: ``fc`` over the normed next-token embedding and the normed
    target hidden state, one gated full-attention decoder layer, the final norm; the target's tied ``lm_head``) with
    its KV cache as explicit tensors, so that entries can be left out or replaced."""

    def __init__(self, target, weights: dict, config):
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        c = type(config)(**{**config.to_dict(), "num_hidden_layers": 1, "layer_types": ["full_attention"]})
        self.target = target
        self.fc = torch.nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.norm_embedding = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.norm_hidden = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layer = Qwen3_5DecoderLayer(c, 0)
        self.norm = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        mods = {"fc": self.fc, "pre_fc_norm_embedding": self.norm_embedding, "pre_fc_norm_hidden": self.norm_hidden,
                "layers.0": self.layer, "norm": self.norm}
        for prefix, mod in mods.items():
            sd = {k[len("mtp." + prefix) + 1:]: v.float() for k, v in weights.items() if k.startswith(f"mtp.{prefix}.")}
            mod.load_state_dict(sd, strict=True)
            mod.eval()
        attn = self.layer.self_attn
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, attn.head_dim
        self.scaling = attn.scaling

    def rope(self, positions: torch.Tensor):
        """cos, sin `[T, rotary_dim]` at ``positions`` (text: the same position on M-RoPE's three axes)."""
        pos = positions.view(1, 1, -1).expand(3, 1, -1)
        h = torch.zeros(1, positions.numel(), self.fc.out_features)
        cos, sin = self.target.model.rotary_emb(h, pos)
        return cos[0], sin[0]

    @torch.no_grad()
    def inputs(self, next_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's residual input `[T, H]` of entries fed ``next_tokens`` `[T]` and ``hidden`` `[T, H]`."""
        e = self.target.model.embed_tokens(next_tokens)
        return self.fc(torch.cat([self.norm_embedding(e), self.norm_hidden(hidden)], -1))

    @torch.no_grad()
    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """Query `[T, heads, d]`, output gate `[T, heads * d]`, key and value `[T, kv_heads, d]` (key and query
        normed and rotated, as a KV cache holds them) of residual inputs ``x`` `[T, H]` at ``positions``."""
        from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

        attn, T, d = self.layer.self_attn, x.shape[0], self.head_dim
        a = self.layer.input_layernorm(x)
        q, gate = torch.chunk(attn.q_proj(a).view(T, -1, 2 * d), 2, dim=-1)
        q = attn.q_norm(q)
        k = attn.k_norm(attn.k_proj(a).view(T, -1, d))
        v = attn.v_proj(a).view(T, -1, d)
        cos, sin = self.rope(positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # cos, sin [T, 1, rotary_dim]
        return q, gate.reshape(T, -1), k, v

    @torch.no_grad()
    def attend(self, x, q, gate, keys, values, valid, own_keys=None, own_values=None):
        """The layer's output after the final norm `[N, H]` for ``N`` queries (residual inputs ``x`` `[N, H]`, ``q``
        `[N, heads, d]`, ``gate`` `[N, heads * d]`) over the cache ``keys`` / ``values`` `[S, kv_heads, d]` where
        ``valid`` `[N, S]`, and each query's own entries ``own_keys`` / ``own_values`` `[N, J, kv_heads, d]` (a
        chain's earlier levels and itself). Head ``h`` reads key head ``h // (heads / kv_heads)``."""
        N, g = q.shape[0], self.kv_heads
        qg = q.view(N, g, self.heads // g, self.head_dim)
        s = torch.einsum("ngrd,sgd->ngrs", qg, keys) * self.scaling
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
        if own_keys is not None:
            s = torch.cat([s, torch.einsum("ngrd,njgd->ngrj", qg, own_keys) * self.scaling], -1)
        p = torch.softmax(s, dim=-1)
        S = keys.shape[0]
        o = torch.einsum("ngrs,sgd->ngrd", p[..., :S], values)
        if own_keys is not None:
            o = o + torch.einsum("ngrj,njgd->ngrd", p[..., S:], own_values)
        o = self.layer.self_attn.o_proj(o.reshape(N, -1) * torch.sigmoid(gate))
        h = x + o
        h = h + self.layer.mlp(self.layer.post_attention_layernorm(h))
        return self.norm(h)

    @torch.no_grad()
    def logits(self, m: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(m)


def load(model_dir: str = MODEL):
    """(target model, :class:`MtpLayer`) in fp32 from ``model_dir`` (transformers' ``Qwen3_5ForCausalLM``)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    return target, MtpLayer(target, weights, target.config)


@torch.no_grad()
def entries(mtp: MtpLayer, tokens: torch.Tensor, hidden: torch.Tensor) -> dict:
    """Every MTP entry of a sequence: ``x`` (residual input), ``q``, ``gate``, ``k``, ``v`` at positions
    ``0 .. L - 2`` (entry ``i`` fed ``tokens[i + 1]`` and ``hidden[i]``)."""
    L = tokens.numel()
    x = mtp.inputs(tokens[1:], hidden[:L - 1])
    q, gate, k, v = mtp.qkv(x, torch.arange(L - 1))
    return dict(x=x, q=q, gate=gate, k=k, v=v)


@torch.no_grad()
def chain_drafts(mtp: MtpLayer, ent: dict, starts: torch.Tensor, steps: int, keys: torch.Tensor,
                 values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The draft tokens `[N, steps]` of drafted steps whose last token is ``x[t]``, ``t`` in ``starts`` `[N]`: a
    ``steps``-token MTP chain, its first level from entry ``t - 1`` (the draft-extend's last position), each further
    level from the previous level's token and MTP hidden state at the next position. The steps attend over the
    cache ``keys`` / ``values`` `[L - 1, kv_heads, d]` where ``valid`` `[N, L - 1]` and before ``t`` (the chained
    steps also over their own entries)."""
    N, S = starts.numel(), keys.shape[0]
    valid = valid & (torch.arange(S)[None] < starts[:, None])  # the cache holds entries 0 .. t - 1
    prev = starts - 1  # the first level: entry t - 1, already in the cache
    m = mtp.attend(ent["x"][prev], ent["q"][prev], ent["gate"][prev], keys, values, valid)
    drafts = [mtp.logits(m).argmax(-1)]
    own_k, own_v = [], []
    for j in range(1, steps):
        x = mtp.inputs(drafts[-1], m)
        q, gate, k, v = mtp.qkv(x, starts - 1 + j)
        own_k.append(k[:, None])
        own_v.append(v[:, None])
        m = mtp.attend(x, q, gate, keys, values, valid, torch.cat(own_k, 1), torch.cat(own_v, 1))
        drafts.append(mtp.logits(m).argmax(-1))
    return torch.stack(drafts, 1)


def accepted(drafts: torch.Tensor, tokens: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Drafts `[N, steps]` a greedy verify accepts `[N]`: the leading ones equal to ``tokens[t + 1], tokens[t + 2],
    ...``."""
    truth = torch.stack([tokens[starts + j] for j in range(1, drafts.shape[1] + 1)], 1)
    return (drafts == truth).to(torch.int64).cumprod(1).sum(1)


def chain_accepts(mtp, tokens, ent, starts, steps, keys, values, valid) -> torch.Tensor:
    """:func:`accepted` of :func:`chain_drafts`."""
    return accepted(chain_drafts(mtp, ent, starts, steps, keys, values, valid), tokens, starts)


def held_out_texts(n: int, min_chars: int):
    """``n`` held-out files of this machine's standard library by the training script's rule (CRC32 of the path
    relative to the library's root % 20 == 0), sorted by path, at least ``min_chars`` long."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        if "site-packages" in d or "test" in os.path.relpath(d, root).split(os.sep):
            continue
        for name in sorted(names):
            f = os.path.join(d, name)
            rel = os.path.relpath(f, root)
            if not name.endswith(".py") or zlib.crc32(rel.encode()) % 20:
                continue
            try:
                text = open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) >= min_chars:
                out.append((rel, text))
    return out[:n]


@torch.no_grad()
def sequence(target, ids, P: int, gen: int, continuation: str):
    """The request's tokens `[P + gen]` -- the file's first ``P`` and then ``gen`` greedy tokens of the target
    (``continuation`` ``greedy``) or the file's own next ``gen`` (``text``: a target that writes the file) -- and the
    target's final hidden states over them `[P + gen, H]` (one forward)."""
    if continuation == "greedy":
        tokens = target.generate(torch.tensor(ids[:P])[None], max_new_tokens=gen, min_new_tokens=gen, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0]
    else:
        tokens = torch.tensor(ids[:P + gen])
    hidden = target.model(input_ids=tokens[None]).last_hidden_state[0]
    return tokens, hidden


def trained_length(model_dir: str):
    """The sequence length the checkpoint was trained on (``train_log.json``'s ``args.seq``), if recorded."""
    try:
        with open(os.path.join(model_dir, "train_log.json")) as f:
            return int(json.load(f)["args"]["seq"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def scenarios(P: int, stretches):
    """Name -> missing entries (a bool mask over entries is built per sequence)."""
    out = {"full": (0, 0)}
    for s in stretches:
        out[f"stretch-{s}"] = (P, P + s)
    out["prompt"] = (0, P)
    return out


@torch.no_grad()
def run(args) -> dict:
    torch.manual_seed(0)
    target, mtp = load(args.model)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    texts = [(rel, tok.encode(t).ids) for rel, t in held_out_texts(8 * args.texts, 2 * args.prompt)]
    need = args.prompt + (args.gen if args.continuation == "text" else 0)
    texts = [(rel, ids) for rel, ids in texts if len(ids) >= need][:args.texts]
    P, steps, smax = args.prompt, args.steps, max(args.stretches)
    seqs = []
    tic = time.perf_counter()
    for rel, ids in texts:
        tokens, hidden = sequence(target, ids, P, args.gen, args.continuation)
        argmax = mtp.logits(hidden).argmax(-1)
        ent = entries(mtp, tokens, hidden)
        # the MTP head's top-1 on the prompt (the file's own text, teacher-forced: x[i + 2] from entry i)
        first = chain_accepts(mtp, tokens, ent, torch.arange(1, P - 1), 1, ent["k"], ent["v"],
                              torch.ones(P - 2, tokens.numel() - 1, dtype=torch.bool))
        seqs.append(dict(rel=rel, tokens=tokens, hidden=hidden, ent=ent, top1=float(first.double().mean()),
                         agree=float((argmax[P - 1:-1] == tokens[P:]).float().mean())))
    gen_s = time.perf_counter() - tic
    # the region: after the longest stretch's resumed cold step, up to the last position with `steps` truths
    lo = P + smax + 1
    names = scenarios(P, args.stretches)
    acc = {f"{n}/{f}": [] for n in names for f in (FILLS if n != "full" else ("-",))}
    by_distance = {k: {} for k in acc}
    for i, s in enumerate(seqs):
        L = s["tokens"].numel()
        starts = torch.arange(lo, L - steps)
        other = seqs[(i + 1) % len(seqs)]["ent"]  # another request's entries: what a reused slot holds
        for name, (a, b) in names.items():
            for fill in (FILLS if name != "full" else ("-",)):
                k, v = s["ent"]["k"].clone(), s["ent"]["v"].clone()
                valid = torch.ones(starts.numel(), L - 1, dtype=torch.bool)
                if b > a:
                    if fill == "masked":
                        valid[:, a:b] = False
                    elif fill == "zero":
                        k[a:b] = 0
                        v[a:b] = 0
                    else:
                        g = torch.Generator().manual_seed(1000 * i + a)
                        src = torch.randint(0, other["k"].shape[0], (b - a,), generator=g)
                        k[a:b], v[a:b] = other["k"][src], other["v"][src]
                got = chain_accepts(mtp, s["tokens"], s["ent"], starts, steps, k, v, valid)
                key = f"{name}/{fill}"
                acc[key].append(got)
                for dist, n in zip((starts - lo).tolist(), got.tolist()):
                    b_ = dist // args.bin
                    by_distance[key].setdefault(b_, []).append(n)
    rows = []
    full = torch.cat(acc["full/-"]).double().mean().item()
    for key, parts in acc.items():
        a = torch.cat(parts).double()
        name, fill = key.split("/")
        rows.append(dict(scenario=name, fill=None if fill == "-" else fill, positions=int(a.numel()),
                         accepted_drafts=round(a.mean().item(), 4), accept_length=round(1 + a.mean().item(), 4),
                         vs_full=round((1 + a.mean().item()) / (1 + full), 4),
                         by_distance={str(d * args.bin): round(sum(v) / len(v), 4)
                                      for d, v in sorted(by_distance[key].items())}))
    return dict(
        command="python3 benchmark/drafters/mtp_holes.py " + " ".join(sys.argv[1:]),
        model=os.path.relpath(args.model, os.path.join(HERE, "..", "..")), continuation=args.continuation,
        steps=steps, prompt=P, gen=args.gen,
        stretches=list(args.stretches), region=[lo, P + args.gen - steps], texts=[s["rel"] for s in seqs],
        python=platform.python_version(), generation_s=round(gen_s, 1),
        target_argmax_agrees_with_continuation=round(sum(s["agree"] for s in seqs) / len(seqs), 4),
        mtp_top1_on_prompts=round(sum(s["top1"] for s in seqs) / len(seqs), 4), rows=rows)


def table(res: dict) -> str:
    lines = ["| scenario | holes served as | accepted drafts per step | accept length | × full |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['scenario']} | {r['fill'] or '–'} | {r['accepted_drafts']:.3f} | {r['accept_length']:.3f} "
                     f"| {r['vs_full']:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--texts", type=int, default=24, help="held-out standard-library files (one request each)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (the file's first ones)")
    ap.add_argument("--gen", type=int, default=380, help="tokens after the prompt")
    ap.add_argument("--continuation", choices=("greedy", "text"), default="greedy",
                    help="after the prompt: the target's greedy tokens, or the file's own (teacher-forced)")
    ap.add_argument("--steps", type=int, default=3, help="the chain's draft tokens (--speculative-num-steps)")
    ap.add_argument("--stretches", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 192],
                    help="no-draft steps before drafting resumes")
    ap.add_argument("--bin", type=int, default=64, help="positions per bin of the by-distance breakdown")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.gen <= max(args.stretches) + args.steps + 1:
        ap.error("--gen must exceed the longest stretch + --steps + 1")
    trained = trained_length(args.model)
    if trained is not None and args.prompt + args.gen > trained:
        ap.error(f"--prompt + --gen = {args.prompt + args.gen} exceeds the {trained}-token windows the checkpoint "
                 "was trained on (train_log.json): positions beyond them are extrapolation")
    res = run(args)
    print(table(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
