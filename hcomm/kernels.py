"""The core's cast / reduce / fp8 kernels on torch tensors.

A thin layer over ``hcomm._C.kernels``: it checks tensors, maps torch dtypes
to the core's ``DType`` numbers (``csrc/core/types.h``) and passes
``data_ptr()``.  CPU tensors run the run-time dispatched CPU kernels
(portable / AVX2 / AVX-512, multi-threaded for large buffers); CUDA tensors
run the CUDA kernels on the current stream when the build has CUDA.

fp8 quantization keeps one fp32 scale per ``chunk`` elements; see
``docs/kernels.md`` for the exact rounding, saturation and NaN/inf rules.
"""
from __future__ import annotations

from typing import Tuple

import torch

from hcomm import _C
from hcomm.settings import declare

# Read by the C++ dispatcher on every call (csrc/core/kernels/cpu_dispatch.cpp).
HCOMM_KERNEL_ISA = declare(
    "HCOMM_KERNEL_ISA", "auto",
    "CPU kernel ISA: auto (best the CPU has), portable, avx2 or avx512; a request the CPU "
    "cannot run falls back to the best it can")
# Read by csrc/core/kernels/threads.cpp.
HCOMM_KERNEL_THREADS = declare(
    "HCOMM_KERNEL_THREADS", 0,
    "most threads one CPU kernel call uses for buffers of 1 MiB and more (0: all cores); "
    "helpers are shared by all callers, never oversubscribed")

_k = _C.kernels

# csrc/core/types.h: DType numbering (do not renumber there).
DTYPE_CODES = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
    torch.int8: 4, torch.int16: 5, torch.int32: 6, torch.int64: 7, torch.uint8: 8, torch.bool: 9,
    torch.float8_e4m3fn: 10, torch.float8_e5m2: 11,
}
REDUCE_OPS = {"sum": 0, "avg": 1, "product": 2, "prod": 2, "min": 3, "max": 4, "band": 5, "bor": 6, "bxor": 7}
FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
               torch.float8_e4m3fn: torch.float8_e4m3fn, torch.float8_e5m2: torch.float8_e5m2}
DEFAULT_CHUNK = 1024

has_cuda = bool(_k.has_cuda)


def dtype_code(dtype: torch.dtype) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise TypeError(f"hcomm kernels do not handle {dtype}") from None


def _op_code(op) -> int:
    code = REDUCE_OPS.get(op) if isinstance(op, str) else None  # the usual "sum", without lower()
    if code is not None:
        return code
    if isinstance(op, int):
        return op
    try:
        return REDUCE_OPS[str(op).lower()]
    except KeyError:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {sorted(REDUCE_OPS)}") from None


def _fp8(fmt) -> torch.dtype:
    try:
        return FP8_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"fp8 format must be 'e4m3' or 'e5m2', got {fmt!r}") from None


def _check(*tensors: torch.Tensor) -> bool:
    """Validates contiguity and a common device; returns True for CUDA."""
    dev = tensors[0].device
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError("hcomm kernels need contiguous tensors")
        if t.device != dev:
            raise ValueError(f"tensors on different devices: {dev} and {t.device}")
    if dev.type == "cuda":
        if not has_cuda:
            raise RuntimeError("this hcomm build has no CUDA kernels")
        return True
    if dev.type != "cpu":
        raise ValueError(f"hcomm kernels run on CPU or CUDA tensors, got {dev}")
    return False


