"""Pipeline parallelism end to end: planned pipelines train the same losses as data parallelism, and
the runtime's explicit-order path (devices in any order, 1F1B with fewer micro-batches than stages)
equals a single process.

1. ``hcomm train --local`` on 4 unshaped local ranks, the tiny model (7 pieces), one run comparing
   ``--pp 2`` auto and uniform, ``auto@pp=4``, the pinned ``auto@pp=2@schedule=gpipe``, interleaved,
   4-stage 1F1B with 2 micro-batches, the parameter split, and ``uniform@pp=1`` (torch DDP over
   gloo, no pipeline) as the reference.  Every plan runs the same global batches from the same seed
   in fp32, so the per-step global losses must agree: a pipeline only regroups the sum over the
   batch's tokens (micro-batches, replicas weighted n_r/N) and hands activations between ranks
   unchanged, so the losses differ by summation order only (~1e-8 relative observed; AdamW's first
   steps are sign-like, m/sqrt(v), so that does not grow over a few steps).  We allow 1e-4 relative,
   as tests/train/test_train_local.py does for auto against uniform.

2. ``Pipeline(..., positions=...)`` over a pool of 3 ranks (the cases of test_pipeline_runtime.py:
   9-piece model, SGD, 4 steps), compared with the single process within that file's derived
   tolerances (2e-5 absolute on parameters, 1e-5 relative on losses).
"""
from __future__ import annotations


import pytest

from tests.helpers.mp import Pool
from tests.parallel import test_pipeline_runtime as rt
from tests.parallel.train_runs import assert_reference_losses, plan_local, train_local

STEPS = 3
LOSS_REL = 1e-4

# With --pp 2 on the command line: auto and uniform pipeline; the pins pick the other variants.
PLANS = ["auto", "uniform", "auto@pp=4", "auto@pp=2@schedule=gpipe", "auto@schedule=interleaved-1f1b",
         "auto@pp=4@schedule=1f1b@microbatches=2", "auto@split=parameters", "uniform@pp=1",
         "auto@precision=per-device"]
MIXED = "auto@precision=per-device"   # A100 stages bf16, V100 stages fp16 (shared loss scale): not exact
MIXED_REL = 2.0 ** -9                 # half bf16's unit roundoff, as tests/parallel/test_precision.py derives
REFERENCE = "uniform@pp=1"


# ------------------------------------------------------------------ 1. the trainer

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_local(tmp_path_factory.mktemp("pp-train"), PLANS, STEPS, "--pp", "2")


def test_every_pipeline_plan_trains_the_reference_losses(trained):
    runs, _ = trained
    assert sorted(runs) == sorted(PLANS)
    assert not any(g["name"].startswith("pp:") for g in runs[REFERENCE]["plan"]["groups"])
    assert_reference_losses(runs, REFERENCE, STEPS, lambda name: MIXED_REL if name == MIXED else LOSS_REL)


def test_pipeline_stages_compute_in_their_devices_dtypes(trained):
    """Per-device precision across pipeline stages: each rank's dtype is its device kind's best, the
    boundaries carry fp32, the fp16 stages' loss scale is shared by every rank (the loss is scaled on
    the last stage), no step is skipped, and autocast really ran (the losses are not bitwise fp32's)."""
    runs, _ = trained
    run = runs[MIXED]
    dtypes = [r.get("compute_dtype", "fp32") for r in run["plan"]["ranks"]]
    assert dtypes == ["bf16", "bf16", "fp16", "fp16"]   # the local ranks carry the default preset's kinds
    assert all(not s["skipped"] and s["loss_scales"] == [65536.0] * 4 for s in run["steps"])
    ref = [s["loss"] for s in runs[REFERENCE]["steps"]]
    assert [s["loss"] for s in run["steps"]] != ref


def _pipes(run):
    return [g for g in run["plan"]["groups"] if g["name"].startswith("pp:")]


def test_the_plans_are_the_pipelines_asked_for(trained):
    from hcomm.parallel.plan import Plan

    runs, stdout = trained
    for name, run in runs.items():
        if name == REFERENCE:
            continue
        plan = Plan.from_dict(run["plan"])   # validates
        depth = 4 if "pp=4" in name else 2
        pipes = plan.pipeline_groups()
        assert len(pipes) == 4 // depth and all(len(g.ranks) == depth for g in pipes), name
        counts = plan.batch_counts()
        for g in pipes:
            assert counts[g.ranks[0]] % g.micro_batches == 0, name
            # every rank of a replica runs the replica's rows
            assert [run["counts"][r] for r in g.ranks] == [counts[g.ranks[0]]] * depth, name
    assert {g.schedule for g in _plan(runs, "auto@pp=2@schedule=gpipe")} == {"gpipe"}
    assert {(g.schedule, g.virtual_stages) for g in _plan(runs, "auto@schedule=interleaved-1f1b")} == {
        ("interleaved-1f1b", 2)}
    assert {(g.schedule, g.micro_batches) for g in _plan(runs, "auto@pp=4@schedule=1f1b@microbatches=2")} == {
        ("1f1b", 2)}
    uniform = _plan(runs, "uniform")
    assert [g.ranks for g in uniform] == [[0, 1], [2, 3]] and {g.schedule for g in uniform} == {"1f1b"}
    assert "plan 'auto@pp=4'" in stdout


