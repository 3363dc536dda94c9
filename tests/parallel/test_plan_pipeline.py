"""Pipeline plans: the rules a plan with "pp:*" groups must satisfy (each message checked), the YAML
round trip of a 2-replica plan, and the pipeline planner on synthetic profiles.  No processes."""
import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcomm.parallel.cluster import ClusterView
from hcomm.parallel.plan import GroupPlan, Plan, PlanError, RankPlan
from hcomm.parallel.planner.pipeline import balanced_ideal_s, boundary_bytes, plan_pipeline
from hcomm.parallel.profile import DeviceProfile, LayerCost

MiB = 1 << 20
N_PIECES = 9   # embedding, 6 blocks, norm, head


# --- plan rules ---------------------------------------------------------------------------------

def two_replicas() -> Plan:
    """A valid plan: 4 ranks, replicas [0, 1] and [2, 3] (pieces [0, 4) and [4, 9)), 4 rows each in 2
    micro-batches; the second replica in the device order 3, 2."""
    ranks = [RankPlan(0, 0.5, stage=0, layers=(0, 4)), RankPlan(1, 0.0, stage=1, layers=(4, 9)),
             RankPlan(2, 0.0, stage=1, layers=(4, 9)), RankPlan(3, 0.5, stage=0, layers=(0, 4))]
    groups = [GroupPlan("dp", [0, 1, 2, 3]),
              GroupPlan("pp:0", [0, 1], micro_batches=2, cuts=[0, 4, 9]),
              GroupPlan("pp:1", [3, 2], micro_batches=2, cuts=[0, 4, 9])]
    return Plan(8, 16, ranks, groups, name="pp").validate()


def assert_error(plan: Plan, *fragments: str) -> None:
    with pytest.raises(PlanError) as info:
        plan.validate()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def changed(edit) -> Plan:
    plan = two_replicas()
    edit(plan)
    return plan


def _set(obj, **fields):
    for k, v in fields.items():
        setattr(obj, k, v)


def _cuts(plan, cuts, virtual=1):
    for g in plan.pipeline_groups():
        g.cuts, g.virtual_stages = list(cuts), virtual
    for r in plan.ranks:
        r.layers = None


