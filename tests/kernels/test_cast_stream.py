"""Casts whose output is large enough for the non-temporal store path
(cast.cpp: kStreamMinBytes = 16 MiB of output per call), at
destinations that start off the vector alignment, bit for bit against torch
on every ISA path.  Special values sit in the scalar head, in the streamed
middle and in the tail."""
import pytest
import torch

from hcomm import kernels
from conftest import assert_fp8_same, assert_same, special_values

STREAM_MIN = 16 << 20


def _big(n, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, generator=g) * 50
    sp = special_values(torch.float16)
    for at in (0, n // 2, n - len(sp)):
        x[at:at + len(sp)] = sp
    return x.to(dtype)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("src,dst", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                     (torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("offset", [0, 1, 5])
def test_streamed_wide_casts_match_torch(isa, monkeypatch, threads, src, dst, offset):
    monkeypatch.setenv("HCOMM_KERNEL_THREADS", threads)
    n = STREAM_MIN // torch.empty(0, dtype=dst).element_size() + 37
    x = _big(n, src)
    out_full = torch.empty(n + offset, dtype=dst)
    out = out_full[offset:]  # data_ptr off the 64-byte alignment by `offset` elements
    kernels.cast(x, dst, out=out)
    assert_same(out, x.to(dst))


@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("offset", [0, 3])
def test_streamed_fp8_casts_match_reference(isa, monkeypatch, fmt, offset):
    monkeypatch.setenv("HCOMM_KERNEL_THREADS", "1")
    n = STREAM_MIN + 19
    x = _big(n, torch.float32)
    codes_full = torch.empty(n + offset, dtype=fmt)
    codes = codes_full[offset:]
    kernels.cast(x, fmt, out=codes)
    assert_fp8_same(codes.view(torch.uint8), x, fmt)
