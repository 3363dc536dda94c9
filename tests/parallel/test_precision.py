"""Per-device precision (hcomm/parallel/precision.py): the loss-scale policy, dtype checks, the plan
rules, loss scaling unscaled inside the gradient all-reduce, mixed-dtype training against a
single fp32 process, and a skipped step after an injected overflow.

The multi-process tests run 3 ranks of a bare pool (tests/parallel/precision_cases.py) on the
``tiny`` model (vocab 97) and dp_cases' global batches, shares 0.5 / 0.3 / 0.2 of 10 rows (5, 3 and
2 samples of 16 tokens), ranks computing in fp32 / bf16 / fp16.
"""
import math

import numpy as np
import pytest
import torch

from hcomm.parallel import GroupPlan, Plan, PlanError, RankPlan
from hcomm.parallel.precision import LossScale, Precision, check_dtype, per_device_dtypes
from tests.parallel import precision_cases

S = 2.0 ** 16
SHARES, BATCH = [0.5, 0.3, 0.2], 10
COUNTS, OFFSETS = [5, 3, 2], [0, 5, 8]
DTYPES = ["fp32", "bf16", "fp16"]
STEPS = 5


# --- the loss-scale policy (torch GradScaler's defaults) ------------------------------

def test_loss_scale_defaults_are_grad_scalers():
    ls = LossScale()
    assert (ls.scale, ls.growth_factor, ls.backoff_factor, ls.growth_interval) == (65536.0, 2.0, 0.5, 2000)


def test_loss_scale_halves_on_overflow_and_resets_good_steps():
    ls = LossScale(growth_interval=3)
    ls.update(False)
    ls.update(False)
    assert (ls.scale, ls.good_steps) == (65536.0, 2)
    ls.update(True)
    assert (ls.scale, ls.good_steps) == (32768.0, 0)
    ls.update(True)
    assert (ls.scale, ls.good_steps) == (16384.0, 0)
    # the two good steps before the overflow no longer count: three more are needed to grow
    ls.update(False)
    ls.update(False)
    assert ls.scale == 16384.0
    ls.update(False)
    assert (ls.scale, ls.good_steps) == (32768.0, 0)


def test_loss_scale_doubles_after_growth_interval_good_steps():
    ls = LossScale()
    for _ in range(1999):
        ls.update(False)
    assert (ls.scale, ls.good_steps) == (65536.0, 1999)
    ls.update(False)
    assert (ls.scale, ls.good_steps) == (131072.0, 0)
    for _ in range(2000):
        ls.update(False)
    assert ls.scale == 262144.0


# --- dtypes per device ------------------------------------------------------------------

def test_check_dtype_names_rank_and_device():
    with pytest.raises(ValueError) as info:
        check_dtype(3, "V100", "bf16")
    msg = str(info.value)
    assert msg.startswith("ranks[3].compute_dtype: V100 cannot compute in bf16")
    assert "it supports fp32, fp16" in msg
    check_dtype(3, "V100", "fp16")
    check_dtype(0, "a100", "bf16")   # device names are case-insensitive
    check_dtype(0, "", "bf16")       # no device given: nothing to check against


def test_check_dtype_refuses_fp8_where_missing_and_unknown_dtypes_and_devices():
    check_dtype(1, "H100", "fp8")   # fp8 where the kind has it (tests/parallel/test_fp8.py)
    with pytest.raises(ValueError, match=r"^ranks\[1\]\.compute_dtype: A100 cannot compute in fp8"):
        check_dtype(1, "A100", "fp8")
    with pytest.raises(ValueError, match=r"^ranks\[2\]\.compute_dtype: 'int8' is not one of fp32, bf16, fp16, fp8$"):
        check_dtype(2, "A100", "int8")
    with pytest.raises(ValueError, match="unknown device kind 'TPU'"):
        check_dtype(0, "TPU", "bf16")


def test_per_device_dtypes():
    assert per_device_dtypes(["A100", "V100", "910B", "H800", "CPU"]) == ["bf16", "fp16", "bf16", "bf16", "bf16"]
    assert per_device_dtypes([]) == []


