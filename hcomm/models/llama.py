"""A Llama-style decoder in one file: config, blocks, model (nanoGPT / torchtitan style).

Plain torch and no parallelism: tensor, pipeline and data parallelism are applied
from outside (hcomm.parallel), which is why every ``Block`` is self-contained —
``Block.forward(x: [B, S, D]) -> [B, S, D]`` with its own RoPE tables — so a
pipeline stage is just a slice of ``layer_modules(model)``.

RoPE uses the "rotate half" layout of Hugging Face's LlamaForCausalLM, so weights
copy one-to-one between this model and ``hcomm.models.hf.build_hf_llama``.
"""
import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: Optional[int] = None  # grouped-query attention; None = n_heads
    ffn_hidden: Optional[int] = None  # None: SwiGLU rule, 8*dim/3 rounded up to multiple_of
    multiple_of: int = 32
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        hidden = int(8 * self.dim / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    def validate(self) -> "LlamaConfig":
        """Raise ValueError naming the first bad field; return self so calls can chain."""
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "multiple_of", "max_seq_len"):
            _require_positive_int(name, getattr(self, name))
        for name in ("n_kv_heads", "ffn_hidden"):
            if getattr(self, name) is not None:
                _require_positive_int(name, getattr(self, name))
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive number, got {value!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"LlamaConfig.tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"LlamaConfig.dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2:
            # RoPE rotates pairs of channels.
            raise ValueError(f"LlamaConfig.dim/n_heads={self.head_dim} (head dim) must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"LlamaConfig.n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        return self

    def with_vocab(self, vocab_size: int) -> "LlamaConfig":
        return dataclasses.replace(self, vocab_size=vocab_size)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _require_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32: the mean of squares under- and overflows in bf16/fp16.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(x)


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [max_seq_len, head_dim], in fp32: positions above 256 are not exact in bf16."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # both halves of a head share the frequencies
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, S, head_dim] by position; channel i pairs with i + head_dim/2."""
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype) + rotated_half * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.kv_heads, config.head_dim
        self.max_seq_len, self.rope_theta = config.max_seq_len, config.rope_theta
        self.wq = nn.Linear(config.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, config.dim, bias=False)
        # Each attention keeps its own tables so a Block runs alone (pipeline stages, TP
        # shards). Non-persistent: derived from the config, so kept out of checkpoints.
        cos, sin = rope_tables(self.head_dim, self.max_seq_len, self.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.normal_(self.wo.weight, mean=0.0, std=out_std)
        # Recomputed here because to_empty() (materialising a meta model) leaves them garbage.
        cos, sin = rope_tables(self.head_dim, self.max_seq_len, self.rope_theta, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_seq_len={self.max_seq_len}")
        q = self.wq(x).view(batch, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:  # GQA: query head h reads kv head h // group
            group = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def init_weights(self, out_std: float) -> None:
        nn.init.normal_(self.w1.weight, mean=0.0, std=0.02)
        nn.init.normal_(self.w3.weight, mean=0.0, std=0.02)
        nn.init.normal_(self.w2.weight, mean=0.0, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block; [B, S, D] -> [B, S, D] with no other inputs."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn = FeedForward(config)

    def init_weights(self, out_std: float) -> None:
        self.attn_norm.reset_parameters()
        self.attn.init_weights(out_std)
        self.ffn_norm.reset_parameters()
        self.ffn.init_weights(out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config.validate()
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        # A meta model has no storage to fill; materialise with to_empty() then init_weights().
        if not self.embed.weight.is_meta:
            self.init_weights()

    def init_weights(self) -> None:
        """Deterministic under torch.manual_seed: N(0, 0.02), residual outputs scaled GPT-2 style."""
        if self.config.tie_embeddings:
            # to_empty() from meta replaces parameters one by one, which unties them.
            self.head.weight = self.embed.weight
        # Each block adds two residual branches; shrink their outputs so the sum's
        # variance does not grow with depth.
        out_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        nn.init.normal_(self.embed.weight, mean=0.0, std=0.02)
        for block in self.blocks:
            block.init_weights(out_std)
        self.norm.reset_parameters()
        if not self.config.tie_embeddings:
            nn.init.normal_(self.head.weight, mean=0.0, std=0.02)

    def layer_modules(self) -> List[nn.Module]:
        return [self.embed, *self.blocks, self.norm, self.head]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, S] (int64) -> logits [B, S, vocab] in the compute dtype."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, tokens_with_targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return causal_lm_loss(self, tokens_with_targets, reduction)


def causal_lm_loss(model: nn.Module, tokens_with_targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross entropy of model(tokens[:, :-1]) against tokens[:, 1:].

    "sum" lets a trainer weight uneven micro-batches exactly (divide by the global
    token count once); it also accepts an empty batch, giving a 0.0 that is still
    connected to the parameters so every rank can run the same backward.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if tokens_with_targets.dim() != 2 or tokens_with_targets.shape[1] < 2:
        shape = tuple(tokens_with_targets.shape)
        raise ValueError(f"expected tokens_with_targets of shape [B, S+1] with S >= 1, got {shape}")
    if reduction == "mean" and tokens_with_targets.shape[0] == 0:
        raise ValueError("reduction='mean' over an empty batch is 0/0; use reduction='sum'")
    logits = model(tokens_with_targets[:, :-1])
    targets = tokens_with_targets[:, 1:]
    # Cross entropy in fp32: a bf16 log-softmax over a large vocabulary loses most of its precision.
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction=reduction)


def layer_modules(model: nn.Module) -> List[nn.Module]:
    """The ordered cuttable pieces [embed, *blocks, norm, head] that profiling and pipeline cuts use.

    Works for any model exposing ``layer_modules()`` (Llama, the Hugging Face wrapper).
    """
    if not hasattr(model, "layer_modules"):
        raise TypeError(f"{type(model).__name__} does not expose layer_modules(); expected Llama or HFLlama")
    return model.layer_modules()
