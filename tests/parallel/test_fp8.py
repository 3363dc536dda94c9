"""fp8 compute (hcomm/parallel/fp8.py): the fp8 linear against fp32, the swap, training with one
rank in fp8, and the plan rules.

Tolerances.  Rounding to e4m3 moves an element by at most u4 = 2^-4 of itself (3 mantissa bits) and
to e5m2 by u5 = 2^-3, above the scaled format's smallest normal; below it by at most half the
subnormal spacing, scale * 2^-10 (e4m3) or scale * 2^-17 (e5m2).  So, per element of a product
sum_k a_k b_k with rounding errors ea_k, eb_k, the bound
    |got - exact| <= sum_k ea_k (|b_k| + eb_k) + |a_k| eb_k  +  2^-8 |got|   (the bf16 output)
holds always (fp32 accumulation adds ~k 2^-24, far below).  It is loose; for random operands the
errors have random signs and grow like sqrt(k), as the result does, so the relative Frobenius error
is about sqrt((ua^2 + ub^2) / 3) -- a uniform rounding error has rms u / sqrt(3) at most -- whatever k:
0.051 forward (e4m3 x e4m3), 0.081 for the gradients (e5m2 x e4m3).  Measured values in comments.
"""
import math

import pytest
import torch
from torch import nn

from hcomm.parallel import GroupPlan, Plan, PlanError, RankPlan
from hcomm.parallel.fp8 import enable_fp8_linears, fp8_active, fp8_linear, to_fp8
from hcomm.parallel.precision import Precision, check_dtype
from tests.parallel import dp_cases, precision_cases

U4, U5, U_BF16 = 2.0 ** -4, 2.0 ** -3, 2.0 ** -8


def _err(t, dtype):
    """Elementwise rounding-error bound of ``t`` cast with ``to_fp8``."""
    _, scale = to_fp8(t, dtype)
    u, sub = (U4, 2.0 ** -10) if dtype == torch.float8_e4m3fn else (U5, 2.0 ** -17)
    return torch.maximum(u * t.abs(), scale * sub)


def _product_bound(a, ea, b, eb, got):
    """The always-true bound of the module docstring for a @ b."""
    return ea @ (b.abs() + eb) + a.abs() @ eb + U_BF16 * got.abs()


def _rel(a, b):
    return float((a.detach().float() - b).norm() / b.norm())


@pytest.mark.parametrize("n,k,m", [(64, 128, 96), (33, 256, 48)])
def test_fp8_linear_forward_and_backward_within_the_derived_bounds(n, k, m):
    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(n, k, generator=g).requires_grad_()
    w = nn.Parameter(torch.randn(m, k, generator=g) * 0.05)
    up = torch.randn(n, m, generator=g) * 1e-3
    y = fp8_linear(x, w)
    assert y.dtype == torch.bfloat16
    y.backward(up.to(torch.bfloat16))
    assert w.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    exact_y, exact_gx, exact_gw = x.detach() @ w.detach().t(), up @ w.detach(), up.t() @ x.detach()

    xd, wd = x.detach(), w.detach()
    ex, ew, eg = _err(xd, torch.float8_e4m3fn), _err(wd, torch.float8_e4m3fn), _err(up, torch.float8_e5m2)
    # the output gradient reaches backward as bf16 (up.to(bf16)): its own 2^-8 rounding joins e5m2's
    eg = eg + U_BF16 * up.abs()
    assert ((y.float() - exact_y).abs() <= _product_bound(xd, ex, wd.t(), ew.t(), y.float())).all()
    assert ((x.grad - exact_gx).abs() <= _product_bound(up, eg, wd, ew, x.grad)).all()
    assert ((w.grad - exact_gw).abs() <= _product_bound(up.t(), eg.t(), xd, ex, w.grad)).all()
    # statistical: measured 0.037 forward (bound 0.051), 0.058-0.060 for both gradients (bound 0.081)
    print(f"relative errors: forward {_rel(y, exact_y):.3f}, grad_input {_rel(x.grad, exact_gx):.3f}, "
          f"grad_weight {_rel(w.grad, exact_gw):.3f}")
    assert _rel(y, exact_y) < math.sqrt(2 * U4 ** 2 / 3)
    assert _rel(x.grad, exact_gx) < math.sqrt((U4 ** 2 + U5 ** 2) / 3)
    assert _rel(w.grad, exact_gw) < math.sqrt((U4 ** 2 + U5 ** 2) / 3)


