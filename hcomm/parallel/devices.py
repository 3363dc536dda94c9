"""The device table: which kinds hcomm knows and which dtypes each computes in.

| kind | vendor library | compute capability | fp32 | bf16 | fp16 | fp8 |
| ---- | -------------- | ------------------ | ---- | ---- | ---- | --- |
| V100 | nccl | 7.0 (Volta)  | yes | **no** | yes | no |
| A100 | nccl | 8.0 (Ampere) | yes | yes | yes | **no** |
| H100 | nccl | 9.0 (Hopper) | yes | yes | yes | yes |
| H800 | nccl | 9.0 (Hopper) | yes | yes | yes | yes |
| 910B | hccl | Ascend (Da Vinci) | yes | yes | yes | no |
| CPU  | gloo | -            | yes | yes | yes | no |

Sources: NVIDIA's CUDA C Programming Guide (arithmetic instructions per
compute capability: bf16 tensor-core math from 8.0, fp8 (e4m3/e5m2) from
8.9/9.0; 7.0 has fp16 only) and the H100/A100/V100 architecture white
papers; Huawei's Ascend 910B documentation (CANN: fp32, bf16 and fp16, no
fp8).  CPUs run bf16/fp16 matmuls in torch, slowly, which is what lets the
emulator exercise precision policies.

On the emulator each rank's kind comes from ``HCOMM_EMU_DEVICE`` (set per
rank by ``hcomm emulate run``), so a "V100" rank refuses bf16 on CPU too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from hcomm.settings import declare

# Also declared by hcomm.emulate.rankwrap, which sets it; declared here
# (same default) because this is where it is read.
HCOMM_EMU_DEVICE = declare("HCOMM_EMU_DEVICE", "", "emulated device kind of this rank, e.g. A100, 910B (set by hcomm emulate run)")


@dataclass(frozen=True)
class DeviceKind:
    name: str
    vendor: str                 # the collective library of its island: nccl, hccl, gloo
    dtypes: Tuple[str, ...]     # compute dtypes it supports
    notes: str


_KINDS = [
    DeviceKind("V100", "nccl", ("fp32", "fp16"), "cc 7.0: fp16 tensor cores, no bf16, no fp8"),
    DeviceKind("A100", "nccl", ("fp32", "bf16", "fp16"), "cc 8.0: bf16 and tf32, no fp8"),
    DeviceKind("H100", "nccl", ("fp32", "bf16", "fp16", "fp8"), "cc 9.0: fp8 (e4m3/e5m2) tensor cores"),
    DeviceKind("H800", "nccl", ("fp32", "bf16", "fp16", "fp8"), "cc 9.0: H100 compute, reduced NVLink"),
    DeviceKind("910B", "hccl", ("fp32", "bf16", "fp16"), "Ascend 910B: bf16/fp16 cube units, no fp8"),
    DeviceKind("CPU", "gloo", ("fp32", "bf16", "fp16"), "torch CPU kernels; low precision is slow"),
]
DEVICE_KINDS: Dict[str, DeviceKind] = {k.name.upper(): k for k in _KINDS}


def device_kind(name: str) -> DeviceKind:
    """The table entry for `name` (case-insensitive)."""
    kind = DEVICE_KINDS.get(name.strip().upper())
    if kind is None:
        known = ", ".join(k.name for k in _KINDS)
        raise ValueError(f"unknown device kind {name!r}; known kinds: {known}")
    return kind


def supports(name: str, dtype: str) -> bool:
    """Whether device kind `name` computes in `dtype` ("fp32", "bf16", "fp16", "fp8")."""
    return dtype in device_kind(name).dtypes


def best_low_precision(name: str) -> str:
    """bf16 where supported (no loss scaling needed), else fp16, else fp32."""
    for dtype in ("bf16", "fp16"):
        if supports(name, dtype):
            return dtype
    return "fp32"


def _cuda_kind() -> str:
    import torch

    gpu = torch.cuda.get_device_name().upper()
    for name in ("A100", "H100", "H800", "V100"):
        if name in gpu:
            return name
    # An unlisted GPU (H200, L40, ...) counts as the listed kind of its
    # compute capability: dtype support follows the capability.
    major, _ = torch.cuda.get_device_capability()
    return "H100" if major >= 9 else "A100" if major == 8 else "V100"


def local_device_name() -> str:
    """This rank's device kind: the emulated one, else the CUDA GPU's, else CPU."""
    emulated = HCOMM_EMU_DEVICE.get()
    if emulated:
        return device_kind(emulated).name
    import torch

    if torch.cuda.is_available():
        return _cuda_kind()
    return "CPU"
