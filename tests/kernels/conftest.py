"""Shared fixtures for the kernel tests: every CPU ISA path and reference helpers."""
import pytest
import torch

from hcomm import kernels

ISAS = ["portable", "avx2", "avx512"]
SIZES = [0, 1, 7, 1000003]  # empty, one, unaligned tail, multithreaded path
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    """Runs the test once per ISA the CPU has, forced via HCOMM_KERNEL_ISA."""
    if not kernels.isa_supported(request.param):
        pytest.skip(f"CPU lacks {request.param}")
    monkeypatch.setenv("HCOMM_KERNEL_ISA", request.param)
    assert kernels.active_isa() == request.param
    return request.param


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """inf, -inf, nan, zeros, denormals of `dtype` and the extremes, as fp32."""
    fi = torch.finfo(dtype)
    vals = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, fi.tiny, -fi.tiny, fi.tiny / 4, -fi.tiny / 8,
            fi.max, -fi.max, 1.0, -2.5, 3.0e-3]
    return torch.tensor(vals, dtype=torch.float32).to(dtype).float()


def fp8_ref(x32: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """Reference codes: torch's cast after OCP satfinite clamping of finite
    values.  torch 2.13 already saturates finite e4m3 values (and turns
    +-inf into +-448), but overflows finite e5m2 values to inf.  hcomm keeps
    non-finite inputs non-finite (csrc/core/kernels/fp8.h): +-inf -> NaN in
    e4m3, +-inf in e5m2; NaN -> NaN (its sign is not compared)."""
    m = FP8_MAX[fmt]
    y = torch.where(x32.isinf(), x32, x32.clamp(-m, m))
    q = y.to(fmt).view(torch.uint8)
    if fmt == torch.float8_e4m3fn:
        sign = (x32.view(torch.int32) < 0).to(torch.uint8) << 7
        q = torch.where(x32.isinf(), sign | 0x7F, q)
    return q


def assert_fp8_same(codes: torch.Tensor, x32: torch.Tensor, fmt: torch.dtype) -> None:
    """Codes equal fp8_ref bit for bit; NaN inputs give some NaN code."""
    expected = fp8_ref(x32, fmt)
    nan_in = x32.isnan()
    got_nan = codes.view(fmt).float().isnan()
    assert torch.equal(got_nan, expected.view(fmt).float().isnan()), "NaN codes differ from the reference's"
    bad = (codes != expected) & ~nan_in
    assert not bad.any(), f"{int(bad.sum())} codes differ, first inputs {x32[bad][:4].tolist()}: " \
                          f"{codes[bad][:4].tolist()} vs {expected[bad][:4].tolist()}"


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-exact for non-NaN values; NaN where expected NaN."""
    a, e = actual.float(), expected.float()
    assert torch.equal(a.isnan(), e.isnan()), "NaN positions differ"
    keep = ~e.isnan()
    if actual.dtype == expected.dtype and actual.element_size() in (1, 2, 4):
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[actual.element_size()]
        bad = (actual.view(ints) != expected.view(ints)) & keep.view(-1).reshape(actual.shape)
        # -0 and +0 compare equal: reduce min/max may pick either zero like the scalar loop.
        bad &= ~((a == 0) & (e == 0))
        assert not bad.any(), f"{int(bad.sum())} elements differ, first at {int(bad.nonzero()[0])}: " \
                              f"{a[bad][:4].tolist()} vs {e[bad][:4].tolist()}"
    else:
        torch.testing.assert_close(a[keep], e[keep], rtol=0, atol=0)