RULES = {
    "rank in two pipelines": (
        lambda p: _set(p.groups[2], ranks=[1, 2]),
        ["groups[2].ranks: rank 1 is in pipeline 'pp:0' too; each rank is in one"]),
    "rank in no pipeline": (
        lambda p: _set(p.groups[2], ranks=[3]),
        ["groups: ranks 2 are in no pipeline ('pp:*') group; with pipelining every rank holds a stage"]),
    "replicas with different cuts": (
        lambda p: _set(p.groups[2], cuts=[0, 5, 9]),
        ["groups[2]: pipeline 'pp:1' has 2 ranks, cuts [0, 5, 9], virtual_stages 1; 'pp:0' has 2, [0, 4, 9], 1: "
         "replicas of a stage must hold the same pieces"]),
    "replicas with different sizes": (
        lambda p: (_set(p.groups[1], ranks=[0, 1, 2], cuts=[0, 3, 6, 9]), _set(p.groups[2], ranks=[3]),
                   _set(p.ranks[2], stage=2), [_set(r, layers=None) for r in p.ranks]),
        ["groups[2]: pipeline 'pp:1' has 1 ranks, cuts [0, 4, 9], virtual_stages 1; 'pp:0' has 3, [0, 3, 6, 9], 1"]),
    "replicas with different virtual stages": (
        lambda p: (_set(p.groups[2], virtual_stages=2), [_set(r, layers=None) for r in p.ranks]),
        ["groups[2]: pipeline 'pp:1' has 2 ranks, cuts [0, 4, 9], virtual_stages 2; 'pp:0' has 2, [0, 4, 9], 1"]),
    "cuts not rising": (
        lambda p: _cuts(p, [0, 4, 4]),
        ["groups[1].cuts: 2 ranks x 1 virtual stages need 3 rising cuts from 0 (first piece of each stage, then "
         "the piece count), got [0, 4, 4]"]),
    "cuts not from 0": (
        lambda p: _cuts(p, [1, 4, 9]),
        ["groups[1].cuts: 2 ranks x 1 virtual stages need 3 rising cuts from 0", "got [1, 4, 9]"]),
    "cuts: wrong count": (
        lambda p: _cuts(p, [0, 3, 6, 9]),
        ["groups[1].cuts: 2 ranks x 1 virtual stages need 3 rising cuts from 0", "got [0, 3, 6, 9]"]),
    "cuts: wrong count for virtual stages": (
        lambda p: (_cuts(p, [0, 4, 9], virtual=2), [_set(g, schedule="interleaved-1f1b")
                                                     for g in p.pipeline_groups()]),
        ["groups[1].cuts: 2 ranks x 2 virtual stages need 5 rising cuts from 0", "got [0, 4, 9]"]),
    "cuts left out": (
        lambda p: _cuts(p, []),
        ["groups[1].cuts: 2 ranks x 1 virtual stages need 3 rising cuts from 0", "got []"]),
    "stage is not the position": (
        lambda p: _set(p.ranks[1], stage=0),
        ["ranks[1].stage: is 0, but rank 1 is at position 1 of 'pp:0'"]),
    "stage of a reordered replica": (
        lambda p: (_set(p.ranks[2], stage=0), _set(p.ranks[3], stage=1)),
        ["ranks[3].stage: is 1, but rank 3 is at position 0 of 'pp:1'"]),
    "layers disagree with the cuts": (
        lambda p: _set(p.ranks[1], layers=(3, 9)),
        ["ranks[1].layers: (3, 9) disagrees with 'pp:0' cuts [0, 4, 9] (stage 1 holds pieces [4, 9))"]),
    "layers with virtual stages": (
        lambda p: ([_set(g, cuts=[0, 2, 4, 6, 9], virtual_stages=2, schedule="interleaved-1f1b")
                    for g in p.pipeline_groups()], _set(p.ranks[0], layers=(0, 2))),
        ["ranks[0].layers: leave it out with virtual_stages 2 (the cuts say which pieces)"]),
    "share on a later rank": (
        lambda p: (_set(p.ranks[0], batch_share=0.25), _set(p.ranks[1], batch_share=0.25)),
        ["ranks[1].batch_share: 0.25, but only a pipeline's first rank (rank 0 of 'pp:0') takes a share: it is "
         "the replica's rows"]),
    "share on the first rank of the group list, not of the pipeline": (
        lambda p: (_set(p.ranks[3], batch_share=0.0), _set(p.ranks[2], batch_share=0.5)),
        ["ranks[2].batch_share: 0.5, but only a pipeline's first rank (rank 3 of 'pp:1') takes a share"]),
    "rows not divisible by micro-batches": (
        lambda p: _set(p.groups[2], micro_batches=3),
        ["groups[2].micro_batches: 'pp:1' gets 4 rows per step, which do not split into 3 equal micro-batches"]),
    "interleaved with one stage per rank": (
        lambda p: _set(p.groups[1], schedule="interleaved-1f1b"),
        ["groups[1] (pp:0): interleaved-1f1b needs virtual_stages >= 2 stages per rank, got 1; with one stage "
         "per rank use 1f1b"]),
    "interleaved micro-batch count": (
        lambda p: ([_set(g, cuts=[0, 2, 4, 6, 9], virtual_stages=2, schedule="interleaved-1f1b", micro_batches=1)
                    for g in p.pipeline_groups()], [_set(r, layers=None) for r in p.ranks],
                   _set(p, global_batch=10), _set(p.groups[1], micro_batches=5)),
        ["groups[1] (pp:0): interleaved-1f1b on 2 ranks cannot run 5 micro-batches: torch's "
         "ScheduleInterleaved1F1B splits them into max(1, M // 2) = 2 rounds"]),
    "gpipe with virtual stages": (
        lambda p: ([_set(g, cuts=[0, 2, 4, 6, 9], virtual_stages=2, schedule="gpipe")
                    for g in p.pipeline_groups()], [_set(r, layers=None) for r in p.ranks]),
        ["groups[1] (pp:0): gpipe runs one stage per rank; virtual_stages must be 1, got 2"]),
    "unknown schedule": (
        lambda p: _set(p.groups[1], schedule="zero-bubble"),
        ["groups[1] (pp:0): unknown pipeline schedule 'zero-bubble'; supported: gpipe, 1f1b, interleaved-1f1b"]),
    "pipeline with zero": (
        lambda p: [_set(r, zero_stage=1) for r in p.ranks],
        ["pipeline groups run on backend 'hcomm' with zero_stage 0 and sync_every 1 (got backend 'hcomm', "
         "zero_stage 1, sync_every 1)"]),
    "pipeline on ddp-gloo": (
        lambda p: _set(p, backend="ddp-gloo"),
        ["pipeline groups run on backend 'hcomm' with zero_stage 0 and sync_every 1 (got backend 'ddp-gloo', "
         "zero_stage 0, sync_every 1)"]),
    "pipeline with sync_every": (
        lambda p: _set(p.groups[0], sync_every=4),
        ["(got backend 'hcomm', zero_stage 0, sync_every 4)"]),
    "virtual_stages 0": (
        lambda p: _set(p.groups[1], virtual_stages=0),
        ["groups[1].virtual_stages: must be >= 1, got 0"]),
}