def test_precision_scale_and_refusal():
    assert Precision("fp16").scale == 65536.0
    assert Precision("bf16").scale == 1.0 and Precision("bf16").loss_scale is None
    assert Precision("fp32").scale == 1.0
    with pytest.raises(ValueError, match=r"ranks\[2\]\.compute_dtype: V100 cannot compute in bf16"):
        Precision("bf16", rank=2, device="V100")
    with pytest.raises(ValueError, match=r"ranks\[0\]\.compute_dtype: V100 cannot compute in fp8"):
        Precision("fp8", device="V100")


@pytest.mark.parametrize("dtype, torch_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                                ("fp16", torch.float16)])
def test_precision_autocast_lowers_matmuls_only(dtype, torch_dtype):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with Precision(dtype).autocast():
        assert (a @ b).dtype == torch_dtype
    assert (a @ b).dtype == torch.float32   # nothing leaks out of the context


def test_overflow_flag_single_rank_group(tmp_path):
    """The overflow decision on a world of one (gloo): non-finite anywhere -> skip and halve; None grads are
    ignored; the good-step count restarts."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("this process already has a default group")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        p = Precision("fp16")
        assert p.overflow([torch.ones(3), None], dist.group.WORLD) is False
        assert (p.scale, p.loss_scale.good_steps, p.skipped_steps) == (S, 1, 0)
        assert p.overflow([torch.ones(3), torch.tensor([1.0, math.inf])], dist.group.WORLD) is True
        assert (p.scale, p.loss_scale.good_steps, p.skipped_steps) == (S / 2, 0, 1)
        assert p.overflow([torch.tensor([math.nan])], dist.group.WORLD) is True
        assert (p.scale, p.skipped_steps) == (S / 4, 2)
        q = Precision("bf16")
        assert q.overflow([torch.tensor([math.nan])], dist.group.WORLD) is True
        assert (q.scale, q.skipped_steps) == (1.0, 1)
    finally:
        dist.destroy_process_group()


# --- plan rules (no processes) ------------------------------------------------------------

def _plan(dtypes, devices=None, backend="hcomm", zero_stage=0, sync_every=1):
    devices = devices or [""] * len(dtypes)
    n = len(dtypes)
    ranks = [RankPlan(i, 1.0 / n, device=d, compute_dtype=t, zero_stage=zero_stage)
             for i, (t, d) in enumerate(zip(dtypes, devices))]
    return Plan(8, 16, ranks, [GroupPlan("dp", list(range(n)), sync_every=sync_every)], backend=backend,
                name="t")


def test_plan_per_device_dtypes_validate():
    _plan(["bf16", "fp16", "fp32", "bf16"], ["A100", "V100", "CPU", "910B"]).validate(4)


def test_plan_refuses_dtype_the_device_lacks():
    with pytest.raises(PlanError) as info:
        _plan(["bf16", "bf16", "bf16"], ["A100", "A100", "V100"]).validate()
    assert str(info.value).startswith("ranks[2].compute_dtype: V100 cannot compute in bf16")
    with pytest.raises(PlanError, match=r"^ranks\[0\]\.compute_dtype: A100 cannot compute in fp8"):
        _plan(["fp8", "fp32"], ["A100", "A100"]).validate()
    with pytest.raises(PlanError, match=r"^ranks\[1\]\.compute_dtype: must be one of fp32, bf16, fp16, fp8, "
                                        r"got 'fp64'"):
        _plan(["fp32", "fp64"]).validate()


def test_plan_from_yaml_names_the_rank():
    text = ("global_batch: 8\nseq_len: 16\nranks:\n"
            "- {rank: 0, batch_share: 0.5, device: A100, compute_dtype: bf16}\n"
            "- {rank: 1, batch_share: 0.5, device: V100, compute_dtype: bf16}\n")
    with pytest.raises(PlanError, match=r"^ranks\[1\]\.compute_dtype: V100 cannot compute in bf16"):
        Plan.from_yaml(text).validate()


SYNC_DP_ONLY = r"^ranks\[1\]\.compute_dtype: bf16 runs on hcomm's synchronous data parallelism and pipelines"


@pytest.mark.parametrize("change", ["zero", "sync_every", "ddp-gloo", "fsdp2-gloo"])
def test_low_precision_only_on_synchronous_hcomm_dp(change):
    dtypes = ["fp32", "bf16"]
    fp32 = {"zero": dict(zero_stage=1), "sync_every": dict(sync_every=2), "ddp-gloo": dict(backend="ddp-gloo"),
            "fsdp2-gloo": dict(backend="fsdp2-gloo", zero_stage=2)}[change]
    _plan(["fp32", "fp32"], **fp32).validate()   # the same plan in fp32 is fine
    with pytest.raises(PlanError, match=SYNC_DP_ONLY):
        _plan(dtypes, **fp32).validate()


def test_low_precision_runs_with_a_pipeline():
    """Pipelines take per-device dtypes (stages cast their boundaries to fp32; test_pipeline_train.py
    trains one); a dtype the device kind lacks is still refused there."""
    from tests.parallel.test_plan import pipeline_plan

    plan = pipeline_plan()
    plan.ranks[1].compute_dtype = "bf16"
    plan.validate()
    plan.ranks[1].device = "V100"
    with pytest.raises(PlanError, match=r"ranks\[1\]\.compute_dtype: V100 cannot compute in bf16"):
        plan.validate()


def _view(devices):
    from tests.parallel.test_plan_pipeline import view

    v = view([1.0] * len(devices))
    v.devices = list(devices)
    return v


def test_make_plans_per_device_precision():
    from hcomm.train.cli import parse
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", "--plan", "auto@precision=per-device,auto,uniform"])
    per_device, auto, uniform = make_plans(args, _view(["A100", "A100", "V100", "V100"]))
    assert [r.compute_dtype for r in per_device.ranks] == ["bf16", "bf16", "fp16", "fp16"]
    assert [r.device for r in per_device.ranks] == ["A100", "A100", "V100", "V100"]
    note = [n for n in per_device.notes if n.startswith("per-device precision:")]
    assert note == ["per-device precision: rank 0 A100 bf16, rank 1 A100 bf16, rank 2 V100 fp16, rank 3 V100 fp16; "
                    "fp32 parameters, optimizer state and gradient reduction; fp16 ranks scale the loss"]
    assert [r.compute_dtype for r in auto.ranks] == ["fp32"] * 4
    assert [r.compute_dtype for r in uniform.ranks] == ["fp32"] * 4
    assert Plan.from_yaml(per_device.to_yaml()) == per_device


def test_cli_precision_flag_reaches_auto_and_equal_only():
    from hcomm.train.cli import parse
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", "--precision", "per-device", "--plan", "auto,equal,uniform,auto@precision=fp32"])
    assert args.precision == "per-device"
    plans = make_plans(args, _view(["H800", "910B", "V100", "CPU"]))
    assert [[r.compute_dtype for r in p.ranks] for p in plans] == [
        ["bf16", "bf16", "fp16", "bf16"], ["bf16", "bf16", "fp16", "bf16"], ["fp32"] * 4, ["fp32"] * 4]
    assert parse(["--model", "tiny"]).precision == "fp32"


def test_cli_precision_choices(capsys):
    from hcomm.train.cli import parse

    with pytest.raises(SystemExit):
        parse(["--precision", "bf16"])
    assert "argument --precision: invalid choice: 'bf16'" in capsys.readouterr().err


def test_parse_entry_precision_pins():
    from hcomm.train.plans import parse_entry

    assert parse_entry("auto@precision=per-device") == ("auto", {"precision": "per-device"})
    assert parse_entry("equal@precision=fp32") == ("equal", {"precision": "fp32"})
    assert parse_entry("auto@precision=fp8") == ("auto", {"precision": "fp8"})
    with pytest.raises(ValueError, match=r"--plan auto@precision=fp64: precision must be fp32, per-device, fp8 or "
                                         r"search, got 'fp64'"):
        parse_entry("auto@precision=fp64")
    # uniform is torch DDP: the general pin rule refuses it first
    with pytest.raises(ValueError, match=r"--plan uniform@precision=per-device: .*apply to auto and equal"):
        parse_entry("uniform@precision=per-device")


# --- multi-process ------------------------------------------------------------------------

def test_grad_scale_is_unscaled_inside_the_reduction(pool3):
    """Rank 1 runs backward on loss * 2^16 and rank 2 on loss * 2^10, each with GradSync.grad_scale set to
    its S: the reduced gradient and the carried global loss equal the unscaled run's BIT FOR BIT.

    Why exact: multiplying by a power of two commutes with IEEE rounding (barring overflow and
    subnormals, neither of which this model's gradients reach), so backward of loss*S produces exactly
    S*g in every element; the bucket is then multiplied by fl32(w/S) = fl32(w)/S, giving fl32(g*fl32(w))
    as with S = 1.  The loss slot is fl32(l*S)*fl32(w)/S = fl32(fl32(l)*fl32(w)).  (The brief allowed
    1 ulp; none is needed.)"""
    results = pool3.run(precision_cases.case_grad_scale, COUNTS, [1.0, S, 2.0 ** 10])
    for (plain, plain_loss), (scaled, scaled_loss) in results:
        assert np.isfinite(plain).all() and np.abs(plain).max() > 0
        np.testing.assert_array_equal(scaled, plain)
        assert scaled_loss == plain_loss
    # and every rank holds the same reduced gradient and loss
    for (plain, loss), _ in results[1:]:
        np.testing.assert_array_equal(plain, results[0][0][0])
        assert loss == results[0][0][1]
    # the global loss is the sample-weighted mean of the ranks' losses (fp32 sum of 3 terms)
    local = precision_cases.local_losses(BATCH, COUNTS, OFFSETS, ["fp32"] * 3)
    assert results[0][0][1] == pytest.approx(sum(n / BATCH * l for n, l in zip(COUNTS, local)), rel=1e-6)


def _mixed_plan(dtypes=DTYPES):
    plan = Plan.from_shares(SHARES, BATCH, precision_cases.SEQ, name="mixed")
    for r, dtype in zip(plan.ranks, dtypes):
        r.compute_dtype = dtype
    return plan.validate(3)


def _same_params_on_every_rank(results):
    for step in range(len(results[0]["params"])):
        for r in results[1:]:
            np.testing.assert_array_equal(r["params"][step], results[0]["params"][step])


# Measured (tiny model, 5 steps, shares 5/3/2 rows in fp32/bf16/fp16) max relative difference of the
# global loss from the single fp32 process: SGD 1.1e-4, AdamW 6.2e-5 (6.8e-4 if run a 6th step).
LOSS_RTOL = 2.0 ** -9


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_mixed_precision_tracks_single_fp32_process(pool3, optimizer):
    """fp32 / bf16 / fp16 ranks under ``parallelize`` follow the single fp32 process's losses.

    Tolerance: bf16's unit roundoff is u = 2^-8 ~ 3.9e-3 (fp16's 2^-11).  A forward error bound
    that adds every rounding of the matmuls' inputs and outputs is useless here (~0.1 absolute on a
    loss of 4.6); in practice the roundings are independent and average out over the 48 tokens x
    97 logits of the rank's loss: the bf16 rank's own step-0 loss moves by 2.2e-5 relative and the
    global loss (it weighs 0.3) by 7e-6.  Later steps add the gradients' error (again ~u per bf16
    element, weighted 0.3), which SGD accumulates to 1.1e-4 in 5 steps; AdamW's per-element
    normalisation lets tiny, badly rounded gradient elements move by up to lr (6.2e-5 in 5 steps,
    but 6.8e-4 at a 6th).  Bound: u/2 = 2^-9 ~ 2e-3 on every step's relative difference, 18x the
    SGD measurement and 3x AdamW's 6th step.
    The runs do differ (autocast is active): each rank's step-0 local loss is the one computed here
    under autocast in its own dtype, differs from fp32 by far more than fp32 rounding (bf16 more than
    fp16), and the fp32 rank's equals fp32."""
    ref = precision_cases.reference(BATCH, STEPS, optimizer)
    results = pool3.run(precision_cases.case_train, _mixed_plan().to_yaml(), STEPS, optimizer)
    assert [r["dtype"] for r in results] == DTYPES
    for r in results:
        assert r["param_dtypes"] == ["torch.float32"] and r["grad_dtypes"] == ["torch.float32"]
        assert r["skipped"] == [False] * STEPS and r["skipped_steps"] == 0
        assert r["global_loss"] == results[0]["global_loss"]
    assert [r["loss_scale"] for r in results] == [[1.0] * STEPS, [1.0] * STEPS, [S] * STEPS]
    losses = np.array(results[0]["global_loss"])
    rel = np.abs(losses - ref) / np.abs(ref)
    assert rel.max() <= LOSS_RTOL, rel
    assert rel.max() > 1e-6, rel   # not the fp32 run
    _same_params_on_every_rank(results)

    # step 0: each rank's loss is its own dtype's
    fp32 = precision_cases.local_losses(BATCH, COUNTS, OFFSETS, ["fp32"] * 3)
    mine = precision_cases.local_losses(BATCH, COUNTS, OFFSETS, DTYPES)
    got = [r["local_loss"][0] for r in results]
    np.testing.assert_allclose(got, mine, rtol=0, atol=1e-6)
    dev = [abs(g - f) for g, f in zip(got, fp32)]
    assert dev[0] <= 1e-6          # fp32: the same computation
    assert dev[1] > 2e-5           # bf16: measured 1.0e-4
    # fp16 moved the loss of its 2 rows by 6.2e-6 on one CPU and by exactly 0 on another (its
    # roundings happened to cancel): the matmuls' output dtype is the proof that autocast was on.
    assert [r["matmul_dtypes"] for r in results] == [["torch.float32"], ["torch.bfloat16"], ["torch.float16"]]
    assert dev[1] > dev[2]         # 8 bits of mantissa lose more than 11


