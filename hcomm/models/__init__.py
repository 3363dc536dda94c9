"""Reference models for the training layer; parallelism is applied from outside (hcomm.parallel)."""
from hcomm.models.configs import CONFIGS, build_model, get_config, param_count
from hcomm.models.hf import build_hf_llama
from hcomm.models.llama import Llama, LlamaConfig, layer_modules

__all__ = [
    "LlamaConfig", "Llama", "CONFIGS", "get_config", "build_model", "param_count", "layer_modules", "build_hf_llama",
]