@pytest.mark.parametrize("name", list(RULES))
def test_pipeline_rule(name):
    edit, fragments = RULES[name]
    assert_error(changed(edit), *fragments)


@pytest.mark.parametrize("field, value, fragment", [
    ("stage", 1, "ranks[1]: stage 1 / layers None set, but the plan has no pipeline ('pp:*') groups"),
    ("layers", (0, 4), "ranks[1]: stage 0 / layers (0, 4) set, but the plan has no pipeline ('pp:*') groups"),
])
def test_stage_or_layers_without_pipeline_groups(field, value, fragment):
    plan = Plan.from_shares([0.5, 0.5], 8, 16)
    setattr(plan.ranks[1], field, value)
    assert_error(plan, fragment)


def test_the_valid_plans_pass():
    plan = two_replicas()
    assert [g.name for g in plan.pipeline_groups()] == ["pp:0", "pp:1"]
    assert plan.pipeline_of(2).name == "pp:1" and plan.pipeline_of(2).ranks == [3, 2]
    assert plan.batch_counts() == [4, 0, 0, 4]
    # a replica with no rows is fine while another has them (it only joins the stage reductions)
    skewed = changed(lambda p: (_set(p.ranks[0], batch_share=1.0), _set(p.ranks[3], batch_share=0.0)))
    assert skewed.validate().batch_counts() == [8, 0, 0, 0]
    # interleaved: two stages per rank, layers left out
    inter = changed(lambda p: ([_set(g, cuts=[0, 2, 4, 6, 9], virtual_stages=2, schedule="interleaved-1f1b")
                                for g in p.pipeline_groups()], [_set(r, layers=None) for r in p.ranks]))
    assert inter.validate() is inter
    # 1f1b with fewer micro-batches than stages is a valid plan (the runtime runs it as an explicit order)
    assert changed(lambda p: [_set(g, micro_batches=1) for g in p.pipeline_groups()]).validate()


def test_two_replica_pipeline_yaml_round_trip(tmp_path):
    plan = two_replicas()
    plan.predicted_step_s, plan.notes = 0.125, ["pipeline (auto split): 2 replica(s) of 2 stages"]
    plan.groups[1].bucket_bytes = plan.groups[2].bucket_bytes = 1 << 20
    text = plan.to_yaml()
    assert "cuts: [0, 4, 9]" in text and "layers: [4, 9]" in text and "ranks: [3, 2]" in text
    back = Plan.from_yaml(text)
    assert back == plan
    assert back.ranks[1].layers == (4, 9) and back.pipeline_of(3).ranks == [3, 2]
    inter = changed(lambda p: ([_set(g, cuts=[0, 2, 4, 6, 9], virtual_stages=2, schedule="interleaved-1f1b",
                                     micro_batches=4) for g in p.pipeline_groups()],
                               [_set(r, layers=None) for r in p.ranks]))
    assert Plan.from_yaml(inter.to_yaml()) == inter
    path = str(tmp_path / "pp.yaml")
    plan.save(path)
    assert Plan.load(path) == plan


