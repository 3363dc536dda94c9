"""Wire compression for the weak (inter-island) tier.

``HCOMM_COMPRESS`` (or a group's own option, which wins) picks what the
inter-island step of the hierarchical collectives sends:

``none`` (default: results stay exact), ``bf16``, ``fp16``, ``fp8e4m3``,
``fp8e5m2``; a ``:ef`` suffix adds error feedback (a per-buffer fp32
residual of what has not been sent yet is added to the next step's data).
``HCOMM_COMPRESS_CHUNK`` sets the fp8 elements per scale.

:class:`Codec` runs the C++ codec (``csrc/core/compress``) on CPU tensors;
the collectives call the same code from C++.  Accuracy figures are in
``docs/kernels.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from hcomm import _C
from hcomm.kernels import DEFAULT_CHUNK, REDUCE_OPS, dtype_code
from hcomm.settings import declare

HCOMM_COMPRESS = declare(
    "HCOMM_COMPRESS", "none",
    "wire dtype on the inter-island tier: none, bf16, fp16, fp8e4m3 or fp8e5m2, optionally "
    "with :ef for error feedback (e.g. fp8e4m3:ef); a group's own option overrides it")
HCOMM_COMPRESS_CHUNK = declare(
    "HCOMM_COMPRESS_CHUNK", DEFAULT_CHUNK, "fp8 compression: elements per fp32 scale")

WIRE_DTYPES = {
    "none": None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16,
    "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2,
}
# What errors offer, in the documented order.  "fp32" stays accepted as an
# undocumented alias of "none" (plan files use it) but is not suggested.
DOCUMENTED_WIRES = ("none", "bf16", "fp16", "fp8e4m3", "fp8e5m2")


@dataclass(frozen=True)
class CompressConfig:
    """What a group sends on its weak tier.  ``wire=None``: uncompressed."""

    wire: Optional[torch.dtype] = None
    error_feedback: bool = False
    chunk: int = DEFAULT_CHUNK

    @property
    def enabled(self) -> bool:
        return self.wire is not None

    def __str__(self) -> str:
        name = next(k for k, v in WIRE_DTYPES.items() if v == self.wire)
        return name + (":ef" if self.error_feedback else "")


def parse(text: str, chunk: Optional[int] = None) -> CompressConfig:
    """Parses ``"fp8e4m3:ef"``-style text (see the module docstring)."""
    spec = text.strip().lower()
    name, _, suffix = spec.partition(":")
    if name not in WIRE_DTYPES:
        raise ValueError(f"HCOMM_COMPRESS: unknown wire dtype {name!r}; expected one of "
                         f"{', '.join(DOCUMENTED_WIRES)} (optionally with :ef)")
    if suffix not in ("", "ef"):
        raise ValueError(f"HCOMM_COMPRESS: unknown suffix {suffix!r} in {text!r}; only ':ef' is defined")
    chunk = HCOMM_COMPRESS_CHUNK.get() if chunk is None else chunk
    if chunk <= 0:
        raise ValueError(f"HCOMM_COMPRESS_CHUNK must be positive, got {chunk}")
    wire = WIRE_DTYPES[name]
    if wire is None and suffix:
        raise ValueError("error feedback needs a compressed wire dtype, not 'none'")
    return CompressConfig(wire, suffix == "ef", chunk)


def resolve(option: Union[None, str, CompressConfig] = None) -> CompressConfig:
    """A group's configuration: its own option if given, else ``HCOMM_COMPRESS``."""
    if isinstance(option, CompressConfig):
        return option
    return parse(option if option is not None else HCOMM_COMPRESS.get())


class Codec:
    """Encodes/decodes 1-D contiguous CPU tensors with one configuration."""

    def __init__(self, config: Union[str, CompressConfig]):
        self.config = resolve(config)
        wire = self.config.wire if self.config.wire is not None else torch.float32
        self._wire = dtype_code(wire)
        self._c = _C.compress

    def encoded_bytes(self, n: int) -> int:
        return self._c.encoded_bytes(n, self._wire, self.config.chunk)

    def encode(self, x: torch.Tensor, residual: Optional["_C.compress.Residual"] = None) -> torch.Tensor:
        """The wire bytes of ``x``; ``residual`` (a ``Residual``) enables error feedback."""
        _need_cpu(x)
        out = torch.empty(self.encoded_bytes(x.numel()), dtype=torch.uint8)
        self._c.encode_ptr(x.data_ptr(), dtype_code(x.dtype), x.numel(), self._wire, self.config.chunk,
                           out.data_ptr(), residual)
        return out

    def decode(self, wire: torch.Tensor, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._check_wire(wire, n)
        out = torch.empty(n, dtype=dtype)
        self._c.decode_ptr(wire.data_ptr(), n, self._wire, self.config.chunk, out.data_ptr(), dtype_code(dtype))
        return out

    def decode_accumulate(self, wire: torch.Tensor, acc: torch.Tensor, op: str = "sum") -> torch.Tensor:
        _need_cpu(acc)
        self._check_wire(wire, acc.numel())
        self._c.decode_accumulate_ptr(wire.data_ptr(), acc.numel(), self._wire, self.config.chunk, acc.data_ptr(),
                                      dtype_code(acc.dtype), REDUCE_OPS[op])
        return acc

    def _check_wire(self, wire: torch.Tensor, n: int) -> None:
        _need_cpu(wire)
        if wire.numel() * wire.element_size() != self.encoded_bytes(n):
            raise ValueError(f"wire buffer has {wire.numel() * wire.element_size()} bytes, "
                             f"{self.encoded_bytes(n)} expected for {n} elements as {self.config}")


def _need_cpu(t: torch.Tensor) -> None:
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("the codec runs on contiguous CPU tensors")


def Residual():  # noqa: N802  (reads like the class it returns)
    """A fresh error-feedback residual (fp32, sized on first use)."""
    return _C.compress.Residual()


def ResidualStore():  # noqa: N802
    """Residuals keyed by (group name, buffer id)."""
    return _C.compress.ResidualStore()
