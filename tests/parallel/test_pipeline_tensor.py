"""Pipelines of tensor-parallel groups (``--pp N --tp T``): the plan rules, the planner on synthetic
profiles (a group as one pipeline device, computed by hand), and training end to end.

Training equivalence: ``hcomm train --local`` runs the same global batches from the same seed in fp32
for every plan, so a pipeline of uneven TP groups must give torch DDP's per-step losses and, after the
shards are joined back into the reference model, its eval loss.  TP only splits each matmul's sum over
heads / features / vocabulary and the pipeline only regroups the sum over tokens, so the plans differ
by summation order (~1e-7 relative observed); we allow 1e-4 relative as the other trainer tests do, and
bf16/fp16 stages half bf16's unit roundoff (tests/parallel/test_precision.py derives it).
"""
from __future__ import annotations

import copy
import dataclasses

import pytest

from hcomm.parallel.plan import GroupPlan, Plan, PlanError, RankPlan
from hcomm.parallel.planner.pipeline_tensor import ALLREDUCES, group_profile, plan_pipeline_tensor
from tests.parallel.test_plan_pipeline import BOUNDARY, pieces_held, view
from tests.parallel.train_runs import assert_reference_losses, train_local

STEPS = 3
LOSS_REL = 1e-4
MIXED_REL = 2.0 ** -9


# --- plan rules ---------------------------------------------------------------------------------

def grid() -> Plan:
    """4 ranks: stage 0 = TP group [0, 1] (0.6 / 0.4), stage 1 = TP group [2, 3] (0.5 / 0.5); pipeline
    pp:0 links position 0 (ranks 0, 2), pp:1 position 1 (ranks 1, 3); rows on rank 0."""
    ranks = [RankPlan(0, 1.0, stage=0, tp_group=0, tp_fraction=0.6),
             RankPlan(1, 0.0, stage=0, tp_group=0, tp_fraction=0.4),
             RankPlan(2, 0.0, stage=1, tp_group=1, tp_fraction=0.5),
             RankPlan(3, 0.0, stage=1, tp_group=1, tp_fraction=0.5)]
    groups = [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [2, 3]),
              GroupPlan("pp:0", [0, 2], micro_batches=2, cuts=[0, 3, 7]),
              GroupPlan("pp:1", [1, 3], micro_batches=2, cuts=[0, 3, 7])]
    return Plan(8, 16, ranks, groups).validate()


def test_a_pipeline_of_tp_groups_is_valid_and_rows_come_from_stage_0_position_0():
    plan = grid()
    assert [plan.rows_leader(r) for r in range(4)] == [0, 0, 0, 0]
    assert plan.batch_counts() == [8, 0, 0, 0]


def _bad(edit, *fragments):
    plan = copy.deepcopy(grid())
    edit(plan)
    with pytest.raises(PlanError) as info:
        plan.validate()
    for f in fragments:
        assert f in str(info.value), str(info.value)


def test_a_tp_group_across_two_stages_is_refused():
    def edit(p):   # TP groups [0, 2] and [1, 3]: each spans both stages
        p.groups[1].ranks, p.groups[2].ranks = [0, 2], [1, 3]
        for r, group in zip(p.ranks, (0, 1, 0, 1)):
            r.tp_group, r.tp_fraction = group, 0.5
    _bad(edit, "groups[1] (tp:0): ranks [0, 2] sit at pipeline positions [0, 1]; a TP group is one stage")


def test_a_pipeline_joining_different_tp_positions_is_refused():
    def edit(p):
        p.groups[3].ranks, p.groups[4].ranks = [0, 3], [1, 2]
    _bad(edit, "pipeline 'pp:0': its ranks [0, 3] hold TP positions [0, 1]",
         "a pipeline links one TP position of equal groups")


def test_sequence_parallel_with_pipelines_is_refused():
    def edit(p):
        for g in p.tensor_groups():
            g.sequence_parallel = True
    _bad(edit, "groups[1] (tp:0): sequence parallelism does not run with pipelines")


def test_pipelines_of_one_replica_must_agree_on_micro_batches():
    def edit(p):
        p.groups[4].micro_batches = 4
    _bad(edit, "pipelines ['pp:0', 'pp:1'] run the same TP groups ['tp:0', 'tp:1'] but differ in micro_batches")


def test_stages_may_split_differently_but_replicas_of_a_stage_may_not():
    grid()   # 0.6/0.4 at stage 0 and 0.5/0.5 at stage 1 pass (above)
    without_pipes = copy.deepcopy(grid())
    without_pipes.groups = without_pipes.groups[:3]
    for r in without_pipes.ranks:
        r.stage = 0
    without_pipes.ranks[2].batch_share = 0.0
    with pytest.raises(PlanError) as info:
        without_pipes.validate()
    assert ("groups[2] (tp:1): tp_fraction [0.5, 0.5] differ from those of 'tp:0' [0.6, 0.4]: ranks at one "
            "position of every TP group hold the same shard") in str(info.value)