# --- the planner on synthetic profiles -------------------------------------------------------------

SECONDS = [0.02] + [0.1] * 6 + [0.01, 0.05]   # fwd + bwd of each piece, one sample, speed 1


def profile(rank, speed=1.0, budget=8 << 30, act=MiB):
    """9 pieces like the tiny model's with 6 blocks; every piece 4 MiB of parameters (16 MiB of state)."""
    layers = [LayerCost(f"p{i}", s / speed / 3, 2 * s / speed / 3, 4 * MiB, 4 * MiB, 8 * MiB, act)
              for i, s in enumerate(SECONDS)]
    return DeviceProfile(rank, "X", 1, 16, layers, budget, 0, "test", 0.0, "measured")


def view(speeds, budgets=None, islands=None):
    budgets = budgets or [8 << 30] * len(speeds)
    profiles = [profile(r, s, b) for r, (s, b) in enumerate(zip(speeds, budgets))]
    islands = islands or [list(range(len(speeds)))]
    allreduce = lambda n: 1e-3 + n / 1e9  # noqa: E731
    return ClusterView(["X"] * len(speeds), islands, profiles, allreduce, [allreduce] * len(islands),
                       [0.0] * len(speeds), None, [f"i{i}" for i in range(len(islands))],
                       links={"intra": (1e-4, 1e9), "inter": (5e-4, 5e7)})


BOUNDARY = boundary_bytes(32, 16)


def pieces_held(plan: Plan):
    """Pieces each rank holds, from its replica's cuts and its position (virtual stages included)."""
    held = [0] * plan.world_size
    for g in plan.pipeline_groups():
        for k, (a, b) in enumerate(zip(g.cuts, g.cuts[1:])):
            held[g.ranks[k % len(g.ranks)]] += b - a
    return held


def check_pipeline_plan(plan: Plan) -> None:
    """What every planned pipeline must satisfy beyond validate()."""
    plan.validate(plan.world_size)
    counts = plan.batch_counts()
    assert sum(counts) == plan.global_batch
    for g in plan.pipeline_groups():
        assert counts[g.ranks[0]] % g.micro_batches == 0, (g.name, counts, g.micro_batches)
        for pos, r in enumerate(g.ranks):
            assert plan.ranks[r].stage == pos
            if pos:
                assert plan.ranks[r].batch_share == 0.0 and counts[r] == 0


def test_auto_gives_the_faster_rank_more_pieces_and_beats_the_baselines():
    v = view([1.0, 0.5])
    auto = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY)
    uniform = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, split="uniform")
    params = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, split="parameters")
    for plan in (auto, uniform, params):
        check_pipeline_plan(plan)
    assert pieces_held(uniform) == [4, 5] and uniform.pipeline_groups()[0].ranks == [0, 1]
    assert uniform.pipeline_groups()[0].schedule == "1f1b"
    assert pieces_held(auto)[0] > pieces_held(uniform)[0]
    assert pieces_held(auto)[0] > pieces_held(auto)[1]
    assert auto.predicted_step_s < uniform.predicted_step_s
    assert auto.predicted_step_s < params.predicted_step_s
    assert auto.name == "auto" and uniform.name == "uniform" and params.name == "parameters"
    # with one stage per rank pinned, the fast rank's layers say so directly
    pinned = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, schedule="1f1b")
    check_pipeline_plan(pinned)
    fast = pinned.ranks[0].layers
    assert fast is not None and fast[1] - fast[0] > 4
    assert pinned.predicted_step_s < uniform.predicted_step_s


