"""Deterministic inputs and exact expected results for every dtype and reduce op.

Inputs are small integers (or 0/1 for bool) chosen per op so that sums,
products and averages are exact in every dtype, including fp16 and bf16:
any summation order gives the same bits, so results can be compared with
``torch.equal`` against a float64/int64 reference and against gloo.
"""
from __future__ import annotations

import torch

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
REDUCE_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
ALL_DTYPES = REDUCE_DTYPES + FP8_DTYPES
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
BITWISE = ("band", "bor", "bxor")


def op_applies(op: str, dtype: torch.dtype) -> bool:
    """Whether hcomm promises to run `op` on `dtype` (bitwise only on integers/bool, no fp8 reductions)."""
    if dtype in FP8_DTYPES:
        return False
    if op in BITWISE:
        return dtype in INT_DTYPES or dtype == torch.bool
    return True


def make_input(rank: int, world: int, n: int, dtype: torch.dtype, op: str = "sum", salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input of `n` elements; exact under `op` across `world` ranks."""
    i = torch.arange(n, dtype=torch.int64)
    seed = i * 7 + rank * 3 + salt * 5
    if dtype == torch.bool:
        return ((seed % 3) == 0)
    if op == "product":
        v = 1 + (seed % 2)  # 1 or 2: at most 2**4 on four ranks
    elif op in ("min", "max"):
        signed = dtype not in (torch.uint8,)
        v = (seed % 11) - (5 if signed else 0)
    elif op == "avg":
        v = world * (seed % 5)  # sums are multiples of world: the average is exact
    else:
        v = seed % 8  # sums up to 28 on four ranks: exact even in int8
    return v.to(dtype)


def reduce_ref(tensors, op: str) -> torch.Tensor:
    """The exact reduction of `tensors` (all the same dtype) in that dtype."""
    dtype = tensors[0].dtype
    world = len(tensors)
    if dtype == torch.bool:
        stack = torch.stack(tensors)
        if op in ("sum", "avg", "max", "bor"):
            return stack.any(0)
        if op in ("product", "min", "band"):
            return stack.all(0)
        if op == "bxor":
            return (stack.to(torch.int64).sum(0) % 2).to(torch.bool)
        raise ValueError(op)
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([t.to(wide) for t in tensors])
    if op == "sum":
        out = stack.sum(0)
    elif op == "avg":
        out = stack.sum(0)
        out = torch.div(out, world, rounding_mode="trunc") if not dtype.is_floating_point else out / world
    elif op == "product":
        out = stack.prod(0)
    elif op == "min":
        out = stack.min(0).values if stack.numel() else stack.sum(0)
    elif op == "max":
        out = stack.max(0).values if stack.numel() else stack.sum(0)
    elif op in BITWISE:
        out = stack[0].clone()
        for t in stack[1:]:
            out = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op](out, t)
    else:
        raise ValueError(op)
    return out.to(dtype)


def torch_op(op: str):
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
            "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}[op]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality of dtype, shape and bits (NaN-free data, so torch.equal is bitwise here)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in FP8_DTYPES:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)
