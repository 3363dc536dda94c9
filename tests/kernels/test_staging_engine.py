"""The bridge's copy engines through ``_C.stage_copy``: device -> host staging block -> device in chunks.

The emulated engine (the staging mode's, CPU memory) must move every byte for any chunk size, including
chunks that do not divide the buffer and empty buffers, and refuse bad arguments by name.  On a GPU the
CUDA engine must do the same on device memory and order its copies after work already queued on the
caller's stream (a slow kernel then an in-place add: the copy sees the add), never blocking on it.
"""
import pytest
import torch

import hcomm  # noqa: F401  (loads torch before the extension)
from hcomm import _C
from hcomm.errors import HCommValueError

CPU, CUDA = 0, 1


def roundtrip(device: int, src: torch.Tensor, chunk: int, stream: int = 0) -> torch.Tensor:
    dst = torch.zeros_like(src)
    seconds, engine = _C.stage_copy(device, src.data_ptr(), dst.data_ptr(), src.numel() * src.element_size(),
                                    chunk, stream)
    assert seconds >= 0 and engine == ("emulated" if device == CPU else "cuda")
    return dst


@pytest.mark.parametrize("n,chunk", [(0, 1), (1, 1), (1001, 7), (1 << 20, 1 << 16), (1 << 20, 3 << 20), (999_983, 4099)])
def test_emulated_engine_moves_every_byte(n, chunk):
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    assert torch.equal(roundtrip(CPU, src, chunk), src)


def test_bad_arguments_are_refused_by_name():
    src = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises((HCommValueError, ValueError), match="chunk > 0"):
        _C.stage_copy(CPU, src.data_ptr(), src.data_ptr(), 8, 0)
    with pytest.raises((HCommValueError, ValueError), match="unknown device kind"):
        _C.stage_copy(7, src.data_ptr(), src.data_ptr(), 8, 4)
    if not _C.has_cuda:
        with pytest.raises((HCommValueError, ValueError), match="no copy engine for cuda"):
            _C.stage_copy(CUDA, src.data_ptr(), src.data_ptr(), 8, 4)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
@pytest.mark.parametrize("n,chunk", [(0, 1), (1001, 7), (1 << 24, 1 << 20), (999_983, 4099)])
def test_cuda_engine_moves_every_byte(n, chunk):
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    dst = roundtrip(CUDA, src, chunk, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


@gpu
def test_cuda_engine_orders_after_the_callers_stream():
    src = torch.zeros(1 << 22, dtype=torch.float32, device="cuda")
    torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning queued first on the current stream
    src.add_(1.0)                   # then the write the copy must see
    dst = roundtrip(CUDA, src, 1 << 20, torch.cuda.current_stream().cuda_stream)
    assert bool((dst == 1.0).all())