def test_four_ranks_two_stages_on_mixed_speeds():
    v = view([1.0, 1.0, 0.5, 0.5])
    plan = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY)
    check_pipeline_plan(plan)
    pipes = plan.pipeline_groups()
    assert len(pipes) == 2 and sorted(r for g in pipes for r in g.ranks) == [0, 1, 2, 3]
    assert all(g.cuts == pipes[0].cuts for g in pipes)
    assert sum(plan.batch_counts()) == 16
    assert plan.predicted_step_s > 0
    uniform = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, split="uniform")
    check_pipeline_plan(uniform)
    assert [g.ranks for g in uniform.pipeline_groups()] == [[0, 1], [2, 3]]
    assert [uniform.batch_counts()[g.ranks[0]] for g in uniform.pipeline_groups()] == [8, 8]
    assert plan.predicted_step_s <= uniform.predicted_step_s


def _ideal(v, plan):
    """balanced_ideal_s of replica 0 at the plan's cuts, schedule and micro-batches."""
    from hcomm.parallel.pipeline.partition import evaluate

    g = plan.pipeline_groups()[0]
    rows = plan.batch_counts()[g.ranks[0]]
    part = evaluate([v.profiles[r] for r in g.ranks], g.cuts, micro_batches=g.micro_batches,
                    micro_batch=rows // g.micro_batches, schedule=g.schedule, virtual_stages=g.virtual_stages,
                    label="check", boundary_bytes=BOUNDARY, link_s=v.p2p_s)
    return balanced_ideal_s(v, g.ranks, part)


@pytest.mark.parametrize("speeds, stages, batch", [([1.0, 0.5], 2, 16), ([1.0, 1.0, 0.5, 0.5], 2, 16),
                                                   ([1.0, 0.7, 0.4], 3, 12), ([1.0, 0.5], 2, 12)])
def test_balanced_ideal_is_at_most_the_auto_prediction(speeds, stages, batch):
    v = view(speeds)
    plan = plan_pipeline(v, batch, 16, stages=stages, boundary=BOUNDARY)
    ideal = _ideal(v, plan)
    assert 0 < ideal <= plan.predicted_step_s, (ideal, plan.predicted_step_s)
    note = next(n for n in plan.notes if n.startswith("balanced ideal of replica 0"))
    assert f"{ideal * 1e3:.0f} ms" in note


@pytest.mark.xfail(strict=False, reason="balanced_ideal_s is the step of an equal-time-per-stage pipeline, not a "
                                        "lower bound: unequal chunks (a tiny first chunk) shrink interleaved-1f1b's "
                                        "bubble below it (here 2880 ms planned vs a 3173 ms 'ideal')")
def test_balanced_ideal_is_a_lower_bound_also_with_few_interleaved_micro_batches():
    v = view([1.0, 1.0, 0.5, 0.5])
    plan = plan_pipeline(v, 12, 16, stages=2, boundary=BOUNDARY)
    assert plan.pipeline_groups()[0].schedule == "interleaved-1f1b"
    assert _ideal(v, plan) <= plan.predicted_step_s


def test_pinned_micro_batches_and_schedule_are_kept():
    v = view([1.0, 1.0, 0.5, 0.5])
    plan = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, micro_batches=4)
    check_pipeline_plan(plan)
    assert all(g.micro_batches == 4 for g in plan.pipeline_groups())
    assert all(plan.batch_counts()[g.ranks[0]] % 4 == 0 for g in plan.pipeline_groups())
    gpipe = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, schedule="gpipe", micro_batches=2)
    check_pipeline_plan(gpipe)
    assert {(g.schedule, g.micro_batches, g.virtual_stages) for g in gpipe.pipeline_groups()} == {("gpipe", 2, 1)}
    with pytest.raises(ValueError, match=r"--microbatches 5 does not divide --global-batch 16"):
        plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY, micro_batches=5)


