"""Train a tiny Qwen3.5-shaped hybrid code model with one MTP layer, offline, deterministically.

Data: the Python standard library of the machine it runs on (files whose CRC32 % 20 == 0 are held
out). Tokenizer: byte-level BPE trained on the same text with the `tokenizers` library, ChatML chat
template. Model: transformers' ``Qwen3_5ForCausalLM`` (Gated DeltaNet layers + gated attention every
4th layer, dense MLP, tied embeddings) plus an MTP layer in the layout SGLang's ``Qwen3_5MTP``
loads (``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*``,
``mtp.norm``), trained jointly: at position t the MTP layer sees norm(embed(x_{t+1})) and
norm(h_t) (h: the model's final, normed hidden state, what SGLang hands its draft worker) and
predicts x_{t+2}.

    python3 benchmark/models/train_tiny_hybrid.py --out benchmark/models/tiny-hybrid --minutes 8   # H200
    python3 benchmark/models/train_tiny_hybrid.py --out /tmp/tiny --smoke                           # CPU check

Writes config.json, model.safetensors (with the mtp.* tensors), tokenizer files with the chat
template, generation_config.json and train_log.json (loss curve, held-out perplexity, MTP top-1
accuracy on held-out text, size); loss_curve.png when matplotlib is present.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sysconfig
import time
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _py_files(root, skip_site=False):
    out = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        if skip_site and "site-packages" in d:
            continue
        out += [os.path.join(d, n) for n in sorted(names) if n.endswith(".py")]
    return out


def corpus(limit_files=None, max_chars=40_000_000):
    """(train, held-out) texts: the standard library first, then installed packages' sources
    (``site.getsitepackages()`` and ``PYTHONPATH`` entries, sorted) up to ``max_chars``.
    A file is held out when CRC32 of its path relative to its root is 0 mod 20."""
    import site

    roots = [(sysconfig.get_paths()["stdlib"], True)]
    extra = list(site.getsitepackages()) + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for r in sorted(set(os.path.realpath(p) for p in extra if os.path.isdir(p))):
        roots.append((r, False))
    files = []
    for root, skip in roots:
        files += [(root, f) for f in _py_files(root, skip)]
    if limit_files:
        files = files[:: max(1, len(files) // limit_files)][:limit_files]
    train, held, total = [], [], 0
    for root, f in files:
        if total >= max_chars:
            break
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > 400_000:  # skip empty and generated giants
            continue
        total += len(text)
        (held if zlib.crc32(os.path.relpath(f, root).encode()) % 20 == 0 else train).append(text)
    if not held and len(train) > 1:  # a small sample (--smoke) can miss every held-out file: hold out one
        held.append(train.pop())
    return train, held


def train_tokenizer(texts, vocab_size, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def make_config(vocab, hidden, layers, inter, heads, kv_heads, head_dim, lin_k_heads, lin_v_heads, lin_dim):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, hidden_act="silu",
        max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=lin_dim,
        linear_value_head_dim=lin_dim, linear_num_key_heads=lin_k_heads, linear_num_value_heads=lin_v_heads,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_interleaved": True, "mrope_section": [2, 2, 4]},
        attn_output_gate=True, attention_bias=False,
        bos_token_id=None, eos_token_id=2, pad_token_id=0,
    )


class MTP(nn.Module):
    """One MTP layer in the parameter layout of SGLang 0.5.17's Qwen3_5MTP (prefix ``mtp.``)."""

    def __init__(self, config):
        super().__init__()
        import copy

        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        c = copy.deepcopy(config)
        c.num_hidden_layers = 1
        c.layer_types = ["full_attention"]
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(c, 0)])
        self.norm = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, embeds_next, hidden, position_embeddings):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds_next), self.pre_fc_norm_hidden(hidden)], -1))
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(x)