def _plan(runs, name):
    from hcomm.parallel.plan import Plan

    return Plan.from_dict(runs[name]["plan"]).pipeline_groups()


# ------------------------------------------------------------------ 2. the runtime with positions

def case_placed(ctx, k, ranges, schedule, n_mb, virtual, positions, steps):
    """A k-rank pipeline over ranks [0, k) with ``positions``; (losses, params, schedule run, local stages)."""
    import torch

    from hcomm.parallel.pipeline.runtime import Pipeline

    if not ctx.in_group(k):
        return None
    model = rt.build()
    pipe = Pipeline(model, ranges, ctx.groups[k][1], schedule=schedule, n_microbatches=n_mb,
                    virtual_stages=virtual, positions=positions)
    opt = torch.optim.SGD(pipe.parameters(), lr=rt.LR)
    data = rt.dp_cases.batches(rt.BATCH)
    losses = []
    for step in range(steps):
        losses.append(pipe.step(data.global_batch_rows(step)).loss)
        opt.step()
    pipe.close()
    return (losses, rt._named_local(model, pipe)), pipe.schedule_name, pipe.stage_indices


@pytest.fixture(scope="module")
def pool():
    p = Pool(3, setup="groups", env={"HCOMM_PROFILE": "off", "OMP_NUM_THREADS": "1"})
    yield p
    p.close()


PLACED = {
    # k, ranges, schedule, micro-batches, virtual stages, positions, schedule that runs
    "2 ranks reversed, 1f1b": (2, rt.RANGES[2], "1f1b", 4, 1, [1, 0], "custom"),
    "2 ranks reversed, gpipe": (2, rt.RANGES[2], "gpipe", 2, 1, [1, 0], "custom"),
    "3 ranks rotated, 1f1b": (3, rt.RANGES[3], "1f1b", 4, 1, [2, 0, 1], "custom"),
    "2 ranks reversed, interleaved": (2, rt.VIRTUAL_RANGES[2], "interleaved-1f1b", 4, 2, [1, 0], "custom"),
    "1f1b, 1 micro-batch on 2 stages": (2, rt.RANGES[2], "1f1b", 1, 1, [0, 1], "custom"),
    "1f1b, 2 micro-batches on 3 stages": (3, rt.RANGES[3], "1f1b", 2, 1, [0, 1, 2], "custom"),
    "1f1b, 2 micro-batches on 3 stages, rotated": (3, rt.RANGES[3], "1f1b", 2, 1, [1, 2, 0], "custom"),
    "identity positions keep torch's class": (2, rt.RANGES[2], "1f1b", 2, 1, [0, 1], "1f1b"),
}


@pytest.mark.parametrize("name", list(PLACED))
def test_placed_pipeline_equals_single_process(pool, name):
    k, ranges, schedule, n_mb, virtual, positions, runs_as = PLACED[name]
    ref_losses, ref_params = rt.reference(rt.BATCH)
    results = pool.run(case_placed, k, ranges, schedule, n_mb, virtual, positions, rt.STEPS)
    mine = [r for r in results if r is not None]
    assert len(mine) == k
    rt._check([r[0] for r in mine], ref_losses, ref_params)
    for rank, (_, ran, stages) in enumerate(mine):
        assert ran == runs_as
        # stage s runs at position s % k, i.e. on group rank positions[s % k]
        assert stages == [s for s in range(len(ranges)) if positions[s % k] == rank], (rank, stages)


def test_positions_must_list_every_rank_once():
    from hcomm.parallel.pipeline.runtime import _placed_order

    with pytest.raises(ValueError, match=r"positions must list each of the group's 2 ranks once, got \[1, 1\]"):
        _placed_order("1f1b", 2, 2, 4, 1, [1, 1])
    with pytest.raises(ValueError, match=r"interleaved on 2 ranks cannot run 5 micro-batches"):
        _placed_order("interleaved", 4, 2, 5, 2, [1, 0])
    assert _placed_order("gpipe", 2, 2, 2, 1, [0, 1]) is None
    order = _placed_order("1f1b", 2, 2, 1, 1, [0, 1])
    assert order == {0: [(0, "F", 0), (0, "B", 0)], 1: [(1, "F", 0), (1, "B", 0)]}


def test_a_saved_pipeline_plan_runs_as_planned(tmp_path):
    """Plan to runtime round trip: ``hcomm plan --save-plan`` writes the pipeline plan as YAML, ``hcomm
    train --plan FILE`` runs exactly that plan (the run's plan equals the file's) and trains the DDP
    reference's losses."""
    from hcomm.parallel.plan import Plan

    path = tmp_path / "pp.yaml"
    stdout = plan_local(tmp_path, "--pp", "2", "--save-plan", str(path))
    assert f"wrote plan 'auto' to {path}" in stdout
    saved = Plan.load(str(path))
    assert len(saved.pipeline_groups()) == 2
    runs, _ = train_local(tmp_path, [str(path), REFERENCE], 2)
    ran = runs[saved.name]
    assert Plan.from_dict(ran["plan"]) == saved
    want = [s["loss"] for s in runs[REFERENCE]["steps"]]
    assert [s["loss"] for s in ran["steps"]] == pytest.approx(want, rel=LOSS_REL)