# --- the planner ------------------------------------------------------------------------------------

def test_group_profile_by_hand():
    """Two ranks at speeds 1 and 0.5 with fractions 2/3 and 1/3: each takes the same time per piece
    (the slow rank's third at half speed = the fast rank's two thirds), plus the piece's all-reduces of
    mb x seq x dim x 4 bytes on the island's all-reduce (1e-3 s + bytes / 1e9)."""
    v = view([1.0, 0.5])
    p = group_profile(v, [0, 1], [2 / 3, 1 / 3], 0, seq_len=16, dim=32)
    full = 1e-3 + 16 * 32 * 4 / 1e9
    # piece 1 (a block): fwd of one sample 0.1/3 s at speed 1; 2 all-reduces forward, 2 backward
    assert ALLREDUCES["block"] == (2, 2)
    assert p.layers[1].fwd_s == pytest.approx(0.1 / 3 * 2 / 3 + 2 * full)
    assert p.layers[1].bwd_s == pytest.approx(0.2 / 3 * 2 / 3 + 2 * full)
    assert p.layers[0].fwd_s == pytest.approx(0.02 / 3 * 2 / 3 + full)       # embedding: one sum forward
    assert p.layers[-1].bwd_s == pytest.approx(0.1 / 3 * 2 / 3 + full)       # head: one sum backward
    loss = 1e-3 + 16 * 4 / 1e9      # the loss's three per-token sums forward (max, exponentials, target)
    assert p.layers[-1].fwd_s == pytest.approx(0.05 / 3 * 2 / 3 + 3 * loss)
    assert p.layers[-2].fwd_s == pytest.approx(0.01 / 3 * 2 / 3)             # norm: none
    # a fixed part (launches) is run whole by every member: only the rest shrinks with the fraction
    for r in (0, 1):
        v.profiles[r].layers[1] = dataclasses.replace(v.profiles[r].layers[1], fwd_fixed_s=0.01 * (1 + r))
    fixed = group_profile(v, [0, 1], [2 / 3, 1 / 3], 0, seq_len=16, dim=32)
    # rank 0: 0.01 + (0.1/3 - 0.01) x 2/3; rank 1 (half speed): 0.02 + (0.2/3 - 0.02) x 1/3 -- slower
    assert fixed.layers[1].fwd_s == pytest.approx(0.02 + (0.2 / 3 - 0.02) / 3 + 2 * full)
    assert fixed.layers[1].fwd_fixed_s == pytest.approx(0.02 + 2 * (1e-3 + 1024 / 1e9))
    # a measured 4 ms per meeting point: one per all-reduce, the loss's three sums one meeting; none
    # shrinks with the rows (fixed)
    v.island_meeting_s = [4e-3]
    met = group_profile(v, [0, 1], [2 / 3, 1 / 3], 0, seq_len=16, dim=32)
    meetings = [(1, 0)] + [(2, 2)] * 6 + [(0, 0), (1, 1)]   # embedding, 6 blocks, norm, head
    assert len(met.layers) == len(meetings)
    for i, (fwd, bwd) in enumerate(meetings):
        assert met.layers[i].fwd_s == pytest.approx(fixed.layers[i].fwd_s + fwd * 4e-3), i
        assert met.layers[i].bwd_s == pytest.approx(fixed.layers[i].bwd_s + bwd * 4e-3), i
        assert met.layers[i].fwd_fixed_s == pytest.approx(fixed.layers[i].fwd_fixed_s + fwd * 4e-3), i
        assert met.layers[i].bwd_fixed_s == pytest.approx(fixed.layers[i].bwd_fixed_s + bwd * 4e-3), i
    # a curve that prices the 1 KiB latency probe above the piece's own all-reduce (a calibrated one did,
    # by 0.14 ms): the fixed part is at most the whole time, so the line never falls with more samples
    v.island_meeting_s = []
    v.island_allreduce_s = [lambda n: 8e-3 if n <= 1024 else 1e-3 + n / 1e9] * len(v.island_allreduce_s)
    odd = group_profile(v, [0, 1], [2 / 3, 1 / 3], 0, seq_len=16, dim=32)
    # the embedding: 0.02/3 x 2/3 + its 2 KiB sum (1 ms) = 5.4 ms in all, its 1 KiB probe alone 8 ms
    assert odd.layers[0].fwd_s == pytest.approx(0.02 / 3 * 2 / 3 + full) and odd.layers[0].fwd_fixed_s == odd.layers[0].fwd_s
    assert all(c.fwd_fixed_s <= c.fwd_s and c.bwd_fixed_s <= c.bwd_s for c in odd.layers)
    # memory: the tightest member's budget over its fraction; activations scaled so the member with the
    # smallest fraction (1/3) fits its own: 10/34 replicated + 24/34 x 1/3, checked as 1/3 of the group's
    assert p.memory_budget_bytes == int((8 << 30) / (2 / 3))
    assert p.layers[1].act_bytes_per_sample == int((1 << 20) * (10 / 34 + 24 / 34 / 3) * 3)


