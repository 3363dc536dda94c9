"""The wire codec: layout, settings, accuracy bounds and a simulated
4-rank sum of compressed contributions (what the inter-island step does)."""
import pytest
import torch

from hcomm import compress, kernels

WIRES = ["bf16", "fp16", "fp8e4m3", "fp8e5m2"]
# Worst-case relative error per element in the format's normal range.
REL = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp8e4m3": 2.0 ** -4, "fp8e5m2": 2.0 ** -3}


def test_parse_and_defaults(monkeypatch):
    monkeypatch.delenv("HCOMM_COMPRESS", raising=False)
    assert compress.resolve() == compress.CompressConfig(None, False, 1024)
    assert not compress.resolve().enabled
    monkeypatch.setenv("HCOMM_COMPRESS", "fp8e4m3:ef")
    monkeypatch.setenv("HCOMM_COMPRESS_CHUNK", "256")
    cfg = compress.resolve()
    assert (cfg.wire, cfg.error_feedback, cfg.chunk) == (torch.float8_e4m3fn, True, 256)
    assert str(cfg) == "fp8e4m3:ef"
    assert compress.resolve("bf16").wire == torch.bfloat16  # a group's own option wins
    for bad in ("fp8", "bf16:xx", "none:ef"):
        with pytest.raises(ValueError):
            compress.parse(bad)


def test_settings_are_declared():
    from hcomm.settings import all_settings
    names = {s.name for s in all_settings()}
    assert {"HCOMM_COMPRESS", "HCOMM_COMPRESS_CHUNK", "HCOMM_KERNEL_ISA", "HCOMM_KERNEL_THREADS"} <= names


@pytest.mark.parametrize("n", [0, 1, 7, 1025])
def test_encoded_size_and_layout(n):
    assert compress.Codec("bf16").encoded_bytes(n) == 2 * n
    c = compress.Codec("fp8e5m2")
    assert c.encoded_bytes(n) == n + 4 * kernels.num_chunks(n, 1024)
    if n:
        x = torch.randn(n)
        wire = c.encode(x)
        q, s = kernels.quantize_fp8(x, "e5m2", 1024)
        nch = kernels.num_chunks(n, 1024)
        assert torch.equal(wire[: 4 * nch].view(torch.float32), s)  # scales first
        assert torch.equal(wire[4 * nch:], q)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_round_trip_bound(wire, src):
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(1)).to(src)
    c = compress.Codec(wire)
    back = c.decode(c.encode(x), x.numel())
    err = (back - x.float()).abs()
    # fp8: the relative bound holds above the scaled format's subnormal range;
    # below it the error is at most half a subnormal step of the chunk scale.
    floor = 2.0 ** -25 if wire == "fp16" else 0.0  # half of fp16's subnormal step
    if wire.startswith("fp8"):
        _, s = kernels.quantize_fp8(x, wire[3:], 1024)
        floor = s.repeat_interleave(1024)[: x.numel()] * (2.0 ** -10 if wire == "fp8e4m3" else 2.0 ** -17)
    assert (err <= torch.clamp(REL[wire] * x.float().abs(), min=floor) * (1 + 1e-6) + 1e-38).all()


@pytest.mark.parametrize("wire", WIRES)
def test_four_rank_compressed_sum(wire):
    # Each simulated rank encodes its contribution; the receiver sums the
    # decoded contributions into an fp32 accumulator with decode_accumulate.
    ranks, n = 4, 65_537
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(n, generator=g) for _ in range(ranks)]
    c = compress.Codec(wire)
    wires = [c.encode(x) for x in xs]
    acc = torch.zeros(n)
    for w in wires:
        c.decode_accumulate(w, acc, "sum")
    exact = torch.stack(xs).double().sum(0)
    # per element: at most the sum of each contribution's own bound
    bound = sum(REL[wire] * x.abs().double() for x in xs) + 1e-6
    assert ((acc.double() - exact).abs() <= bound).all()
    rel = ((acc.double() - exact).norm() / exact.norm()).item()
    assert rel < {"bf16": 3e-3, "fp16": 4e-4, "fp8e4m3": 4e-2, "fp8e5m2": 8e-2}[wire]
    # decode_accumulate equals decode-then-add (same rounding)
    acc2 = torch.zeros(n)
    for w in wires:
        acc2 += c.decode(w, n)
    assert torch.equal(acc, acc2)


def test_error_feedback_residual_is_what_was_not_sent():
    c = compress.Codec("fp8e4m3:ef")
    r = compress.Residual()
    x = torch.randn(3000)
    sent = c.decode(c.encode(x, r), 3000)
    assert torch.equal(torch.tensor(r.values()), x - sent)
    # the next step sends x2 + r; what arrives over two steps is x + x2 minus the new residual
    x2 = torch.randn(3000)
    sent2 = c.decode(c.encode(x2, r), 3000)
    torch.testing.assert_close(sent + sent2 + torch.tensor(r.values()), x + x2, rtol=0, atol=1e-6)


def test_residual_store_keys_and_resize():
    store = compress.ResidualStore()
    a = store.get("g0", 1)
    assert store.get("g0", 1) is a and store.get("g1", 1) is not a
    c = compress.Codec("bf16:ef")
    c.encode(torch.randn(10), a)
    assert a.size == 10
    c.encode(torch.randn(20), a)  # bucket rebuilt: residual restarts at zero
    assert a.size == 20
    store.clear("g0")
    assert len(store) == 1


def test_uncompressed_wire_is_exact():
    c = compress.Codec("none")
    x = torch.randn(1000)
    assert torch.equal(c.decode(c.encode(x), 1000), x)
