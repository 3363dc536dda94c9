"""Thread-rank harness: one collective on `world` in-process ranks over torch tensors.

Wraps ``hcomm._C.local_run`` (see python/bind_core.cpp), which runs each rank
on its own Communicator over the in-process LocalTransport, so every hcomm
algorithm is exercised without processes or sockets.  Tensors are handed to
the core as numpy views of their bytes (bf16 and fp8 have no numpy dtype),
so results land in the tensors themselves.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from hcomm import _C

_DTYPE_NAMES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8",
    torch.bool: "bool", torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2",
}


def dtype_code(dtype: torch.dtype) -> int:
    return _C.DTYPES[_DTYPE_NAMES[dtype]]


def _view(t: Optional[torch.Tensor]):
    if t is None:
        return None
    assert t.is_contiguous()
    width = t.element_size()
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    return t.view(raw).numpy() if t.dtype != raw else t.numpy()


def run(world: int, kind: str, dtype: torch.dtype, inputs: Sequence[Optional[torch.Tensor]],
        outputs: Optional[Sequence[Optional[torch.Tensor]]] = None, reduce: str = "sum", root: int = 0,
        input_counts: Optional[List[List[int]]] = None, output_counts: Optional[List[List[int]]] = None,
        algorithm: str = "", debug: bool = False, timeout_ms: int = 10000, kill_rank: int = -1) -> List[dict]:
    """Run `kind` (an ``_C.OP_KINDS`` name) on `world` thread ranks; returns each rank's op record."""
    outputs = outputs if outputs is not None else [None] * world
    return _C.local_run(world, _C.OP_KINDS[kind], dtype_code(dtype), _C.REDUCE_OPS[reduce], root,
                        [_view(t) for t in inputs], [_view(t) for t in outputs],
                        input_counts or [], output_counts or [], algorithm=algorithm, debug=debug,
                        timeout_ms=timeout_ms, kill_rank=kill_rank)
