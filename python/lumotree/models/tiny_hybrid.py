"""A tiny pure-PyTorch hybrid LM in the shape of Qwen3.5, that runs a draft tree in one forward.

Layers: Gated DeltaNet (in-proj -> causal short conv -> gated delta rule with L2-normalised q/k ->
gated RMSNorm with ``z`` -> out-proj) and, every 4th layer, gated full attention (q/k RMSNorm,
RoPE, sigmoid output gate); each followed by a SwiGLU MLP; pre-RMSNorm residual blocks.

Every forward is a tree forward: ``verify(tokens, tree)`` runs the nodes of one draft tree against
the committed caches (tree conv, tree GDN, tree-masked attention) without changing them;
``commit(accept_nodes)`` then replays the accepted root path into the GDN/conv state and appends
the accepted keys/values. Plain decoding is the 1-node tree. Batch size 1 (one request).

Randomly initialised with a fixed seed; float64 by default so that a tree forward and a chain of
single-token forwards agree to far below any argmax gap.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lumotree import ops
from lumotree.tree import TreeDescriptor

__all__ = ["TinyHybridConfig", "TinyHybridLM"]


@dataclasses.dataclass
class TinyHybridConfig:
    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 4
    full_attention_interval: int = 4
    intermediate_size: int = 256
    # Gated DeltaNet
    num_k_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 32
    head_v_dim: int = 32
    conv_kernel: int = 4
    # attention
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    eps: float = 1e-6
    seed: int = 1
    dtype: torch.dtype = torch.float64

    def layer_types(self):
        return ["full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.num_layers)]


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class GatedDeltaNet(nn.Module):
    def __init__(self, c: TinyHybridConfig):
        super().__init__()
        self.c = c
        self.key_dim = c.num_k_heads * c.head_k_dim
        self.value_dim = c.num_v_heads * c.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkv = nn.Linear(c.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.randn(self.conv_dim, c.conv_kernel) / math.sqrt(c.conv_kernel))
        self.A_log = nn.Parameter(torch.log(torch.empty(c.num_v_heads).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(torch.zeros(c.num_v_heads))
        self.norm = RMSNorm(c.head_v_dim, c.eps)
        self.out_proj = nn.Linear(self.value_dim, c.hidden_size, bias=False)

    def new_state(self, dtype):
        c = self.c
        return dict(conv=torch.zeros(1, self.conv_dim, c.conv_kernel - 1, dtype=dtype),
                    ssm=torch.zeros(1, c.num_v_heads, c.head_v_dim, c.head_k_dim, dtype=dtype))

    def forward(self, x, tree: TreeDescriptor, cache: dict, saved: dict):
        c = self.c
        B, N, _ = x.shape
        mixed = self.in_proj_qkv(x)
        z = self.in_proj_z(x).view(B, N, c.num_v_heads, c.head_v_dim)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -torch.exp(self.A_log) * F.softplus(self.in_proj_a(x) + self.dt_bias)
        conv_out = ops.conv_tree_verify(mixed, cache["conv"], self.conv_weight, None, tree, "silu")
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], -1)
        q = q.reshape(B, N, c.num_k_heads, c.head_k_dim)
        k = k.reshape(B, N, c.num_k_heads, c.head_k_dim)
        v = v.reshape(B, N, c.num_v_heads, c.head_v_dim)
        o = ops.gdn_tree_verify(q, k, v, g, beta, cache["ssm"], tree, use_qk_l2norm=True)
        o = self.norm(o.to(x.dtype)) * F.silu(z)
        saved.update(mixed=mixed, k=k, v=v, g=g, beta=beta)
        return self.out_proj(o.reshape(B, N, self.value_dim))

    @torch.no_grad()
    def commit(self, tree, cache, saved, accept_nodes, accept_len):
        ops.conv_tree_commit(saved["mixed"], cache["conv"], tree, accept_nodes, accept_len)
        ops.gdn_tree_commit(saved["k"], saved["v"], saved["g"], saved["beta"], cache["ssm"], tree,
                            accept_nodes, accept_len, use_qk_l2norm=True)


def _rope(x, pos, theta, partial=1.0):
    """Rotate-half RoPE on the first ``partial * head_dim`` dims (Qwen3.5: 0.25); text positions
    (all M-RoPE axes equal) make Qwen3.5's interleaved M-RoPE this plain RoPE."""
    d = int(x.shape[-1] * partial)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(x.dtype) / d))
    ang = pos.to(x.dtype)[..., None] * inv  # [B, N, d/2]
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    x1, x2, rest = x[..., : d // 2], x[..., d // 2: d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)


class GatedAttention(nn.Module):
    def __init__(self, c: TinyHybridConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, 2 * c.num_heads * c.head_dim, bias=False)  # query and gate
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.eps)
        self.k_norm = RMSNorm(c.head_dim, c.eps)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def new_state(self, dtype):
        c = self.c
        return dict(k=torch.zeros(1, 0, c.num_kv_heads, c.head_dim, dtype=dtype),
                    v=torch.zeros(1, 0, c.num_kv_heads, c.head_dim, dtype=dtype))

    def forward(self, x, tree: TreeDescriptor, cache: dict, saved: dict, positions):
        c = self.c
        B, N, _ = x.shape
        qg = self.q_proj(x).view(B, N, c.num_heads, 2 * c.head_dim)
        q, gate = qg.split(c.head_dim, -1)
        q = _rope(self.q_norm(q), positions, c.rope_theta, c.partial_rotary_factor)
        k = _rope(self.k_norm(self.k_proj(x).view(B, N, c.num_kv_heads, c.head_dim)), positions, c.rope_theta,
                  c.partial_rotary_factor)
        v = self.v_proj(x).view(B, N, c.num_kv_heads, c.head_dim)
        K = torch.cat([cache["k"], k], 1)
        Vv = torch.cat([cache["v"], v], 1)
        T = cache["k"].shape[1]
        allowed = torch.cat([torch.ones(B, N, T, dtype=torch.bool), tree.mask.cpu()], -1)  # tree mask
        rep = c.num_heads // c.num_kv_heads
        K, Vv = K.repeat_interleave(rep, 2), Vv.repeat_interleave(rep, 2)
        s = torch.einsum("bnhd,bthd->bhnt", q, K) / math.sqrt(c.head_dim)
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        o = torch.einsum("bhnt,bthd->bnhd", torch.softmax(s, -1), Vv) * torch.sigmoid(gate)
        saved.update(k=k, v=v)
        return self.o_proj(o.reshape(B, N, -1))

    @torch.no_grad()
    def commit(self, tree, cache, saved, accept_nodes, accept_len):
        idx = accept_nodes[0, : int(accept_len[0])]
        cache["k"] = torch.cat([cache["k"], saved["k"][:, idx]], 1)
        cache["v"] = torch.cat([cache["v"], saved["v"][:, idx]], 1)


