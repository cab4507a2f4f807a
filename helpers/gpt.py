"""A small GPT (decoder-only transformer) and the text it trains on, for the capstone (chapter 7)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pydoc_data.topics import topics

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.i18n import tr
from helpers.validate import positive_int

ATTENTIONS = ("manual", "sdpa")


def text_bytes() -> torch.Tensor:
    """The standard library's `pydoc_data.topics` (help() pages) as UTF-8 bytes, int64 (chapter 7)."""
    text = "\n\n".join(topics[key] for key in sorted(topics))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT, byte-level (vocabulary 256), and how its attention is computed (chapter 7)."""

    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    seq_len: int = 128
    vocab_size: int = 256
    attention: str = (
        "manual"  # "manual": softmax written out; "sdpa": F.scaled_dot_product_attention
    )
    checkpoint: bool = False  # recompute each block in backward instead of saving its activations

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"):
            positive_int(getattr(self, name), name)
        if self.d_model % self.n_head:
            raise ValueError(
                tr(
                    "d_model ({d_model}) must be a multiple of n_head ({n_head}): "
                    "each head gets d_model // n_head channels."
                ).format(d_model=self.d_model, n_head=self.n_head)
            )
        if self.attention not in ATTENTIONS:
            raise ValueError(
                tr("attention must be one of {choices}, got {value!r}.").format(
                    choices=ATTENTIONS, value=self.attention
                )
            )


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out: softmax(q k^T / sqrt(d), future masked) v (chapter 7)."""
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one qkv projection, heads, an output projection (chapter 7)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.attention = cfg.n_head, cfg.attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            for z in self.qkv(x).split(c, dim=2)
        )
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = manual_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(ln(x)), then x + MLP(ln(x)) (chapter 7)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks, a final norm, a head tied to the embedding (chapter 7)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # weight tying, as GPT-2 does
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, seq, vocab), or the mean cross-entropy loss when targets are given."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.cfg.checkpoint else block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def make_gpt(cfg: GPTConfig, *, seed: int = 0, device: str | torch.device = "cpu") -> GPT:
    """A GPT built from `seed`: the same seed gives the same weights whatever the config's levers (chapter 7)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(cfg)
    model = model.to(device)
    model.head.weight = model.wte.weight  # .to("meta") unties shared weights: tie them again
    return model


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups as GPT-2 is trained: decay on matrices and embeddings, none on biases and norms (chapter 7)."""
    params = list(model.parameters())  # a tied weight is listed once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def non_embedding_params(model: GPT) -> int:
    """Parameters that every token multiplies through: all but the position embedding (chapter 7)."""
    return sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()


def flops_per_token(model: GPT) -> int:
    """Training FLOPs per token, the standard estimate: 6N + 12 * layers * seq_len * d_model (chapter 7)."""
    cfg = model.cfg
    return 6 * non_embedding_params(model) + 12 * cfg.n_layer * cfg.seq_len * cfg.d_model