def _plain_cpu(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Both contiguous CPU tensors (the fast path); anything else goes through _check."""
    # is_cpu, not device.type: the latter builds a device object (~0.7 us).
    return a.is_cpu and b.is_cpu and a.is_contiguous() and b.is_contiguous()


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def active_isa() -> str:
    return _k.active_isa()


def best_isa() -> str:
    return _k.best_isa()


def isa_supported(name: str) -> bool:
    return bool(_k.isa_supported(name))


def reduce_into(acc: torch.Tensor, src: torch.Tensor, op="sum") -> torch.Tensor:
    """``acc = acc OP src`` in place (fp16/bf16 computed in fp32); ``src`` may be
    another float dtype than ``acc`` (fp32/bf16/fp16 accumulators)."""
    n = acc.numel()
    if n != src.numel():
        raise ValueError(f"reduce_into: {n} vs {src.numel()} elements")
    code = _op_code(op)
    # Plain CPU tensors skip _check: its device comparisons cost microseconds,
    # measurable next to a 0.25 MiB kernel.
    if not _plain_cpu(acc, src) and _check(acc, src):
        if acc.dtype != src.dtype:
            raise ValueError("reduce_into on CUDA needs equal dtypes")
        _k.cuda_reduce_into(acc.data_ptr(), src.data_ptr(), n, dtype_code(acc.dtype), code, _stream(acc))
    elif acc.dtype == src.dtype:
        _k.reduce_into_ptr(acc.data_ptr(), src.data_ptr(), n, dtype_code(acc.dtype), code)
    else:
        _k.reduce_into_cast_ptr(acc.data_ptr(), dtype_code(acc.dtype), src.data_ptr(), dtype_code(src.dtype), n, code)
    return acc


def divide_by(data: torch.Tensor, divisor: int) -> torch.Tensor:
    if _check(data):
        raise ValueError("divide_by runs on CPU tensors")
    _k.divide_by_ptr(data.data_ptr(), data.numel(), dtype_code(data.dtype), int(divisor))
    return data


def cast(src: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src`` converted to ``dtype`` (fp32/bf16/fp16/fp8; fp8 saturates)."""
    out = torch.empty(src.shape, dtype=dtype, device=src.device) if out is None else out
    n = src.numel()
    if out.numel() != n or out.dtype != dtype:
        raise ValueError("cast: out has the wrong size or dtype")
    if not _plain_cpu(src, out) and _check(src, out):  # plain CPU tensors skip _check, as in reduce_into
        _k.cuda_cast(src.data_ptr(), dtype_code(src.dtype), out.data_ptr(), dtype_code(dtype), n, _stream(src))
    else:
        _k.cast_ptr(src.data_ptr(), dtype_code(src.dtype), out.data_ptr(), dtype_code(dtype), n)
    return out


def num_chunks(n: int, chunk: int) -> int:
    if chunk <= 0:
        raise ValueError(f"fp8 chunk must be positive, got {chunk}")
    return 0 if n <= 0 else (n + chunk - 1) // chunk


def quantize_fp8(x: torch.Tensor, fmt="e4m3", chunk: int = DEFAULT_CHUNK) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(q, scales)``: ``q`` the fp8 codes as uint8 (``x.numel()``
    bytes; ``q.view(torch.float8_e4m3fn)`` gives torch's view), ``scales``
    one fp32 per chunk; ``x ≈ q.float() * scales[i // chunk]``."""
    fmt = _fp8(fmt)
    n = x.numel()
    q = torch.empty(n, dtype=torch.uint8, device=x.device)
    scales = torch.empty(num_chunks(n, chunk), dtype=torch.float32, device=x.device)
    if _check(x, q, scales):
        _k.cuda_quantize_fp8(x.data_ptr(), dtype_code(x.dtype), n, dtype_code(fmt), chunk, q.data_ptr(),
                             scales.data_ptr(), _stream(x))
    else:
        _k.quantize_fp8_ptr(x.data_ptr(), dtype_code(x.dtype), n, dtype_code(fmt), chunk, q.data_ptr(),
                            scales.data_ptr())
    return q, scales


def _check_q(q: torch.Tensor, scales: torch.Tensor, n: int, chunk: int) -> None:
    if q.numel() != n or q.element_size() != 1:
        raise ValueError(f"fp8 codes: expected {n} bytes, got {q.numel()} x {q.element_size()}")
    if scales.dtype != torch.float32 or scales.numel() != num_chunks(n, chunk):
        raise ValueError(f"fp8 scales: expected {num_chunks(n, chunk)} float32, got {scales.numel()} {scales.dtype}")


def dequantize_fp8(q: torch.Tensor, scales: torch.Tensor, fmt="e4m3", chunk: int = DEFAULT_CHUNK,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    fmt = _fp8(fmt)
    n = q.numel()
    _check_q(q, scales, n, chunk)
    out = torch.empty(n, dtype=dtype, device=q.device)
    if _check(q, scales, out):
        _k.cuda_dequantize_fp8(q.data_ptr(), scales.data_ptr(), n, dtype_code(fmt), chunk, out.data_ptr(),
                               dtype_code(dtype), _stream(q))
    else:
        _k.dequantize_fp8_ptr(q.data_ptr(), scales.data_ptr(), n, dtype_code(fmt), chunk, out.data_ptr(),
                              dtype_code(dtype))
    return out


def dequantize_accumulate(acc: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, fmt="e4m3",
                          chunk: int = DEFAULT_CHUNK, op="sum") -> torch.Tensor:
    """``acc = acc OP dequantize(q, scales)`` in place, computed in fp32."""
    fmt = _fp8(fmt)
    n = acc.numel()
    _check_q(q, scales, n, chunk)
    if _check(acc, q, scales):
        _k.cuda_dequantize_accumulate(q.data_ptr(), scales.data_ptr(), n, dtype_code(fmt), chunk, acc.data_ptr(),
                                      dtype_code(acc.dtype), _op_code(op), _stream(acc))
    else:
        _k.dequantize_accumulate_ptr(q.data_ptr(), scales.data_ptr(), n, dtype_code(fmt), chunk, acc.data_ptr(),
                                     dtype_code(acc.dtype), _op_code(op))
    return acc
