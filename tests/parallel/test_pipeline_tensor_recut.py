"""A pipeline of TP groups re-cut when a member drifts: the re-plan sees each group as one device at its
slowest member's drifted speed, keeps the groups and their fractions (every shard keeps its shape), and
prices the state move shard by shard.  The move itself and training through it end to end are in
test_pipeline_recut.py's ``hcomm train`` test (every step's loss within 1e-4 of torch DDP's).
"""
from __future__ import annotations

import dataclasses

import pytest

from hcomm.parallel.planner.pipeline_tensor import contract, expand, plan_pipeline_tensor
from tests.parallel.test_pipeline_tensor import grid
from tests.parallel.test_plan_pipeline import BOUNDARY, view

BATCH, SEQ = 16, 16


def _view():
    """test_plan_pipeline's 9-piece profiles, the norm sized for a model of dim 32 (its 128-byte weight:
    what the simulator reads the hidden size from, so it prices the same boundaries and TP all-reduces
    as the planner called with dim 32)."""
    v = view([1.0, 0.5, 1.0, 0.5], islands=[[0, 1], [2, 3]])

    def norm_of_dim_32(p):
        layers = list(p.layers)
        layers[-2] = dataclasses.replace(layers[-2], param_bytes=128, grad_bytes=128, optim_bytes=256)
        return dataclasses.replace(p, layers=layers)
    return dataclasses.replace(v, profiles=[norm_of_dim_32(p) for p in v.profiles])


def _planned():
    """The planner's pipeline of TP groups on two islands of a full- and a half-speed rank: groups [0, 1]
    and [2, 3], each split 2/3 : 1/3."""
    plan = plan_pipeline_tensor(_view(), BATCH, SEQ, stages=2, tp=2, dim=32,
                                boundary=BOUNDARY, name="auto@pp=2@tp=2")
    plan.dp_group().straggler_margin = 0.5
    return plan


def test_a_watched_pipeline_of_tp_groups_is_valid():
    plan = grid()
    plan.dp_group().straggler_margin = 0.3
    plan.validate()   # torch's baselines run no pipeline: their refusal is test_straggler.py's


def test_contract_is_the_inverse_of_expand():
    plan = _planned()
    inner, groups, fractions = contract(plan)
    assert groups == [g.ranks for g in plan.tensor_groups()] == [[0, 1], [2, 3]]
    assert fractions == [plan.ranks[0].tp_fraction, plan.ranks[1].tp_fraction] and fractions[0] > fractions[1]
    assert inner.world_size == 2 and len(inner.pipeline_groups()) == 1
    from hcomm.parallel import simulate   # the view is consistent: the planner's prediction is simulate's

    assert plan.predicted_step_s == pytest.approx(simulate(plan, _view()).step_s, rel=1e-9)
    assert inner.dp_group().straggler_margin == 0.5
    again = expand(inner, groups, fractions, _view())
    for a, b in zip(again.ranks, plan.ranks):
        assert (a.batch_share, a.stage, a.layers, a.tp_group, a.tp_fraction) == \
            (b.batch_share, b.stage, b.layers, b.tp_group, b.tp_fraction)
    assert sorted((g.name, g.ranks, g.cuts, g.micro_batches, g.schedule) for g in again.pipeline_groups()) == \
        sorted((g.name, g.ranks, g.cuts, g.micro_batches, g.schedule) for g in plan.pipeline_groups())


def test_contract_refuses_groups_split_differently():
    with pytest.raises(ValueError, match=r"TP groups \[\[2, 3\]\] split by other fractions than \[0, 1\] "
                                         r"\(\[0.6, 0.4\]\); a pipeline of TP groups re-plans with one split"):
        contract(grid())