def test_all_zero_operands_give_zeros_not_nan():
    x = torch.zeros(4, 32, requires_grad=True)
    w = nn.Parameter(torch.zeros(16, 32))
    y = fp8_linear(x, w)
    y.backward(torch.zeros_like(y))
    for t in (y, x.grad, w.grad):
        assert torch.equal(t.float(), torch.zeros_like(t.float()))
    q, scale = to_fp8(torch.zeros(3), torch.float8_e5m2)
    assert float(scale) == 1.0 and torch.equal(q.float(), torch.zeros(3))


def test_swap_keeps_the_same_fp32_parameters_and_the_head_in_bf16():
    model = precision_cases.build()
    before = {n: p for n, p in model.named_parameters()}
    n_linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert enable_fp8_linears(model) == n_linears - 1      # all but the head
    assert enable_fp8_linears(model) == n_linears - 1      # idempotent
    after = dict(model.named_parameters())
    assert before.keys() == after.keys()
    assert all(after[n] is p and p.dtype == torch.float32 for n, p in before.items())
    assert not getattr(model.head, "_hcomm_fp8", False)
    # outside fp8's context a swapped linear is plain F.linear: fp32 exactly as before
    lin = model.blocks[0].attn.wq
    x = torch.randn(2, lin.in_features)
    assert torch.equal(lin(x), x @ lin.weight.t())
    with fp8_active():
        assert lin(x).dtype == torch.bfloat16


def _train(dtypes, steps, counts=(5, 3, 2), offsets=(0, 5, 8), batch=10):
    """Data parallelism in one process, exactly: each rank's rows under its own dtype, its gradient
    weighted n_r / N and summed in fp32 (what the all-reduce computes), one SGD step; the global loss."""
    model = precision_cases.build()
    precisions = [Precision(d, rank=r, device="H800") for r, d in enumerate(dtypes)]
    for p in precisions:
        p.prepare(model)
    opt = dp_cases.make_optimizer(model.parameters(), "sgd")
    rows = dp_cases.batches(batch).rows
    losses = []
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for p, n, o in zip(precisions, counts, offsets):
            with p.autocast():
                loss = model.loss(rows(step, o, n), reduction="sum") / float(batch * precision_cases.SEQ)
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
    return losses


def test_training_with_one_fp8_rank_tracks_fp32():
    """Rank 1 (3 of 10 rows) computes in fp8, the others in fp32, 5 SGD steps (lr 0.5).  Measured
    relative loss difference per step: 1.9e-5, 2.6e-4, 2.9e-4, 2.1e-4, 8.6e-5.  Step 0 is the forward
    alone: calibrate's end-to-end fp8 loss error (1.3e-4) times the fp8 rank's 30% weight ~ 4e-5; later
    steps add the weights' drift from fp8 gradients.  Bound 2e-3: 7x the largest measurement, the same
    2^-9 the bf16 mixed-precision test allows, and 30x below e4m3's unit roundoff, so a wrong scale or a
    gradient off by a factor (errors of order 1e-1 and more) fails it."""
    ref = _train(["fp32", "fp32", "fp32"], 5)
    fp8 = _train(["fp32", "fp8", "fp32"], 5)
    rel = [abs(a - b) / b for a, b in zip(fp8, ref)]
    print("fp8 vs fp32 relative loss difference per step:", [f"{r:.1e}" for r in rel])
    assert max(rel) < 2e-3
    assert max(rel) > 0          # the fp8 rank really ran fp8


def test_precision_fp8_runs_on_fp8_kinds_only():
    check_dtype(0, "H800", "fp8")
    check_dtype(0, "H100", "fp8")
    with pytest.raises(ValueError, match=r"^ranks\[2\]\.compute_dtype: A100 cannot compute in fp8"):
        check_dtype(2, "A100", "fp8")
    for kind in ("V100", "910B"):
        with pytest.raises(ValueError, match=rf"^ranks\[1\]\.compute_dtype: {kind} cannot compute in fp8"):
            Precision("fp8", rank=1, device=kind)