def test_planner_puts_the_fast_tp_group_on_more_pieces_and_expands_to_ranks():
    v = view([1.0, 1.0, 0.5, 0.5])
    auto = plan_pipeline_tensor(v, 16, 16, stages=2, tp=2, dim=32, boundary=BOUNDARY)
    uniform = plan_pipeline_tensor(v, 16, 16, stages=2, tp=2, dim=32, boundary=BOUNDARY, split="uniform")
    for plan in (auto, uniform):
        plan.validate(4)
        assert [g.ranks for g in plan.tensor_groups()] == [[0, 1], [2, 3]]
        assert sorted(g.ranks for g in plan.pipeline_groups()) == [[0, 2], [1, 3]] or \
            sorted(g.ranks for g in plan.pipeline_groups()) == [[2, 0], [3, 1]]
        assert plan.batch_counts()[plan.rows_leader(0)] == 16
    held = pieces_held(auto)
    assert held[0] == held[1] > held[2] == held[3]   # the fast pair holds more pieces (any schedule)
    assert sum(held) == 2 * 9
    assert auto.predicted_step_s < uniform.predicted_step_s


def test_planner_refuses_a_world_that_does_not_factor():
    with pytest.raises(ValueError, match="the 6 ranks do not form pipelines of 2 TP groups of 2"):
        plan_pipeline_tensor(view([1.0] * 6), 12, 16, stages=2, tp=2, dim=32, boundary=BOUNDARY)


# --- training end to end ----------------------------------------------------------------------------

PLANS = ["auto", "uniform", "auto@precision=per-device", "uniform@pp=1@tp=1"]
REFERENCE = "uniform@pp=1@tp=1"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_local(tmp_path_factory.mktemp("pp-tp"), PLANS, STEPS, "--pp", "2", "--tp", "2")


def test_pipelines_of_tp_groups_train_the_reference_losses(trained):
    runs, _ = trained
    assert_reference_losses(runs, REFERENCE, STEPS, lambda n: MIXED_REL if "precision" in n else LOSS_REL)
    plan = runs["auto"]["plan"]
    # the TP groups are the islands' pairs (members fastest first: either order on unshaped ranks)
    assert sorted(sorted(g["ranks"]) for g in plan["groups"] if g["name"].startswith("tp:")) == [[0, 1], [2, 3]]
    pipes = [g for g in plan["groups"] if g["name"].startswith("pp:")]
    assert len(pipes) == 2 and len({tuple(g["cuts"]) for g in pipes}) == 1


def test_mixed_dtypes_across_tp_and_stages(trained):
    runs, _ = trained
    run = runs["auto@precision=per-device"]
    assert [r.get("compute_dtype", "fp32") for r in run["plan"]["ranks"]] == ["bf16", "bf16", "fp16", "fp16"]
    assert all(not s["skipped"] for s in run["steps"])
    want = [s["loss"] for s in runs[REFERENCE]["steps"]]
    assert [s["loss"] for s in run["steps"]] != want   # autocast really ran


EIGHT = """name: eight
nodes:
  - name: a
    island: a
    vendor: nccl
    uplink: {bandwidth: 400mbit, latency: 500us}
    ranks:
      - {device: A100, speed: 1.0, memory: 3GiB}
      - {device: A100, speed: 1.0, memory: 3GiB}
      - {device: A100, speed: 1.0, memory: 3GiB}
      - {device: A100, speed: 1.0, memory: 3GiB}
  - name: v
    island: v
    vendor: nccl
    uplink: {bandwidth: 400mbit, latency: 500us}
    ranks:
      - {device: V100, speed: 0.5, memory: 1536MiB}
      - {device: V100, speed: 0.5, memory: 1536MiB}
      - {device: V100, speed: 0.5, memory: 1536MiB}
      - {device: V100, speed: 0.5, memory: 1536MiB}
"""


def test_two_replicas_of_a_pipeline_of_tp_groups(tmp_path):
    """8 ranks = 2 replicas x 2 stages x TP 2: each (stage, position) shard's gradient is all-reduced
    between the two replicas only; the losses equal torch DDP's on the same 8 ranks."""
    spec = tmp_path / "eight.yaml"
    spec.write_text(EIGHT)
    runs, _ = train_local(tmp_path, ["auto", "uniform@pp=1@tp=1"], 2, "--pp", "2", "--tp", "2",
                          "--cluster", str(spec))
    auto, ref = runs["auto"], runs["uniform@pp=1@tp=1"]
    assert len([g for g in auto["plan"]["groups"] if g["name"].startswith("pp:")]) == 4
    assert len(auto["steps"][0]["ranks"]) == 8
    assert [s["loss"] for s in auto["steps"]] == pytest.approx([s["loss"] for s in ref["steps"]], rel=LOSS_REL)
    assert auto["eval_loss"] == pytest.approx(ref["eval_loss"], rel=LOSS_REL)
