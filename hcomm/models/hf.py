"""Hugging Face's LlamaForCausalLM behind the same contract as hcomm's Llama.

The trainer can then run either: ``forward(tokens) -> logits``,
``loss(tokens_with_targets, reduction)`` and ``layer_modules()``. Built from a
config only (random weights): no download, no hub access. transformers is an
optional dependency, imported when a model is built.
"""
from typing import List, Optional

import torch
from torch import nn

from hcomm.models.llama import LlamaConfig, causal_lm_loss


class HFLlama(nn.Module):
    """Wraps a transformers LlamaForCausalLM; its modules live under ``self.hf``."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # No KV cache: training sees whole sequences, and a cache would only hold memory.
        return self.hf(input_ids=tokens, use_cache=False).logits

    def loss(self, tokens_with_targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return causal_lm_loss(self, tokens_with_targets, reduction)

    def layer_modules(self) -> List[nn.Module]:
        """[embed_tokens, *layers, norm, lm_head].

        Unlike hcomm's Block, a Hugging Face decoder layer is not self-contained:
        its forward also needs ``position_embeddings`` (cos, sin) from
        ``self.hf.model.rotary_emb``, so a pipeline stage must supply them.
        """
        inner = self.hf.model
        return [inner.embed_tokens, *inner.layers, inner.norm, self.hf.lm_head]


def hf_config(config: LlamaConfig, *, vocab_size: Optional[int] = None):
    """Our LlamaConfig as a transformers.LlamaConfig (same shapes, same RoPE and norm)."""
    transformers = _import_transformers()
    if vocab_size is not None:
        config = config.with_vocab(vocab_size)
    config.validate()
    return transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.dim,
        intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps,
        # transformers 5 moves this into rope_parameters and still accepts the old keyword.
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
        # SDPA is built into torch, so it works offline with no extra kernels.
        attn_implementation="sdpa",
    )


def build_hf_llama(config: LlamaConfig, *, vocab_size: Optional[int] = None, seed: int = 0) -> HFLlama:
    """A randomly initialised LlamaForCausalLM (deterministic in ``seed``) wrapped as HFLlama.

    Builds on the CPU in fp32; the caller's RNG state is left untouched.
    """
    transformers = _import_transformers()
    configuration = hf_config(config, vocab_size=vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(configuration)
    return HFLlama(model)


def _import_transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "build_hf_llama needs Hugging Face transformers (pip install transformers); "
            "hcomm's own Llama (hcomm.models.build_model) does not"
        ) from error
    return transformers
