"""CUDA kernels against the CPU kernels (which tests/kernels check against
torch): the two share half.h/fp8.h and round every product separately, so
results must match bit for bit.  Skipped without a GPU or a CUDA build."""
import pytest
import torch

from hcomm import kernels
from conftest import assert_same

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not kernels.has_cuda, reason="hcomm built without CUDA"),
]

SIZES = [0, 1, 7, 1000003]
WIDE = [torch.float32, torch.bfloat16, torch.float16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _data(n, dtype, seed, offset=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + offset, generator=g) * torch.exp(torch.randn(n + offset, generator=g) * 2)
    if n > 16:
        x[3], x[5], x[11] = float("inf"), float("nan"), -float("inf")
    return x.to(dtype)[offset:]  # offset 1: not 16-byte aligned -> scalar path


@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.parametrize("op", ["sum", "product", "min", "max"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("offset", [0, 1])
def test_reduce(dtype, op, n, offset):
    a, b = _data(n, dtype, 1, offset), _data(n, dtype, 2, offset)
    ga, gb = a.cuda(), b.cuda()
    kernels.reduce_into(a, b, op)
    kernels.reduce_into(ga, gb, op)
    assert_same(ga.cpu(), a)


@pytest.mark.parametrize("src", WIDE + FP8)
@pytest.mark.parametrize("dst", WIDE + FP8)
@pytest.mark.parametrize("n", [7, 1000003])
def test_cast(src, dst, n):
    if src == dst:
        pytest.skip("copy")
    x = _data(n, torch.float32, 3).clamp(-400, 400).to(src) if src in FP8 else _data(n, src, 3)
    expected = kernels.cast(x, dst)
    got = kernels.cast(x.cuda(), dst).cpu()
    assert_same(got.view(torch.uint8) if dst in FP8 else got, expected.view(torch.uint8) if dst in FP8 else expected)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("src", WIDE)
@pytest.mark.parametrize("n,chunk", [(0, 1024), (1, 1024), (7, 3), (1000003, 1024), (1 << 24, 1024), (4099, 100)])
def test_quantize_dequantize(fmt, src, n, chunk):
    x = _data(n, src, 4)
    q, s = kernels.quantize_fp8(x, fmt, chunk)
    gq, gs = kernels.quantize_fp8(x.cuda(), fmt, chunk)
    assert torch.equal(gs.cpu().view(torch.int32), s.view(torch.int32))
    assert torch.equal(gq.cpu(), q)
    for dst in WIDE:
        assert_same(kernels.dequantize_fp8(gq, gs, fmt, chunk, dst).cpu(), kernels.dequantize_fp8(q, s, fmt, chunk, dst))
    for acc_dtype in WIDE:
        acc = _data(n, acc_dtype, 5)
        gacc = acc.cuda()
        kernels.dequantize_accumulate(acc, q, s, fmt, chunk, "sum")
        kernels.dequantize_accumulate(gacc, gq, gs, fmt, chunk, "sum")
        assert_same(gacc.cpu(), acc)


def test_runs_on_the_current_stream():
    x = torch.randn(1 << 22, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = kernels.cast(x, torch.bfloat16)
    s.synchronize()
    assert torch.equal(y, x.to(torch.bfloat16))
