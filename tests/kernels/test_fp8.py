"""Per-chunk scaled fp8 quantize / dequantize / dequantize-accumulate,
bit-exact against a torch reference of the documented algorithm
(csrc/core/kernels/quantize.h), on every ISA path."""
import pytest
import torch

from hcomm import kernels
from conftest import FP8_MAX, assert_fp8_same, assert_same

FMTS = [torch.float8_e4m3fn, torch.float8_e5m2]
MIN_SCALE = 2.0 ** -126


def ref_scales(x32: torch.Tensor, chunk: int, fmt) -> torch.Tensor:
    n = x32.numel()
    nch = kernels.num_chunks(n, chunk)
    a = torch.where(x32.isfinite(), x32.abs(), torch.zeros_like(x32))
    a = torch.nn.functional.pad(a, (0, nch * chunk - n)).view(nch, chunk)
    s = a.amax(dim=1) / torch.tensor(FP8_MAX[fmt], dtype=torch.float32)
    return torch.clamp(s, min=MIN_SCALE)


def expand(per_chunk: torch.Tensor, n: int, chunk: int) -> torch.Tensor:
    return per_chunk.repeat_interleave(chunk)[:n]


def _data(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # chunks of very different magnitudes, as gradients have
    mag = torch.exp(torch.randn(kernels.num_chunks(n, 64) + 1, generator=g) * 3).repeat_interleave(64)[:n]
    return (torch.randn(n, generator=g) * mag).to(dtype)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,chunk", [(0, 1024), (1, 1024), (7, 3), (7, 1024), (4099, 64)])
def test_quantize_matches_reference(isa, fmt, src, n, chunk):
    x = _data(n, src, n + chunk)
    q, scales = kernels.quantize_fp8(x, fmt, chunk)
    x32 = x.float()
    s = ref_scales(x32, chunk, fmt)
    assert torch.equal(scales.view(torch.int32), s.view(torch.int32))
    inv = torch.ones(()) / s
    assert_fp8_same(q, x32 * expand(inv, n, chunk), fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_large_multithreaded(isa, fmt):
    test_quantize_matches_reference(isa, fmt, torch.bfloat16, 1000003, 1024)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dst", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [0, 1, 7, 4099])
def test_dequantize_matches_reference(isa, fmt, dst, n):
    x = _data(n, torch.float32, 11)
    q, scales = kernels.quantize_fp8(x, fmt, 1024)
    expected = (q.view(fmt).float() * expand(scales, n, 1024)).to(dst)
    assert_same(kernels.dequantize_fp8(q, scales, fmt, 1024, dst), expected)


@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_large(isa, fmt):
    test_dequantize_matches_reference(isa, fmt, torch.float32, 1000003)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op,ref", [("sum", torch.add), ("product", torch.mul), ("min", torch.minimum),
                                    ("max", torch.maximum)])
@pytest.mark.parametrize("n", [7, 4099])
def test_dequantize_accumulate(isa, fmt, acc_dtype, op, ref, n):
    x = _data(n, torch.float32, 12)
    acc = (torch.randn(n, generator=torch.Generator().manual_seed(2))).to(acc_dtype)
    q, scales = kernels.quantize_fp8(x, fmt, 1024)
    deq = q.view(fmt).float() * expand(scales, n, 1024)  # rounded before the op: no FMA anywhere
    expected = ref(acc.float(), deq).to(acc_dtype)
    kernels.dequantize_accumulate(acc, q, scales, fmt, 1024, op)
    assert_same(acc, expected)


@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_accumulate_large(isa, fmt):
    test_dequantize_accumulate(isa, fmt, torch.bfloat16, "sum", torch.add, 1000003)


@pytest.mark.parametrize("fmt", FMTS)
def test_special_chunks(isa, fmt):
    chunk = 8
    x = torch.tensor(
        [0.0] * 8                                                  # all zero: minimum scale, zero codes
        + [1e-40, -3e-41, 0.0, 2e-39, 1e-45, 0.0, 0.0, 5e-40]      # fp32 denormals only
        + [float("inf"), 1.0, -2.0, float("nan"), 0.5, 0.0, -float("inf"), 3.0]  # non-finite ignored by amax
        + [448.0 * 7, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    q, scales = kernels.quantize_fp8(x, fmt, chunk)
    assert scales[0].item() == MIN_SCALE and (q[:8] == 0).all()
    assert scales[1].item() == MIN_SCALE
    assert scales[2].item() == pytest.approx(3.0 / FP8_MAX[fmt], rel=1e-7)
    assert_fp8_same(q, x * expand(torch.ones(()) / ref_scales(x, chunk, fmt), x.numel(), chunk), fmt)
    back = kernels.dequantize_fp8(q, scales, fmt, chunk)
    assert back[16].isinf() if fmt == torch.float8_e5m2 else back[16].isnan()
    assert back[19].isnan()
    assert back[24].item() == 448.0 * 7  # a chunk's amax round-trips exactly
    # denormal inputs go through the minimum scale 2^-126: within the
    # documented bound (half a subnormal step of the scaled format)
    step = MIN_SCALE * (2.0 ** -10 if fmt == torch.float8_e4m3fn else 2.0 ** -17)
    rel = 2.0 ** -4 if fmt == torch.float8_e4m3fn else 2.0 ** -3
    assert ((back[8:16] - x[8:16]).abs() <= torch.clamp(rel * x[8:16].abs(), min=step)).all()


@pytest.mark.parametrize("fmt,rel", [(torch.float8_e4m3fn, 2.0 ** -4), (torch.float8_e5m2, 2.0 ** -3)])
def test_round_trip_error_bound(isa, fmt, rel):
    # |x - x'| <= rel * |x| in the scaled format's normal range, and at most
    # half a subnormal step (scale * 2^-10 resp. 2^-17) below it.
    n, chunk = 200003, 1024
    x = _data(n, torch.float32, 9)
    q, scales = kernels.quantize_fp8(x, fmt, chunk)
    back = kernels.dequantize_fp8(q, scales, fmt, chunk)
    s = expand(scales, n, chunk)
    half_step = s * (2.0 ** -10 if fmt == torch.float8_e4m3fn else 2.0 ** -17)
    err = (x - back).abs()
    assert (err <= torch.maximum(rel * x.abs(), half_step) * (1 + 1e-6)).all()


def test_bad_arguments():
    x = torch.ones(10)
    with pytest.raises(ValueError):
        kernels.quantize_fp8(x, "e3m4")
    with pytest.raises(Exception, match="chunk"):
        kernels.quantize_fp8(x, "e4m3", 0)
    q, s = kernels.quantize_fp8(x, "e4m3", 4)
    with pytest.raises(ValueError, match="scales"):
        kernels.dequantize_fp8(q, s[:1], "e4m3", 4)