def test_more_stages_than_pieces_is_refused():
    v = view([1.0] * 10)
    with pytest.raises(ValueError, match=r"--pp 10: the model has only 9 pieces \(embedding, blocks, norm, head\); "
                                         r"every stage needs at least one"):
        plan_pipeline(v, 10, 16, stages=10, boundary=BOUNDARY)


def test_world_not_divisible_by_stages_is_refused():
    with pytest.raises(ValueError, match=r"--pp 2: the 3 ranks do not form equal pipelines of 2 stages"):
        plan_pipeline(view([1.0, 1.0, 1.0]), 12, 16, stages=2, boundary=BOUNDARY)


def test_bad_split_and_schedule_are_refused():
    v = view([1.0, 1.0])
    with pytest.raises(ValueError, match=r"pipeline split must be one of auto, uniform, parameters, got 'even'"):
        plan_pipeline(v, 8, 16, stages=2, boundary=BOUNDARY, split="even")
    with pytest.raises(ValueError, match=r"--schedule must be one of gpipe, 1f1b, interleaved-1f1b, got 'zb'"):
        plan_pipeline(v, 8, 16, stages=2, boundary=BOUNDARY, schedule="zb")


def test_uniform_split_that_does_not_fit_memory_is_refused_and_auto_fits():
    # Rank 1 has 60 MiB: the uniform split's 5 pieces there need 80 MiB of state alone; auto moves
    # pieces to rank 0 until rank 1's stage fits.
    v = view([1.0, 1.0], budgets=[8 << 30, 60 * MiB])
    with pytest.raises(ValueError, match=r"the uniform split does not fit memory: rank 1 needs \d+ MiB of 60 MiB"):
        plan_pipeline(v, 8, 16, stages=2, boundary=BOUNDARY, split="uniform")
    auto = plan_pipeline(v, 8, 16, stages=2, boundary=BOUNDARY)
    check_pipeline_plan(auto)
    assert pieces_held(auto)[1] * 16 < 60


def test_planner_does_not_mutate_and_plans_round_trip():
    v = view([1.0, 1.0, 0.5, 0.5])
    before = copy.deepcopy(v.profiles)
    plan = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY)
    assert v.profiles == before
    assert Plan.from_yaml(plan.to_yaml()) == plan


@pytest.mark.parametrize("speeds", [[1.0, 1.0, 1.0, 1.0], [1.0, 0.997, 0.999, 0.998], [0.998, 1.0, 0.997, 0.999]])
def test_replicas_across_two_islands_keep_each_stage_inside_one(speeds):
    """Four devices of (nearly) equal speed in islands {0, 1} and {2, 3} joined by a slow link, two
    replicas of two stages: whatever order the profiles' noise sorts them in, the groupings tried include
    one replica per island pair and one per island, and the plan syncs every stage inside an island
    (36 MiB of gradients over the 50 MB/s link would cost ~0.75 s; the activations crossing, ~KiB)."""
    from hcomm.parallel.planner.pipeline import replica_groupings

    v = view(speeds, islands=[[0, 1], [2, 3]])
    groupings = [replicas for _, replicas in replica_groupings(v, 2, "auto")]
    spans = [[len({v.island_of(r) for r in rep}) for rep in replicas] for replicas in groupings]
    assert [2, 2] in spans and [1, 1] in spans, groupings
    assert len({frozenset(map(frozenset, g)) for g in groupings}) == len(groupings)   # each tried once
    plan = plan_pipeline(v, 16, 16, stages=2, boundary=BOUNDARY)
    check_pipeline_plan(plan)
    pipes = plan.pipeline_groups()
    for pos in range(2):
        assert len({v.island_of(g.ranks[pos]) for g in pipes}) == 1, [g.ranks for g in pipes]
    assert all(len({v.island_of(r) for r in g.ranks}) == 2 for g in pipes)


