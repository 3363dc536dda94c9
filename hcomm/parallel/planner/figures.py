"""Published device figures, and a model profile computed from them instead of measured.

For planning a cluster that cannot be measured: each device kind's dense peak
FLOP/s per dtype, memory, HBM bandwidth and intra-node link, and
``analytic_profile``, which turns them into the ``DeviceProfile`` that
``profile.measure`` would have produced on such a device.

Sources (dense figures: the datasheets' "with sparsity" numbers halved):

- V100 SXM2 32GB: NVIDIA Tesla V100 datasheet -- 15.7 TFLOP/s fp32, 125 fp16
  tensor; 900 GB/s HBM2; NVLink 2 300 GB/s total = 150 GB/s each way.
- A100 SXM4 80GB: NVIDIA A100 datasheet -- 19.5 fp32, 156 tf32, 312 bf16/fp16;
  2,039 GB/s HBM2e; NVLink 3 600 GB/s total = 300 each way.
- H100 SXM5 80GB: NVIDIA H100 datasheet -- 67 fp32, 494.7 tf32, 989.4
  bf16/fp16, 1,978.9 fp8; 3.35 TB/s HBM3; NVLink 4 900 GB/s total = 450 each way.
- H800 SXM5 80GB: H100 compute and memory with NVLink cut to 400 GB/s total
  (200 each way), as NVIDIA's export variant is described.
- 910B: Huawei Ascend 910B, public figures of 313-400 TFLOP/s fp16 by variant;
  376 (the 910B2 figure) for bf16 and fp16.  ESTIMATES: fp32 (no public
  figure; a quarter of fp16 taken), 1.6 TB/s HBM2e (public reports), HCCS
  7 links x 56 GB/s in an 8-NPU full mesh = 392 GB/s total, 196 each way.
- CPU: a nominal small entry (1 TFLOP/s, 50 GB/s DRAM, shared memory between
  processes), not a published figure: it keeps the emulator's kind plannable.

Link latencies are ESTIMATES of the per-step alpha of the vendor library on
that fabric (a few microseconds on NVLink, more on HCCS): no datasheet gives
them.  Dtypes follow ``hcomm.parallel.devices``; a dtype absent from a row is
one the kind cannot compute in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Union

from hcomm.models.llama import LlamaConfig
from hcomm.parallel.profile import ADAMW_STATE_BYTES, GiB, DeviceProfile, LayerCost

T = 1e12
GB = 1e9


@dataclass(frozen=True)
class DeviceFigures:
    name: str
    peak_flops: Mapping[str, float]   # dense FLOP/s by compute dtype: fp32 (non-tensor), tf32, bf16, fp16, fp8
    memory_bytes: int                 # device memory (HBM)
    hbm_bytes_per_s: float
    link_bytes_per_s: float           # intra-node fabric (NVLink / HCCS), each direction
    link_latency_s: float             # its per-step alpha (an estimate, see the module docstring)


FIGURES: Dict[str, DeviceFigures] = {f.name: f for f in [
    DeviceFigures("V100", {"fp32": 15.7 * T, "fp16": 125 * T}, 32 * GiB, 900 * GB, 150 * GB, 5e-6),
    DeviceFigures("A100", {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
                  80 * GiB, 2039 * GB, 300 * GB, 5e-6),
    DeviceFigures("H100", {"fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T,
                           "fp8": 1978.9 * T}, 80 * GiB, 3350 * GB, 450 * GB, 5e-6),
    DeviceFigures("H800", {"fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T,
                           "fp8": 1978.9 * T}, 80 * GiB, 3350 * GB, 200 * GB, 5e-6),
    DeviceFigures("910B", {"fp32": 94 * T, "bf16": 376 * T, "fp16": 376 * T}, 64 * GiB, 1600 * GB, 196 * GB, 10e-6),
    DeviceFigures("CPU", {"fp32": 1 * T, "bf16": 0.5 * T, "fp16": 0.5 * T}, 16 * GiB, 50 * GB, 10 * GB, 10e-6),
]}

USABLE_FRACTION = 0.9       # of device memory a plan may use: the rest for the runtime's context and fragmentation
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Eager PyTorch costs ~10 us per kernel (dispatch + launch) whatever the batch; kernels per forward, counted
# from hcomm.models.llama: a block ~40 (two RMSNorms of 8, q/k/v/o, RoPE, attention, SwiGLU, residual adds),
# a norm 8, the head 4 (linear, fp32 cast, log-softmax, nll), the embedding 1.  Backward launches about twice.
KERNEL_S = 10e-6
KERNELS = {"embed": 1, "block": 40, "norm": 8, "head": 4}
LOSS_BYTES_PER_LOGIT = 16   # the loss's passes over the logits: fp32 cast, log-softmax read + write, nll


def figures_for(kind: str, extra: Optional[Mapping[str, DeviceFigures]] = None) -> DeviceFigures:
    """The figures of device kind ``kind`` (case-insensitive), from ``extra`` first, then the table."""
    for table in (extra or {}, FIGURES):
        for name, figures in table.items():
            if name.upper() == kind.strip().upper():
                return figures
    raise ValueError(f"no published figures for device kind {kind!r} (known: {', '.join(FIGURES)}): give a "
                     f"measured profile of it (a profile file from a run on one such device, "
                     f"HCOMM_MODEL_PROFILE=<file>, or profiles={{{kind!r}: DeviceProfile}}) or its figures "
                     f"(figures={{{kind!r}: DeviceFigures(...)}})")


def block_flops(config: LlamaConfig, tokens: int, seq_len: int) -> float:
    """Forward FLOPs of one block over ``tokens`` tokens in sequences of ``seq_len``: 2 per matmul weight per
    token, plus attention's 4 * seq_len * dim per token (QK^T and AV, causal mask not discounted: PaLM's
    MFU accounting, Chowdhery et al. 2022, app. B, which the ``mfu`` figure is quoted against)."""
    return 2.0 * _block_matmul_params(config) * tokens + 4.0 * seq_len * config.dim * tokens


def block_act_bytes(config: LlamaConfig, seq_len: int, element_bytes: int) -> int:
    """Bytes one block saves for backward per sample: Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", eq. 1 term by term) with selective recomputation, which
    a fused (flash) attention does: no s^2 terms; no dropout masks; mapped onto GQA and SwiGLU.  Per token,
    in the compute dtype: two norm inputs (2h); the q/k/v input, Q, K, V, the attention output and the
    output projection's input (4h + 2 kv); SwiGLU's input, w1 and w3 outputs, silu output and w2 input
    (h + 4f); plus the attention's fp32 log-sum-exp per head.  An autocast run keeps the residual stream
    and the norms in fp32, so a measured profile shows somewhat more."""
    kv = config.kv_heads * config.head_dim
    per_token = element_bytes * (7 * config.dim + 2 * kv + 4 * config.hidden_dim) + 4 * config.n_heads
    return per_token * seq_len


def _block_matmul_params(config: LlamaConfig) -> int:
    kv = config.kv_heads * config.head_dim
    return 2 * config.dim * config.dim + 2 * config.dim * kv + 3 * config.dim * config.hidden_dim


def _piece(name: str, kind: str, compute_s: float, params: int, act: int, trainable: bool = True) -> LayerCost:
    fixed = KERNELS[kind] * KERNEL_S
    grads = params if trainable else 0
    return LayerCost(name, fixed + compute_s, 2 * (fixed + compute_s), 4 * params, 4 * grads,
                     ADAMW_STATE_BYTES * grads, act, fwd_fixed_s=fixed, bwd_fixed_s=2 * fixed)


def analytic_profile(config: Union[LlamaConfig, str], device: Union[str, DeviceFigures], *, micro_batch: int,
                     seq_len: int, dtype: str = "bf16", mfu: float = 0.45, memory_bytes: Optional[int] = None,
                     rank: int = 0) -> DeviceProfile:
    """The profile ``measure`` would give on ``device`` (a kind, or its figures), from the figures.

    Per piece of ``Llama.layer_modules()`` (embed, blocks.i, norm, head), for one micro-batch of
    T = micro_batch * seq_len tokens:

    - matmul pieces: fwd = fixed + FLOPs / (peak[dtype] * mfu); a block's FLOPs are ``block_flops``, the
      head's 2 * dim * vocab * T, plus its loss moving the logits (``LOSS_BYTES_PER_LOGIT`` per logit)
      at the HBM bandwidth;
    - memory-bound pieces (embedding lookup, final norm): fwd = fixed + 2 * 4 * dim * T / HBM bandwidth
      (read and write the fp32 hidden states once);
    - bwd = 2 x fwd (two matmuls per forward one), fixed parts included;
    - fixed = kernels * ``KERNEL_S`` (see ``KERNELS``).

    Bytes mean what ``measure`` counts: fp32 parameters and gradients, AdamW's 8 B per parameter,
    activations per sample (``block_act_bytes``; the embedding its int64 token ids, the norm its input,
    the head its input plus the loss's fp32 log-softmax and int64 targets).  Tied embeddings count once,
    on the embedding.  The memory budget is ``USABLE_FRACTION`` of ``memory_bytes`` (default: the kind's).
    """
    if isinstance(config, str):
        from hcomm.models.configs import get_config

        config = get_config(config)
    config.validate()
    figures = device if isinstance(device, DeviceFigures) else figures_for(device)
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"analytic_profile: {name} must be a positive integer, got {value!r}")
    if seq_len > config.max_seq_len:
        raise ValueError(f"analytic_profile: seq_len {seq_len} exceeds the model's max_seq_len {config.max_seq_len}")
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"analytic_profile: mfu must be in (0, 1], got {mfu!r}")
    if dtype not in figures.peak_flops:
        raise ValueError(f"analytic_profile: {figures.name} cannot compute in {dtype!r}; its figures give "
                         f"{', '.join(figures.peak_flops)}")
    flops_per_s = figures.peak_flops[dtype] * mfu
    tokens = micro_batch * seq_len
    dim, vocab, e = config.dim, config.vocab_size, ELEMENT_BYTES[dtype]
    hidden_pass_s = 2 * 4 * dim * tokens / figures.hbm_bytes_per_s
    block_params = _block_matmul_params(config) + 2 * dim
    head_s = 2.0 * dim * vocab * tokens / flops_per_s + LOSS_BYTES_PER_LOGIT * vocab * tokens / figures.hbm_bytes_per_s
    layers = [_piece("embed", "embed", hidden_pass_s, vocab * dim, 8 * seq_len)]
    block_s = block_flops(config, tokens, seq_len) / flops_per_s
    block_act = block_act_bytes(config, seq_len, e)
    layers += [_piece(f"blocks.{i}", "block", block_s, block_params, block_act) for i in range(config.n_layers)]
    layers.append(_piece("norm", "norm", hidden_pass_s, dim, e * dim * seq_len))
    head = _piece("head", "head", head_s, 0 if config.tie_embeddings else vocab * dim,
                  (e * dim + 4 * vocab + 8) * seq_len)
    layers.append(head)
    memory = figures.memory_bytes if memory_bytes is None else int(memory_bytes)
    budget = int(memory * USABLE_FRACTION)
    return DeviceProfile(rank, figures.name, micro_batch, seq_len, layers, budget, memory - budget,
                         "figures", 0.0, "figures", dtype)
