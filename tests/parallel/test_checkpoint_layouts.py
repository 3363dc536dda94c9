"""A checkpoint of ``hcomm train`` (``train.checkpoint``) is layout-free: written by a pipeline's stages, it
loads into other cuts, another device order, replicas with other rows, or data parallelism -- and back;
written by TP groups, alone or as pipeline stages (through the reference layout, ``tensor.checkpoint``),
into other fractions and member orders, or data parallelism -- and back; written by ZeRO ranks (each its
uneven ranges), into other fractions and another stage.

On pools of 3 and 4 ranks (the 9-piece model of test_pipeline_runtime.py), plan A trains 3 steps and
every rank saves; a fresh model (its parameters zeroed: only the files can train it) is built under
plan B, loads the checkpoint and trains 3 more.  Every optimizer state a rank steps under plan B
equals the one plan A's owner had, bit for bit (DCP copies bytes; where either plan has TP shards the
shapes differ and the names are checked), so the losses and parameters are
those of one process on the whole batches within test_pipeline_recut.py's bounds (SGD with momentum:
parameters 2e-5 absolute, losses 1e-5 relative; AdamW: losses 1e-4 relative), which a lost moment
or a stale piece exceeds by orders of magnitude.
"""
from __future__ import annotations

import pytest

from hcomm.parallel.plan import GroupPlan, Plan, RankPlan
from tests.parallel import recut_cases
from tests.parallel.test_pipeline_recut import BATCH, ONE_A, ONE_B, STEPS, SWITCH, TWO_A, TWO_B, _check
from tests.parallel.test_tensor_reshard import A as TP_A, B as TP_B

DP3 = Plan(BATCH, 16, [RankPlan(0, 0.25), RankPlan(1, 0.5), RankPlan(2, 0.25)],
           [GroupPlan("dp", [0, 1, 2])], name="dp3").validate(3)
# stage 0 = TP group [0, 1] (0.6 / 0.4) on pieces [0, 4), stage 1 = TP group [2, 3] (0.5 / 0.5) on [4, 9)
PPTP = Plan(BATCH, 16, [RankPlan(0, 1.0, stage=0, layers=(0, 4), tp_group=0, tp_fraction=0.6),
                        RankPlan(1, 0.0, stage=0, layers=(0, 4), tp_group=0, tp_fraction=0.4),
                        RankPlan(2, 0.0, stage=1, layers=(4, 9), tp_group=1, tp_fraction=0.5),
                        RankPlan(3, 0.0, stage=1, layers=(4, 9), tp_group=1, tp_fraction=0.5)],
            [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [2, 3]),
             GroupPlan("pp:0", [0, 2], micro_batches=2, cuts=[0, 4, 9]),
             GroupPlan("pp:1", [1, 3], micro_batches=2, cuts=[0, 4, 9])], name="pptp").validate(4)
ZERO_A = Plan.from_shares([0.25, 0.5, 0.25], BATCH, 16, name="zero-2")
ZERO_B = Plan.from_shares([0.5, 0.25, 0.25], BATCH, 16, name="zero-1")
for _plan, _stage, _fractions in ((ZERO_A, 2, [0.2, 0.5, 0.3]), (ZERO_B, 1, [0.6, 0.0, 0.4])):
    for _r, _f in zip(_plan.ranks, _fractions):
        _r.zero_stage, _r.shard_fraction = _stage, _f
    _plan.validate(3)
DP4 = Plan(BATCH, 16, [RankPlan(0, 0.125), RankPlan(1, 0.375), RankPlan(2, 0.25), RankPlan(3, 0.25)],
           [GroupPlan("dp", [0, 1, 2, 3])], name="dp4").validate(4)


def _run(pool, a: Plan, b: Plan, kind: str, tmp_path):
    return pool.run(recut_cases.case_restage, a.to_yaml(), b.to_yaml(), STEPS, SWITCH, kind, "checkpoint",
                    str(tmp_path / "ckpt"))


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_pipeline_checkpoint_loads_into_other_cuts(pool3, kind, tmp_path):
    results = _run(pool3, ONE_A, ONE_B, kind, tmp_path)
    _check(results, kind)
    assert all(n.startswith("blocks.3.") for n in results[2][3])   # plan B's cuts, not plan A's
    # each parameter written once: the files hold the whole model, not three stale copies
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(tmp_path / "ckpt" / f"step-{SWITCH}")).read_metadata().state_dict_metadata
    params = [k for k in keys if k.startswith("model.")]
    assert len(params) == len(set(params)) == len(recut_cases.rt.build().state_dict())


def test_replicas_checkpoint_loads_into_other_cuts_and_rows(pool4, tmp_path):
    _check(_run(pool4, TWO_A, TWO_B, "sgd", tmp_path), "sgd")


@pytest.mark.parametrize("a,b", [(ONE_A, DP3), (DP3, ONE_B)], ids=["pipeline-to-dp", "dp-to-pipeline"])
def test_a_checkpoint_moves_between_a_pipeline_and_data_parallelism(pool3, a, b, tmp_path):
    results = _run(pool3, a, b, "adamw", tmp_path)
    _check(results, "adamw")
    if b is DP3:
        assert all(len(r[3]) == len(recut_cases.rt.build().state_dict()) for r in results)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_tp_checkpoint_loads_into_other_fractions_and_member_order(pool4, kind, tmp_path):
    _check(_run(pool4, TP_A, TP_B, kind, tmp_path), kind)


@pytest.mark.parametrize("a,b", [(TP_A, DP4), (DP4, TP_B), (PPTP, DP4), (TP_A, PPTP)],
                         ids=["tp-to-dp", "dp-to-tp", "pipeline-of-tp-to-dp", "tp-to-pipeline-of-tp"])
def test_a_checkpoint_moves_between_tp_groups_and_data_parallelism(pool4, a, b, tmp_path):
    _check(_run(pool4, a, b, "adamw", tmp_path), "adamw")


def test_a_zero_checkpoint_loads_into_other_fractions_and_stage(pool3, tmp_path):
    """ZeRO-2 over 0.2 / 0.5 / 0.3 shards, then ZeRO-1 over 0.6 / 0 / 0.4 with other rows: each rank wrote
    its own uneven ranges (``zero/`` of the checkpoint) and reads the ranges of the new split.  A rank's
    flat shard spans many parameters, so the states are not compared by name: SGD with momentum holds
    every parameter to one process's within 2e-5, which a lost or misplaced range exceeds."""
    results = _run(pool3, ZERO_A, ZERO_B, "sgd", tmp_path)
    assert (tmp_path / "ckpt" / f"step-{SWITCH}" / "zero").is_dir()
    _check([(losses, params, True, names) for losses, params, _, names in results], "sgd")