class TinyHybridLM(nn.Module):
    def __init__(self, config: Optional[TinyHybridConfig] = None):
        super().__init__()
        c = config or TinyHybridConfig()
        self.config = c
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(c.seed)
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList()
        self.norms1 = nn.ModuleList()
        self.norms2 = nn.ModuleList()
        for t in c.layer_types():
            self.layers.append(GatedAttention(c) if t == "full_attention" else GatedDeltaNet(c))
            self.norms1.append(RMSNorm(c.hidden_size, c.eps))
            self.norms2.append(RMSNorm(c.hidden_size, c.eps))
        self.gate_up = nn.ModuleList([nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
                                      for _ in range(c.num_layers)])
        self.down = nn.ModuleList([nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
                                   for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(c.hidden_size, c.eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        torch.random.set_rng_state(gen_state)
        self.to(c.dtype)
        self.eval()
        self.reset()

    # ------------------------------------------------------------------ Hugging Face checkpoints
    @classmethod
    def from_hf(cls, path: str, dtype: torch.dtype = torch.float64) -> "TinyHybridLM":
        """Load a Qwen3.5 text checkpoint (``Qwen3_5ForCausalLM`` layout: config.json +
        model.safetensors) into this reference model, e.g. the one
        ``benchmark/models/train_tiny_hybrid.py`` exports. ``mtp.*`` tensors are ignored."""
        import json
        import os

        from safetensors.torch import load_file

        hf = json.load(open(os.path.join(path, "config.json")))
        if hf.get("model_type") not in ("qwen3_5_text", "qwen3_next") or "layer_types" not in hf:
            raise ValueError(f"{path}: not a Qwen3.5 text checkpoint (model_type={hf.get('model_type')!r})")
        types = hf["layer_types"]
        bad = sorted(set(types) - {"linear_attention", "full_attention"})
        if bad:
            raise ValueError(f"{path}: unsupported layer types {bad}")
        interval = hf.get("full_attention_interval", 4)
        rope = hf.get("rope_parameters") or {}
        c = TinyHybridConfig(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
            full_attention_interval=interval, intermediate_size=hf["intermediate_size"],
            num_k_heads=hf["linear_num_key_heads"], num_v_heads=hf["linear_num_value_heads"],
            head_k_dim=hf["linear_key_head_dim"], head_v_dim=hf["linear_value_head_dim"],
            conv_kernel=hf["linear_conv_kernel_dim"], num_heads=hf["num_attention_heads"],
            num_kv_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"],
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)),
            eps=hf["rms_norm_eps"], dtype=dtype)
        if c.layer_types() != types:
            raise ValueError(f"{path}: layer_types {types} are not 'full attention every {interval}th layer'")
        sd = {k: v.to(dtype) for k, v in load_file(os.path.join(path, "model.safetensors")).items()
              if not k.startswith("mtp.")}
        m = cls(c)
        one = lambda w: 1.0 + w  # noqa: E731  Qwen3.5's RMSNorm scales by (1 + weight)
        with torch.no_grad():
            m.embed.weight.copy_(sd["model.embed_tokens.weight"])
            m.lm_head.weight.copy_(sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))
            m.final_norm.weight.copy_(one(sd["model.norm.weight"]))
            for i, layer in enumerate(m.layers):
                p = f"model.layers.{i}."
                m.norms1[i].weight.copy_(one(sd[p + "input_layernorm.weight"]))
                m.norms2[i].weight.copy_(one(sd[p + "post_attention_layernorm.weight"]))
                m.gate_up[i].weight.copy_(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
                m.down[i].weight.copy_(sd[p + "mlp.down_proj.weight"])
                if isinstance(layer, GatedAttention):
                    a = p + "self_attn."
                    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                        getattr(layer, name).weight.copy_(sd[a + name + ".weight"])
                    layer.q_norm.weight.copy_(one(sd[a + "q_norm.weight"]))
                    layer.k_norm.weight.copy_(one(sd[a + "k_norm.weight"]))
                else:
                    g = p + "linear_attn."
                    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                        getattr(layer, name).weight.copy_(sd[g + name + ".weight"])
                    layer.conv_weight.copy_(sd[g + "conv1d.weight"].squeeze(1))
                    layer.A_log.copy_(sd[g + "A_log"])
                    layer.dt_bias.copy_(sd[g + "dt_bias"])
                    layer.norm.weight.copy_(sd[g + "norm.weight"])  # the gated norm scales by weight
        return m

    # ------------------------------------------------------------------ caches
    def reset(self):
        self.caches = [layer.new_state(self.config.dtype) for layer in self.layers]
        self.seq_len = 0  # committed tokens (the root of the next tree is not among them)
        self._pending = None

    def gdn_state_bytes(self) -> int:
        """Bytes of one request's recurrent (GDN) state summed over layers."""
        return sum(c["ssm"].numel() * 4 for c in self.caches if "ssm" in c)  # counted as fp32, as served

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def verify(self, tokens: torch.Tensor, tree: TreeDescriptor) -> torch.Tensor:
        """Run one tree (`tokens: [1, N]`) on the committed caches; returns logits `[1, N, vocab]`."""
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens must be [1, N], got {tuple(tokens.shape)}")
        x = self.embed(tokens)
        positions = tree.positions(torch.tensor([self.seq_len]))
        saved = [dict() for _ in self.layers]
        for i, layer in enumerate(self.layers):
            h = self.norms1[i](x)
            if isinstance(layer, GatedAttention):
                h = layer(h, tree, self.caches[i], saved[i], positions)
            else:
                h = layer(h, tree, self.caches[i], saved[i])
            x = x + h
            gu = self.gate_up[i](self.norms2[i](x))
            gate, up = gu.chunk(2, -1)
            x = x + self.down[i](F.silu(gate) * up)
        self._pending = (tree, saved)
        return self.lm_head(self.final_norm(x))

    @torch.no_grad()
    def commit(self, accept_nodes: torch.Tensor, accept_len: torch.Tensor):
        """Replay the accepted root path of the last :meth:`verify` into the caches."""
        if self._pending is None:
            raise RuntimeError("commit() without a preceding verify()")
        tree, saved = self._pending
        for i, layer in enumerate(self.layers):
            layer.commit(tree, self.caches[i], saved[i], accept_nodes, accept_len)
        self.seq_len += int(accept_len[0])
        self._pending = None

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor):
        """Commit a prompt (all but its last token, which becomes the first tree's root)."""
        n = tokens.shape[-1]
        if n == 0:
            return
        tree = TreeDescriptor.from_parents(torch.arange(-1, n - 1)[None])
        self.verify(tokens.view(1, n), tree)
        self.commit(torch.arange(n)[None], torch.tensor([n]))