def forward_losses(model, mtp, ids):
    """Main next-token loss and MTP next-next-token loss on ``ids`` `[B, T]`."""
    out = model.model(input_ids=ids)
    h = out.last_hidden_state  # normed, as SGLang hands it to the draft worker
    logits = model.lm_head(h[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    T = ids.shape[1]
    pos = torch.arange(T - 1, device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)
    pe = model.model.rotary_emb(h, pos)
    m = mtp(model.model.embed_tokens(ids[:, 1:]), h[:, :-1], pe)  # position t: x_{t+1}, h_t -> x_{t+2}
    mlog = model.lm_head(m[:, :-1])
    mloss = F.cross_entropy(mlog.float().reshape(-1, mlog.shape[-1]), ids[:, 2:].reshape(-1))
    return loss, mloss, mlog


def export(model, mtp, tok_dir, out):
    from safetensors.torch import load_file, save_file

    model.save_pretrained(out, safe_serialization=True)
    path = os.path.join(out, "model.safetensors")
    sd = load_file(path)
    for k, v in mtp.state_dict().items():
        sd["mtp." + k] = v.detach().to(torch.bfloat16).contiguous()
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}
    save_file(sd, path, metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(out, "config.json")))
    cfg.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", mtp_num_hidden_layers=1,
               num_nextn_predict_layers=1, torch_dtype="bfloat16", dtype="bfloat16")
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump({"eos_token_id": 2, "pad_token_id": 0}, open(os.path.join(out, "generation_config.json"), "w"))
    return os.path.getsize(path)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--inter", type=int, default=384)  # 3.98M params: 7.6 MiB in bf16
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-chars", type=int, default=40_000_000, help="corpus size cap (characters)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: time budget only)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run: a check of the recipe, not a model")
    args = ap.parse_args(argv)
    if args.smoke:
        args.vocab, args.hidden, args.layers, args.inter, args.seq, args.batch = 320, 64, 4, 128, 64, 4
        args.steps = args.steps or 3
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    train_txt, held_txt = corpus(limit_files=40 if args.smoke else None, max_chars=args.max_chars)
    tok = train_tokenizer(train_txt, args.vocab, args.out)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")

    def encode(texts):
        ids = []
        for t in tok(texts)["input_ids"]:  # batch encoding runs in parallel in tokenizers
            ids += t + [eot]
        return torch.tensor(ids, dtype=torch.long)

    train_ids, held_ids = encode(train_txt), encode(held_txt)
    heads = max(1, args.hidden // 64)
    cfg = make_config(args.vocab, args.hidden, args.layers, args.inter, heads, max(1, heads // 2), 64,
                      max(1, heads // 2), heads, 64)
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM(cfg).to(dev)
    mtp = MTP(cfg).to(dev)
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    log = dict(args=vars(args), device=torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
               train_files=len(train_txt), held_files=len(held_txt), train_chars=sum(map(len, train_txt)),
               train_tokens=len(train_ids), held_tokens=len(held_ids), steps=[])
    budget = args.minutes * 60
    t_train = time.time()
    step = 0
    gen = torch.Generator().manual_seed(args.seed)
    while True:
        elapsed = time.time() - t_train
        if (args.steps and step >= args.steps) or (not args.steps and elapsed > budget):
            break
        frac = min(1.0, elapsed / budget) if not args.steps else step / args.steps
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq - 1, (args.batch,), generator=gen)
        ids = torch.stack([train_ids[s:s + args.seq] for s in starts]).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            loss, mloss, _ = forward_losses(model, mtp, ids)
        opt.zero_grad(set_to_none=True)
        (loss + args.mtp_weight * mloss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 20 == 0 or args.steps:
            log["steps"].append(dict(step=step, seconds=round(time.time() - t_train, 1), loss=float(loss.detach()),
                                     mtp_loss=float(mloss.detach()), lr=lr))
            print(json.dumps(log["steps"][-1]), flush=True)
        step += 1
    # held-out evaluation: perplexity and MTP top-1 accuracy (the chance an MTP draft is accepted greedily)
    model.eval()
    mtp.eval()
    tot = mtot = n = correct = 0
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
        W = args.seq
        for s in range(0, min(len(held_ids), 200 * W) - W - 1, W):
            ids = held_ids[s:s + W][None].to(dev)
            loss, mloss, mlog = forward_losses(model, mtp, ids)
            tot += float(loss) * (W - 1)
            mtot += float(mloss) * (W - 2)
            correct += int((mlog.argmax(-1) == ids[:, 2:]).sum())
            n += 1
    log.update(held_out_ppl=math.exp(tot / max(n * (W - 1), 1)), held_out_mtp_ppl=math.exp(mtot / max(n * (W - 2), 1)),
               held_out_mtp_top1=correct / max(n * (W - 2), 1), train_steps=step,
               train_seconds=round(time.time() - t_train, 1), total_seconds=round(time.time() - t0, 1))
    size = export(model, mtp, args.out, args.out)
    log["checkpoint_bytes"] = size
    json.dump(log, open(os.path.join(args.out, "train_log.json"), "w"), indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([s["step"] for s in log["steps"]], [s["loss"] for s in log["steps"]], label="next token")
        ax.plot([s["step"] for s in log["steps"]], [s["mtp_loss"] for s in log["steps"]], label="MTP (token +2)")
        ax.set(xlabel="step", ylabel="loss", title=f"tiny hybrid on {log['device']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss_curve.png"), dpi=100)
    except ImportError:
        pass
    print(json.dumps({k: v for k, v in log.items() if k not in ("steps", "args")}))
    return model, mtp, log


if __name__ == "__main__":
    main()