def test_the_leaders_micro_batch_count_is_chosen_for_the_whole_grouping():
    """Two replicas of two stages, each across two islands, 8 rows each: the leader alone is fastest at
    8 micro-batches (the grouping then predicts 10.996 s); its best at 2 micro-batches gives the whole
    grouping 10.211 s.  Trying the leader's best per micro-batch count for the whole finds it."""
    from hcomm.parallel.planner.pipeline import Effort, _predict, replica_groupings

    v = view([0.5, 0.5, 0.5, 0.25], islands=[[0, 1], [2, 3]])
    replicas = dict(replica_groupings(v, 2, "auto"))["each replica across the islands"]
    assert replicas == [[0, 2], [1, 3]]
    alone = _predict(v, replicas, [8, 8], BOUNDARY, "auto", None, None, Effort(leads=1))
    whole = _predict(v, replicas, [8, 8], BOUNDARY, "auto", None, None)
    assert [r.part.micro_batches for r in alone[1]] == [8, 8] and alone[0] == pytest.approx(10.996, abs=1e-3)
    assert [r.part.micro_batches for r in whole[1]] == [2, 2] and whole[0] == pytest.approx(10.2113, abs=1e-4)
    assert whole[2].best.micro_batches == 2   # the choice reported is the one taken


def test_equal_rows_are_tried_beside_rows_by_speed():
    """Three replicas of two stages (uneven's devices): rows by speed (8, 5, 11) leave the leader 11 rows,
    which only 1 or 11 micro-batches divide (5.345 s); equal rows, 8 each, run 8 micro-batches (4.259 s)."""
    from hcomm.parallel.planner.pipeline import Effort

    v = view([1.0, 1.0, 1.0, 0.5, 0.5, 0.75], islands=[[0, 1, 2], [3, 4], [5]])
    alone = plan_pipeline(v, 24, 16, stages=2, boundary=BOUNDARY, effort=Effort(leads=1))
    plan = plan_pipeline(v, 24, 16, stages=2, boundary=BOUNDARY)
    check_pipeline_plan(plan)
    assert [alone.batch_counts()[g.ranks[0]] for g in alone.pipeline_groups()] == [8, 5, 11]
    assert alone.predicted_step_s == pytest.approx(5.3449, abs=1e-4)
    assert [plan.batch_counts()[g.ranks[0]] for g in plan.pipeline_groups()] == [8, 8, 8]
    assert [g.micro_batches for g in plan.pipeline_groups()] == [8, 8, 8]
    assert plan.predicted_step_s == pytest.approx(4.2586, abs=1e-4)


@settings(max_examples=40, deadline=None)
@given(speeds=st.lists(st.sampled_from([1.0, 0.75, 0.5, 0.25]), min_size=4, max_size=6).filter(
           lambda s: len(s) % 2 == 0),
       split_islands=st.booleans(), batch=st.sampled_from([8, 12, 16, 24]))