def test_a_slow_member_moves_pieces_off_its_group_and_the_shards_keep_their_shape():
    """Rank 1 turns 4x slower: its group runs at its slowest member, so the group gets fewer pieces; the
    groups and fractions stay, the note prices every option."""
    from hcomm.parallel import simulate
    from hcomm.parallel.planner.pipeline import plan_pipeline
    from hcomm.parallel.planner.replan import PipelineReplanner, held_pieces

    before = _planned()

    def make(grouped, old):   # what hcomm train hands the replanner: the pipeline planner on the groups
        return plan_pipeline(grouped, BATCH, SEQ, stages=2, boundary=BOUNDARY, name=old.name)

    replanner = PipelineReplanner(_view(), make)
    after = replanner.replan(before, [1.0, 4.0, 1.0, 1.0])
    after.validate(4)
    profile = _view().profiles[0]

    def work(plan, rank):   # seconds per sample of the pieces a rank holds, at full speed
        return sum(profile.layers[i].fwd_s + profile.layers[i].bwd_s for i in held_pieces(plan)[rank])

    assert work(after, 0) == work(after, 1) < work(before, 0)
    assert work(after, 2) == work(after, 3) > work(before, 2)
    assert [(g.name, g.ranks) for g in after.tensor_groups()] == [(g.name, g.ranks) for g in before.tensor_groups()]
    assert [r.tp_fraction for r in after.ranks] == [r.tp_fraction for r in before.ranks]
    assert after.name == before.name and after.dp_group().straggler_margin == 0.5
    kept_s = simulate(before, replanner.view).step_s   # the old cuts at the drifted speeds, rank by rank
    chosen, rest = after.notes[0].split(": at the drifted speeds, per step: ")
    assert chosen in ("re-cut in place", "re-plan") and rest.startswith(f"keep the cuts {kept_s * 1e3:.0f} ms")
    assert after.predicted_step_s == pytest.approx(simulate(after, replanner.view).step_s, rel=1e-9)
    assert after.predicted_step_s < kept_s


def test_the_move_of_a_tp_piece_is_its_largest_shard_by_hand():
    """Two groups as devices of one island (links 1e-4 s + bytes / 1e9): cuts [0, 4, 9] -> [0, 3, 9] move
    piece 3 (a block: 4 MiB of parameters + 8 MiB of AdamW moments in test_plan_pipeline's profile) from group 0
    to group 1; every TP position sends its shard at once, so the largest (fraction 0.6) sets the time:
    1e-4 + 0.6 x 12 MiB / 1e9, plus two more messages' latency."""
    from hcomm.parallel.planner.pipeline_tensor import group_view
    from hcomm.parallel.planner.replan import move_seconds
    from tests.parallel.test_pipeline_recut import pipelines

    v = view([1.0, 1.0, 1.0, 1.0])
    grouped = group_view(v, [[0, 1], [2, 3]], [[0.6, 0.4]] * 2, SEQ, 32)
    a = pipelines(2, [([0, 1], [0, 4, 9], 8, 2, "1f1b")])
    b = pipelines(2, [([0, 1], [0, 3, 9], 8, 2, "1f1b")])
    piece = v.profiles[0].layers[3]
    nbytes = int((piece.param_bytes + piece.optim_bytes) * 0.6)
    assert move_seconds(grouped, a, b, share=0.6) == pytest.approx(3e-4 + nbytes / 1e9, rel=1e-12)
    assert move_seconds(grouped, a, b, share=0.6) < move_seconds(grouped, a, b)


def _tp_groups(inner, fractions=(0.6, 0.4)):
    """A plan over 2 devices (test_pipeline_recut.pipelines) as a pipeline of the TP groups [0, 1], [2, 3]."""
    devices = type("Devices", (), {"devices": ["X"] * 4})()
    return expand(inner, [[0, 1], [2, 3]], list(fractions), devices)


def test_restage_moves_each_shard_to_its_position_and_trains_the_single_process_run(pool4):
    """test_pipeline_recut.py's in-memory re-cut on a pipeline of TP groups (0.6 / 0.4): cuts [0, 4, 9] on
    groups in order, then cuts [0, 6, 9] with the groups swapped, 4 micro-batches of GPipe.  Every
    optimizer state that moved (SGD momentum, per shard) equals its old owner's bit for bit, and the
    losses and the joined model are the single process's within test_pipeline_recut.py's bounds (TP
    reorders the sums of each matmul, as the pipeline reorders the sum over tokens)."""
    from tests.parallel import recut_cases
    from tests.parallel.test_pipeline_recut import STEPS, SWITCH, _check, pipelines

    a = _tp_groups(pipelines(2, [([0, 1], [0, 4, 9], 8, 2, "1f1b")]))
    b = _tp_groups(pipelines(2, [([1, 0], [0, 6, 9], 8, 4, "gpipe")]))
    results = pool4.run(recut_cases.case_restage, a.to_yaml(), b.to_yaml(), STEPS, SWITCH, "sgd")
    _check(results, "sgd")
    # group [2, 3] now runs pieces 0-5 (the embedding's shards came from ranks 0 and 1), [0, 1] the rest
    for r, held in enumerate(result[3] for result in results):
        assert any(n.startswith("embed" if r >= 2 else "head") for n in held), (r, held)
        assert not any(n.startswith("head" if r >= 2 else "embed") for n in held), (r, held)
