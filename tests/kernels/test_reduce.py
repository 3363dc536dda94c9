"""reduce_into against torch on every ISA path: float types accumulate in
fp32 and round once, so the result equals torch's op computed in fp32 and
cast back (which is also what ``a.add_(b)`` on bf16 does)."""
import pytest
import torch

from hcomm import kernels
from conftest import SIZES, assert_same, special_values

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
REF = {
    "sum": torch.add, "avg": torch.add, "product": torch.mul,
    "min": torch.minimum, "max": torch.maximum,
}


def _inputs(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, generator=g) * 4).to(dtype)
    b = (torch.randn(n, generator=g) * 4).to(dtype)
    return a, b


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(REF))
@pytest.mark.parametrize("n", SIZES)
def test_float_ops_match_torch(isa, dtype, op, n):
    a, b = _inputs(n, dtype, n)
    expected = REF[op](a.float(), b.float()).to(dtype)
    kernels.reduce_into(a, b, op)
    assert_same(a, expected)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(REF))
def test_special_values(isa, dtype, op):
    s = special_values(dtype)
    # every pair of specials, long enough to hit the vector body and the tail
    a = s.repeat_interleave(len(s)).to(dtype)
    b = s.repeat(len(s)).to(dtype)
    expected = REF[op](a.float(), b.float()).to(dtype)
    kernels.reduce_into(a, b, op)
    assert_same(a, expected)


def test_bf16_add_equals_torch_add_(isa):
    a, b = _inputs(4099, torch.bfloat16, 1)
    ref = a.clone().add_(b)
    kernels.reduce_into(a, b, "sum")
    assert torch.equal(a.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("acc_dtype,src_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                                 (torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("n", [7, 1000003])
def test_mixed_dtypes(isa, acc_dtype, src_dtype, n):
    acc, _ = _inputs(n, acc_dtype, 3)
    _, src = _inputs(n, src_dtype, 4)
    expected = (acc.float() + src.float()).to(acc_dtype)
    kernels.reduce_into(acc, src, "sum")
    assert_same(acc, expected)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8, torch.float64])
def test_other_dtypes_use_generic_loops(dtype):
    a = torch.arange(1, 1002, dtype=torch.float64).to(dtype)
    b = torch.full((1001,), 3, dtype=dtype)
    expected = a + b
    kernels.reduce_into(a, b, "sum")
    assert torch.equal(a, expected)


def test_bool_logical_ops():
    a = torch.tensor([0, 0, 1, 1], dtype=torch.bool)
    b = torch.tensor([0, 1, 0, 1], dtype=torch.bool)
    assert kernels.reduce_into(a.clone(), b, "sum").tolist() == [False, True, True, True]
    assert kernels.reduce_into(a.clone(), b, "min").tolist() == [False, False, False, True]
    assert kernels.reduce_into(a.clone(), b, "bxor").tolist() == [False, True, True, False]


def test_avg_then_divide():
    a = torch.full((9,), 6.0, dtype=torch.bfloat16)
    kernels.reduce_into(a, torch.full((9,), 2.0, dtype=torch.bfloat16), "avg")
    kernels.divide_by(a, 2)
    assert a.float().tolist() == [4.0] * 9


def test_rejects_bitwise_on_floats_and_fp8():
    with pytest.raises(Exception, match="bitwise"):
        kernels.reduce_into(torch.ones(3), torch.ones(3), "band")
    q = torch.zeros(3, dtype=torch.float8_e4m3fn)
    with pytest.raises(Exception, match="wire format"):
        kernels.reduce_into(q, q, "sum")