def test_trying_more_leads_never_predicts_slower(speeds, split_islands, batch):
    from hcomm.parallel.planner.pipeline import Effort

    n = len(speeds)
    v = view(speeds, islands=[list(range(n // 2)), list(range(n // 2, n))] if split_islands else None)
    alone = plan_pipeline(v, batch, 16, stages=2, boundary=BOUNDARY, effort=Effort(leads=1))
    whole = plan_pipeline(v, batch, 16, stages=2, boundary=BOUNDARY)
    assert whole.predicted_step_s <= alone.predicted_step_s * (1 + 1e-12)


def test_a_fixed_order_replica_takes_a_micro_batch_count_that_fits():
    """A replica in a fixed device order (large clusters follow the leader's order) whose rows the
    leader's count does not divide tries every count: 6 rows in 1, 2 or 3 micro-batches do not fit
    (800 / 800 / 544 MiB of activations and state on a 448 MiB budget), 6 of one sample do (288 MiB).
    A part that does not fit has no step time (0), so it was taken as the fastest; at 4,096 devices that
    dropped shapes from the search."""
    from types import SimpleNamespace

    from hcomm.parallel.planner.pipeline import _best_for_cuts
    from hcomm.parallel.planner.pipeline_step import transfer_costs

    def prof(rank):
        layers = [LayerCost(f"p{i}", 0.01, 0.02, 4 * MiB, 4 * MiB, 8 * MiB, 64 * MiB, fwd_fixed_s=0.005,
                            bwd_fixed_s=0.01) for i in range(4)]
        return DeviceProfile(rank, "X", 1, 16, layers, 448 * MiB, 0, "test", 0.0, "measured")

    allreduce = lambda n: 1e-3 + n / 1e9  # noqa: E731
    v = ClusterView(["X", "X"], [[0, 1]], [prof(0), prof(1)], allreduce, [allreduce], [0.0, 0.0], None, ["i0"],
                    links={"intra": (1e-4, 1e9)})
    lead = SimpleNamespace(schedule="1f1b", virtual_stages=1, micro_batches=4)   # 4 does not divide 6 rows
    part = _best_for_cuts(v, [0, 1], 6, [0, 2, 4], lead, None, None, True, boundary_bytes=BOUNDARY,
                          **transfer_costs(v))
    assert part.fits and part.micro_batches == 6 and part.step_s == pytest.approx(0.421, abs=1e-3)


def test_the_leader_chooses_cuts_every_replica_can_hold_when_following_its_order(monkeypatch):
    """At scale the other replicas take the leader's cuts in its device order (``follow_leader``).  Here
    the leader (ranks 1, 0: budgets 1000 MiB) puts 3 of 4 pieces on its fast device (1F1B, 4 micro-batches,
    336 MiB there); the other replica's fast device (rank 2, the same speed) has 300 MiB and cannot hold
    them.  The leader chooses again with each position held to the smallest budget any replica has there:
    interleaved 1F1B, one piece per virtual stage (272 / 240 MiB), which both replicas hold.  (At 4,096
    devices of llama-70b this took the shapes that fit from 4 of 11 to 10.)"""
    from hcomm.parallel.planner import pipeline
    from hcomm.parallel.planner.pipeline import Effort, _predict

    def layers(fwd):
        return [LayerCost(f"p{i}", fwd, 2 * fwd, 24 * MiB, 24 * MiB, 48 * MiB, 16 * MiB) for i in range(4)]

    fast, slow = layers(0.01), layers(0.04)

    def prof(rank, pieces, budget):
        return DeviceProfile(rank, "X", 1, 16, pieces, budget * MiB, 0, "test", 0.0, "measured")

    profiles = [prof(0, fast, 1000), prof(1, slow, 1000), prof(2, fast, 300), prof(3, slow, 1000)]
    allreduce = lambda n: 1e-3 + n / 1e9  # noqa: E731
    v = ClusterView(["X"] * 4, [[0, 1, 2, 3]], profiles, allreduce, [allreduce], [0.0] * 4, None, ["i0"],
                    links={"intra": (1e-4, 1e9)})
    effort = Effort(follow_leader=True, leads=1, refine_rows=False)
    step, replicas, choice, _, _ = _predict(v, [[0, 1], [2, 3]], [4, 4], BOUNDARY, "auto", None, None, effort)
    assert [r.part.ranks for r in replicas] == [[1, 0], [3, 2]]
    assert [list(r.part.cuts) for r in replicas] == [[0, 1, 2, 3, 4]] * 2
    assert all(r.part.fits for r in replicas) and choice.best.cuts == replicas[0].part.cuts
    assert [m // MiB for m in replicas[1].part.memory_bytes] == [272, 240]
    assert step == pytest.approx(1.0113, abs=1e-4)
    # the leader's own choice, as before: rank 2 would need 336 MiB of its 300
    monkeypatch.setattr(pipeline, "_tightest_budgets", lambda *a: None)
    _, first, _, _, _ = _predict(v, [[0, 1], [2, 3]], [4, 4], BOUNDARY, "auto", None, None, effort)
    assert list(first[1].part.cuts) == [0, 1, 4] and not first[1].part.fits
    assert [m // MiB for m in first[1].part.memory_bytes] == [128, 336]