def _plan(dtypes, devices):
    ranks = [RankPlan(i, 1.0 / len(dtypes), device=dev, compute_dtype=d)
             for i, (d, dev) in enumerate(zip(dtypes, devices))]
    return Plan(8, 16, ranks, [GroupPlan("dp", list(range(len(dtypes))))], name="t")


def test_plan_check_accepts_fp8_on_h800_and_refuses_it_on_a100_naming_the_rank():
    _plan(["bf16", "fp8"], ["H800", "H800"]).validate()
    with pytest.raises(PlanError, match=r"^ranks\[1\]\.compute_dtype: A100 cannot compute in fp8"):
        _plan(["bf16", "fp8"], ["H800", "A100"]).validate()


def test_calibrate_reports_fp8_per_piece(capsys):
    """Each block's fp8 output and input gradient stray from fp32 by about one matmul's error or less
    (the residual stream passes unrounded): measured 1.7e-2-1.9e-2 and 2.2e-2-2.9e-2, bounds the
    per-matmul 0.051 / 0.081 of the module docstring.  The head is bf16 in both, so its row is bf16's."""
    from hcomm.parallel.calibrate import calibrate, main

    result = calibrate(precision_cases.build(), ["bf16", "fp8"], seq_len=16, vocab_size=precision_cases.VOCAB)
    rows = {(r.piece, r.dtype): r for r in result["pieces"]}
    for name in ("blocks.0", "blocks.3"):
        fp8, bf16 = rows[(name, "fp8")], rows[(name, "bf16")]
        assert bf16.output_rel < fp8.output_rel < math.sqrt(2 * U4 ** 2 / 3), name
        assert bf16.input_grad_rel < fp8.input_grad_rel < math.sqrt((U4 ** 2 + U5 ** 2) / 3), name
    assert rows[("head", "fp8")].output_rel == rows[("head", "bf16")].output_rel
    assert main(["--device", "H800", "--dtypes", "fp8", "--seq-len", "8", "--vocab", "128"]) == 0
    assert " fp8 " in capsys.readouterr().out
    assert main(["--device", "A100", "--dtypes", "fp8"]) == 2
    assert "A100 cannot compute in fp8" in capsys.readouterr().err


def test_plan_check_refuses_fp8_with_tensor_parallelism_naming_the_rank():
    ranks = [RankPlan(0, 0.6, tp_group=0, tp_fraction=0.75), RankPlan(1, 0.0, tp_group=0, tp_fraction=0.25,
                                                                    device="H800", compute_dtype="fp8"),
             RankPlan(2, 0.4, tp_group=1, tp_fraction=0.75), RankPlan(3, 0.0, tp_group=1, tp_fraction=0.25)]
    groups = [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [2, 3])]
    with pytest.raises(PlanError, match=r"^ranks\[1\]\.compute_dtype: fp8 runs on plain data parallelism"):
        Plan(10, 16, ranks, groups, name="tp").validate()


def test_fp8_autocast_without_prepare_is_refused_naming_the_rank(monkeypatch):
    from hcomm.parallel import fp8

    monkeypatch.setattr(fp8, "_SWAPPED", [0])   # a process that never swapped a linear
    with pytest.raises(RuntimeError, match=r"^ranks\[3\]\.compute_dtype: fp8 needs Precision.prepare"):
        with Precision("fp8", rank=3, device="H800").autocast():
            pass


def test_fallback_when_torch_refuses_the_fp8_product(monkeypatch):
    """Where ``_scaled_mm`` refuses (a CUDA layout or dtype pairing), a bf16 matmul of the same fp8 values:
    equal up to the bf16 rounding of the product (the fp8 values are exact in bf16), twice u_bf16 = 2^-7
    relative per element; measured 0 to a few 1e-3."""
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g)
    fast = fp8_linear(x, w).float()

    def refuse(*args, **kwargs):
        raise RuntimeError("refused")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    slow = fp8_linear(x, w).float()
    assert ((slow - fast).abs() <= 2 * U_BF16 * fast.abs() + 1e-6).all()