BAD_STEP = 2


@pytest.mark.parametrize("bad_rank", [2, 0], ids=["fp16-rank", "fp32-rank"])
def test_injected_overflow_skips_the_step_on_every_rank(pool3, bad_rank):
    """At step 2 one rank's first block outputs inf (a forward hook): every rank skips that step and
    only that one, its parameters and AdamW state stay as they were, the fp16 rank's loss scale halves
    (whichever rank overflowed: the decision is one for all), and training goes on finite with every
    rank's parameters bitwise equal."""
    steps = 4
    results = pool3.run(precision_cases.case_train, _mixed_plan().to_yaml(), steps, "adamw", bad_rank, BAD_STEP)
    expected_skips = [step == BAD_STEP for step in range(steps)]
    for r in results:
        assert r["skipped"] == expected_skips
        assert r["skipped_steps"] == 1
        assert r["optimizer_steps"] == [steps - 1]      # AdamW's step count: the skipped step never reached it
        np.testing.assert_array_equal(r["params"][BAD_STEP], r["params"][BAD_STEP - 1])
        assert not np.array_equal(r["params"][BAD_STEP + 1], r["params"][BAD_STEP])
        g = r["global_loss"]
        assert math.isnan(g[BAD_STEP])
        assert all(math.isfinite(x) for i, x in enumerate(g) if i != BAD_STEP)
        assert all(np.isfinite(p).all() for p in r["params"])
    assert not math.isfinite(results[bad_rank]["local_loss"][BAD_STEP])
    fp16 = results[2]
    assert fp16["loss_scale"] == [S, S, S, S / 2]
    assert fp16["final_scale"] == S / 2
    assert results[0]["loss_scale"] == results[1]["loss_scale"] == [1.0] * steps
    _same_params_on_every_rank(results)
