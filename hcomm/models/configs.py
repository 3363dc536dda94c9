"""Named model configs, YAML configs, and deterministic model construction."""
import dataclasses
import os
from typing import Dict, Optional, Union

import torch
import yaml

from hcomm.models.llama import Llama, LlamaConfig

# Parameter counts from param_count(), embeddings and head included (untied):
#   tiny       1,066,112   (ffn_hidden 352 from the SwiGLU rule)
#   small     16,913,280   (ffn_hidden 1024)
#   llama-7b   6,738,415,616
#   llama-70b 68,976,648,192
CONFIGS: Dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(vocab_size=1024, dim=128, n_layers=4, n_heads=4, max_seq_len=256),
    "small": LlamaConfig(vocab_size=8192, dim=384, n_layers=6, n_heads=6, max_seq_len=512),
    "llama-7b": LlamaConfig(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, ffn_hidden=11008, max_seq_len=4096),
    "llama-70b": LlamaConfig(
        vocab_size=32000, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, max_seq_len=4096
    ),
}

_FIELDS = {field.name: field for field in dataclasses.fields(LlamaConfig)}
_FLOAT_FIELDS = {"norm_eps", "rope_theta"}


def get_config(name_or_path: str) -> LlamaConfig:
    """A config from CONFIGS by name, or from a YAML file of LlamaConfig fields.

    The YAML may say ``base: <name>`` to start from a named config and override
    only the fields it lists.
    """
    if name_or_path in CONFIGS:
        return dataclasses.replace(CONFIGS[name_or_path])  # a copy: callers may edit theirs
    if os.path.isfile(name_or_path):
        return _load_yaml(name_or_path)
    raise ValueError(f"unknown model config {name_or_path!r}: not a file, and not one of {sorted(CONFIGS)}")


def _load_yaml(path: str) -> LlamaConfig:
    with open(path) as f:
        data = yaml.safe_load(f)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of LlamaConfig fields, got {type(data).__name__}")
    fields = dict(data)
    base_name = fields.pop("base", None)
    if base_name is not None and (not isinstance(base_name, str) or base_name not in CONFIGS):
        raise ValueError(f"{path}: base {base_name!r} is not one of {sorted(CONFIGS)}")
    for key in fields:
        if key not in _FIELDS:
            raise ValueError(f"{path}: unknown key {key!r}; LlamaConfig fields are {sorted(_FIELDS)} (and 'base')")
    for key in _FLOAT_FIELDS & fields.keys():
        fields[key] = _as_float(fields[key])
    if base_name is not None:
        base = CONFIGS[base_name]
    else:
        required = [name for name, field in _FIELDS.items() if field.default is dataclasses.MISSING]
        missing = [name for name in required if name not in fields]
        if missing:
            raise ValueError(
                f"{path}: missing field(s) {missing} (or give 'base: <name>' to start from {sorted(CONFIGS)})"
            )
        base = LlamaConfig(**{name: fields[name] for name in required})
    config = dataclasses.replace(base, **fields)
    try:
        return config.validate()
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _as_float(value):
    # PyYAML follows YAML 1.1, where "1e-5" (no dot) is a string, not a float.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value  # validate() names the field if it is still not a number


def build_model(
    config: Union[LlamaConfig, str],
    *,
    vocab_size: Optional[int] = None,
    seed: int = 0,
    device: Union[str, torch.device] = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Llama:
    """Build and initialise a Llama; the same config and seed give bitwise-identical parameters.

    Initialisation always runs on the CPU in fp32, then moves to ``device`` and
    casts to ``dtype``: ranks on different accelerator kinds (or with different
    dtypes) start from the same weights, which per-device RNGs would not give.
    The caller's RNG state is left untouched. On device "meta" nothing is
    allocated or initialised (for planning 7B/70B shapes).
    """
    config = _resolve(config, vocab_size)
    with torch.device("meta"):
        model = Llama(config)
    if torch.device(device).type == "meta":
        return model.to(dtype=dtype)
    model.to_empty(device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model.to(device=device, dtype=dtype)


def param_count(config: Union[LlamaConfig, str], vocab_size: Optional[int] = None) -> int:
    """Number of parameters of build_model(config, vocab_size=...), computed without building it."""
    config = _resolve(config, vocab_size)
    dim, head_dim = config.dim, config.head_dim
    attention = dim * config.n_heads * head_dim * 2 + dim * config.kv_heads * head_dim * 2  # wq, wo + wk, wv
    feed_forward = 3 * dim * config.hidden_dim
    block = attention + feed_forward + 2 * dim  # two RMSNorm weights
    embeddings = config.vocab_size * dim * (1 if config.tie_embeddings else 2)
    return embeddings + config.n_layers * block + dim


def _resolve(config: Union[LlamaConfig, str], vocab_size: Optional[int]) -> LlamaConfig:
    if isinstance(config, str):
        config = get_config(config)
    if vocab_size is not None:
        config = config.with_vocab(vocab_size)
    return config.validate()
